package buildtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	stdsync "sync"
	"testing"
)

var built struct {
	once stdsync.Once
	dir  string
	err  error
}

var cmd struct {
	once stdsync.Once
	err  error
}

// Root is the module's root directory.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

func outDir() (string, error) {
	if built.dir == "" {
		d, err := os.MkdirTemp("", "bindings-buildtest-")
		if err != nil {
			return "", err
		}
		built.dir = d
	}
	return built.dir, nil
}

// Library builds libgorovod.so (once), as users build it (no build tags), and
// returns the directory holding it.
func Library(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		root, err := Root()
		if err == nil {
			var dir string
			if dir, err = outDir(); err == nil {
				c := exec.Command("go", "build", "-buildmode=c-shared", "-o", filepath.Join(dir, "libgorovod.so"), "./bindings/c")
				c.Dir = root
				if out, berr := c.CombinedOutput(); berr != nil {
					err = fmt.Errorf("building libgorovod.so: %v\n%s", berr, out)
				}
			}
		}
		built.err = err
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.dir
}

// tagged are the libraries LibraryTagged built, by build tags.
var tagged struct {
	mu   stdsync.Mutex
	dirs map[string]string
}

// LibraryTagged builds libgorovod.so with the given build tags (once per
// tags), as Library does, and returns the directory holding it.
func LibraryTagged(t testing.TB, tags string) string {
	t.Helper()
	base := Library(t) // the same temporary directory, cleaned up with it
	tagged.mu.Lock()
	defer tagged.mu.Unlock()
	if dir, ok := tagged.dirs[tags]; ok {
		return dir
	}
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(base, "tags-")
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command("go", "build", "-tags", tags, "-buildmode=c-shared", "-o", filepath.Join(dir, "libgorovod.so"), "./bindings/c")
	c.Dir = root
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("building libgorovod.so with -tags %s: %v\n%s", tags, err, out)
	}
	if tagged.dirs == nil {
		tagged.dirs = map[string]string{}
	}
	tagged.dirs[tags] = dir
	return dir
}

// Gorovod builds the gorovod command (once) and returns its path.
func Gorovod(t testing.TB) string {
	t.Helper()
	Library(t) // the same directory
	path := filepath.Join(built.dir, "gorovod")
	cmd.once.Do(func() {
		root, err := Root()
		if err == nil {
			c := exec.Command("go", "build", "-o", path, "./cmd/gorovod")
			c.Dir = root
			if out, berr := c.CombinedOutput(); berr != nil {
				err = fmt.Errorf("building gorovod: %v\n%s", berr, out)
			}
		}
		cmd.err = err
	})
	if cmd.err != nil {
		t.Fatal(cmd.err)
	}
	return path
}

// Cleanup removes what was built.
func Cleanup() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}
