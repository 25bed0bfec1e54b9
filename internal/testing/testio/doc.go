// Package testio holds small I/O helpers the tests of several packages
// share: a buffer one goroutine writes (a process's output copied by
// os/exec, a log handler) while the test reads it.
package testio
