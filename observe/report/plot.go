package report

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Chart is one plot of the report, written as NAME.svg and NAME.png.
type Chart struct {
	Name    string // file name without extension
	Title   string
	Caption string // where the data comes from
	plot    *plot.Plot
}

// Plot sizes: wide and short, so the charts stack on one page with their
// time axes aligned.
const (
	chartWidth  = 10 * vg.Inch
	chartHeight = 3.4 * vg.Inch
	pngDPI      = 120
)

var (
	blue   = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	orange = color.RGBA{R: 255, G: 127, B: 14, A: 255}
	green  = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	red    = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	purple = color.RGBA{R: 148, G: 103, B: 189, A: 255}
	brown  = color.RGBA{R: 140, G: 86, B: 75, A: 255}
	gray   = color.RGBA{R: 110, G: 110, B: 110, A: 255}
	faint  = color.NRGBA{R: 31, G: 119, B: 180, A: 90}
)

// markerColor colors the engine's events by kind.
func markerColor(m Marker) color.Color {
	switch m.Kind {
	case "decision":
		switch {
		case len(m.Label) >= 4 && m.Label[:4] == "grow":
			return green
		case len(m.Label) >= 6 && m.Label[:6] == "shrink":
			return orange
		}
		return purple
	case "settled":
		return gray
	case "failed", "error":
		return red
	case "straggler":
		return brown
	}
	return gray
}

// Charts builds the report's plots from the series; a chart without data
// (loss when the trainer reports none) is left out.
func Charts(s *Series) []Chart {
	var out []Chart
	if len(s.Workers) > 0 {
		p := newPlot("Workers over time", "workers")
		line := mustLine(stepXYs(s.Workers, s.End))
		line.Color, line.Width = blue, vg.Points(2)
		p.Add(line)
		p.Legend.Add("world size", line)
		p.Y.Min, p.Y.Max = 0, math.Max(1, maxV(s.Workers))*1.45
		p.Y.Tick.Marker = integerTicks{}
		finish(p, s)
		out = append(out, Chart{Name: "workers", Title: "Workers over time", Caption: "the world size at each world epoch, from the engine's world events", plot: p})
	}
	if len(s.Throughput) > 0 || len(s.MeasuredTP) > 0 {
		out = append(out, measuredChart(s, "throughput", "Throughput", s.Unit, s.Throughput, "all workers", s.MeasuredTP, "engine's measurement per world",
			"Throughput ("+s.Unit+", all workers together)"))
	}
	if len(s.StepMS) > 0 || len(s.MeasuredStepMS) > 0 {
		out = append(out, measuredChart(s, "steptime", "Step time", "ms", s.StepMS, "step time", s.MeasuredStepMS, "engine's median per world",
			"Step time (ms)"))
	}
	if len(s.Loss) > 0 {
		p := newPlot("Training loss", "loss")
		lo, hi := minV(s.Loss), maxV(s.Loss)
		if len(s.LossRaw) > 0 {
			raw := mustLine(xys(s.LossRaw))
			raw.Color, raw.Width = faint, vg.Points(0.8)
			p.Add(raw)
			p.Legend.Add("per step", raw)
			lo, hi = math.Min(lo, minV(s.LossRaw)), math.Max(hi, maxV(s.LossRaw))
		}
		line := mustLine(xys(s.Loss))
		line.Color, line.Width = blue, vg.Points(1.8)
		p.Add(line)
		p.Legend.Add("smoothed", line)
		if lo > 0 && hi/lo > 100 {
			// Losses falling by orders of magnitude: a log axis shows
			// the whole descent, not just its first steps.
			p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
			p.Y.Label.Text = "loss (log scale)"
			p.Y.Min, p.Y.Max = lo/1.5, hi*math.Pow(hi/lo, 0.3)
		} else {
			pad := (hi - lo) * 0.1
			if pad == 0 {
				pad = math.Max(math.Abs(hi)*0.1, 1e-3)
			}
			p.Y.Min, p.Y.Max = math.Max(0, lo-pad), hi+5*pad
			if lo < 0 {
				p.Y.Min = lo - pad
			}
		}
		finish(p, s)
		out = append(out, Chart{Name: "loss", Title: "Training loss", Caption: "from " + s.LossFrom, plot: p})
	}
	return out
}

// measuredChart draws a quantity over time from the per-step data (pts) with
// the engine's measurement of each world (segs) over it, from zero up.
func measuredChart(s *Series, name, title, ylabel string, pts []Point, ptsLabel string, segs []Segment, segsLabel, fullTitle string) Chart {
	p := newPlot(title, ylabel)
	top := maxSeg(segs)
	if len(pts) > 0 {
		line := mustLine(xys(pts))
		line.Color, line.Width = blue, vg.Points(1.2)
		p.Add(line)
		p.Legend.Add(ptsLabel, line)
		top = math.Max(top, maxV(pts))
	}
	addSegments(p, segs, segsLabel)
	p.Y.Min, p.Y.Max = 0, top*1.45
	finish(p, s)
	return Chart{Name: name, Title: fullTitle, Caption: "from " + s.ThroughputFrom, plot: p}
}

func newPlot(title, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds since the first world formed"
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	p.X.Tick.Marker = timeTicks{}
	// The legend goes top right; the decisions' labels below it, and the
	// y axes leave headroom for both.
	p.Legend.Top, p.Legend.Left = true, false
	return p
}

