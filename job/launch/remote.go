package launch

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SSH is how workers are started on other hosts: with the OpenSSH client, as
// Horovod and mpirun do. The remote host needs nothing of gorovod's: ssh runs
// a small POSIX sh program there (shimScript) that reads the worker's
// environment from the connection's stdin — so the job secret is never on a
// command line, here or there — starts the worker in a process group of its
// own, forwards signals, and kills that group when stdin closes: when the
// launcher stops the worker, when the launcher dies, or when the connection
// drops. Nothing outlives the connection.
//
// Every field is optional; the user's own ssh configuration (~/.ssh/config,
// agent, known_hosts) applies to what is left unset.
type SSH struct {
	// Command is the ssh client and any arguments it takes first. Default
	// ["ssh"].
	Command []string
	// Port (-p), IdentityFile (-i) and User (-l); zero values leave them to
	// the ssh configuration.
	Port         int
	IdentityFile string
	User         string
	// KnownHostsFile (UserKnownHostsFile) and StrictHostKeyChecking ("yes",
	// "accept-new", "no") set the host key policy; empty leaves it to the
	// ssh configuration. BatchMode is always on: a host whose key is unknown
	// under a strict policy, or that wants a password, fails the worker
	// instead of waiting for an answer nobody will type.
	KnownHostsFile        string
	StrictHostKeyChecking string
	// Options are more `-o` options ("ServerAliveInterval=5"). They come
	// before gorovod's own, so they win (ssh takes the first value given).
	Options []string
	// ConnectTimeout bounds the TCP connection to a host. Default 10 s.
	ConnectTimeout time.Duration
	// StartTimeout bounds the time from running ssh to the worker running on
	// the host; past it, the attempt is given up and the worker fails with a
	// *HostError. Default 30 s (Horovod's --start-timeout).
	StartTimeout time.Duration
	// Dir is the working directory of remote workers. Default: the ssh
	// user's home directory.
	Dir string
}

// Defaults.
const (
	defaultConnectTimeout = 10 * time.Second
	defaultStartTimeout   = 30 * time.Second
)

func (s SSH) withDefaults() (SSH, error) {
	if len(s.Command) == 0 {
		s.Command = []string{"ssh"}
	}
	if s.Port < 0 || s.Port > 65535 {
		return s, fmt.Errorf("launch: ssh port %d outside [1, 65535]", s.Port)
	}
	switch s.StrictHostKeyChecking {
	case "", "yes", "no", "accept-new", "ask", "off":
	default:
		return s, fmt.Errorf("launch: StrictHostKeyChecking %q (want yes, accept-new or no)", s.StrictHostKeyChecking)
	}
	for _, o := range s.Options {
		if !strings.Contains(o, "=") || strings.HasPrefix(o, "-") {
			return s, fmt.Errorf("launch: ssh option %q is not Name=value", o)
		}
	}
	if s.ConnectTimeout <= 0 {
		s.ConnectTimeout = defaultConnectTimeout
	}
	if s.StartTimeout <= 0 {
		s.StartTimeout = defaultStartTimeout
	}
	return s, nil
}

// argv is the ssh command line that runs command on host.
func (s SSH) argv(host, command string) []string {
	a := append([]string(nil), s.Command...)
	for _, o := range s.Options {
		a = append(a, "-o", o)
	}
	if s.Port != 0 {
		a = append(a, "-p", strconv.Itoa(s.Port))
	}
	if s.IdentityFile != "" {
		a = append(a, "-i", s.IdentityFile)
	}
	if s.User != "" {
		a = append(a, "-l", s.User)
	}
	if s.KnownHostsFile != "" {
		a = append(a, "-o", "UserKnownHostsFile="+s.KnownHostsFile)
	}
	if s.StrictHostKeyChecking != "" {
		a = append(a, "-o", "StrictHostKeyChecking="+s.StrictHostKeyChecking)
	}
	secs := int((s.ConnectTimeout + time.Second - 1) / time.Second)
	a = append(a, "-o", "BatchMode=yes", "-o", "ConnectTimeout="+strconv.Itoa(secs),
		// No terminal (the worker's stdout and stderr stay apart), no X11 or
		// agent forwarding, and no "Permanently added" chatter in the output.
		"-T", "-x", "-a", "-o", "LogLevel=ERROR", "--", host, command)
	return a
}

