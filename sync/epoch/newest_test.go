package epoch_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

func TestNewest(t *testing.T) {
	var n epoch.Newest
	if n.Number() != 0 || n.World().Number != 0 {
		t.Fatal("the zero Newest holds a world")
	}
	got := make(chan epoch.World, 1)
	go func() {
		w, err := n.Await(context.Background(), 1)
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	if !n.Put(world(1, "a")) {
		t.Fatal("epoch 1 not taken")
	}
	if !n.Put(world(3, "a", "b")) || n.Put(world(2, "a")) || n.Put(world(3, "c")) {
		t.Fatal("Put must take only newer numbers")
	}
	if w := <-got; w.Number != 3 {
		t.Fatalf("Await(after 1) returned %v", w)
	}
	if n.Number() != 3 || !n.World().Equal(world(3, "a", "b")) {
		t.Fatalf("holds %v", n.World())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := n.Await(ctx, 3); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Await past the newest: %v", err)
	}
}
