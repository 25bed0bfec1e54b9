package launch

import (
	"io"
	"os"
	"time"
)

// followEvery is how often the output files of a running process are read
// for new lines: a line reaches Output at most this late.
const followEvery = 20 * time.Millisecond

// outputFiles is a process's stdout and stderr written to files by the
// process itself and read back here as they grow (ProcessSpec.OutputFiles).
type outputFiles struct {
	stdout, stderr outputFile
	drained        chan struct{} // closed once follow has read both files to their end after the exit
}

type outputFile struct {
	w    *os.File // the process's end, closed here once it started
	r    *os.File // read from where the last read stopped
	line *lineWriter
}

func openOutputFiles(prefix string, stdout, stderr *lineWriter) (*outputFiles, error) {
	f := &outputFiles{drained: make(chan struct{})}
	for _, o := range []struct {
		file   *outputFile
		suffix string
		line   *lineWriter
	}{{&f.stdout, ".stdout", stdout}, {&f.stderr, ".stderr", stderr}} {
		path := prefix + o.suffix
		w, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			f.close()
			return nil, err
		}
		r, err := os.Open(path)
		if err != nil {
			w.Close()
			f.close()
			return nil, err
		}
		// Lines already in a file that is appended to (a worker index's
		// earlier run) are not this process's.
		if _, err := r.Seek(0, io.SeekEnd); err != nil {
			w.Close()
			r.Close()
			f.close()
			return nil, err
		}
		*o.file = outputFile{w: w, r: r, line: o.line}
	}
	return f, nil
}

func (f *outputFiles) closeWriters() {
	for _, o := range []*outputFile{&f.stdout, &f.stderr} {
		if o.w != nil {
			o.w.Close()
			o.w = nil
		}
	}
}

func (f *outputFiles) close() {
	f.closeWriters()
	for _, o := range []*outputFile{&f.stdout, &f.stderr} {
		if o.r != nil {
			o.r.Close()
			o.r = nil
		}
	}
}

// follow hands the files' new lines on until exited is closed, then reads
// them to their end (what the process wrote last) and closes drained.
func (f *outputFiles) follow(exited <-chan struct{}) {
	defer close(f.drained)
	defer f.close()
	buf := make([]byte, 64<<10)
	tick := time.NewTicker(followEvery)
	defer tick.Stop()
	for {
		select {
		case <-exited:
			f.stdout.readAll(buf)
			f.stderr.readAll(buf)
			return
		case <-tick.C:
			f.stdout.readAll(buf)
			f.stderr.readAll(buf)
		}
	}
}

// readAll hands on what was appended since the last read.
func (o *outputFile) readAll(buf []byte) {
	for {
		n, err := o.r.Read(buf)
		if n > 0 {
			_, _ = o.line.Write(buf[:n])
		}
		if err != nil || n == 0 { // io.EOF: all read for now
			return
		}
	}
}
