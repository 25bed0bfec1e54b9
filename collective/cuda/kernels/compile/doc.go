// Package compile compiles the CUDA kernels (kernels.Source) with NVRTC,
// through gorgonia.org/cu/nvrtc. It is built only with the build tag cuda.
//
// It imports gorgonia.org/cu/nvrtc but not gorgonia.org/cu, whose package init
// needs a GPU driver: so this package and its tests run on machines without a
// GPU or a driver, given libnvrtc (Debian: libnvrtc11.2) and nvrtc.h (Debian:
// nvidia-cuda-dev). That is how CI checks that every kernel compiles for
// sm_70, sm_80 and sm_90, and how go generate writes kernels.ptx
// (internal/genptx). The GPU backend itself does not use this package at run
// time: it loads the pre-compiled PTX (see the kernels package doc).
package compile
