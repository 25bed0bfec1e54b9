// Package python holds gorovod's Python package (gorovod, with the PyTorch
// binding gorovod.torch) and, as Go tests, the tests that drive it: `go test
// ./bindings/python/` builds libgorovod.so (-buildmode=c-shared) and the
// gorovod command into a temporary directory, and runs the Python scripts
// under tests/ and examples/pytorch with Debian's /usr/bin/python3 and
// torch, alone and as several workers under real `gorovod run` processes.
// The tests skip, saying why, when /usr/bin/python3 or torch is missing (CI
// installs python3-torch).
//
// pyproject.toml and backend/ (a PEP 517 build backend of the standard
// library only) make the package installable with `pip install
// ./bindings/python`: a wheel holding libgorovod.so and the gorovod command.
//
// There is no Go API here: the Python package loads libgorovod.so through
// ctypes (gorovod/_core.py), the library built from bindings/c. bench/ holds
// the benchmarks against DDP-Gloo (compare.py), of the binding's own cost
// (overhead.py, with its Go counterpart bench/overhead, a command run under
// `gorovod run`; bucket_cost.py, DistributedOptimizer's CPU time for a small
// model) and of how much of a training step's gradient exchange is hidden
// behind its backward pass (overlap.py; ddp_trace.py, when DDP's buckets
// on the "gorovod" backend are reduced against backward's gradients).
package python