// IsLocal reports whether host names this machine without ssh: "",
// "localhost" and the loopback addresses, as Horovod treats them.
func IsLocal(host string) bool {
	switch host {
	case "", "localhost":
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// HostError is a remote worker that never ran, or that the launcher lost
// touch with: ssh could not connect or log in, the host did not start it in
// time, or the connection broke while it ran. A job runner blacklists the
// host on it.
type HostError struct {
	Host string
	Err  error
	// Stderr holds the connection's last lines on stderr: ssh's own
	// diagnostics ("Connection refused", "Host key verification failed"), or
	// the worker's last words before the connection broke.
	Stderr string
}

func (e *HostError) Error() string {
	msg := fmt.Sprintf("host %s: %v", e.Host, e.Err)
	if e.Stderr != "" {
		msg += ": " + e.Stderr
	}
	return msg
}

func (e *HostError) Unwrap() error { return e.Err }

// RemoteExit is how a remote worker ended: its exit status as the remote
// shell reports it (128 + n for a worker killed by signal n).
type RemoteExit struct {
	Host string
	Code int
	// Unknown: the worker was adopted (FollowRemote) and has exited; its
	// status (Code) is not known. Such an error wraps ErrExitUnknown.
	Unknown bool
}

func (e *RemoteExit) Unwrap() error {
	if e.Unknown {
		return ErrExitUnknown
	}
	return nil
}

func (e *RemoteExit) Error() string {
	if e.Unknown {
		return fmt.Sprintf("exited on %s: %v", e.Host, ErrExitUnknown)
	}
	if sig, ok := e.Signal(); ok {
		return fmt.Sprintf("signal: %v (exit status %d on %s)", sig, e.Code, e.Host)
	}
	return fmt.Sprintf("exit status %d on %s", e.Code, e.Host)
}

// Signal reports the signal that ended the worker, by the shells' rule.
func (e *RemoteExit) Signal() (syscall.Signal, bool) {
	if !e.Unknown && e.Code > 128 && e.Code < 128+65 {
		return syscall.Signal(e.Code - 128), true
	}
	return 0, false
}

// Signal reports the signal that ended the worker: the one that killed a
// local worker, or for a remote one an exit status above 128 (see
// RemoteExit). A worker lost to a signal is what an elastic job survives.
func (e *WorkerError) Signal() (syscall.Signal, bool) {
	var xe *exec.ExitError
	if errors.As(e.Err, &xe) {
		if ws, ok := xe.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return ws.Signal(), true
		}
		return 0, false
	}
	var re *RemoteExit
	if errors.As(e.Err, &re) {
		return re.Signal()
	}
	return 0, false
}

// controlLoop is the part both remote programs (shimScript, followScript)
// share: in the background, it serves the control lines on fd 3 (the
// connection's stdin) for the worker $pid: "signal NAME" sends NAME to the
// worker, "stop" stops it. When "stop" came, or stdin closed without it and
// $runon is empty (the worker does not outlive its connection), it sends
// $stopsig to the worker's process group (and SIGCONT, for a stopped one),
// then SIGKILL once $grace tenths of a second have passed with the group
// still there. It leaves its own pid in $w, for the program to end it once
// the worker is gone. Its syntax is POSIX sh's (a host's /bin/sh may be
// dash or busybox), its one command beyond the shell's is coreutils'
// `sleep 0.1`.
const controlLoop = `(
  stop=
  while read -r cmd arg <&3; do
    case $cmd in
    signal) kill -s "$arg" "$pid" ;;
    stop) stop=1; break ;;
    esac
  done
  if [ -z "$stop" ] && [ -n "$runon" ]; then exit 0; fi
  trap '' TERM
  kill -s "$stopsig" -- "-$pid" && kill -s CONT -- "-$pid"
  i=0
  while kill -s 0 -- "-$pid"; do
    if [ "$i" -ge "$grace" ]; then kill -s KILL -- "-$pid"; break; fi
    sleep 0.1; i=$((i + 1))
  done
) >/dev/null 2>&1 &
w=$!`

// The remote side: ssh runs `exec sh -c SHIM gorovod-shim ARGV...`, and the
// launcher writes on the connection's stdin a header (one item per line: the
// protocol version, a nonce, the host's slots, the stop signal, the grace in
// tenths of a second, the working directory, the output files' path prefix
// or ""), the worker's environment (NAME=value lines), an empty line, then
// control lines for as long as the worker runs: "signal NAME", and "stop"
// when the launcher stops the worker. The shim prints "gorovod-shim NONCE
// started PID" before the worker runs and "gorovod-shim NONCE exit STATUS"
// after, on stdout; the launcher takes both out of the worker's output.
//
// Without output files, the worker writes to the connection, and the shim
// stops it when stdin closes, whether the launcher asked (stop) or not (it
// died, or the connection dropped): a worker writing to a connection that is
// gone would die of SIGPIPE anyway. With them, the worker writes its output
// to PREFIX.stdout and PREFIX.stderr on its host, which the shim follows
// (tail -f) onto the connection, and stdin closing without "stop" leaves it
// running: it trains on with its job, as the launcher's local workers do,
// until training ends or its job's own rules end it (the elastic timeout of a
// worker that has no world).
//
// Why a shell program rather than a gorovod subcommand on the remote side:
// it needs no gorovod binary there (a Python trainer's hosts have none), and
// everything it does is what POSIX sh, setsid and kill do anyway. The worker
// starts as an asynchronous command, whose SIGINT and SIGQUIT POSIX sh
// ignores; `env --default-signal` (coreutils 8.31 and later) gives them back
// where it exists.
const shimProtocol = "gorovod-shim 2"

const shimScript = `set -u
fail() { echo "gorovod: $*" >&2; exit 126; }
IFS= read -r v || fail "no launch header on stdin"
[ "$v" = "` + shimProtocol + `" ] || fail "unknown launch protocol: $v"
IFS= read -r nonce && IFS= read -r slots && IFS= read -r stopsig && IFS= read -r grace && IFS= read -r dir && IFS= read -r out || fail "truncated launch header"
ok=
while IFS= read -r kv; do
  if [ -z "$kv" ]; then ok=1; break; fi
  export "$kv" || fail "bad environment entry"
done
[ -n "$ok" ] || fail "truncated environment"
n=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
g=$((n / slots)); [ "$g" -ge 1 ] || g=1
[ -n "${GOMAXPROCS:-}" ] || export GOMAXPROCS=$g
[ -n "${OMP_NUM_THREADS:-}" ] || export OMP_NUM_THREADS=$g
if [ -n "$dir" ]; then cd "$dir" || fail "cannot enter $dir"; fi
dflt=
if env --default-signal=INT,QUIT true 2>/dev/null; then dflt="env --default-signal=INT,QUIT"; fi
exec 3<&0
if [ -n "$out" ]; then
  (umask 077 && mkdir -p "$(dirname "$out")") || fail "cannot create the directory of $out"
  (umask 077 && : >>"$out.stdout" && : >>"$out.stderr") || fail "cannot write $out.stdout"
  setsid sh -c 'echo "gorovod-shim $1 started $$" >&4; shift; exec 4>&- "$@"' sh "$nonce" $dflt "$@" </dev/null 3<&- 4>&1 >>"$out.stdout" 2>>"$out.stderr" &
  pid=$!
  tail -n +1 -s 0.05 --pid="$pid" -f "$out.stdout" 3<&- &
  t1=$!
  tail -n +1 -s 0.05 --pid="$pid" -f "$out.stderr" >&2 3<&- &
  t2=$!
else
  setsid sh -c 'echo "gorovod-shim $1 started $$"; shift; exec "$@"' sh "$nonce" $dflt "$@" </dev/null 3<&- &
  pid=$!
fi
runon=$out
` + controlLoop + `
wait "$pid"; st=$?
kill -s KILL -- "-$pid" 2>/dev/null
kill "$w" 2>/dev/null
if [ -n "$out" ]; then wait "$t1" "$t2"; fi
echo "gorovod-shim $nonce exit $st"
exit "$st"`

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shimCommand is the remote command line that runs argv under the shim.
func shimCommand(argv []string) string {
	parts := []string{"exec", "sh", "-c", shellQuote(shimScript), "gorovod-shim"}
	for _, a := range argv {
		parts = append(parts, shellQuote(a))
	}
	return strings.Join(parts, " ")
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// shimInput is what the launcher writes first on the remote worker's stdin.
func shimInput(nonce string, slots int, stop syscall.Signal, grace time.Duration, dir, out string, env []string) ([]byte, error) {
	if strings.ContainsAny(dir, "\n\r\x00") {
		return nil, fmt.Errorf("working directory %q cannot be sent to a remote worker", dir)
	}
	if strings.ContainsAny(out, "\n\r\x00") {
		return nil, fmt.Errorf("output files %q cannot be sent to a remote worker", out)
	}
	sig := strings.TrimPrefix(unix.SignalName(stop), "SIG")
	if sig == "" {
		return nil, fmt.Errorf("stop signal %d has no name", stop)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n%s\n%d\n%s\n%d\n%s\n%s\n", shimProtocol, nonce, max(slots, 1), sig, max(int(grace/(100*time.Millisecond)), 1), dir, out)
	for _, kv := range env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || !envName.MatchString(name) {
			return nil, fmt.Errorf("environment entry %q is not NAME=value", kv)
		}
		if strings.ContainsAny(kv, "\n\r\x00") {
			return nil, fmt.Errorf("environment entry %s holds a line break or NUL, which cannot be sent to a remote worker", name)
		}
		b.WriteString(kv)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}

// remoteWorker is the launcher's end of one remote worker.
type remoteWorker struct {
	host    string
	nonce   string
	timeout time.Duration

	wmu   sync.Mutex // orders writes on stdin
	stdin io.WriteCloser

	mu         sync.Mutex
	startedPID int // 0 until "started"
	started    chan struct{}
	exitCode   int // valid when exitSeen
	exitSeen   bool
	gone       bool // an adopted worker exited, status unknown (FollowRemote)
	timedOut   bool
	stderr     []string // ssh's last lines
}

// startRemote starts w (worker i) on w.host over ssh. Called with j.mu held.
func (j *Job) startRemote(w *worker, env []string, stdout, stderr *lineWriter) error {
	cmd, r, err := startSSH(j.ctx, j.spec.SSH, w.host, j.spec.Argv, env, j.spec.HostSlots(w.host), j.spec.StopSignal, j.spec.StopGrace, "", stdout, stderr)
	if err != nil {
		return err
	}
	w.cmd, w.remote = cmd, r
	return nil
}

// startSSH starts argv on host over ssh, under the shim, with env sent on
// the connection's stdin; out is the path prefix of its output files on the
// host ("": none, see shimScript). Ending ctx stops the worker (a "stop"
// line, then stdin closes: the shim sends the stop signal, then SIGKILL
// after grace). s must have its defaults.
func startSSH(ctx context.Context, s SSH, host string, argv, env []string, slots int, stop syscall.Signal, grace time.Duration,
	out string, stdout, stderr *lineWriter) (*exec.Cmd, *remoteWorker, error) {
	if strings.HasPrefix(host, "-") || strings.ContainsAny(host, " \t\r\n'\"\\") {
		return nil, nil, fmt.Errorf("%q is not a host name", host)
	}
	r := newRemoteWorker(host, s.StartTimeout)
	input, err := shimInput(r.nonce, slots, stop, grace, s.Dir, out, env)
	if err != nil {
		return nil, nil, err
	}
	cmd, err := r.run(ctx, s, shimCommand(argv), input, grace, stdout, stderr)
	if err != nil {
		return nil, nil, err
	}
	return cmd, r, nil
}

func newRemoteWorker(host string, startTimeout time.Duration) *remoteWorker {
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	return &remoteWorker{host: host, nonce: hex.EncodeToString(nonce), timeout: startTimeout, started: make(chan struct{})}
}

// run runs command, one of the remote programs (shimScript, followScript),
// on r.host over ssh, and writes input (the program's header) on the
// connection's stdin. The program's own lines are taken out of stdout, and
// stderr's last lines kept for r.outcome. Ending ctx stops the worker (see
// controlLoop); a worker not started within r.timeout is given up on.
func (r *remoteWorker) run(ctx context.Context, s SSH, command string, input []byte, grace time.Duration,
	stdout, stderr *lineWriter) (*exec.Cmd, error) {
	sshArgv := s.argv(r.host, command)
	cmd := exec.CommandContext(ctx, sshArgv[0], sshArgv[1:]...)
	var err error
	if r.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	// Stopping the worker is a "stop" line and closing its stdin: the remote
	// program then sends the stop signal to the worker's process group, and
	// SIGKILL after the grace. (stdin closing alone is how a launcher that
	// died shows: with output files, the worker runs on.) ssh itself is
	// killed only if the connection does not close by then.
	cmd.Cancel = func() error {
		r.wmu.Lock()
		defer r.wmu.Unlock()
		_, _ = io.WriteString(r.stdin, "stop\n") // a connection already gone needs no stop
		return r.stdin.Close()
	}
	cmd.WaitDelay = grace + s.ConnectTimeout
	stdout.out = r.filterStdout(stdout.out)
	stderr.out = r.keepStderr(stderr.out)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("running %s: %w", sshArgv[0], err)
	}
	// The pipe's buffer holds the header long before ssh reads it; should it
	// not (a huge environment), this must not hold up the caller.
	r.wmu.Lock()
	go func() {
		defer r.wmu.Unlock()
		_, _ = r.stdin.Write(input)
	}()
	go r.watchStart(cmd)
	return cmd, nil
}

// watchStart gives up on a worker that has not started within the timeout:
// killing ssh drops the connection, which stops anything the host started.
func (r *remoteWorker) watchStart(cmd *exec.Cmd) {
	t := time.NewTimer(r.timeout)
	defer t.Stop()
	select {
	case <-r.started:
	case <-t.C:
		r.mu.Lock()
		r.timedOut = r.startedPID == 0
		r.mu.Unlock()
		if r.timedOut {
			_ = cmd.Process.Kill()
		}
	}
}

// filterStdout takes the shim's lines out of the worker's stdout.
func (r *remoteWorker) filterStdout(out func(int, string, []byte)) func(int, string, []byte) {
	prefix := []byte("gorovod-shim " + r.nonce + " ")
	return func(i int, stream string, line []byte) {
		rest, ok := bytes.CutPrefix(line, prefix)
		if !ok {
			out(i, stream, line)
			return
		}
		word, arg, _ := bytes.Cut(rest, []byte(" "))
		n, err := strconv.Atoi(string(arg))
		if err != nil {
			out(i, stream, line)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		switch string(word) {
		case "started":
			if r.startedPID == 0 && n > 0 {
				r.startedPID = n
				close(r.started)
			}
		case "exit":
			r.exitCode, r.exitSeen = n, true
		case "gone":
			r.gone = true
		default:
			out(i, stream, line)
		}
	}
}

// keepStderr passes ssh's stderr on and keeps its last lines for errors.
func (r *remoteWorker) keepStderr(out func(int, string, []byte)) func(int, string, []byte) {
	return func(i int, stream string, line []byte) {
		r.mu.Lock()
		r.stderr = append(r.stderr, string(line))
		if len(r.stderr) > 4 {
			r.stderr = r.stderr[1:]
		}
		r.mu.Unlock()
		out(i, stream, line)
	}
}

func (r *remoteWorker) pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.startedPID
}

// signal asks the shim to send sig to the worker.
func (r *remoteWorker) signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("launch: cannot send %v to a remote worker", sig)
	}
	if s == 0 {
		return nil
	}
	name := strings.TrimPrefix(unix.SignalName(s), "SIG")
	if name == "" {
		return fmt.Errorf("launch: signal %d has no name", s)
	}
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if _, err := io.WriteString(r.stdin, "signal "+name+"\n"); err != nil {
		return fmt.Errorf("launch: signalling the worker on %s: %w", r.host, err)
	}
	return nil
}

