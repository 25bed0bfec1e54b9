package membership

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/testing/testhosts"
)

// Addressing children: a member on a host of a testhosts.Net, bound and
// advertised as the test says, that prints the cluster it sees.
const (
	hostChildEnv      = "GOROVOD_MEMBERSHIP_HOST_CHILD"
	childBindEnv      = "GOROVOD_MEMBERSHIP_CHILD_BIND"      // host:port
	childAdvertiseEnv = "GOROVOD_MEMBERSHIP_CHILD_ADVERTISE" // host
	childExpectEnv    = "GOROVOD_MEMBERSHIP_CHILD_EXPECT"    // members to wait for
)

// runHostChild joins, waits until it sees the expected number of members,
// prints "MEMBERS name=addr ..." (sorted) and stays until its stdin closes.
func runHostChild() int {
	cfg := DefaultConfig()
	cfg.Secret = []byte(os.Getenv(childSecretEnv))
	if seed := os.Getenv(childSeedEnv); seed != "" {
		cfg.Seeds = []string{seed}
	}
	host, port, _ := strings.Cut(os.Getenv(childBindEnv), ":")
	cfg.BindAddr, cfg.AdvertiseAddr = host, os.Getenv(childAdvertiseEnv)
	cfg.BindPort, _ = strconv.Atoi(port)
	cfg.Logger = testLogger()
	expect, _ := strconv.Atoi(os.Getenv(childExpectEnv))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := Join(ctx, cfg, Meta{JobID: os.Getenv(childJobEnv), CollectiveAddr: "127.0.0.1:1", GPUs: GPUsUnknown})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer m.Shutdown()
	for len(m.Members()) < expect {
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "child: saw %d members, not %d\n", len(m.Members()), expect)
			return 1
		case <-m.Events():
		}
	}
	var seen []string
	for _, n := range m.Members() {
		seen = append(seen, n.Name+"="+n.Addr.String())
	}
	sort.Strings(seen)
	fmt.Printf("MEMBERS %s %s\n", m.Name(), strings.Join(seen, " "))
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestAcrossHosts: members on three hosts (separate network stacks), two of
// them bound to the wildcard address and advertising their host's address,
// one bound to its address: each sees the others at the advertised addresses.
func TestAcrossHosts(t *testing.T) {
	_, hs := testhosts.NewHosts(t, testhosts.Config{}, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const port = 7946 // free: every host has a network stack of its own
	seed := fmt.Sprintf("%s:%d", hs[0].Addr, port)
	specs := []struct{ bind, advertise, seed string }{
		{fmt.Sprintf("0.0.0.0:%d", port), hs[0].Addr.String(), ""},
		{fmt.Sprintf("%s:%d", hs[1].Addr, port), "", seed},
		{fmt.Sprintf("0.0.0.0:%d", port), hs[2].Addr.String(), seed},
	}
	lines := make(chan string, len(specs))
	for i, s := range specs {
		cmd := hs[i].Command(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), hostChildEnv+"=1", childSecretEnv+"="+string(testSecret),
			childJobEnv+"="+testJob, childSeedEnv+"="+s.seed, childBindEnv+"="+s.bind,
			childAdvertiseEnv+"="+s.advertise, childExpectEnv+"=3")
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "MEMBERS ") {
					lines <- sc.Text()
				}
			}
		}()
	}
	var views []string
	for range specs {
		select {
		case l := <-lines:
			views = append(views, l)
		case <-ctx.Done():
			t.Fatalf("members did not converge: %v", views)
		}
	}
	for _, v := range views {
		f := strings.Fields(v)[2:]
		if len(f) != 3 {
			t.Errorf("view %q", v)
			continue
		}
		addrs := map[string]bool{}
		for _, m := range f {
			_, a, _ := strings.Cut(m, "=")
			addrs[a] = true
		}
		for _, h := range hs {
			if !addrs[fmt.Sprintf("%s:%d", h.Addr, port)] {
				t.Errorf("view %q lacks %s at %s:%d", v, h, h.Addr, port)
			}
		}
	}
	t.Logf("%s", strings.Join(views, "\n"))
}
