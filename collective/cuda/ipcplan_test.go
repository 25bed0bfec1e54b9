package cuda

// These run in the default build (no GPU, no cuda tag): the records, verdicts,
// shares and mapping cache of the same-host path.

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/collective"
)

func TestGroupRecordRoundTrip(t *testing.T) {
	long := strings.Repeat("x", maxReason+50)
	for _, g := range []groupRecord{
		{OK: true, HostID: hostID("a", "b"), UUID: [16]byte{1, 2, 3}, Probe: ipcHandle{9, 8, 7, 63: 1}},
		{OK: false, Reason: "cuIpcGetMemHandle: CUDA_ERROR_NOT_SUPPORTED"},
		{OK: false, Reason: long},
	} {
		b := g.marshal()
		if len(b) != groupRecordSize {
			t.Fatalf("%d bytes, want %d", len(b), groupRecordSize)
		}
		got, err := unmarshalGroupRecord(b)
		if err != nil {
			t.Fatal(err)
		}
		want := g
		if len(want.Reason) > maxReason {
			want.Reason = want.Reason[:maxReason]
		}
		if got != want {
			t.Fatalf("round trip: got %+v, want %+v", got, want)
		}
	}
	bad := groupRecord{OK: true}.marshal()
	bad[0] = recordVersion + 1
	if _, err := unmarshalGroupRecord(bad); err == nil || !strings.Contains(err.Error(), "version") {
		t.Fatalf("wrong version: err %v", err)
	}
	if _, err := unmarshalGroupRecords(make([]byte, groupRecordSize+1), 1); err == nil {
		t.Fatal("short record accepted")
	}
	huge := groupRecord{OK: true}.marshal()
	huge[114], huge[115] = 0xff, 0xff
	if _, err := unmarshalGroupRecord(huge); err == nil {
		t.Fatal("reason length past the record accepted")
	}
}

func TestDecideGroup(t *testing.T) {
	here, there := hostID("node1", "boot-a"), hostID("node2", "boot-b")
	if here == there || hostID("node1", "boot-a") != here || hostID("node1", "boot-c") == here {
		t.Fatal("hostID does not tell hosts and boots apart")
	}
	ok := groupRecord{OK: true, HostID: here}
	cases := []struct {
		name string
		recs []groupRecord
		want string // substring of the reason; "" for IPC
	}{
		{"all ready", []groupRecord{ok, ok, ok}, ""},
		{"one cannot export", []groupRecord{ok, {Reason: "CUDA_ERROR_NOT_SUPPORTED"}, ok}, "rank 1: CUDA_ERROR_NOT_SUPPORTED"},
		{"another host", []groupRecord{ok, ok, {OK: true, HostID: there}}, "rank 2 runs on another host"},
		{"failure wins over hosts", []groupRecord{ok, {OK: true, HostID: there}, {Reason: "disabled"}}, "rank 2: disabled"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := decideGroup(c.recs)
			if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
				t.Fatalf("decideGroup = %q, want %q", got, c.want)
			}
		})
	}
	if got := firstFailure([]groupRecord{ok, {Reason: "open failed"}, {Reason: "later"}}); got != "rank 1: open failed" {
		t.Fatalf("firstFailure = %q", got)
	}
	if got := firstFailure([]groupRecord{ok, ok}); got != "" {
		t.Fatalf("firstFailure of successes = %q", got)
	}
}

