package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "goodputplot:", err)
		os.Exit(1)
	}
}

// record is the union of the trainer's step and eval records.
type record struct {
	Kind           string   `json:"kind"`
	Rank           int      `json:"rank"`
	Global         int      `json:"global_batch"`
	Efficiency     *float64 `json:"efficiency"`
	TrainedSamples int      `json:"trained_samples"`
	Seconds        float64  `json:"seconds"`
	TrainSeconds   float64  `json:"train_seconds"`
	TestAccuracy   float64  `json:"test_accuracy"`
}

// series is one run.
type series struct {
	label                string
	evalT, evalS, evalAc []float64
	stepS, batch, eff    []float64 // eff NaN before the first estimate
	stepT                []float64 // training time at each step
}

func load(path string) (series, error) {
	f, err := os.Open(path)
	if err != nil {
		return series{}, err
	}
	defer f.Close()
	s := series{label: strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, "] "); strings.HasPrefix(line, "[") && i > 0 {
			line = line[i+2:] // gorovod run's worker prefix
		}
		if !strings.HasPrefix(line, `{"kind":`) {
			continue // the launcher's own lines
		}
		var r record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return s, fmt.Errorf("%s: %v", path, err)
		}
		switch {
		case r.Kind == "eval":
			s.evalT, s.evalS, s.evalAc = append(s.evalT, r.TrainSeconds), append(s.evalS, float64(r.TrainedSamples)), append(s.evalAc, r.TestAccuracy)
		case r.Kind == "step" && r.Rank == 0:
			e := math.NaN()
			if r.Efficiency != nil {
				e = *r.Efficiency
			}
			s.stepS, s.batch, s.eff = append(s.stepS, float64(r.TrainedSamples)), append(s.batch, float64(r.Global)), append(s.eff, e)
			s.stepT = append(s.stepT, r.Seconds)
		}
	}
	if err := sc.Err(); err != nil {
		return s, err
	}
	if len(s.evalT) == 0 {
		return s, fmt.Errorf("%s: no eval records (run the trainer with --json --eval-every-samples N)", path)
	}
	return s, nil
}

// goodputWindow is how many steps one goodput point averages over.
const goodputWindow = 50

// goodput is the measured goodput over training: the samples per second of
// each window of steps times their mean statistical efficiency (samples
// counted by their progress at M0), at the window's last sample count.
func (s series) goodput() (x, y []float64) {
	for i := goodputWindow; i < len(s.stepT); i += goodputWindow {
		dt := s.stepT[i] - s.stepT[i-goodputWindow]
		eff, n := 0.0, 0
		for _, e := range s.eff[i-goodputWindow+1 : i+1] {
			if !math.IsNaN(e) {
				eff += e
				n++
			}
		}
		if dt <= 0 || n == 0 {
			continue
		}
		x = append(x, s.stepS[i])
		y = append(y, (s.stepS[i]-s.stepS[i-goodputWindow])/dt*eff/float64(n))
	}
	return x, y
}

// reach is the first evaluation at or above target: time and samples.
func (s series) reach(target float64) (sec, samples float64, ok bool) {
	for i, a := range s.evalAc {
		if a >= target {
			return s.evalT[i], s.evalS[i], true
		}
	}
	return 0, 0, false
}

var palette = []color.Color{
	color.RGBA{R: 31, G: 119, B: 180, A: 255}, color.RGBA{R: 255, G: 127, B: 14, A: 255},
	color.RGBA{R: 44, G: 160, B: 44, A: 255}, color.RGBA{R: 214, G: 39, B: 40, A: 255},
	color.RGBA{R: 148, G: 103, B: 189, A: 255}, color.RGBA{R: 140, G: 86, B: 75, A: 255},
	color.RGBA{R: 227, G: 119, B: 194, A: 255}, color.RGBA{R: 110, G: 110, B: 110, A: 255},
}

func xys(x, y []float64, every int) plotter.XYs {
	out := make(plotter.XYs, 0, len(x)/every+1)
	for i := 0; i < len(x); i += every {
		if !math.IsNaN(y[i]) {
			out = append(out, plotter.XY{X: x[i], Y: y[i]})
		}
	}
	return out
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("goodputplot", flag.ContinueOnError)
	out := fs.String("o", "goodput.png", "the PNG to write")
	target := fs.Float64("target", 0.85, "the test accuracy whose time to reach the table reports")
	title := fs.String("title", "Fashion-MNIST: fixed vs adaptive batch size", "the figure's title")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("give the runs' JSON record files")
	}
	var runs []series
	for _, p := range fs.Args() {
		s, err := load(p)
		if err != nil {
			return err
		}
		runs = append(runs, s)
	}
	fmt.Fprintf(stdout, "| run | time to %.0f %% (s) | samples to %.0f %% | best accuracy | largest global batch |\n|---|---|---|---|---|\n", 100**target, 100**target)
	for _, s := range runs {
		best := 0.0
		for _, a := range s.evalAc {
			best = max(best, a)
		}
		largest := 0.0
		for _, b := range s.batch {
			largest = max(largest, b)
		}
		if sec, n, ok := s.reach(*target); ok {
			fmt.Fprintf(stdout, "| %s | %.1f | %.0f | %.2f %% | %.0f |\n", s.label, sec, n, 100*best, largest)
		} else {
			fmt.Fprintf(stdout, "| %s | not reached | not reached | %.2f %% | %.0f |\n", s.label, 100*best, largest)
		}
	}

	panels := []struct {
		title, x, y string
		data        func(series) ([]float64, []float64, int)
	}{
		{"test accuracy against training time", "training time (s, evaluations excluded)", "test accuracy",
			func(s series) ([]float64, []float64, int) { return s.evalT, s.evalAc, 1 }},
		{"test accuracy against samples trained", "samples", "test accuracy",
			func(s series) ([]float64, []float64, int) { return s.evalS, s.evalAc, 1 }},
		{"global batch size", "samples", "global batch",
			func(s series) ([]float64, []float64, int) { return s.stepS, s.batch, 1 }},
		{"statistical efficiency of the batch (vs M0), measured", "samples", "efficiency",
			func(s series) ([]float64, []float64, int) { return s.stepS, s.eff, 1 }},
		{"goodput: samples/s × efficiency, per 50 steps", "samples", "goodput (samples/s at M0's efficiency)",
			func(s series) ([]float64, []float64, int) { x, y := s.goodput(); return x, y, 1 }},
	}
	const rows, cols = 3, 2
	img := vgimg.New(14*vg.Inch, 13*vg.Inch)
	dc := draw.New(img)
	// The title first: a plot paints its background over the whole canvas.
	tc := plot.New()
	tc.Title.Text = *title
	tc.HideAxes()
	tc.Draw(dc)
	top := dc
	top.Max.Y -= vg.Points(24)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(18), PadY: vg.Points(18), PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(6)}
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text, p.X.Label.Text, p.Y.Label.Text = pn.title, pn.x, pn.y
		p.Add(plotter.NewGrid())
		for j, s := range runs {
			x, y, every := pn.data(s)
			pts := xys(x, y, every)
			if len(pts) == 0 {
				continue
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			l.Color, l.Width = palette[j%len(palette)], vg.Points(1.5)
			p.Add(l)
			if i == 0 {
				p.Legend.Add(s.label, l)
			}
		}
		switch i {
		case 0, 1:
			p.Y.Min, p.Y.Max = 0.7, 0.9
			p.Legend.Top, p.Legend.Left = false, false
		case 2:
			p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		case 3:
			p.Y.Min, p.Y.Max = 0, 1.2
		}
		p.Draw(tiles.At(top, i%cols, i/cols))
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