// outcome turns ssh's exit into the worker's: the status the shim reported,
// or a *HostError when the worker never ran or the connection broke.
func (r *remoteWorker) outcome(sshErr error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	stderr := strings.Join(r.stderr, " | ")
	switch {
	case r.gone:
		return &RemoteExit{Host: r.host, Code: -1, Unknown: true}
	case r.exitSeen && r.exitCode == 0:
		return nil
	case r.exitSeen:
		return &RemoteExit{Host: r.host, Code: r.exitCode}
	case r.timedOut:
		return &HostError{Host: r.host, Err: fmt.Errorf("the worker did not start within %v", r.timeout), Stderr: stderr}
	case r.startedPID == 0:
		return &HostError{Host: r.host, Err: fmt.Errorf("could not start the worker (ssh: %v)", sshErr), Stderr: stderr}
	default:
		return &HostError{Host: r.host, Err: fmt.Errorf("lost the connection to the worker (ssh: %v)", sshErr), Stderr: stderr}
	}
}

// RemoteSpec describes one worker process to start on another host over
// ssh: what StartRemote takes, as ProcessSpec is what StartProcess takes.
type RemoteSpec struct {
	// Host is where it runs: a name or address ssh reaches (not one IsLocal
	// accepts: start those with StartProcess).
	Host string
	Argv []string
	// Env holds the worker's NAME=value entries. They travel on the ssh
	// connection's stdin, never on a command line, and are added to the
	// environment the remote login gives it.
	Env []string
	// Slots is how many workers share the host's CPUs: the worker gets
	// GOMAXPROCS and OMP_NUM_THREADS = max(1, the host's CPUs / Slots),
	// each unless Env sets it. Default 1.
	Slots int
	// Output receives every line the worker prints (stream "stdout" or
	// "stderr"), ssh's own diagnostics among stderr's; the line is valid only
	// during the call. Default: discarded.
	Output func(stream string, line []byte)
	// OutputFiles, when set, is a path prefix on the host: the worker writes
	// its stdout to OutputFiles+".stdout" and its stderr to
	// OutputFiles+".stderr" there (created mode 0600 in a directory created
	// mode 0700, appended to), which the shim follows onto the connection,
	// so Output receives the lines as without it. The worker then outlives
	// its connection: when ssh's stdin closes without the launcher asking
	// the worker to stop (the launcher died, the connection dropped), it
	// runs on, writing its output there. The host needs GNU tail (--pid).
	OutputFiles string
	// StopSignal is sent to the worker's process group when the context
	// given to StartRemote ends (or, without OutputFiles, the connection
	// drops); SIGKILL follows after StopGrace. Defaults SIGTERM and
	// DefaultStopGrace.
	StopSignal syscall.Signal
	StopGrace  time.Duration
	// SSH is how the host is reached.
	SSH SSH
}

