package job

import "fmt"

// standing is where the job stands, which decides whether it may still
// start workers: how many of its processes are launched (or being
// launched) and have not exited, whether they all have (then the job's
// processes have ended, for good), whether a member reported the end of
// training (rule 1) and whether every worker was asked to leave (LeaveAll).
// The roster's mu guards it: the roster, the floor and end.go's rules read
// it in the same look as the processes' records.
type standing struct {
	running   int           // processes launched or being launched, not exited
	ended     bool          // every process has exited: no more can be added
	allExited chan struct{} // closed when ended is set

	trainingOver bool // a member reported the end of training (rule 1)
	draining     bool // LeaveAll: every worker was asked to leave
}

func newStanding() standing { return standing{allExited: make(chan struct{})} }

// admit says whether one more process may start: ErrEnded once the job's
// processes have all exited or every worker was asked to leave.
func (s *standing) admit() error {
	if s.ended {
		return ErrEnded
	}
	if s.draining {
		return fmt.Errorf("%w: every worker was asked to leave", ErrEnded)
	}
	return nil
}

// add counts one more process, launched or being launched.
func (s *standing) add() { s.running++ }

// left counts one process less; the job's processes have all exited when
// none is left.
func (s *standing) left() {
	if s.running--; s.running == 0 && !s.ended {
		s.ended = true
		close(s.allExited)
	}
}
