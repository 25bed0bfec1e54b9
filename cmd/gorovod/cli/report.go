package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gorovod/gorovod/internal/logging"
	"github.com/gorovod/gorovod/observe/report"
)

// reportCommand is `gorovod report RUN.jsonl`: the plots and the one-page
// summary of a run, from what `gorovod run --json` printed.
func reportCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod report", flag.ContinueOnError)
	out := fs.String("out", "", "`directory` to write the report into (default: the input's name without .jsonl, plus .report)")
	title := fs.String("title", "", "the report's title (default: gorovod run report)")
	logOpts := logging.DefaultOptions()
	logOpts.Register(fs)
	usage := "Usage: gorovod report [flags] RUN.jsonl\n\n" +
		"Reads what `gorovod run --json ... > RUN.jsonl` printed (the engine's events\n" +
		"and summary; with trainers run with --json, their step lines too) and writes\n" +
		"plots of workers, throughput, step time and loss over time as SVG and PNG,\n" +
		"and index.html, a one-page summary showing them. RUN.jsonl - reads stdin."
	if err := parseFlags(fs, args, usage, stdout, stderr); err != nil {
		return err
	}
	if err := logOpts.Validate(); err != nil {
		return reportUsage(stderr, "%v", err)
	}
	log, _ := logOpts.Logger(stderr)
	if fs.NArg() != 1 {
		return reportUsage(stderr, "want one RUN.jsonl file, got %d arguments", fs.NArg())
	}
	in := fs.Arg(0)
	dir := *out
	if dir == "" {
		if in == "-" {
			return reportUsage(stderr, "reading stdin: say where the report goes with --out")
		}
		dir = strings.TrimSuffix(in, filepath.Ext(in)) + ".report"
	}
	var r io.Reader = os.Stdin
	source := "standard input"
	if in != "-" {
		f, err := os.Open(in)
		if err != nil {
			return &commandError{command: "report", err: err}
		}
		defer f.Close()
		r, source = f, in
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	run, err := report.Read(r)
	if err != nil {
		return &commandError{command: "report", err: fmt.Errorf("reading %s: %w", source, err)}
	}
	if len(run.Events) == 0 && run.Summary == nil && len(run.Progress) == 0 {
		return &commandError{command: "report", err: fmt.Errorf("%s holds none of gorovod run's JSON lines (%d lines read): was it written by `gorovod run --json`?", source, run.Lines)}
	}
	if run.Bad > 0 {
		log.Warn("lines that did not decode were skipped", "count", run.Bad, "first", run.FirstBad)
	}
	files, err := report.Write(dir, run, report.Options{Title: *title, Source: source})
	if err != nil {
		return &commandError{command: "report", err: err}
	}
	if run.Summary == nil {
		fmt.Fprintf(stderr, "gorovod report: %s has no summary line (the run was interrupted?); the report shows what came before\n", source)
	}
	fmt.Fprintf(stdout, "%s\n", files[0])
	for _, f := range files[1:] {
		fmt.Fprintf(stdout, "%s\n", f)
	}
	return nil
}

func reportUsage(stderr io.Writer, format string, args ...any) error {
	fmt.Fprintf(stderr, "gorovod report: "+format+"\nRun 'gorovod report --help' for the flags.\n", args...)
	return ErrUsage
}
