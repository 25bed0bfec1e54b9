package membership

import (
	"errors"
	"fmt"
	"time"
)

// Message is a payload another member sent with Send.
type Message struct {
	// From is the sender as known here. When the sender's alive message has not
	// reached this member yet, only From.Name is set.
	From Node
	// Payload is the sender's bytes; the receiver owns them.
	Payload []byte
	// At is when the message arrived.
	At time.Time
}

// Frame of every user message this package puts on memberlist's reliable
// channel:
//
//	0 magic   "gm"
//	2 version uint8 = 1
//	3 kind    uint8 (frameData, frameBye, frameMeta, frameReach)
//	4 job     uint8 length + JobID
//	  from    uint8 length + sender name
//	  payload the rest (empty for frameBye and frameReach; the sender's
//	          encoded Meta for frameMeta)
//
// The job id rides in every frame because memberlist's NotifyMsg does not say
// who sent a message: without it a member of another job that shares the
// secret could inject messages.
const (
	frameMagic0, frameMagic1 = 'g', 'm'
	frameVersion             = 1
	frameData                = 1
	// frameBye tells a peer that the sender is leaving gracefully, so its
	// coming death is reported as Left rather than Failed.
	frameBye = 2
	// frameMeta carries the sender's metadata straight to a peer (Tell): a
	// change of State there at once instead of after some gossip rounds.
	frameMeta = 3
	// frameReach asks nothing of its receiver (Reach): its delivery, or
	// the dial's refusal, is the answer.
	frameReach = 4

	maxFrameString = 255
)

type frame struct {
	kind    uint8
	jobID   string
	from    string
	payload []byte
}

func appendFrame(b []byte, f *frame) []byte {
	b = append(b, frameMagic0, frameMagic1, frameVersion, f.kind)
	b = appendString(b, f.jobID)
	b = appendString(b, f.from)
	return append(b, f.payload...)
}

func frameSize(f *frame) int { return 6 + len(f.jobID) + len(f.from) + len(f.payload) }

// decodeFrame parses b; payload aliases b. It refuses unknown versions and
// kinds, an empty sender or job, and a goodbye with a payload.
func decodeFrame(b []byte, f *frame) error {
	if len(b) < 4 || b[0] != frameMagic0 || b[1] != frameMagic1 {
		return errors.New("membership: message without the frame magic")
	}
	if b[2] != frameVersion {
		return fmt.Errorf("membership: message frame version %d, want %d", b[2], frameVersion)
	}
	kind := b[3]
	if kind < frameData || kind > frameReach {
		return fmt.Errorf("membership: unknown message kind %d", kind)
	}
	r := reader{b: b[4:]}
	job, from := r.str(), r.str()
	if r.err != nil {
		return r.err
	}
	if job == "" || from == "" {
		return errors.New("membership: message without a job or a sender")
	}
	if (kind == frameBye || kind == frameReach) && len(r.b) != 0 {
		return errors.New("membership: goodbye or reach message with a payload")
	}
	*f = frame{kind: kind, jobID: job, from: from, payload: r.b}
	return nil
}
