// Package gpu owns GPU discovery on a host: which NVIDIA GPUs there are (UUID,
// name, memory, PCI bus id, compute capability), how each pair is connected
// (NVLink, or how far apart on PCIe), a compact Summary for membership
// metadata, and the assignment of one GPU per local worker
// (AssignDevices, for CUDA_VISIBLE_DEVICES under gorovod run --assign-gpus).
//
// Discovery goes through NVML, the driver's libnvidia-ml.so.1, loaded at the
// first System call with dlopen, and the few functions it uses looked up with
// dlsym (nvml_cgo.go): no NVIDIA software is needed to build, and the binary,
// or libgorovod.so, references no NVML symbol, so it loads on any host, also
// where every symbol is resolved at load time (a shared library opened with
// RTLD_NOW, as Python's ctypes opens it). (github.com/NVIDIA/go-nvml, used
// before, references all of NVML's functions from its cgo code and leaves
// them to be resolved once it has loaded the library: fine in an executable,
// but a shared library built with it would not load without NVML.) On a host
// without NVML (the library is missing or lacks a function discovery needs),
// or with NVML but no kernel driver, System returns a *NoGPUsError whose
// reason starts "no NVML:" and says why; with a driver but no GPU, also a
// *NoGPUsError; never a crash: callers treat it as a CPU-only host
// (IsNoGPUs). Other NVML failures are *NVMLError. The discovery logic is
// written against a small interface (nvmlLib) that tests fake. Built without
// cgo, System always reports no GPUs.
//
// Topology follows nvidia-smi topo -m: for each pair of GPUs, NVLink if they
// have active NVLinks to each other or both reach an NVSwitch (a remote end
// that is not one of the host's GPUs), otherwise the PCIe level of their
// common ancestor from nvmlDeviceGetTopologyCommonAncestor: the same board,
// one PCIe switch (PIX), several switches (PXB), a host bridge (PHB), the
// same NUMA node (NODE), or across NUMA nodes (SYS).
package gpu
