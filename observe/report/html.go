package report

import (
	"bytes"
	"fmt"
	"html/template"
	"os"
	"path/filepath"
	"time"

	"github.com/gorovod/gorovod/heuristics"
)

// Options describe the report being written.
type Options struct {
	// Title heads the page; default "gorovod run report".
	Title string
	// Source names where the run's lines came from (a file name).
	Source string
}

// Write writes the report of run into dir (created if needed): every chart
// as SVG and PNG, and index.html, the one-page summary that shows them. It
// returns the files written, index.html first.
func Write(dir string, run *Run, opts Options) ([]string, error) {
	if opts.Title == "" {
		opts.Title = "gorovod run report"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	s := Analyze(run)
	charts := Charts(s)
	var files []string
	for _, c := range charts {
		paths, err := c.Write(dir)
		files = append(files, paths...)
		if err != nil {
			return files, err
		}
	}
	page, err := renderHTML(run, s, charts, opts)
	if err != nil {
		return files, err
	}
	index := filepath.Join(dir, "index.html")
	if err := os.WriteFile(index, page, 0o644); err != nil {
		return files, fmt.Errorf("report: %w", err)
	}
	return append([]string{index}, files...), nil
}

type pageRow struct{ Name, Value string }

type pageEvent struct {
	Time, Kind, Message string
	Step                int64
	Workers             int
}

type pageData struct {
	Title, Source string
	Facts         []pageRow
	Measurements  []heuristics.Measurement
	Charts        []Chart
	Events        []pageEvent
	Notes         []string
}

func renderHTML(run *Run, s *Series, charts []Chart, opts Options) ([]byte, error) {
	d := pageData{Title: opts.Title, Source: opts.Source, Charts: charts}
	if sum := run.Summary; sum != nil {
		d.Facts = append(d.Facts,
			pageRow{"duration", fmt.Sprintf("%.1f s", sum.Elapsed)},
			pageRow{"steps", fmt.Sprint(sum.Steps)},
		)
		if n := len(sum.Timeline); n > 0 {
			d.Facts = append(d.Facts, pageRow{"worlds", fmt.Sprintf("%d (the last of %d workers)", n, sum.Timeline[n-1].Workers)})
		}
		if sum.SettledAfter >= 0 {
			d.Facts = append(d.Facts, pageRow{"settled", fmt.Sprintf("at %d workers after %.1f s (step %d)", sum.SettledWorkers, sum.SettledAfter, sum.SettledStep)})
		} else {
			d.Facts = append(d.Facts, pageRow{"settled", "no: the policy never found its target (or none was running)"})
		}
		d.Facts = append(d.Facts, pageRow{"stragglers replaced", fmt.Sprint(sum.Replacements)})
		d.Measurements = sum.Throughput
	} else {
		d.Notes = append(d.Notes, "The output has no summary line: the run was interrupted, or the file was cut. What is shown is what the lines before the end say.")
	}
	if run.Bad > 0 {
		d.Notes = append(d.Notes, fmt.Sprintf("%d lines looked like the run's JSON but did not decode; the first: %s.", run.Bad, run.FirstBad))
	}
	if len(run.Steps) == 0 && len(run.Progress) == 0 {
		d.Notes = append(d.Notes, "No per-step data: throughput and step time are the engine's measurement of each world. Run the trainer with --json (the examples print one JSON line per step, with its loss) to see them step by step.")
	} else if s.Loss == nil {
		d.Notes = append(d.Notes, "The trainer reported no loss: print a \"loss\" field in its --json step lines to plot it.")
	}
	if len(run.Steps) > 0 && !s.Anchored {
		d.Notes = append(d.Notes, "Trainer step lines were found but no engine events to place them in time (run gorovod with --json).")
	}
	d.Facts = append(d.Facts, pageRow{"lines read", fmt.Sprintf("%d (%d engine events, %d trainer step lines, %d progress records, %d other lines skipped)",
		run.Lines, len(run.Events), trainerLines(run.Steps), len(run.Progress), run.Skipped)})
	for _, ev := range run.Events {
		if ev.Kind == heuristics.EventWorld {
			continue // the workers chart shows them
		}
		d.Events = append(d.Events, pageEvent{Time: fmt.Sprintf("%.1f s", ev.Elapsed), Kind: ev.Kind, Message: ev.Message, Step: ev.Step, Workers: ev.Workers})
	}
	var b bytes.Buffer
	if err := pageTemplate.Execute(&b, d); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	return b.Bytes(), nil
}

func trainerLines(steps []TrainerStep) int {
	n := 0
	for _, s := range steps {
		n += s.Lines
	}
	return n
}

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"ms":   func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) },
	"unit": func(m heuristics.Measurement) string { return m.Unit() },
	"f1":   func(v float64) string { return fmt.Sprintf("%.1f", v) },
}).Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.Title}}</title>
<style>
body { font-family: system-ui, sans-serif; max-width: 1000px; margin: 2em auto; color: #222; }
h1 { margin-bottom: 0.2em; }
.source { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
td, th { padding: 0.2em 0.8em; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 0 0 1.5em; }
figure img { width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
.note { background: #fff7e0; border-left: 4px solid #e0a800; padding: 0.5em 1em; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
{{if .Source}}<p class="source">{{.Source}}</p>{{end}}
{{range .Notes}}<p class="note">{{.}}</p>
{{end}}
<table>
{{range .Facts}}<tr><th>{{.Name}}</th><td>{{.Value}}</td></tr>
{{end}}</table>
{{if .Measurements}}<h2>Throughput per world size</h2>
<table>
<tr><th>workers</th><th>throughput</th><th>median step</th><th>steps measured</th></tr>
{{range .Measurements}}<tr><td class="num">{{.Workers}}</td><td class="num">{{f1 .Throughput}} {{unit .}}</td><td class="num">{{ms .StepTime}} ms</td><td class="num">{{.Steps}}</td></tr>
{{end}}</table>
{{end}}
{{range .Charts}}<figure>
<img src="{{.Name}}.svg" alt="{{.Title}}">
<figcaption>{{.Title}}: {{.Caption}}; dashed lines mark the autoscaling engine's decisions (<a href="{{.Name}}.png">PNG</a>).</figcaption>
</figure>
{{end}}
{{if .Events}}<h2>Decisions and outcomes</h2>
<table>
<tr><th>time</th><th>step</th><th>workers</th><th>event</th><th>message</th></tr>
{{range .Events}}<tr><td class="num">{{.Time}}</td><td class="num">{{.Step}}</td><td class="num">{{.Workers}}</td><td>{{.Kind}}</td><td>{{.Message}}</td></tr>
{{end}}</table>
{{end}}
</body>
</html>
`))
