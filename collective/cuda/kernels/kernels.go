package kernels

import (
	"crypto/sha256"
	_ "embed" // the CUDA source and its PTX travel inside the binary
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/gorovod/gorovod/collective"
)

// Source is the CUDA C++ source of every kernel (kernels.cu).
//
//go:embed kernels.cu
var Source string

// PTX is Source compiled by NVRTC for PTXArch (kernels.ptx, written by go
// generate). The driver JIT-compiles it for the GPU at hand when the module is
// loaded.
//
//go:embed kernels.ptx
var PTX string

// PTXArch is the virtual architecture kernels.ptx targets: Volta, the oldest
// GPU generation gorovod supports. PTX is forward compatible, so the same
// text runs on every later GPU (Ampere sm_80, Hopper sm_90, ...).
const PTXArch = "compute_70"

// Options returns the NVRTC options every compile of Source uses, whatever
// the architecture: IEEE-exact arithmetic, so the device gives the host
// kernels' bits. No fused multiply-add, no flush-to-zero of subnormals,
// correctly rounded division.
func Options() []string {
	return []string{"--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--std=c++14"}
}

// BlockThreads is the thread count of every block a kernel is launched with.
const BlockThreads = 256

// maxBlocks bounds the grid: the kernels loop over the remainder (grid-stride),
// so a bounded grid covers any count, and 4096 blocks fill even the largest
// GPUs several times over.
const maxBlocks = 4096

// Grid returns the number of blocks of BlockThreads threads to launch for n
// elements: at least 1 (a launch with n = 0 is then a no-op, not an error).
func Grid(n int) int {
	b := (n + BlockThreads - 1) / BlockThreads
	return min(max(b, 1), maxBlocks)
}

// Kind is the shape of a kernel's parameter list.
type Kind uint8

// The kernel kinds. Every parameter is 8 bytes wide (see kernels.cu).
const (
	// Reduce kernels take (dst, a, b *T, n uint64) and set dst[i] = a[i] op b[i].
	Reduce Kind = iota + 1
	// Scale kernels take (x *T, n uint64, f float64) and set x[i] *= f.
	Scale
	// Div kernels take (x *T, n uint64, d int64) and set x[i] /= d, truncating.
	Div
)

// Kernel names one kernel of Source.
type Kernel struct {
	Name  string // the extern "C" symbol: gorovod_<op>_<dtype>
	Kind  Kind
	DType collective.DType
	Op    collective.ReduceOp // Reduce kernels only
}

// All lists every kernel Source defines: 28 reduce, 7 scale and 3 divide
// kernels. Each call returns a new slice.
func All() []Kernel {
	dtypes := []collective.DType{
		collective.Float32, collective.Float64, collective.Float16, collective.BFloat16,
		collective.Int32, collective.Int64, collective.Uint8,
	}
	reduceOps := []collective.ReduceOp{collective.Sum, collective.Product, collective.Min, collective.Max}
	var ks []Kernel
	for _, dt := range dtypes {
		for _, op := range reduceOps {
			name, _ := ReduceKernel(dt, op)
			ks = append(ks, Kernel{Name: name, Kind: Reduce, DType: dt, Op: op})
		}
	}
	for _, dt := range dtypes {
		name, _ := ScaleKernel(dt)
		ks = append(ks, Kernel{Name: name, Kind: Scale, DType: dt})
	}
	for _, dt := range dtypes {
		if name, err := DivKernel(dt); err == nil {
			ks = append(ks, Kernel{Name: name, Kind: Div, DType: dt})
		}
	}
	return ks
}

// KernelError is a request for a kernel Source does not have.
type KernelError struct {
	Kind  Kind
	DType collective.DType
	Op    collective.ReduceOp
}

