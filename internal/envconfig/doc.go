// Package envconfig is the one place gorovod reads its environment: the
// variables a launcher (gorovod run, gorovod bench) sets for each worker process
// so that it can find the others. Everything else takes configuration structs.
package envconfig
