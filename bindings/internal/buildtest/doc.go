// Package buildtest builds what the bindings' tests run — libgorovod.so (as
// the README builds it) and the gorovod command — once per test binary, into
// a directory that Cleanup removes (call it from TestMain).
package buildtest
