package job

import (
	"errors"
	"testing"
)

// The job's processes have ended when the last one running has left, and
// only then; after that, and once every worker was asked to leave, no
// process may start.
func TestStanding(t *testing.T) {
	for _, tc := range []struct {
		name      string
		steps     string // a: add, l: left, d: draining
		wantEnded bool
		wantAdmit bool
	}{
		{"nothing launched yet", "", false, true},
		{"running", "aal", false, true},
		{"the last one left", "aall", true, false},
		{"draining", "ad", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStanding()
			for _, step := range tc.steps {
				switch step {
				case 'a':
					s.add()
				case 'l':
					s.left()
				case 'd':
					s.draining = true
				}
			}
			closed := false
			select {
			case <-s.allExited:
				closed = true
			default:
			}
			if s.ended != tc.wantEnded || closed != tc.wantEnded {
				t.Fatalf("ended %v, allExited closed %v; want %v", s.ended, closed, tc.wantEnded)
			}
			if err := s.admit(); (err == nil) != tc.wantAdmit || err != nil && !errors.Is(err, ErrEnded) {
				t.Fatalf("admit() = %v, want admitted %v (or ErrEnded)", err, tc.wantAdmit)
			}
		})
	}
}
