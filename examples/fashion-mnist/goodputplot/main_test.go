package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Two runs, one as gorovod run prints it (worker prefixes, the launcher's
// own lines, a second rank's records): the table says when each reached the
// target, from rank 0's records only, and the PNG decodes.
func TestTableAndPlot(t *testing.T) {
	dir := t.TempDir()
	fixed := `{"kind":"step","rank":0,"global_batch":64,"trained_samples":64,"seconds":0.1,"lr_factor":1}
{"kind":"step","rank":0,"global_batch":64,"efficiency":1,"trained_samples":128,"seconds":0.2,"lr_factor":1}
{"kind":"eval","test_accuracy":0.80,"trained_samples":128,"train_seconds":0.2}
{"kind":"step","rank":0,"global_batch":64,"efficiency":1,"trained_samples":192,"seconds":0.3,"lr_factor":1}
{"kind":"eval","test_accuracy":0.86,"trained_samples":192,"train_seconds":0.3}
`
	adaptive := `gorovod run: job job-1, 2 workers
[1] {"kind":"step","rank":0,"global_batch":64,"trained_samples":64,"seconds":0.1,"lr_factor":1}
[0] {"kind":"step","rank":1,"global_batch":4096,"trained_samples":64,"seconds":0.1,"lr_factor":1}
[1] {"kind":"eval","test_accuracy":0.85,"trained_samples":64,"train_seconds":0.1}
[1] {"kind":"step","rank":0,"global_batch":128,"efficiency":0.7,"trained_samples":192,"seconds":0.15,"lr_factor":1.4}
[1] {"kind":"eval","test_accuracy":0.87,"trained_samples":192,"train_seconds":0.15}
`
	paths := []string{filepath.Join(dir, "fixed-64.jsonl"), filepath.Join(dir, "2w-adaptive.jsonl")}
	for i, text := range []string{fixed, adaptive} {
		if err := os.WriteFile(paths[i], []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "plot.png")
	var table bytes.Buffer
	if err := run(append([]string{"-o", out, "-target", "0.85"}, paths...), &table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| fixed-64 | 0.3 | 192 | 86.00 % | 64 |", "| 2w-adaptive | 0.1 | 64 | 87.00 % | 128 |"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 1000 || b.Dy() < 600 {
		t.Fatalf("plot of %v", b)
	}

	// A file without evaluations, and no files, are errors that say what to do.
	empty := filepath.Join(dir, "empty.jsonl")
	os.WriteFile(empty, []byte(`{"kind":"step","rank":0,"global_batch":64}`+"\n"), 0o644)
	for _, args := range [][]string{{empty}, {}} {
		err := run(args, &table)
		if err == nil || !(strings.Contains(err.Error(), "--eval-every-samples") || strings.Contains(err.Error(), "give the runs")) {
			t.Errorf("run %v: %v", args, err)
		}
	}
}