// RemoteProcess is one worker started on another host by StartRemote.
type RemoteProcess struct {
	host string
	cmd  *exec.Cmd
	r    *remoteWorker
	done chan struct{}
	err  error // set before done is closed
}

// stopOrDefault is how a remote worker stops: sig, default SIGTERM, to its
// process group, then SIGKILL after grace, default DefaultStopGrace.
func stopOrDefault(sig syscall.Signal, grace time.Duration) (syscall.Signal, time.Duration) {
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	if grace <= 0 {
		grace = DefaultStopGrace
	}
	return sig, grace
}

// remoteStreams are the worker's stdout and stderr, cut into lines for
// output (nil: discarded).
func remoteStreams(output func(stream string, line []byte)) (stdout, stderr *lineWriter) {
	if output == nil {
		output = func(string, []byte) {}
	}
	out := func(_ int, stream string, line []byte) { output(stream, line) }
	return &lineWriter{stream: "stdout", out: out}, &lineWriter{stream: "stderr", out: out}
}

// newRemoteProcess is the RemoteProcess of r, which cmd runs: it ends once
// ssh has exited and its output is drained.
func newRemoteProcess(host string, cmd *exec.Cmd, r *remoteWorker, stdout, stderr *lineWriter) *RemoteProcess {
	p := &RemoteProcess{host: host, cmd: cmd, r: r, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		stdout.flush()
		stderr.flush()
		p.err = r.outcome(err)
		close(p.done)
	}()
	return p
}

