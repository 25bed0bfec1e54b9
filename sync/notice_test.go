package sync

import (
	"context"
	"errors"
	"os"
	stdsync "sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// unheardMember is a job member whose request to leave goes unanswered: the
// job cannot move on without it (every worker was told to leave at once, or
// the world is at its minimum). Only its notice gets it out.
type unheardMember struct{ coordMember }

func (*unheardMember) requestLeave(context.Context) error { return nil }

// A worker whose leave signal the job cannot act on leaves within its notice
// anyway, with its last step committed; the others redo the step they were
// in without it and lose no sample. Two ways the notice runs out: between
// steps (the next step would not fit), and in a step that cannot finish in
// time (the step is abandoned, uncommitted).
func TestLeaveNoticeRunsOut(t *testing.T) {
	const notice = time.Second
	for _, tc := range []struct {
		name string
		// stuck: the leaver's steps after its signal never finish by
		// themselves (a collective its peers never join).
		stuck bool
	}{{"between steps", false}, {"during a step", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 1})
			go coord.Run(ctx)
			log := &loopLog{}
			leave := make(chan os.Signal, 1)
			var signalled atomic.Int64 // unix nanoseconds; 0 before the signal
			var sigOnce stdsync.Once

			var wg stdsync.WaitGroup
			var res [2]TrainResult
			var errs [2]error
			var returned time.Time
			for i := range 2 {
				w := newLoopWorker(t, []string{"n0", "n1"}[i], log, func(c *TrainConfig) { c.LeaveNotice = notice })
				tr := listenTCP(t)
				cfg, err := w.cfg.prepare(w.state, w.step)
				if err != nil {
					t.Fatal(err)
				}
				coord.Add(epoch.Member{Name: w.name, Addr: tr.Addr()})
				wg.Go(func() {
					sess, err := joinCoord(ctx, coord, w.name, tr, w.state)
					if err != nil {
						errs[i] = err
						return
					}
					var m member = &coordMember{sess: sess, coord: coord, name: w.name}
					var ch <-chan os.Signal
					if i == 1 {
						m, ch = &unheardMember{coordMember{sess: sess, coord: coord, name: w.name}}, leave
					}
					res[i], errs[i] = runLoop(ctx, cfg, m, ch, func(ctx context.Context, s *TrainStep) error {
						time.Sleep(60 * time.Millisecond)
						if i == 0 && s.Number == 6 && s.Size == 2 {
							sigOnce.Do(func() {
								signalled.Store(time.Now().UnixNano())
								leave <- syscall.SIGTERM
							})
						}
						if i == 1 && tc.stuck && signalled.Load() != 0 {
							<-ctx.Done() // the step cannot finish: only the notice ends it
							return ctx.Err()
						}
						return w.step(ctx, s)
					})
					if i == 1 {
						returned = time.Now()
						// As Train would: the member leaves the job.
						_ = m.close()
						coord.Remove(w.name)
					}
				})
			}
			waitEpoch(t, coord, func(e epoch.World) bool { return len(e.Members) == 2 })
			wg.Wait()
			if errs[0] != nil || res[0].Outcome != Completed || res[0].Steps != 3*loopSamples/12 {
				t.Fatalf("the worker that stayed: %+v, %v", res[0], errs[0])
			}
			if errs[1] != nil || res[1].Outcome != Left {
				t.Fatalf("the worker that was told to leave: %+v, %v; want outcome left", res[1], errs[1])
			}
			took := returned.Sub(time.Unix(0, signalled.Load()))
			if took > notice {
				t.Fatalf("the leaver took %v from its signal to leave; its notice is %v", took, notice)
			}
			// It used its notice: the job never answered its request.
			if reserve := notice / 5; took < notice-reserve-200*time.Millisecond {
				t.Fatalf("the leaver left %v after its signal, before its notice (%v less %v) ran out", took, notice, reserve)
			}
			var last int64
			for _, r := range log.steps {
				if r.worker == "n1" {
					last = max(last, r.step)
				}
			}
			if last != res[1].Steps {
				t.Fatalf("the leaver ended at step %d, its last committed step is %d", res[1].Steps, last)
			}
			t.Logf("left %v after the signal (notice %v), at committed step %d", took.Round(time.Millisecond), notice, last)
			checkLoopLog(t, log, 3)
		})
	}
}

func TestLeaveNoticeConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  TrainConfig
		env  string
		want time.Duration
		err  bool
	}{
		{TrainConfig{Steps: 1}, "", DefaultLeaveNotice, false},
		{TrainConfig{Steps: 1}, "7s", 7 * time.Second, false},
		{TrainConfig{Steps: 1, LeaveNotice: 3 * time.Second}, "7s", 3 * time.Second, false},
		{TrainConfig{Steps: 1, LeaveNotice: -time.Second}, "", 0, true},
		{TrainConfig{Steps: 1}, "never", 0, true},
	} {
		t.Setenv("GOROVOD_LEAVE_NOTICE", tc.env)
		c, err := tc.cfg.prepare(NewState(), func(context.Context, *TrainStep) error { return nil })
		if (err != nil) != tc.err || !tc.err && c.LeaveNotice != tc.want {
			t.Errorf("%+v with GOROVOD_LEAVE_NOTICE=%q: notice %v, %v", tc.cfg, tc.env, c.LeaveNotice, err)
		}
		if err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%v is not an ErrInvalidConfig", err)
		}
	}
}

// askCounter is a world of one that tells the test when its leave was
// asked for.
type askCounter struct {
	*alone
	asked chan struct{}
	once  stdsync.Once
}

func (a *askCounter) requestLeave(ctx context.Context) error {
	a.once.Do(func() { close(a.asked) })
	return a.alone.requestLeave(ctx)
}

// The leave signal is passed on to the job while the step it arrives in
// still runs, not at the top of the next step: the next world without the
// worker is under way a step sooner. The step that gets the signal waits
// for the request; it would wait in vain (and fail the test) if the loop
// asked only between steps. The worker then leaves at the next boundary.
func TestLeaveAskedDuringTheStep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := TrainConfig{Steps: 100}.prepare(NewState(), func(context.Context, *TrainStep) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	a, err := startAlone(ctx, cfg.Worker, NewState())
	if err != nil {
		t.Fatal(err)
	}
	m := &askCounter{alone: a, asked: make(chan struct{})}
	leave := make(chan os.Signal, 1)
	res, err := runLoop(ctx, cfg, m, leave, func(ctx context.Context, s *TrainStep) error {
		if s.Number != 3 {
			return nil
		}
		leave <- syscall.SIGTERM
		select {
		case <-m.asked:
			return nil
		case <-time.After(5 * time.Second):
			return errors.New("the leave was not asked for while the step ran")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Left || res.Steps != 3 {
		t.Fatalf("%+v, want outcome left after step 3", res)
	}
}