func (e *KernelError) Error() string {
	switch e.Kind {
	case Reduce:
		return fmt.Sprintf("cuda kernels: no reduce kernel for %v %v (want sum, product, min or max of a valid dtype)", e.Op, e.DType)
	case Div:
		return fmt.Sprintf("cuda kernels: no divide kernel for %v (integer dtypes only)", e.DType)
	}
	return fmt.Sprintf("cuda kernels: no scale kernel for %v", e.DType)
}

// ReduceKernel names the kernel that combines two dt buffers with op. Average
// is not an op here: the collectives reduce it as Sum and scale afterwards.
func ReduceKernel(dt collective.DType, op collective.ReduceOp) (string, error) {
	var o string
	switch op {
	case collective.Sum:
		o = "sum"
	case collective.Product:
		o = "prod"
	case collective.Min:
		o = "min"
	case collective.Max:
		o = "max"
	}
	if o == "" || !dt.Valid() {
		return "", &KernelError{Kind: Reduce, DType: dt, Op: op}
	}
	return "gorovod_" + o + "_" + dt.String(), nil
}

// ScaleKernel names the kernel that multiplies dt elements by a factor.
func ScaleKernel(dt collective.DType) (string, error) {
	if !dt.Valid() {
		return "", &KernelError{Kind: Scale, DType: dt}
	}
	return "gorovod_scale_" + dt.String(), nil
}

// DivKernel names the kernel that divides integer dt elements, truncating.
func DivKernel(dt collective.DType) (string, error) {
	if !dt.Valid() || dt.IsFloat() {
		return "", &KernelError{Kind: Div, DType: dt}
	}
	return "gorovod_div_" + dt.String(), nil
}

// SourceHash is the hex SHA-256 of Source. kernels.ptx records the hash of the
// source it was compiled from, so a stale PTX is caught without NVRTC.
func SourceHash() string {
	h := sha256.Sum256([]byte(Source))
	return hex.EncodeToString(h[:])
}

// The header lines genptx writes at the top of kernels.ptx (PTX comments).
const (
	headerSource = "// source: kernels.cu sha256="
	headerNVRTC  = "// nvrtc: "
)

// PTXHeader is what kernels.ptx says about its own making.
type PTXHeader struct {
	SourceHash string // SHA-256 of the kernels.cu it was compiled from
	NVRTC      string // NVRTC version, "major.minor"
}

// ParsePTXHeader reads the header genptx wrote at the top of ptx.
func ParsePTXHeader(ptx string) (PTXHeader, error) {
	var h PTXHeader
	for _, line := range strings.Split(ptx, "\n") {
		if !strings.HasPrefix(line, "//") {
			break
		}
		if v, ok := strings.CutPrefix(line, headerSource); ok {
			h.SourceHash = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, headerNVRTC); ok {
			h.NVRTC = strings.TrimSpace(v)
		}
	}
	if h.SourceHash == "" || h.NVRTC == "" {
		return h, fmt.Errorf("cuda kernels: PTX has no generator header (%q and %q lines); regenerate it with go generate", headerSource, headerNVRTC)
	}
	return h, nil
}

// FormatPTX prefixes ptx, NVRTC's output for Source, with the header
// ParsePTXHeader reads. nvrtcVersion is "major.minor".
func FormatPTX(ptx, nvrtcVersion string) string {
	var b strings.Builder
	b.WriteString("// Code generated by go generate (collective/cuda/kernels/internal/genptx); DO NOT EDIT.\n")
	b.WriteString(headerSource + SourceHash() + "\n")
	b.WriteString(headerNVRTC + nvrtcVersion + "\n")
	b.WriteString("// arch: " + PTXArch + "; options: " + strings.Join(Options(), " ") + "\n")
	b.WriteString(ptx)
	if !strings.HasSuffix(ptx, "\n") {
		b.WriteString("\n")
	}
	return b.String()
}

// Entries returns the names of the .entry (kernel) functions in ptx.
func Entries(ptx string) []string {
	var names []string
	for _, line := range strings.Split(ptx, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == ".entry" {
				names = append(names, strings.TrimSuffix(f[i+1], "("))
				break
			}
		}
	}
	return names
}
