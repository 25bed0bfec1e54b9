package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/testing/testhosts"
)

// TestGlooAcrossHosts runs the benchmark's Gloo ranks on two test hosts
// (needs root; GOROVOD_REQUIRE_TESTHOSTS=1 makes a missing harness a
// failure): started over ssh from the head, they meet at rank 0's store and
// talk over the hosts' interface; rank 0's verified result comes back.
func TestGlooAcrossHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts torch on two hosts (seconds)")
	}
	skipWithoutTorch(t)
	script, err := findPeerFile("gloo_allreduce.py")
	if err != nil {
		t.Fatal(err)
	}
	net, hosts := testhosts.NewHosts(t, testhosts.Config{Prefix: "gvhgloo"}, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const size = 256 << 10
	rs, err := runGloo(ctx, net, hosts[0], hosts[1:], 1, script, size, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Bytes != size || rs[0].NP != 2 || !rs[0].Right || rs[0].BusBW <= 0 {
		t.Fatalf("results %+v; want one verified %d-byte allreduce of 2 ranks", rs, size)
	}
}

// TestGlooRankFailureStopsTheRest: a rank that exits early must not leave
// the others waiting in Gloo for its timeout; runGloo stops them and says
// which rank failed.
func TestGlooRankFailureStopsTheRest(t *testing.T) {
	// Rank 1 fails at once; rank 0 would wait an hour (as a Gloo rank
	// waits for a dead peer until its process group's timeout).
	script := filepath.Join(t.TempDir(), "rank.py")
	if err := os.WriteFile(script, []byte("import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(3600)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	net, hosts := testhosts.NewHosts(t, testhosts.Config{Prefix: "gvhgloo"}, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := runGloo(ctx, net, hosts[0], hosts[1:], 1, script, 4096, 1, 3)
	if err == nil {
		t.Fatal("runGloo succeeded with a rank that exited 3")
	}
	if ctx.Err() != nil {
		t.Fatalf("runGloo returned only when the test's deadline passed: %v", err)
	}
	if !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("the error does not give the failed rank's exit status: %v", err)
	}
}

func skipWithoutTorch(t *testing.T) {
	t.Helper()
	if err := exec.Command(glooPython, "-c", "import torch.distributed as d; assert d.is_gloo_available()").Run(); err != nil {
		t.Skipf("%s has no torch with Gloo: %v", glooPython, err)
	}
}
