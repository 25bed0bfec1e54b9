package report

import (
	"bytes"
	"encoding/xml"
	"errors"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testRun is the output of a real run, `gorovod run --json --np 1 --max-np 4
// --heuristic scaling-efficiency -- synthetic --steps 400 --json ...`, with
// the step lines of workers 1-3 left out to keep it small.
const testRun = "testdata/scaling-efficiency.jsonl"

func readTestRun(t *testing.T) (*Run, []byte) {
	t.Helper()
	b, err := os.ReadFile(testRun)
	if err != nil {
		t.Fatal(err)
	}
	run, err := Read(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return run, b
}

func TestReadRealRun(t *testing.T) {
	run, _ := readTestRun(t)
	if run.Summary == nil || run.Summary.Steps != 400 || len(run.Summary.Throughput) != 2 {
		t.Fatalf("summary %+v", run.Summary)
	}
	kinds := ""
	for _, ev := range run.Events {
		kinds += ev.Kind + " "
	}
	if kinds != "world decision world done settled " {
		t.Fatalf("events %q", kinds)
	}
	if len(run.Steps) != 400 || run.Steps[0].Step != 1 || run.Steps[399].Step != 400 {
		t.Fatalf("%d trainer steps, first %+v", len(run.Steps), run.Steps[0])
	}
	for _, st := range run.Steps {
		if math.IsNaN(st.Loss) || st.StepMS <= 0 || st.Global != 64 || st.Workers < 1 {
			t.Fatalf("step %+v", st)
		}
	}
	if run.Bad != 0 || run.Skipped != 0 || run.Lines != 406 {
		t.Fatalf("lines %d, skipped %d, bad %d (%s)", run.Lines, run.Skipped, run.Bad, run.FirstBad)
	}
}

func TestReadTolerates(t *testing.T) {
	long := "[0] {\"step\":1,\"pad\":\"" + strings.Repeat("x", maxLine) + "\"}"
	in := strings.Join([]string{
		`{"event":"world","elapsed_s":0,"step":0,"workers":2,"world_epoch":1,"message":"world epoch 1: 2 workers"}`,
		`gorovod run: a human line that went to stdout by mistake`,
		`[0] plain text from a trainer`,
		`[1] {"step":5,"loss":2.5,"step_ms":10,"size":2,"global":32}`,
		`[0] {"step":5,"loss":1.5,"step_ms":30,"size":2,"global":32}`,
		`[0] {"kind":"epoch","step":5,"test_loss":0.3}`,      // fashion-mnist's epoch line: not a step
		`[0] {"kind":"step","step":6,"loss":1,"samples":16}`, // fashion-mnist's step line: samples per worker
		`[1] {"kind":"step","step":6,"loss":3,"samples":16}`,
		`[x] {"step":1}`,
		`{"event":"progress","elapsed_s":1.5,"step":5,"workers":2,"throughput":100,"unit":"samples/s","loss":0.7}`,
		`{"event":"progress","elapsed_s":-3,"step":5}`, // impossible time
		`{"event":"decision","elapsed_s":"soon"}`,      // wrong type
		`{"not":"ours"}`,
		`{"event":"summary","elapsed_s":2,"steps":6,"timeline":[{"world_epoch":1,"workers":2,"start_s":0,"duration_s":2,"steps":6}],"throughput":[],"events":[],"settled_after_s":-1,"replacements":0}`,
		`{"truncated":`,
		long,
		``,
		`   `,
	}, "\n")
	run, err := Read(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Events) != 1 || run.Summary == nil || len(run.Progress) != 1 || run.Progress[0].Loss == nil || *run.Progress[0].Loss != 0.7 {
		t.Fatalf("run %+v", run)
	}
	if len(run.Steps) != 2 {
		t.Fatalf("steps %+v", run.Steps)
	}
	s5, s6 := run.Steps[0], run.Steps[1]
	if s5.Step != 5 || s5.Loss != 2 || s5.StepMS != 30 || s5.Global != 32 || s5.Lines != 2 || s5.Workers != 2 {
		t.Fatalf("step 5: %+v", s5)
	}
	if s6.Step != 6 || s6.Loss != 2 || s6.Global != 32 || s6.StepMS != 0 {
		t.Fatalf("step 6: %+v", s6)
	}
	// 18 lines, 2 blank: 16 read. Skipped: the human line, the plain
	// trainer text, the epoch line, "[x]", {"not":"ours"}, the long line.
	// Bad: the impossible time, the wrong type, the truncated object.
	if run.Lines != 16 || run.Skipped != 6 || run.Bad != 3 {
		t.Fatalf("lines %d, skipped %d, bad %d", run.Lines, run.Skipped, run.Bad)
	}
	if !strings.Contains(run.FirstBad, "elapsed_s -3") {
		t.Fatalf("first bad: %q", run.FirstBad)
	}
}

type failingReader struct{ n int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n > 0 {
		r.n--
		return copy(p, "{\"event\":\"world\",\"elapsed_s\":0}\n"), nil
	}
	return 0, errors.New("disk on fire")
}

func TestReadReportsReaderErrors(t *testing.T) {
	run, err := Read(&failingReader{n: 3})
	if err == nil || !strings.Contains(err.Error(), "disk on fire") || len(run.Events) != 3 {
		t.Fatalf("Read: %v, %d events", err, len(run.Events))
	}
}

func TestTimeOfStep(t *testing.T) {
	as := []anchor{{0, 0}, {3, 30}, {3.2, 30}, {3.3, 30}, {5, 60}}
	cases := []struct {
		step int64
		want float64
	}{
		{0, 0}, {15, 1.5}, {30, 3.3}, {45, 4.15}, {60, 5},
		{90, 6.7}, // beyond: at the last stretch's rate, (5-3.3)/30 per step
	}
	for _, c := range cases {
		if got := timeOfStep(as, c.step); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("step %d at %v s, want %v", c.step, got, c.want)
		}
	}
}

func TestRollingMedian(t *testing.T) {
	in := []Point{{0, 10}, {1, 9}, {2, 100}, {3, 7}, {4, 6}, {5, 5}}
	got := rollingMedian(in, 3)
	want := []float64{10, 10, 9, 7, 6, 5} // the spike at 2 is gone; the ends are their own
	for i := range want {
		if got[i].V != want[i] || got[i].T != in[i].T {
			t.Fatalf("rollingMedian = %v, want values %v", got, want)
		}
	}
}

func TestAnalyzeRealRun(t *testing.T) {
	run, _ := readTestRun(t)
	s := Analyze(run)
	if n := len(s.Workers); n < 2 || s.Workers[0].V != 1 || s.Workers[n-1].V != 4 {
		t.Fatalf("workers %v", s.Workers)
	}
	if len(s.Markers) != 2 || s.Markers[0].Label != "grow +3" || s.Markers[1].Label != "settled at 4" {
		t.Fatalf("markers %+v", s.Markers)
	}
	if s.Unit != "samples/s" || len(s.Throughput) != 400 || len(s.Loss) != 400 || len(s.MeasuredTP) != 2 {
		t.Fatalf("unit %q, %d throughput points, %d loss points, %d measured", s.Unit, len(s.Throughput), len(s.Loss), len(s.MeasuredTP))
	}
	// The trainer lines agree with the engine's measurement of each world
	// (the same steps, timed on both sides): within 15 % at the middle of
	// each world's stretch.
	for _, seg := range s.MeasuredTP {
		mid := (seg.T0 + seg.T1) / 2
		var near Point
		for _, p := range s.Throughput {
			if math.Abs(p.T-mid) < math.Abs(near.T-mid) {
				near = p
			}
		}
		if math.Abs(near.V/seg.V-1) > 0.15 {
			t.Errorf("at %.1f s the trainer lines say %.0f, the engine measured %.0f", near.T, near.V, seg.V)
		}
	}
	if s.End < 20 || s.End > 40 {
		t.Fatalf("end %v", s.End)
	}
}

func TestWriteReport(t *testing.T) {
	run, raw := readTestRun(t)
	for _, tc := range []struct {
		name   string
		run    *Run
		charts []string
		note   string
	}{
		{"complete", run, []string{"workers", "throughput", "steptime", "loss"}, ""},
		{"interrupted", mustRead(t, raw[:len(raw)/2]), []string{"workers", "throughput", "steptime", "loss"}, "no summary line"},
		{"events only", mustRead(t, onlyEvents(raw)), []string{"workers", "throughput", "steptime"}, "No per-step data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "report")
			files, err := Write(dir, tc.run, Options{Source: "test <run>"})
			if err != nil {
				t.Fatal(err)
			}
			if len(files) != 1+2*len(tc.charts) || filepath.Base(files[0]) != "index.html" {
				t.Fatalf("files %v", files)
			}
			page, _ := os.ReadFile(files[0])
			for _, c := range tc.charts {
				checkPNG(t, filepath.Join(dir, c+".png"))
				checkSVG(t, filepath.Join(dir, c+".svg"))
				if !bytes.Contains(page, []byte(`<img src="`+c+`.svg"`)) {
					t.Errorf("index.html does not show %s", c)
				}
			}
			if !bytes.Contains(page, []byte("test &lt;run&gt;")) {
				t.Errorf("the source is not escaped in the page")
			}
			if tc.note != "" && !bytes.Contains(page, []byte(tc.note)) {
				t.Errorf("index.html lacks the note %q", tc.note)
			}
			if err := xml.NewDecoder(bytes.NewReader(page)).Decode(new(any)); err != nil && !strings.Contains(err.Error(), "doctype") {
				// html/template output is not XML; only check that it is
				// not cut short.
				if !bytes.HasSuffix(bytes.TrimSpace(page), []byte("</html>")) {
					t.Errorf("index.html is cut short")
				}
			}
		})
	}
}

