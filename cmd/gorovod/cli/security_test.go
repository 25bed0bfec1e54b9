package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

// TestHelpWarnsAboutExposure: the help of the flags that open or hand out
// something sensitive says so.
func TestHelpWarnsAboutExposure(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"run", "--help"}, []string{"unauthenticated", ":9100 binds every interface", "127.0.0.1:9100"}},
		{[]string{"attach", "--help"}, []string{"mode 0600", "the secret appears on no command line"}},
	} {
		var out bytes.Buffer
		err := Main(context.Background(), tc.args, Config{Stdout: &out, Stderr: &out})
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%v: %v", tc.args, err)
		}
		text := strings.Join(strings.Fields(out.String()), " ")
		for _, w := range tc.want {
			if !strings.Contains(text, w) {
				t.Errorf("%v does not say %q:\n%s", tc.args, w, out.String())
			}
		}
	}
}

func TestShellWords(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"/tmp/fmnist", "--epochs", "5"}, "/tmp/fmnist --epochs 5"},
		{[]string{"python3", "train.py", "--name", "a b"}, "python3 train.py --name 'a b'"},
		{[]string{"sh", "-c", "echo $HOME 'x'"}, `sh -c 'echo $HOME '\''x'\'''`},
		{[]string{"prog", ""}, "prog ''"},
	} {
		if got := shellWords(tc.argv); got != tc.want {
			t.Errorf("shellWords(%q) = %s, want %s", tc.argv, got, tc.want)
		}
	}
}

func TestWithEnv(t *testing.T) {
	got := withEnv([]string{"A=1", "GOROVOD_JOB_ID=old", "B=2"}, []string{"GOROVOD_JOB_ID=new", "GOROVOD_SECRET=ab"})
	want := []string{"A=1", "B=2", "GOROVOD_JOB_ID=new", "GOROVOD_SECRET=ab"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("withEnv = %q, want %q", got, want)
	}
}
