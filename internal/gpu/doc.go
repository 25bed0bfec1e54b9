// Package gpu owns GPU discovery on a host: which NVIDIA GPUs there are (UUID,
// name, memory, PCI bus id, compute capability), how each pair is connected
// (NVLink, or how far apart on PCIe), a compact Summary for membership
// metadata, and the assignment of one GPU per local worker
// (AssignDevices, for CUDA_VISIBLE_DEVICES in the launcher).
//
// Discovery goes through NVML with github.com/NVIDIA/go-nvml, written against
// its nvml.Interface so that tests plug in go-nvml's mock package. go-nvml
// needs cgo but no NVIDIA software at build time: it loads
// libnvidia-ml.so.1 with dlopen when Discover runs. On a host without a
// driver (the library is missing: ERROR_LIBRARY_NOT_FOUND; or present
// without the kernel module: ERROR_DRIVER_NOT_LOADED), or with a driver but
// no GPU, Discover returns a *NoGPUsError, never a crash: callers treat it as
// a CPU-only host (IsNoGPUs). Other NVML failures are *NVMLError. Built
// without cgo, System always reports no GPUs.
//
// Topology follows nvidia-smi topo -m: for each pair of GPUs, NVLink if they
// have active NVLinks to each other or both reach an NVSwitch (a remote end
// that is not one of the host's GPUs), otherwise the PCIe level of their
// common ancestor from nvmlDeviceGetTopologyCommonAncestor: the same board,
// one PCIe switch (PIX), several switches (PXB), a host bridge (PHB), the
// same NUMA node (NODE), or across NUMA nodes (SYS).
package gpu