// StartRemote starts one worker on spec.Host over ssh and returns once ssh
// runs; the worker itself starts asynchronously (Started), and a host that
// cannot be reached, refuses the login or does not start the worker within
// SSH.StartTimeout shows as the process's end with a *HostError. Ending ctx
// stops the worker: spec.StopSignal to its process group on the host, then
// SIGKILL after spec.StopGrace. Without spec.OutputFiles nothing it started
// outlives the connection; with them, the worker does.
func StartRemote(ctx context.Context, spec RemoteSpec) (*RemoteProcess, error) {
	if len(spec.Argv) == 0 {
		return nil, errors.New("launch: no worker command")
	}
	if IsLocal(spec.Host) {
		return nil, fmt.Errorf("launch: %q is this host: start its workers as local processes", spec.Host)
	}
	spec.StopSignal, spec.StopGrace = stopOrDefault(spec.StopSignal, spec.StopGrace)
	s, err := spec.SSH.withDefaults()
	if err != nil {
		return nil, err
	}
	stdout, stderr := remoteStreams(spec.Output)
	cmd, r, err := startSSH(ctx, s, spec.Host, spec.Argv, spec.Env, max(spec.Slots, 1), spec.StopSignal, spec.StopGrace, spec.OutputFiles, stdout, stderr)
	if err != nil {
		return nil, fmt.Errorf("launch: starting a worker on %s: %w", spec.Host, err)
	}
	return newRemoteProcess(spec.Host, cmd, r, stdout, stderr), nil
}

