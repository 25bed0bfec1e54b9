// Command asmgen writes the AVX2/F16C kernels of package reduce
// (kernels_amd64.s) and their Go declarations (kernels_amd64.go).
//
// The kernels share one loop skeleton and differ only in how a step loads,
// combines and stores its vectors, so generating them keeps thirty
// functions consistent and lets the skeleton be reviewed once. Run it with
// `go generate ./internal/reduce`; a test fails if the checked-in files are
// stale.
package main
