package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/examples/fashion-mnist/mnist"
)

// writeDataDir writes a small learnable data set of 4×4 "images" in the
// Debian package's layout: class c lights up pixel c (plus a little noise).
func writeDataDir(t *testing.T, trainN, testN int) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, dims []uint32, payload []byte) {
		b := []byte{0, 0, 0x08, byte(len(dims))}
		for _, d := range dims {
			b = binary.BigEndian.AppendUint32(b, d)
		}
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		w.Write(append(b, payload...))
		w.Close()
		if err := os.WriteFile(filepath.Join(dir, name), buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []struct {
		images, labels string
		n              int
	}{{mnist.TrainImagesFile, mnist.TrainLabelsFile, trainN}, {mnist.TestImagesFile, mnist.TestLabelsFile, testN}} {
		px := make([]byte, s.n*16)
		lb := make([]byte, s.n)
		for i := range s.n {
			c := (i * 7) % mnist.Classes
			lb[i] = byte(c)
			px[i*16+c] = 255
			px[i*16+15] = byte(i * 37)
		}
		write(s.images, []uint32{uint32(s.n), 4, 4}, px)
		write(s.labels, []uint32{uint32(s.n)}, lb)
	}
	return dir
}

func TestRunJSON(t *testing.T) {
	dir := writeDataDir(t, 100, 30)
	args := []string{"--data-dir", dir, "--epochs", "3", "--batch-size", "16", "--hidden", "16", "--lr", "0.3", "--json", "--log-every", "2"}
	var out, progress bytes.Buffer
	if err := run(context.Background(), args, &out, &progress); err != nil {
		t.Fatalf("run: %v\n%s", err, progress.String())
	}
	var steps, epochs int
	var final map[string]any
	sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("stdout line %q is not JSON: %v", sc.Text(), err)
		}
		switch rec["kind"] {
		case "step":
			steps++
			for _, k := range []string{"step", "epoch", "world_epoch", "rank", "size", "loss", "params_sha256"} {
				if _, ok := rec[k]; !ok {
					t.Fatalf("step record %s lacks %q", sc.Text(), k)
				}
			}
			if rec["step"] != float64(steps) || rec["size"] != 1.0 || rec["rank"] != 0.0 {
				t.Fatalf("step record %s: want step %d of rank 0, size 1", sc.Text(), steps)
			}
		case "epoch":
			epochs++
		case "final":
			final = rec
		default:
			t.Fatalf("unknown record %s", sc.Text())
		}
	}
	// 100 samples in global batches of 16: 7 steps per epoch, the last of 4.
	if steps != 21 || epochs != 3 || final == nil {
		t.Fatalf("%d step, %d epoch records, final %v; want 21, 3, present", steps, epochs, final)
	}
	if acc := final["test_accuracy"].(float64); acc < 0.9 {
		t.Errorf("test accuracy %.2f on a trivially separable set, want ≥ 0.9", acc)
	}
	if !strings.Contains(progress.String(), "final: test accuracy") {
		t.Errorf("progress output lacks the final line:\n%s", progress.String())
	}

	// Same flags, same parameters, bit for bit.
	var again bytes.Buffer
	if err := run(context.Background(), args, &again, io.Discard); err != nil {
		t.Fatal(err)
	}
	if a, b := withoutTimes(t, out.Bytes()), withoutTimes(t, again.Bytes()); !slices.Equal(a, b) {
		t.Fatalf("two runs with the same seed differ:\n%s\n%s", strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
}

// withoutTimes re-encodes JSON lines without their "seconds" fields, the only
// part of the output that may differ between two identical runs.
func withoutTimes(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatal(err)
		}
		delete(rec, "seconds")
		m, _ := json.Marshal(rec)
		out = append(out, string(m))
	}
	return out
}

// Gradients averaged in float16 or bfloat16 train as well on the separable
// set, and do travel in that dtype: the parameters differ from float32's.
func TestRunGradDTypes(t *testing.T) {
	dir := writeDataDir(t, 100, 30)
	final := map[string]map[string]any{}
	for _, dt := range []string{"float32", "float16", "bfloat16"} {
		var out bytes.Buffer
		args := []string{"--data-dir", dir, "--epochs", "3", "--batch-size", "16", "--hidden", "16", "--lr", "0.3", "--json", "--grad-dtype", dt}
		if err := run(context.Background(), args, &out, io.Discard); err != nil {
			t.Fatalf("%s: %v", dt, err)
		}
		lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
		var rec map[string]any
		if err := json.Unmarshal(lines[len(lines)-1], &rec); err != nil || rec["kind"] != "final" {
			t.Fatalf("%s: last line %s (%v)", dt, lines[len(lines)-1], err)
		}
		final[dt] = rec
		if acc := rec["test_accuracy"].(float64); acc < 0.9 {
			t.Errorf("%s gradients: test accuracy %.2f on a trivially separable set, want ≥ 0.9", dt, acc)
		}
	}
	if final["float16"]["params_sha256"] == final["float32"]["params_sha256"] || final["bfloat16"]["params_sha256"] == final["float16"]["params_sha256"] {
		t.Error("the gradient dtype made no difference to the parameters: the gradients did not travel in it")
	}
}

func TestRunHumanOutput(t *testing.T) {
	dir := writeDataDir(t, 40, 10)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--data-dir", dir, "--epochs", "1", "--batch-size", "8", "--log-every", "1", "--hidden", "4"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"loaded 40 training and 10 test images", "epoch 1 step 5 (40/40)", "epoch 1/1 done", "final: test accuracy"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"missing data names the package", []string{"--data-dir", "/nonexistent/fashion"}, mnist.DebianPackage},
		{"zero epochs", []string{"--epochs", "0"}, "--epochs"},
		{"zero batch", []string{"--batch-size", "0"}, "--batch-size"},
		{"negative hidden", []string{"--hidden", "-1"}, "--hidden"},
		{"stray argument", []string{"extra"}, "unexpected"},
		{"unknown flag", []string{"--nope"}, "not defined"},
		{"bad gradient dtype", []string{"--grad-dtype", "int8"}, `--grad-dtype "int8"`},
		{"unknown learning-rate rule", []string{"--lr-rule", "cosine"}, `unknown learning-rate rule "cosine"`},
		{"adaptive without the measurement", []string{"--adaptive", "--no-gradient-noise"}, "--adaptive needs the gradient noise measurement"},
		{"maximum batch without adaptive", []string{"--max-batch-size", "512"}, "need --adaptive"},
		{"maximum below the initial batch", []string{"--adaptive", "--batch-size", "64", "--max-batch-size", "32"}, "--max-batch-size 32 < --batch-size 64"},
		{"adaptive with another M0", []string{"--adaptive", "--lr-batch-size", "32"}, "--lr-batch-size with --adaptive"},
		{"negative evaluation interval", []string{"--eval-every-samples", "-1"}, "must be ≥ 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := run(context.Background(), tc.args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	if err := run(context.Background(), []string{"--data-dir", "/nonexistent"}, io.Discard, io.Discard); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing data: %v does not match fs.ErrNotExist", err)
	}
	if err := run(context.Background(), []string{"-h"}, io.Discard, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := run(ctx, []string{"--data-dir", writeDataDir(t, 10, 10)}, io.Discard, io.Discard); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled run: %v, want context.Canceled", err)
	}
}
