package driver

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

// A peer's death makes its neighbours abort their links, so a survivor is
// blamed too (c1 blames c0, which aborted when c2 died). The coordinator
// probes each blamed worker: the survivor, still listening, keeps its place
// and the world goes on without the dead one alone, whichever report comes
// first.
func TestCoordinatorProbesTheBlamed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reports [][2]string // reporter, blamed, in order
	}{
		{"dead blamed first", [][2]string{{"c0", "c2"}, {"c1", "c0"}}},
		{"survivor blamed first", [][2]string{{"c1", "c0"}, {"c0", "c2"}}},
		{"survivor blamed alone", [][2]string{{"c1", "c0"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			coord := NewCoordinator(CoordinatorConfig{MinWorkers: 2, Coalesce: time.Millisecond})
			go coord.Run(ctx)
			for _, name := range []string{"c0", "c1", "c2"} {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				go func() { // accept and drop, as a transport does a stranger
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						c.Close()
					}
				}()
				if name == "c2" {
					ln.Close() // c2 died: nothing listens at its address
				}
				coord.Add(epoch.Member{Name: name, Addr: ln.Addr().String()})
			}
			view := coord.View("c0")
			w, err := view.Await(ctx, 0)
			for err == nil && len(w.Members) != 3 {
				w, err = view.Await(ctx, w.Number)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range tc.reports {
				blamed := w.Members[w.Rank(r[1])]
				coord.View(r[0]).ReportFailure(w.Number, blamed, errors.New("peer closed the connection"))
			}
			next, err := view.Await(ctx, w.Number)
			for err == nil && slices.ContainsFunc(next.Members, func(m epoch.Member) bool { return m.Name == "c2" }) {
				next, err = view.Await(ctx, next.Number)
			}
			if err != nil {
				t.Fatalf("no world without the dead c2 after %v: %v", tc.reports, err)
			}
			var names []string
			for _, m := range next.Members {
				names = append(names, m.Name)
			}
			if !slices.Equal(names, []string{"c0", "c1"}) {
				t.Fatalf("world %d after %v: %v, want [c0 c1]", next.Number, tc.reports, names)
			}
		})
	}
}
