package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

// fakeNVMLDir builds internal/gpu's stand-in libnvidia-ml.so.1 (two GPUs,
// GPU-fake-0 and GPU-fake-1, joined by NVLink) into a directory for
// LD_LIBRARY_PATH, where gorovod's dlopen finds it as the driver's library.
func fakeNVMLDir(t *testing.T) string {
	t.Helper()
	if out, err := exec.Command("go", "env", "CGO_ENABLED").Output(); err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Skip("GPU discovery needs cgo (dlopen), and cgo is off here: skipping the fake-NVML run")
	}
	cc, err := exec.Command("go", "env", "CC").Output()
	if err != nil {
		t.Fatalf("go env CC: %v", err)
	}
	compiler := strings.TrimSpace(string(cc))
	if _, err := exec.LookPath(compiler); err != nil {
		t.Skipf("no C compiler (%s) to build the fake NVML: %v", compiler, err)
	}
	dir := t.TempDir()
	b, err := exec.Command(compiler, "-shared", "-fPIC", "-o", filepath.Join(dir, "libnvidia-ml.so.1"),
		filepath.Join("..", "..", "internal", "gpu", "testdata", "fakenvml.c")).CombinedOutput()
	if err != nil {
		t.Fatalf("building the fake NVML: %v\n%s", err, b)
	}
	return dir
}

// TestRunGPUAssignment runs gorovod run on a host whose NVML (a stand-in
// library) reports two GPUs, with trainers that print the
// CUDA_VISIBLE_DEVICES they got: by default the one gorovod run has (every
// worker sees every GPU, and torch.cuda.set_device(hvd.local_rank()) picks
// one per worker, as under horovodrun); with --assign-gpus or
// GOROVOD_ASSIGN_GPUS=1 one GPU each, and a notice when there are fewer GPUs
// than workers.
func TestRunGPUAssignment(t *testing.T) {
	lib := fakeNVMLDir(t)
	const unset = "unset"
	cases := []struct {
		name   string
		flags  []string
		env    []string // besides LD_LIBRARY_PATH
		want   []string // per launch index
		notice string   // stderr must say this; "" nothing about GPUs
	}{
		{name: "default", flags: []string{"--np", "2"}, want: []string{unset, unset}},
		{name: "default keeps the user's", flags: []string{"--np", "2"}, env: []string{"CUDA_VISIBLE_DEVICES=1"}, want: []string{"1", "1"}},
		{name: "default with more workers than GPUs", flags: []string{"--np", "3"}, want: []string{unset, unset, unset}},
		{name: "flag", flags: []string{"--np", "2", "--assign-gpus"}, want: []string{"GPU-fake-0", "GPU-fake-1"}, notice: "one GPU per worker, in this order: GPU-fake-0, GPU-fake-1"},
		{name: "environment", flags: []string{"--np", "2"}, env: []string{"GOROVOD_ASSIGN_GPUS=1", "CUDA_VISIBLE_DEVICES=1"}, want: []string{"GPU-fake-0", "GPU-fake-1"}, notice: "one GPU per worker"},
		{name: "flag over environment", flags: []string{"--np", "2", "--assign-gpus=false"}, env: []string{"GOROVOD_ASSIGN_GPUS=true"}, want: []string{unset, unset}},
		{name: "flag with too few GPUs", flags: []string{"--np", "3", "--assign-gpus"}, env: []string{"CUDA_VISIBLE_DEVICES=0,1"}, want: []string{"0,1", "0,1", "0,1"},
			notice: "cannot assign GPUs to 3 local workers (2 GPUs): fewer GPUs than workers"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			marks := t.TempDir()
			np := len(tc.want)
			// Each worker stays until all have printed (at most 30 s), so
			// that none gives its GPU back before the last one starts.
			trainer := fmt.Sprintf(`echo "cvd=${CUDA_VISIBLE_DEVICES-%s}"; touch %s/$GOROVOD_LAUNCH_INDEX; i=0
while [ "$(ls %s | wc -l)" -lt %d ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done`, unset, marks, marks, np)
			args := slices.Concat([]string{"run"}, tc.flags, []string{"--", "sh", "-c", trainer})
			stdout, stderr := runWithEnv(t, slices.Concat([]string{"LD_LIBRARY_PATH=" + lib}, tc.env), args...)
			got := make([]string, np)
			for _, m := range regexp.MustCompile(`(?m)^\[(\d+)\] cvd=(\S+)$`).FindAllStringSubmatch(stdout, -1) {
				var i int
				if _, err := fmt.Sscan(m[1], &i); err != nil || i >= np {
					t.Fatalf("a line from worker %s of %d: %q", m[1], np, m[0])
				}
				got[i] = m[2]
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("CUDA_VISIBLE_DEVICES of the workers: %q, want %q\nstdout:\n%s\nstderr:\n%s", got, tc.want, stdout, stderr)
			}
			if tc.notice != "" && !strings.Contains(stderr, tc.notice) {
				t.Errorf("stderr lacks %q:\n%s", tc.notice, stderr)
			}
			for _, gpuNotice := range []string{"one GPU per worker", "cannot assign GPUs", "GPU discovery"} {
				if tc.notice == "" && strings.Contains(stderr, gpuNotice) {
					t.Errorf("stderr says %q:\n%s", gpuNotice, stderr)
				}
			}
		})
	}
}