// finish sets the time axis and draws the engine's events on it: a dashed
// vertical line each, labelled at the top (labels staggered so that events
// close together stay readable).
func finish(p *plot.Plot, s *Series) {
	p.X.Min, p.X.Max = 0, math.Max(s.End, 1)
	// yAt is the value a fraction of the way up the y axis, on its scale.
	yAt := func(frac float64) float64 {
		if _, log := p.Y.Scale.(plot.LogScale); log {
			return math.Exp(math.Log(p.Y.Min) + frac*(math.Log(p.Y.Max)-math.Log(p.Y.Min)))
		}
		return p.Y.Min + frac*(p.Y.Max-p.Y.Min)
	}
	for i, m := range s.Markers {
		l := mustLine(plotter.XYs{{X: m.T, Y: p.Y.Min}, {X: m.T, Y: yAt(0.98)}})
		l.Color = markerColor(m)
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Width = vg.Points(1)
		p.Add(l)
		y := yAt(0.87 - 0.06*float64(i%3)) // above the data, which ends at 1/1.45 = 0.69
		labels, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: m.T, Y: y}}, Labels: []string{" " + m.Label}})
		if err == nil {
			labels.TextStyle[0].Color = markerColor(m)
			p.Add(labels)
		}
	}
	// Labels widen the data range; keep the axes where they were set.
	p.X.Min, p.X.Max = 0, math.Max(s.End, 1)
}

func addSegments(p *plot.Plot, segs []Segment, legend string) {
	for i, sg := range segs {
		l := mustLine(plotter.XYs{{X: sg.T0, Y: sg.V}, {X: sg.T1, Y: sg.V}})
		l.Color, l.Width = orange, vg.Points(2.5)
		l.Dashes = []vg.Length{vg.Points(6), vg.Points(2)}
		p.Add(l)
		if i == 0 {
			p.Legend.Add(legend, l)
		}
	}
}

// stepXYs draws a step function that holds each value until the next point
// (and the last until end).
func stepXYs(ps []Point, end float64) plotter.XYs {
	var out plotter.XYs
	for i, pt := range ps {
		next := end
		if i+1 < len(ps) {
			next = ps[i+1].T
		}
		out = append(out, plotter.XY{X: pt.T, Y: pt.V}, plotter.XY{X: math.Max(next, pt.T), Y: pt.V})
	}
	return out
}

func xys(ps []Point) plotter.XYs {
	out := make(plotter.XYs, len(ps))
	for i, p := range ps {
		out[i] = plotter.XY{X: p.T, Y: p.V}
	}
	return out
}

// mustLine builds a line of finite points (the series hold only finite
// values, so NewLine cannot fail on them).
func mustLine(xy plotter.XYs) *plotter.Line {
	l, err := plotter.NewLine(xy)
	if err != nil {
		l = &plotter.Line{}
	}
	return l
}

func maxV(ps []Point) float64 {
	m := math.Inf(-1)
	for _, p := range ps {
		m = math.Max(m, p.V)
	}
	return m
}

func minV(ps []Point) float64 {
	m := math.Inf(1)
	for _, p := range ps {
		m = math.Min(m, p.V)
	}
	return m
}

func maxSeg(ss []Segment) float64 {
	m := 0.0
	for _, s := range ss {
		m = math.Max(m, s.V)
	}
	return m
}

// timeTicks marks seconds at a round interval, about ten labels an axis.
type timeTicks struct{}

func (timeTicks) Ticks(lo, hi float64) []plot.Tick {
	span := hi - lo
	step := 1.0
	for _, s := range []float64{0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400} {
		step = s
		if span/s <= 10 {
			break
		}
	}
	for span/step > 10 {
		step *= 2
	}
	var ts []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step/1e6; v += step {
		label := fmt.Sprintf("%g", math.Round(v*10)/10)
		ts = append(ts, plot.Tick{Value: v, Label: label})
		if minor := v + step/2; minor < hi {
			ts = append(ts, plot.Tick{Value: minor})
		}
	}
	return ts
}

// integerTicks labels whole numbers only (a worker count).
type integerTicks struct{}

func (integerTicks) Ticks(lo, hi float64) []plot.Tick {
	step := math.Max(1, math.Ceil((hi-lo)/8))
	var ts []plot.Tick
	for v := math.Ceil(lo); v <= hi; v += step {
		ts = append(ts, plot.Tick{Value: v, Label: fmt.Sprintf("%.0f", v)})
	}
	return ts
}

// Write saves the chart as dir/NAME.svg and dir/NAME.png and returns their
// paths.
func (c Chart) Write(dir string) ([]string, error) {
	svg := vgsvg.New(chartWidth, chartHeight)
	c.plot.Draw(draw.New(svg))
	var sb bytes.Buffer
	if _, err := svg.WriteTo(&sb); err != nil {
		return nil, fmt.Errorf("report: %s.svg: %w", c.Name, err)
	}
	img := vgimg.NewWith(vgimg.UseWH(chartWidth, chartHeight), vgimg.UseDPI(pngDPI), vgimg.UseBackgroundColor(color.White))
	c.plot.Draw(draw.New(img))
	var pb bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&pb); err != nil {
		return nil, fmt.Errorf("report: %s.png: %w", c.Name, err)
	}
	var paths []string
	for _, f := range []struct {
		ext string
		b   []byte
	}{{".svg", sb.Bytes()}, {".png", pb.Bytes()}} {
		path := filepath.Join(dir, c.Name+f.ext)
		if err := os.WriteFile(path, f.b, 0o644); err != nil {
			return paths, fmt.Errorf("report: %w", err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}