func TestCallRecords(t *testing.T) {
	rec := callRecord{OK: true, DType: collective.BFloat16, Op: collective.Average, Count: 1<<40 + 3,
		Src: ipcHandle{1, 63: 2}, SrcOff: 4096, Dst: ipcHandle{3, 63: 4}, DstOff: 1<<33 + 8}
	other := rec
	other.OK = false
	b := append(rec.marshal(), other.marshal()...)
	recs, err := unmarshalCallRecords(b, 2)
	if err != nil {
		t.Fatal(err)
	}
	if recs[0] != rec || recs[1] != other {
		t.Fatalf("round trip: got %+v, want %+v and %+v", recs, rec, other)
	}
	if _, err := unmarshalCallRecords(b[:len(b)-1], 2); err == nil {
		t.Fatal("short records accepted")
	}
	b[callRecordSize] = 0
	if _, err := unmarshalCallRecords(b, 2); err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("bad version of rank 1: err %v", err)
	}

	base := callRecord{OK: true, DType: collective.Float32, Op: collective.Sum, Count: 100}
	with := func(f func(*callRecord)) callRecord { c := base; f(&c); return c }
	cases := []struct {
		name    string
		recs    []callRecord
		ipc     bool
		errText string
	}{
		{"all shareable", []callRecord{base, base}, true, ""},
		{"one not shareable", []callRecord{base, with(func(c *callRecord) { c.OK = false })}, false, ""},
		{"count differs", []callRecord{base, with(func(c *callRecord) { c.Count = 99 })}, false, "rank 1 reduces 99"},
		{"dtype differs", []callRecord{base, base, with(func(c *callRecord) { c.DType = collective.Float16 })}, false, "rank 2"},
		{"op differs, not shareable", []callRecord{base, with(func(c *callRecord) { c.Op = collective.Max; c.OK = false })}, false, "rank 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ipc, err := decideCall(c.recs)
			if ipc != c.ipc || (err == nil) != (c.errText == "") || (err != nil && !strings.Contains(err.Error(), c.errText)) {
				t.Fatalf("decideCall = %v, %v; want %v, error containing %q", ipc, err, c.ipc, c.errText)
			}
		})
	}
}

func TestShareRange(t *testing.T) {
	for _, p := range []int{1, 2, 3, 4, 7} {
		for _, count := range []int{0, 1, 2, 5, 7, 1000, 1001, 65537} {
			next := 0
			longest, shortest := 0, count+1
			for r := range p {
				lo, hi := shareRange(count, p, r)
				if lo != next || hi < lo {
					t.Fatalf("p=%d count=%d rank %d: [%d, %d) after %d", p, count, r, lo, hi, next)
				}
				next = hi
				longest, shortest = max(longest, hi-lo), min(shortest, hi-lo)
			}
			if next != count || longest-shortest > 1 {
				t.Fatalf("p=%d count=%d: shares end at %d, lengths %d..%d", p, count, next, shortest, longest)
			}
		}
	}
}

func TestFinalScaling(t *testing.T) {
	cases := []struct {
		dt      collective.DType
		op      collective.ReduceOp
		post    float64
		p       int
		factor  float64
		divisor int
	}{
		{collective.Float32, collective.Sum, 1, 2, 1, 1},
		{collective.Float32, collective.Average, 1, 2, 0.5, 1},
		{collective.BFloat16, collective.Average, 3, 4, 0.75, 1},
		{collective.Int32, collective.Average, 1, 3, 1, 3},
		{collective.Int64, collective.Average, 2, 2, 2, 2},
		{collective.Float16, collective.Average, 1, 1, 1, 1},
		{collective.Float64, collective.Max, 0.5, 2, 0.5, 1},
	}
	for _, c := range cases {
		f, d := finalScaling(c.dt, c.op, c.post, c.p)
		if f != c.factor || d != c.divisor {
			t.Errorf("%v %v post=%g p=%d: %g, %d; want %g, %d", c.dt, c.op, c.post, c.p, f, d, c.factor, c.divisor)
		}
	}
}

// fakeMaps is a mapCache whose open and close are recorded.
type fakeMaps struct {
	next   uintptr
	opened []ipcHandle
	closed []uintptr
	fail   map[ipcHandle]error
}

func (f *fakeMaps) cache(max int) *mapCache {
	return &mapCache{max: max,
		open: func(h ipcHandle) (uintptr, error) {
			if err := f.fail[h]; err != nil {
				return 0, err
			}
			f.next += 0x1000
			f.opened = append(f.opened, h)
			return f.next, nil
		},
		close: func(p uintptr) error { f.closed = append(f.closed, p); return nil },
	}
}

