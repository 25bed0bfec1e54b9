package mnist

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// DebianPackage is the Debian package that ships the data set.
const DebianPackage = "dataset-fashion-mnist"

// DefaultDir is where DebianPackage installs the files.
const DefaultDir = "/usr/share/datasets/fashion-mnist"

// The file names inside the data directory, as the upstream project and the
// Debian package name them.
const (
	TrainImagesFile = "train-images-idx3-ubyte.gz"
	TrainLabelsFile = "train-labels-idx1-ubyte.gz"
	TestImagesFile  = "t10k-images-idx3-ubyte.gz"
	TestLabelsFile  = "t10k-labels-idx1-ubyte.gz"
)

// Classes is the number of Fashion-MNIST classes.
const Classes = 10

// maxIDXBytes bounds the payload a header may announce, so a corrupt or
// hostile header cannot make the reader allocate gigabytes. The real training
// images are 47 MB.
const maxIDXBytes = 1 << 28

// ErrFormat is wrapped by every error about malformed IDX content.
var ErrFormat = errors.New("mnist: malformed IDX data")

// Set is a labelled image set.
type Set struct {
	// Images holds N images of Rows×Cols pixels, row-major, one after another,
	// scaled from bytes 0..255 to [0, 1].
	Images []float32
	// Labels holds N class numbers in [0, Classes).
	Labels     []uint8
	N          int
	Rows, Cols int
}

// Features is the number of inputs per image (Rows×Cols).
func (s *Set) Features() int { return s.Rows * s.Cols }

// Slice returns a Set sharing samples lo..hi-1 of s (clamped to the set), for
// quick runs, hold-out splits and tests.
func (s *Set) Slice(lo, hi int) *Set {
	hi = max(0, min(hi, s.N))
	lo = max(0, min(lo, hi))
	f := s.Features()
	return &Set{Images: s.Images[lo*f : hi*f], Labels: s.Labels[lo:hi], N: hi - lo, Rows: s.Rows, Cols: s.Cols}
}

// Gather copies the samples at indices into x (len(indices)×Features floats)
// and y (len(indices) labels), the layout ComputeGradients takes, growing them
// if needed, and returns them.
func (s *Set) Gather(indices []int, x []float32, y []uint8) ([]float32, []uint8, error) {
	f := s.Features()
	x = grow(x, len(indices)*f)
	y = y[:0]
	for k, i := range indices {
		if i < 0 || i >= s.N {
			return nil, nil, fmt.Errorf("mnist: sample index %d out of range [0, %d)", i, s.N)
		}
		copy(x[k*f:(k+1)*f], s.Images[i*f:(i+1)*f])
		y = append(y, s.Labels[i])
	}
	return x, y, nil
}

// Load reads the training and test sets from dir (normally DefaultDir). When
// a file is missing the error says so, names DebianPackage and still matches
// errors.Is(err, fs.ErrNotExist).
func Load(dir string) (train, test *Set, err error) {
	train, err = LoadSet(filepath.Join(dir, TrainImagesFile), filepath.Join(dir, TrainLabelsFile))
	if err != nil {
		return nil, nil, err
	}
	test, err = LoadSet(filepath.Join(dir, TestImagesFile), filepath.Join(dir, TestLabelsFile))
	if err != nil {
		return nil, nil, err
	}
	if test.Rows != train.Rows || test.Cols != train.Cols {
		return nil, nil, fmt.Errorf("%w: test images are %d×%d, training images %d×%d",
			ErrFormat, test.Rows, test.Cols, train.Rows, train.Cols)
	}
	return train, test, nil
}