// TestRunHelpSaysWhichGPUs: run's usage says that workers see every GPU by
// default, and what --assign-gpus changes for a script.
func TestRunHelpSaysWhichGPUs(t *testing.T) {
	out, _, code := runGorovod(t, "run", "--help")
	for _, want := range []string{"torch.cuda.set_device(hvd.local_rank()) gives each its own", "-assign-gpus", "local_rank() % device_count()", "GOROVOD_ASSIGN_GPUS=1"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("run --help (exit %d) lacks %q:\n%s", code, want, out)
		}
	}
}

// TestRunAssignGPUsBadEnvironment: a GOROVOD_ASSIGN_GPUS that is not a
// boolean is a usage error naming it, unless --assign-gpus decides.
func TestRunAssignGPUsBadEnvironment(t *testing.T) {
	cases := []struct {
		flags []string
		code  int
	}{
		{flags: nil, code: 2},
		{flags: []string{"--assign-gpus=false", "--np", "1"}, code: 1}, // the flag decides; `false` fails the job
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.flags, " "), func(t *testing.T) {
			args := slices.Concat([]string{"run"}, tc.flags, []string{"--", "false"})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, e2e.Binary, args...)
			cmd.Env = append(environWithout("GOROVOD_ASSIGN_GPUS"), "GOROVOD_ASSIGN_GPUS=maybe")
			e2e.DumpOnCancel(cmd)
			var errb bytes.Buffer
			cmd.Stderr = &errb
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Fatalf("exit %v, want status %d; stderr:\n%s", err, tc.code, errb.String())
			}
			if named := strings.Contains(errb.String(), `GOROVOD_ASSIGN_GPUS="maybe"`); named != (tc.code == 2) {
				t.Fatalf("stderr names the variable: %v, want %v:\n%s", named, tc.code == 2, errb.String())
			}
		})
	}
}

// runWithEnv runs gorovod with env (NAME=value) replacing those variables
// of this process's environment, and the GPU ones removed, and returns its
// output; its exit status is not checked (trainers that are not gorovod
// trainers fail the job).
func runWithEnv(t *testing.T, env []string, args ...string) (stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e2e.Binary, args...)
	cmd.Env = append(environWithout("CUDA_VISIBLE_DEVICES", "GOROVOD_ASSIGN_GPUS", "LD_LIBRARY_PATH"), env...)
	e2e.DumpOnCancel(cmd)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var ee *exec.ExitError
	if err := cmd.Run(); err != nil && !errors.As(err, &ee) {
		t.Fatalf("running gorovod %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("gorovod %v did not end within 2 minutes:\n%s", args, errb.String())
	}
	return out.String(), errb.String()
}

// environWithout is this process's environment less the named variables.
func environWithout(names ...string) []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, name)
	})
}
