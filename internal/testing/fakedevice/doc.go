// Package fakedevice is device memory for tests without an accelerator: a
// collective.DeviceMemory backed by host bytes that the code under test can
// reach only through the interface, as with CUDA memory. A test that passes
// with it shows that the collectives, the fuser and the session stage device
// tensors through the device's own copies and kernels rather than touching
// device bytes.
//
// Its kernels compute through float64, which is exact for the small integers
// tests hold in any dtype; they are not the production kernels (package
// collective/cuda has those, checked against internal/reduce).
package fakedevice
