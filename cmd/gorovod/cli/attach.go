package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/gorovod/gorovod/job"
)

const attachUsageText = `Usage: gorovod attach JOBFILE -- COMMAND [ARGS...]

Starts a worker by hand in the job whose job file 'gorovod run' printed:
COMMAND runs with the job's environment (its secret included) added to this
one's, in place of this process (same pid, so kill -TERM <pid> asks it to
leave), and the secret appears on no command line. The job file must be a
regular file of this user with mode 0600.`

// attachCommand is `gorovod attach`: it replaces this process with the
// worker command, as exec does, so it returns only when that fails.
func attachCommand(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod attach", flag.ContinueOnError)
	if err := parseFlags(fs, args, attachUsageText, stdout, stderr); err != nil {
		return err
	}
	rest := fs.Args()
	usage := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "gorovod attach: "+format+"\nRun 'gorovod attach --help' for the usage.\n", a...)
		return ErrUsage
	}
	if len(rest) == 0 {
		return usage("no job file (gorovod attach JOBFILE -- COMMAND [ARGS...])")
	}
	file, argv := rest[0], rest[1:]
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return usage("no worker command (gorovod attach JOBFILE -- COMMAND [ARGS...])")
	}
	jobEnv, err := job.ReadJobFile(file)
	if err != nil {
		return &commandError{command: "attach", err: err}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return &commandError{command: "attach", err: err}
	}
	err = syscall.Exec(path, argv, withEnv(os.Environ(), jobEnv))
	return &commandError{command: "attach", err: fmt.Errorf("starting %s: %w", argv[0], err)}
}

// withEnv is base with the variables of add set to add's values.
func withEnv(base, add []string) []string {
	set := map[string]bool{}
	for _, kv := range add {
		name, _, _ := strings.Cut(kv, "=")
		set[name] = true
	}
	out := make([]string, 0, len(base)+len(add))
	for _, kv := range base {
		if name, _, _ := strings.Cut(kv, "="); !set[name] {
			out = append(out, kv)
		}
	}
	return append(out, add...)
}
