package launch

import (
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestShellQuote: what shellQuote makes of an argument is that argument again
// once a real POSIX shell has read it (as the remote login shell and the shim
// do with the worker's command line).
func TestShellQuote(t *testing.T) {
	args := []string{"", "plain", "two words", "it's", "'", "''", `back\slash`, `"dq"`, "$HOME", "`id`",
		"$(id)", "a\nnewline", "tab\there", "*", "~", "-n", "!bang", "semi;colon", "pipe|amp&", "ünïcødé", "=", "a=b"}
	script := `for a; do printf '%s\0' "$a"; done`
	cmd := "sh -c " + shellQuote(script) + " sh"
	for _, a := range args {
		cmd += " " + shellQuote(a)
	}
	out, err := exec.Command("sh", "-c", cmd).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	if !slices.Equal(got, args) {
		t.Errorf("through sh:\n got %q\nwant %q", got, args)
	}
}

func TestShimInput(t *testing.T) {
	in, err := shimInput("n0", 2, syscall.SIGINT, 1500*time.Millisecond, "/work dir", "/jobs/j 1/worker-3", []string{"A=1", "B=x=y", "C="})
	if err != nil {
		t.Fatal(err)
	}
	want := "gorovod-shim 2\nn0\n2\nINT\n15\n/work dir\n/jobs/j 1/worker-3\nA=1\nB=x=y\nC=\n\n"
	if string(in) != want {
		t.Errorf("shim input %q, want %q", in, want)
	}
	bad := []struct {
		env      []string
		dir, out string
	}{
		{env: []string{"NOEQUALS"}},
		{env: []string{"1A=x"}},
		{env: []string{"A B=x"}},
		{env: []string{"=x"}},
		{env: []string{"A=line\nbreak"}},
		{env: []string{"A=nul\x00"}},
		{dir: "two\nlines"},
		{out: "two\nlines"},
	}
	for _, b := range bad {
		if _, err := shimInput("n", 1, syscall.SIGTERM, time.Second, b.dir, b.out, b.env); err == nil {
			t.Errorf("env %q dir %q out %q accepted", b.env, b.dir, b.out)
		}
	}
}

func TestSSHArgv(t *testing.T) {
	s, err := SSH{Port: 2222, IdentityFile: "/k", User: "u", KnownHostsFile: "/kh", StrictHostKeyChecking: "accept-new",
		Options: []string{"ConnectTimeout=3"}, ConnectTimeout: 1500 * time.Millisecond}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(s.argv("h1", "CMD"), " ")
	want := "ssh -o ConnectTimeout=3 -p 2222 -i /k -l u -o UserKnownHostsFile=/kh -o StrictHostKeyChecking=accept-new " +
		"-o BatchMode=yes -o ConnectTimeout=2 -T -x -a -o LogLevel=ERROR -- h1 CMD"
	if got != want {
		t.Errorf("argv\n got %s\nwant %s", got, want)
	}
	for _, bad := range []SSH{{Port: -1}, {Port: 70000}, {StrictHostKeyChecking: "maybe"}, {Options: []string{"-v"}}, {Options: []string{"NoValue"}}} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestIsLocal(t *testing.T) {
	for h, want := range map[string]bool{"": true, "localhost": true, "127.0.0.1": true, "::1": true, "[::1]": true,
		"127.0.0.2": true, "h1": false, "198.18.0.2": false, "localhost.example": false} {
		if IsLocal(h) != want {
			t.Errorf("IsLocal(%q) = %v", h, !want)
		}
	}
}

// TestBadHostNames: names ssh would take for options, or that a shell would
// split, are refused before anything runs.
func TestBadHostNames(t *testing.T) {
	j, err := Start(t.Context(), Spec{Argv: []string{"sleep", "100"}, NP: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { j.Signal(syscall.SIGKILL); _ = j.Wait() }()
	for _, h := range []string{"-oProxyCommand=x", "a b", "h'1", "h\n1"} {
		if _, err := j.AddOn(h); err == nil || !strings.Contains(err.Error(), "is not a host name") {
			t.Errorf("host %q: %v", h, err)
		}
	}
}

// TestRemoteProgramsParseAsPOSIXsh: the remote programs, composed with
// controlLoop, are read without a syntax error by each POSIX shell this
// machine has (dash is Debian's /bin/sh; bash --posix and busybox sh stand
// for other hosts'). The ssh tests run them for real under /bin/sh.
func TestRemoteProgramsParseAsPOSIXsh(t *testing.T) {
	shells := [][]string{{"dash"}, {"bash", "--posix"}, {"busybox", "sh"}, {"posh"}, {"yash", "--posix"}}
	ran := 0
	for _, sh := range shells {
		if _, err := exec.LookPath(sh[0]); err != nil {
			t.Logf("%s: not installed, not checked", sh[0])
			continue
		}
		for name, script := range map[string]string{"shim": shimScript, "follow": followScript} {
			if !strings.Contains(script, controlLoop) {
				t.Fatalf("%s program lacks the control loop", name)
			}
			argv := append(append([]string(nil), sh...), "-n", "-c", script)
			if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
				t.Errorf("%s program under %v: %v: %s", name, sh, err, out)
			}
		}
		ran++
	}
	if ran == 0 {
		t.Skip("no POSIX shell found to check the remote programs with")
	}
}
