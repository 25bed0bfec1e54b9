// Package ptxas assembles PTX to GPU machine code with NVIDIA's PTX compiler
// library (nvPTXCompiler, linked statically from libnvptxcompiler_static.a,
// which ships with the CUDA toolkit; Debian: nvidia-cuda-dev). It is built
// only with the build tag cuda and needs no GPU or driver.
//
// Its test assembles the kernels.ptx the GPU backend embeds, byte for byte as
// shipped, for sm_70 through sm_90: the same translation the driver's JIT
// makes when collective/cuda loads the module, so a PTX file that a driver
// would reject fails CI on a machine without a GPU.
package ptxas