// LoadSet reads one gzip-compressed IDX image file and its label file.
func LoadSet(imagesPath, labelsPath string) (*Set, error) {
	var s Set
	err := readGzipFile(imagesPath, func(r io.Reader) error {
		var err error
		s.Images, s.N, s.Rows, s.Cols, err = DecodeImages(r)
		return err
	})
	if err != nil {
		return nil, err
	}
	err = readGzipFile(labelsPath, func(r io.Reader) error {
		var err error
		s.Labels, err = DecodeLabels(r)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(s.Labels) != s.N {
		return nil, fmt.Errorf("%w: %s has %d labels for the %d images of %s",
			ErrFormat, labelsPath, len(s.Labels), s.N, imagesPath)
	}
	return &s, nil
}

func readGzipFile(path string, decode func(io.Reader) error) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("mnist: %s is missing: install the data set with `%s` (Debian's package puts it in %s), or point the data directory elsewhere: %w",
			path, InstallCommand, DefaultDir, err)
	}
	if err != nil {
		return fmt.Errorf("mnist: %w", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(bufio.NewReader(f))
	if err != nil {
		return fmt.Errorf("mnist: %s: %w (%w)", path, ErrFormat, err)
	}
	defer zr.Close()
	if err := decode(zr); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// DecodeImages reads an uncompressed IDX file of unsigned-byte images
// (magic 0x00000803: three dimensions N, rows, cols) and returns the pixels
// scaled to [0, 1]. It insists on the whole payload and nothing after it.
func DecodeImages(r io.Reader) (pixels []float32, n, rows, cols int, err error) {
	dims, data, err := decodeIDX(r, 3)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	pixels = make([]float32, len(data))
	for i, b := range data {
		pixels[i] = float32(b) / 255
	}
	return pixels, dims[0], dims[1], dims[2], nil
}

// DecodeLabels reads an uncompressed IDX file of unsigned-byte labels (magic
// 0x00000801) and checks that each is a class in [0, Classes).
func DecodeLabels(r io.Reader) ([]uint8, error) {
	_, data, err := decodeIDX(r, 1)
	if err != nil {
		return nil, err
	}
	for i, l := range data {
		if l >= Classes {
			return nil, fmt.Errorf("%w: label %d of sample %d is not a class in [0, %d)", ErrFormat, l, i, Classes)
		}
	}
	return data, nil
}

// decodeIDX reads an IDX header (two zero bytes, type 0x08 for unsigned bytes,
// the number of dimensions, then each dimension as a big-endian uint32) and the
// unsigned-byte payload it announces.
func decodeIDX(r io.Reader, wantDims int) (dims []int, data []byte, err error) {
	var magic [4]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return nil, nil, fmt.Errorf("%w: reading the magic number: %w", ErrFormat, err)
	}
	if magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || int(magic[3]) != wantDims {
		return nil, nil, fmt.Errorf("%w: magic %#08x, want %#08x (unsigned bytes, %d dimensions)",
			ErrFormat, binary.BigEndian.Uint32(magic[:]), 0x0800|wantDims, wantDims)
	}
	size := 1
	dims = make([]int, wantDims)
	for i := range dims {
		var d [4]byte
		if _, err := io.ReadFull(r, d[:]); err != nil {
			return nil, nil, fmt.Errorf("%w: reading dimension %d: %w", ErrFormat, i, err)
		}
		dims[i] = int(binary.BigEndian.Uint32(d[:]))
		if dims[i] == 0 {
			return nil, nil, fmt.Errorf("%w: dimension %d is zero", ErrFormat, i)
		}
		if dims[i] > maxIDXBytes/size {
			return nil, nil, fmt.Errorf("%w: dimensions %v exceed %d bytes", ErrFormat, dims[:i+1], maxIDXBytes)
		}
		size *= dims[i]
	}
	data = make([]byte, size)
	if _, err := io.ReadFull(r, data); err != nil {
		return nil, nil, fmt.Errorf("%w: dimensions %v announce %d bytes: %w", ErrFormat, dims, size, err)
	}
	// Read to the end rather than stopping at the payload: trailing bytes mean
	// the header is wrong, and gzip only checks its CRC when it reaches EOF.
	var extra [1]byte
	switch n, err := io.ReadFull(r, extra[:]); {
	case n != 0:
		return nil, nil, fmt.Errorf("%w: data continues past the %d bytes dimensions %v announce", ErrFormat, size, dims)
	case err != io.EOF:
		return nil, nil, fmt.Errorf("%w: after the payload: %w", ErrFormat, err)
	}
	return dims, data, nil
}

func grow[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}