// Host is where the worker runs.
func (p *RemoteProcess) Host() string { return p.host }

// PID is the worker's process id on its host; 0 until it has started.
func (p *RemoteProcess) PID() int { return p.r.pid() }

// Started is closed once the worker runs on its host (never, if it does not:
// then Done is closed).
func (p *RemoteProcess) Started() <-chan struct{} { return p.r.started }

// Signal sends sig to the worker through its connection; before the worker
// has started, the shim delivers it as soon as it has.
func (p *RemoteProcess) Signal(sig os.Signal) error {
	select {
	case <-p.done:
		return os.ErrProcessDone
	default:
	}
	return p.r.signal(sig)
}

// Done is closed once the worker has exited (or was never started) and its
// output is drained.
func (p *RemoteProcess) Done() <-chan struct{} { return p.done }

// Err is, once Done is closed, nil if the worker exited with status 0, a
// *RemoteExit for another status (a signal shows as status 128+n), or a
// *HostError when it never ran or the connection broke. Before that it is
// nil.
func (p *RemoteProcess) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// The follow shim: what a launcher that adopts a running remote worker (its
// own launcher died) runs on the worker's host. It reads a header on stdin
// (the protocol, a nonce, the worker's pid, its job id and launch index, its
// output files' path prefix, the stop signal and the grace in tenths of a
// second), checks that the pid is that worker (/proc/PID/environ names the
// job and the index: a pid used again by another process is refused), prints
// "gorovod-shim NONCE started PID", follows the output files from their end
// onto the connection, forwards "signal NAME" lines, stops the worker's
// process group on "stop", and prints "gorovod-shim NONCE gone 0" once the
// pid has exited: its exit status went to whoever reaped it, not here. stdin
// closing without "stop" leaves the worker running, as under shimScript.
const followProtocol = "gorovod-follow 1"

