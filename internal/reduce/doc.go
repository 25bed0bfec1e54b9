// Package reduce owns the element-wise kernels of gorovod's collective data
// path: combining two buffers with Sum, Prod, Min or Max, scaling a buffer
// (pre/post-scaling and Average on floating-point types), and integer
// division (Average on integer types), for float32, float64, float16,
// bfloat16, int32, int64 and uint8 elements.
//
// On amd64 with AVX2 (and F16C for float16) the bulk of each buffer goes
// through generated assembly (kernels_amd64.s, written by ./asmgen); the
// remainder, other architectures and older CPUs use the pure-Go kernels in
// generic.go. Both paths give bit-identical results, so ranks running
// either agree. The one exception is which NaN payload Sum, Prod and Scale
// propagate when both inputs are NaNs; the result is a NaN either way.
// Destinations of 16 MiB or more that are not one of the sources are
// written with non-temporal stores (see streamBytes).
//
// Min and Max on floating-point types are symmetric, so min(a,b) and
// min(b,a) have the same bits even when the inputs differ only in sign of
// zero or NaN payload: if either input is NaN the result is the bitwise OR of
// the two inputs, which is a NaN; min(+0,-0) is -0 and max(+0,-0) is +0.
// Float16 and bfloat16 inputs are widened to float32, combined, and rounded
// back once, to nearest even.
//
// Kernels hold no state; all of them are safe for concurrent use on
// distinct destinations.
package reduce
