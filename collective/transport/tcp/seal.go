package tcp

import (
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
)

// The sealed data path (Config.Security authenticated or encrypted), in the
// wire layout package framesec describes: header and tag, then each payload
// segment and its tag.

// sendWindow is how many segments of an authenticated frame one writev
// offers the kernel: their tags are computed first, so a larger window
// delays the frame's first byte, a smaller one costs system calls. With the
// header, 3 segments and their tags make 7 buffers, within the 8 that
// unix.Writev gathers without allocating.
const sendWindow = 3

// initSealing sets up the link's sealers for keys.
func (l *link) initSealing(keys framesec.Keys) error {
	if keys.Security == transport.SecurityPlain {
		return nil
	}
	var err error
	if l.wseal, err = framesec.NewSealer(keys.Security, keys.Send); err != nil {
		return err
	}
	if l.rseal, err = framesec.NewSealer(keys.Security, keys.Recv); err != nil {
		return err
	}
	if !l.wseal.Encrypts() {
		l.wtags = make([]byte, sendWindow*framesec.TagSize)
	}
	return nil
}

// sendSealed writes one sealed frame, or with hh nil a payload alone (a
// stripe of a frame; see sendStripe). A small frame is sealed in l.wbuf and
// goes out in one write. A large one goes out window by window: when
// authenticating, a writev of the segments straight from the caller's
// buffer with their tags between them; when encrypting, one segment at a
// time, sealed into l.wscr (the caller's buffer is not to be changed, so
// encryption costs one pass that reads it and writes the scratch buffer).
func (l *link) sendSealed(c *ioCall, hh *transport.Header, payload []byte) error {
	const sealedHeader = transport.HeaderSize + framesec.TagSize
	n := len(payload)
	if hh != nil && n <= smallFrame {
		buf := l.wbuf[:framesec.WireSize(transport.SecurityAuthenticated, n)]
		hh.Encode(buf)
		l.wseal.SealInPlace(buf[:sealedHeader])
		if n > 0 { // smallFrame ≤ SegmentSize: one segment
			copy(buf[sealedHeader:], payload)
			l.wseal.SealInPlace(buf[sealedHeader:])
		}
		l.wparts = append(l.wparts[:0], buf)
		return l.writeFrame(c)
	}
	l.wparts = l.wparts[:0]
	if hh != nil {
		hh.Encode(l.whdr[:])
		l.wseal.SealInPlace(l.whdr[:])
		l.wparts = append(l.wparts, l.whdr[:])
	}
	for off := 0; off < n; {
		if l.wseal.Encrypts() {
			if l.wscr == nil {
				l.wscr = make([]byte, framesec.SegmentSize+framesec.TagSize)
			}
			seg := payload[off:min(off+framesec.SegmentSize, n)]
			l.wparts = append(l.wparts, l.wseal.SealTo(l.wscr, seg))
			off += len(seg)
		} else {
			for k := 0; k < sendWindow && off < n; k++ {
				seg := payload[off:min(off+framesec.SegmentSize, n)]
				tag := l.wtags[k*framesec.TagSize : (k+1)*framesec.TagSize]
				l.wseal.Tag(tag, seg)
				l.wparts = append(l.wparts, seg, tag)
				off += len(seg)
			}
		}
		if err := l.writeFrame(c); err != nil {
			return err
		}
		l.wparts = l.wparts[:0]
	}
	return nil
}

// readPayloadSealed reads the sealed payload announced by the last header
// into p, segment by segment, each verified (and decrypted) before the next
// is read. On an error p's contents are undefined: a segment that failed
// authentication may be in it, but the call fails and the link is broken,
// so no caller takes it as a result.
func (l *link) readPayloadSealed(c *ioCall, p []byte) error {
	for off := 0; off < len(p); {
		seg := p[off:min(off+framesec.SegmentSize, len(p))]
		off += len(seg)
		var err error
		if l.rseal.Encrypts() {
			err = l.readSegmentEncrypted(c, seg)
		} else {
			err = l.readSegmentAuthenticated(c, seg, off == len(p))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readSegmentAuthenticated reads a segment that travels as it is straight
// into dst, and its tag into l.rtag, then verifies it. last says it ends
// the frame: the read then also offers the read buffer, to catch the next
// header with the same system call.
func (l *link) readSegmentAuthenticated(c *ioCall, dst []byte, last bool) error {
	want := len(dst) + framesec.TagSize
	got := l.takeBuffered(dst, 0)
	if rest := want - got; rest > 0 && rest < len(l.rbuf) {
		// The tail: through the buffer, which then also catches what follows.
		if err := l.fill(c, rest); err != nil {
			return err
		}
		got += l.takeBuffered(dst, got)
	}
	for got < want {
		l.riov = l.rvec[:0]
		if got < len(dst) {
			l.riov = append(l.riov, dst[got:], l.rtag[:])
		} else {
			l.riov = append(l.riov, l.rtag[got-len(dst):])
		}
		ahead := last && l.rlo == l.rhi
		if ahead {
			l.rlo, l.rhi = 0, 0
			l.riov = append(l.riov, l.rbuf)
		}
		m, err := l.readv(c)
		if extra := got + m - want; ahead && extra > 0 {
			l.rhi = extra
			m -= extra
		}
		got += m
		if err != nil {
			return err
		}
	}
	return l.rseal.Verify(dst, l.rtag[:])
}

// takeBuffered moves what the read buffer holds of the segment being read
// into it: the byte at position got of dst followed by its tag (l.rtag)
// onwards. It returns how many bytes it moved.
func (l *link) takeBuffered(dst []byte, got int) int {
	moved := 0
	if got < len(dst) {
		n := copy(dst[got:], l.rbuf[l.rlo:l.rhi])
		l.rlo += n
		got += n
		moved += n
	}
	if got >= len(dst) {
		n := copy(l.rtag[got-len(dst):], l.rbuf[l.rlo:l.rhi])
		l.rlo += n
		moved += n
	}
	return moved
}

// readSegmentEncrypted reads an encrypted segment and its tag and decrypts
// it into dst: through the read buffer when it fits (decrypted from there),
// else through l.rscr, which stays in cache from one segment to the next.
// AES-GCM needs the ciphertext and its tag side by side, so it cannot be
// read into dst and opened there without moving the tag.
func (l *link) readSegmentEncrypted(c *ioCall, dst []byte) error {
	want := len(dst) + framesec.TagSize
	if l.rhi-l.rlo >= want || want < len(l.rbuf) {
		if err := l.fill(c, want); err != nil {
			return err
		}
		err := l.rseal.OpenTo(dst, l.rbuf[l.rlo:l.rlo+want])
		l.rlo += want
		return err
	}
	if l.rscr == nil {
		l.rscr = make([]byte, framesec.SegmentSize+framesec.TagSize)
	}
	sealed := l.rscr[:want]
	got := copy(sealed, l.rbuf[l.rlo:l.rhi])
	l.rlo += got
	for got < want {
		m, err := l.read(c, sealed[got:])
		got += m
		if err != nil {
			return err
		}
	}
	return l.rseal.OpenTo(dst, sealed)
}

// readv makes one read into l.riov: polling while nothing has arrived, then
// parking. It returns the bytes read (at least one unless it fails).
func (l *link) readv(c *ioCall) (int, error) {
	defer func() {
		l.riov = nil
		l.rvec = [3][]byte{} // the caller's buffer is not pinned
	}()
	return l.do(&l.rio, &l.rwake, c)
}