const followScript = `set -u
fail() { echo "gorovod: $*" >&2; exit 126; }
IFS= read -r v || fail "no follow header on stdin"
[ "$v" = "` + followProtocol + `" ] || fail "unknown follow protocol: $v"
IFS= read -r nonce && IFS= read -r pid && IFS= read -r job && IFS= read -r index && IFS= read -r out && IFS= read -r stopsig && IFS= read -r grace || fail "truncated follow header"
envs=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null) || fail "pid $pid: not running (or not readable)"
printf '%s\n' "$envs" | grep -qxF "GOROVOD_JOB_ID=$job" || fail "pid $pid: not a worker of job $job"
printf '%s\n' "$envs" | grep -qxF "GOROVOD_LAUNCH_INDEX=$index" || fail "pid $pid: not worker $index of job $job"
echo "gorovod-shim $nonce started $pid"
exec 3<&0
tail -n 0 -s 0.05 --pid="$pid" -f "$out.stdout" </dev/null &
t1=$!
tail -n 0 -s 0.05 --pid="$pid" -f "$out.stderr" </dev/null >&2 &
t2=$!
runon=1
` + controlLoop + `
while kill -s 0 "$pid" 2>/dev/null && [ "$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)" != Z ]; do sleep 0.1; done
kill "$w" 2>/dev/null
wait "$t1" "$t2"
echo "gorovod-shim $nonce gone 0"`

