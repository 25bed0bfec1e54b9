// Package fakecuda builds a stand-in for the NVIDIA driver's libcuda.so.1
// (testdata/fakedriver.c) for tests on hosts without a GPU: it exports every driver
// function collective/cuda loads, with cuda.h's parameter order, and its
// device 0's memory is host memory at moved addresses (so Go code that took
// them for host memory would fault). Streams run their work at once, the
// float32 sum and scale kernels run, and IPC handles open within the
// process that exported them (so across processes the same-host group
// finds IPC unusable and takes the staged path, as it must). A process
// reaches its allocations through the driver functions alone, as with a
// GPU: a C test program loads the same library (dlopen of "libcuda.so.1"
// with LD_LIBRARY_PATH naming Build's directory) to allocate and copy.
//
// It also tells tests where NVIDIA's real driver libraries are
// (NVIDIALibrary): on a host without a GPU they load, export what we
// resolve, and answer as a GPU host without a working GPU does.
package fakecuda