func mustRead(t *testing.T, b []byte) *Run {
	t.Helper()
	run, err := Read(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return run
}

func onlyEvents(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if bytes.HasPrefix(l, []byte("{")) {
			out = append(append(out, l...), '\n')
		}
	}
	return out
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() != 1200 || b.Dy() != 408 {
		t.Fatalf("%s is %dx%d, want 1200x408 (10 x 3.4 in at 120 dpi)", path, b.Dx(), b.Dy())
	}
}

func checkSVG(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b))
	root := ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("%s: root element %q", path, root)
	}
}

func FuzzRead(f *testing.F) {
	b, err := os.ReadFile(testRun)
	if err != nil {
		f.Fatal(err)
	}
	lines := bytes.Split(b, []byte("\n"))
	for _, l := range lines[:8] {
		f.Add(l)
	}
	f.Add(lines[len(lines)-2]) // the summary
	f.Add([]byte(`{"event":"progress","elapsed_s":1e308,"step":9223372036854775807,"throughput":1e308,"step_ms":1e-308,"loss":-1e308}`))
	f.Add([]byte("[0] {\"step\":-1,\"step_ms\":1e-320,\"global\":2147483647}\n[0] {\"step\":0,\"loss\":1e308}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		run, err := Read(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("Read of an in-memory input failed: %v", err)
		}
		s := Analyze(run)
		for _, ps := range [][]Point{s.Workers, s.Throughput, s.StepMS, s.Loss, s.LossRaw} {
			for _, p := range ps {
				if !finite(p.T) || !finite(p.V) {
					t.Fatalf("a value no plot can draw in a series: %+v", p)
				}
			}
		}
		if !finite(s.End) {
			t.Fatalf("end %v", s.End)
		}
		_ = Charts(s) // builds the plots without drawing them
	})
}