// ErrExitUnknown is wrapped by the end of a remote worker that was adopted
// (FollowRemote): it was not started through this connection, so its exit
// status is not known here.
var ErrExitUnknown = errors.New("exit status not known: the process was started by a launcher that died")

// FollowSpec is a running remote worker to adopt: one started with
// RemoteSpec.OutputFiles by a launcher that died.
type FollowSpec struct {
	Host  string
	PID   int    // on Host
	JobID string // its GOROVOD_JOB_ID
	Index int    // its GOROVOD_LAUNCH_INDEX
	// OutputFiles is the path prefix of its output files on Host: their
	// new lines go to Output.
	OutputFiles string
	Output      func(stream string, line []byte)
	StopSignal  syscall.Signal
	StopGrace   time.Duration
	SSH         SSH
}

// FollowRemote adopts a running remote worker over ssh: its new output
// lines, signals, its stop when ctx ends (StopSignal to its process group,
// SIGKILL after StopGrace), and its exit, whose status is not known (the
// process's end wraps ErrExitUnknown). A pid that is not that worker of the
// job, or not running, ends the process with a *HostError saying so.
func FollowRemote(ctx context.Context, spec FollowSpec) (*RemoteProcess, error) {
	if IsLocal(spec.Host) {
		return nil, fmt.Errorf("launch: %q is this host", spec.Host)
	}
	if strings.HasPrefix(spec.Host, "-") || strings.ContainsAny(spec.Host, " \t\r\n'\"\\") {
		return nil, fmt.Errorf("launch: %q is not a host name", spec.Host)
	}
	for _, v := range []string{spec.JobID, spec.OutputFiles} {
		if v == "" || strings.ContainsAny(v, "\n\r\x00") {
			return nil, fmt.Errorf("launch: following a worker on %s: job id %q and output files %q must be single lines", spec.Host, spec.JobID, spec.OutputFiles)
		}
	}
	if spec.PID <= 0 || spec.Index < 0 {
		return nil, fmt.Errorf("launch: following a worker on %s: pid %d, index %d", spec.Host, spec.PID, spec.Index)
	}
	spec.StopSignal, spec.StopGrace = stopOrDefault(spec.StopSignal, spec.StopGrace)
	sig := strings.TrimPrefix(unix.SignalName(spec.StopSignal), "SIG")
	if sig == "" {
		return nil, fmt.Errorf("launch: stop signal %d has no name", spec.StopSignal)
	}
	s, err := spec.SSH.withDefaults()
	if err != nil {
		return nil, err
	}
	r := newRemoteWorker(spec.Host, s.StartTimeout)
	input := fmt.Sprintf("%s\n%s\n%d\n%s\n%d\n%s\n%s\n%d\n", followProtocol, r.nonce, spec.PID, spec.JobID, spec.Index, spec.OutputFiles,
		sig, max(int(spec.StopGrace/(100*time.Millisecond)), 1))
	stdout, stderr := remoteStreams(spec.Output)
	command := strings.Join([]string{"exec", "sh", "-c", shellQuote(followScript), "gorovod-follow"}, " ")
	cmd, err := r.run(ctx, s, command, []byte(input), spec.StopGrace, stdout, stderr)
	if err != nil {
		return nil, fmt.Errorf("launch: following a worker on %s: %w", spec.Host, err)
	}
	return newRemoteProcess(spec.Host, cmd, r, stdout, stderr), nil
}