func TestMapCache(t *testing.T) {
	f := &fakeMaps{fail: map[ipcHandle]error{{0xee}: errors.New("CUDA_ERROR_INVALID_VALUE")}}
	m := f.cache(2)
	h := func(b byte) ipcHandle { return ipcHandle{b} }
	get := func(b byte) uintptr {
		t.Helper()
		p, err := m.get(h(b))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p1, p2 := get(1), get(2)
	if p1 == p2 || get(1) != p1 || len(f.opened) != 2 {
		t.Fatalf("hits reopened: %d opens, %#x %#x", len(f.opened), p1, p2)
	}
	// 1 was used last, so opening 3 closes 2.
	p3 := get(3)
	if fmt.Sprint(f.closed) != fmt.Sprint([]uintptr{p2}) {
		t.Fatalf("closed %#x, want the least recently used %#x", f.closed, p2)
	}
	if get(1) != p1 || get(3) != p3 || len(f.opened) != 3 {
		t.Fatalf("entries lost: %d opens", len(f.opened))
	}
	if get(2) == p2 || len(f.opened) != 4 {
		t.Fatal("an evicted handle was not reopened")
	}
	if _, err := m.get(h(0xee)); err == nil || len(m.entries) != 2 {
		t.Fatalf("failed open: err %v, %d entries", err, len(m.entries))
	}
	if err := m.closeAll(); err != nil || len(m.entries) != 0 || len(f.closed) != 4 {
		t.Fatalf("closeAll: %v, %d entries left, %d closed", err, len(m.entries), len(f.closed))
	}
}

func TestProbePattern(t *testing.T) {
	for r := range 3 {
		if err := checkProbe(r, probePattern(r, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	b := probePattern(1, 4096)
	b[1000]++
	if err := checkProbe(1, b); err == nil || !strings.Contains(err.Error(), "byte 1000") {
		t.Fatalf("corrupt probe: %v", err)
	}
	if checkProbe(0, probePattern(1, 64)) == nil {
		t.Fatal("rank 1's pattern passed as rank 0's")
	}
}

func TestSameMappings(t *testing.T) {
	a := callRecord{OK: true, Src: ipcHandle{1}, Dst: ipcHandle{2}, SrcOff: 0, Count: 10}
	b := callRecord{OK: true, Src: ipcHandle{3}, Dst: ipcHandle{3}, SrcOff: 64, Count: 10}
	with := func(c callRecord, f func(*callRecord)) callRecord { f(&c); return c }
	cases := []struct {
		name      string
		prev, cur []callRecord
		want      bool
	}{
		{"same allocations", []callRecord{a, b}, []callRecord{a, b}, true},
		{"other offsets and counts, same allocations", []callRecord{a, b},
			[]callRecord{with(a, func(c *callRecord) { c.SrcOff, c.Count = 128, 5 }), b}, true},
		{"no last call", nil, []callRecord{a, b}, false},
		{"another world size", []callRecord{a, b}, []callRecord{a, b, a}, false},
		{"a new send allocation", []callRecord{a, b}, []callRecord{a, with(b, func(c *callRecord) { c.Src = ipcHandle{4} })}, false},
		{"a new receive allocation", []callRecord{a, b}, []callRecord{with(a, func(c *callRecord) { c.Dst = ipcHandle{5} }), b}, false},
		{"not exported now", []callRecord{a, b}, []callRecord{a, with(b, func(c *callRecord) { c.OK = false })}, false},
		{"ranks swapped", []callRecord{a, b}, []callRecord{b, a}, false},
	}
	for _, c := range cases {
		if got := sameMappings(c.prev, c.cur); got != c.want {
			t.Errorf("%s: sameMappings = %v, want %v", c.name, got, c.want)
		}
	}
}
