package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// parseFlags parses a command's flags the same way for every command: --help
// (or -h) prints usage and the flags on stdout and returns flag.ErrHelp, which
// Run turns into exit status 0; a bad flag is reported on stderr as
// "NAME: what is wrong", NAME being the flag set's name ("gorovod bench"),
// with a pointer to --help, and returns ErrUsage (exit status 2).
func parseFlags(fs *flag.FlagSet, args []string, usage string, stdout, stderr io.Writer) error {
	fs.SetOutput(io.Discard) // the flag package's own messages lack the prefix
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(stdout, "%s\n\nFlags:\n", usage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return flag.ErrHelp
	}
	fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for the flags.\n", fs.Name(), err, fs.Name())
	return ErrUsage
}

// commandError is a command's failure, printed by Run after the program's and
// the command's names ("gorovod bench: ..."), as its usage errors are.
type commandError struct {
	command string
	err     error
}

func (e *commandError) Error() string { return e.command + ": " + e.err.Error() }
func (e *commandError) Unwrap() error { return e.err }

// flagGiven reports whether the command line set the flag named name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// appendParsed is the flag.Func of a repeatable flag whose every value
// parse turns into one more element of *list; parse's error is the flag's.
func appendParsed[T any](list *[]T, parse func(string) (T, error)) func(string) error {
	return func(v string) error {
		x, err := parse(v)
		if err != nil {
			return err
		}
		*list = append(*list, x)
		return nil
	}
}
