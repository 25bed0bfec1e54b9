package membership

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func validMeta() Meta {
	return Meta{
		JobID: "job-1", Role: RoleWorker, State: StateReady,
		CollectiveAddr: "10.0.0.7:29500", Host: "node-7", GPUs: 8,
		StartedAt: 1_700_000_000_123_456_789,
		Extra:     map[string]string{"rack": "r3", "zone": "b"},
	}
}

func TestMetaRoundTrip(t *testing.T) {
	big := validMeta()
	big.Extra = nil
	big.JobID = strings.Repeat("j", 255)
	big.Host = strings.Repeat("h", 100)
	for _, tc := range []struct {
		name   string
		change func(*Meta)
	}{
		{"full", func(*Meta) {}},
		{"driver without collective address", func(m *Meta) { m.Role, m.CollectiveAddr, m.GPUs = RoleDriver, "", GPUsUnknown }},
		{"joining, no extra", func(m *Meta) { m.State, m.Extra = StateJoining, nil }},
		{"leaving, empty extra value", func(m *Meta) { m.State, m.Extra = StateLeaving, map[string]string{"k": ""} }},
		{"ipv6 address", func(m *Meta) { m.CollectiveAddr = "[fe80::1%eth0]:1" }},
		{"unicode", func(m *Meta) { m.Host, m.Extra = "hôte-7", map[string]string{"clé": "valeur ✓"} }},
		{"max gpus", func(m *Meta) { m.GPUs = MaxGPUs }},
		{"exactly MaxMetaSize bytes", func(m *Meta) {
			*m = big
			m.Extra = map[string]string{"x": ""}
			m.Extra["x"] = strings.Repeat("v", MaxMetaSize-m.EncodedSize())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := validMeta()
			tc.change(&in)
			b, err := in.MarshalBinary()
			if err != nil {
				t.Fatalf("MarshalBinary: %v", err)
			}
			if len(b) != in.EncodedSize() || len(b) > MaxMetaSize {
				t.Fatalf("encoded %d bytes, EncodedSize %d, limit %d", len(b), in.EncodedSize(), MaxMetaSize)
			}
			var out Meta
			if err := out.UnmarshalBinary(b); err != nil {
				t.Fatalf("UnmarshalBinary: %v", err)
			}
			if !out.Equal(in) {
				t.Fatalf("round trip:\n in %+v\nout %+v", in, out)
			}
			// One encoding per value: Extra's map order must not leak into the bytes.
			for range 5 {
				again, _ := out.MarshalBinary()
				if !bytes.Equal(again, b) {
					t.Fatal("encoding is not deterministic")
				}
			}
		})
	}
}

func TestMetaInvalid(t *testing.T) {
	manyPairs := map[string]string{}
	for i := range maxExtraPairs + 1 {
		manyPairs[fmt.Sprint(i)] = ""
	}
	for _, tc := range []struct {
		name     string
		change   func(*Meta)
		tooLarge bool
	}{
		{"no job", func(m *Meta) { m.JobID = "" }, false},
		{"zero role", func(m *Meta) { m.Role = 0 }, false},
		{"unknown role", func(m *Meta) { m.Role = 9 }, false},
		{"zero state", func(m *Meta) { m.State = 0 }, false},
		{"unknown state", func(m *Meta) { m.State = 4 }, false},
		{"gpus below -1", func(m *Meta) { m.GPUs = -2 }, false},
		{"gpus too many", func(m *Meta) { m.GPUs = MaxGPUs + 1 }, false},
		{"no start time", func(m *Meta) { m.StartedAt = 0 }, false},
		{"negative start time", func(m *Meta) { m.StartedAt = -5 }, false},
		{"address without port", func(m *Meta) { m.CollectiveAddr = "10.0.0.1" }, false},
		{"string over 255 bytes", func(m *Meta) { m.Host = strings.Repeat("h", 256) }, false},
		{"invalid utf-8", func(m *Meta) { m.JobID = "job\xff" }, false},
		{"empty extra key", func(m *Meta) { m.Extra = map[string]string{"": "v"} }, false},
		{"too many extra pairs", func(m *Meta) { m.Extra = manyPairs }, false},
		{"one byte over MaxMetaSize", func(m *Meta) {
			m.Extra = nil
			m.JobID, m.Host = strings.Repeat("j", 255), strings.Repeat("h", 100)
			m.Extra = map[string]string{"x": ""}
			m.Extra["x"] = strings.Repeat("v", MaxMetaSize-m.EncodedSize()+1)
		}, true},
		{"extra far too large", func(m *Meta) {
			m.Extra = map[string]string{}
			for i := range 20 {
				m.Extra[fmt.Sprintf("key-%02d", i)] = strings.Repeat("v", 100)
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := validMeta()
			tc.change(&m)
			b, err := m.MarshalBinary()
			if err == nil {
				t.Fatalf("MarshalBinary accepted %+v (%d bytes)", m, len(b))
			}
			if got := errors.Is(err, ErrMetaTooLarge); got != tc.tooLarge {
				t.Fatalf("errors.Is(%v, ErrMetaTooLarge) = %v, want %v", err, got, tc.tooLarge)
			}
		})
	}
}

func TestMetaDecodeRejects(t *testing.T) {
	good, err := func() ([]byte, error) { m := validMeta(); return m.MarshalBinary() }()
	if err != nil {
		t.Fatal(err)
	}
	// Offsets in good: header 13, then jobID "job-1" (1+5), addr (1+14), host
	// (1+6), count, "rack" (1+4) "r3" (1+2), "zone" (1+4) "b" (1+1).
	extraAt := metaFixed + 6 + 15 + 7
	swapped := append(bytes.Clone(good[:extraAt]), "\x02\x04zone\x01b\x04rack\x02r3\x00"...)
	if len(swapped) != len(good) {
		t.Fatalf("offsets in this test are stale: %d vs %d bytes", len(swapped), len(good))
	}
	dup := bytes.Clone(good[:extraAt])
	dup = append(dup, 2, 4, 'r', 'a', 'c', 'k', 0, 4, 'r', 'a', 'c', 'k', 0)
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"header only", good[:metaFixed]},
		{"truncated", good[:len(good)-1]},
		{"trailing byte", append(bytes.Clone(good), 0)},
		{"version 2", append([]byte{2}, good[1:]...)},
		{"role 0", append([]byte{1, 0}, good[2:]...)},
		{"state 7", append([]byte{1, 1, 7}, good[3:]...)},
		{"extra keys out of order", swapped},
		{"duplicate extra key", dup},
		{"over MaxMetaSize bytes", make([]byte, MaxMetaSize+1)},
		{"length past the end", append(bytes.Clone(good[:metaFixed]), 200, 'j')},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := validMeta()
			m.Host = "unchanged"
			before := m.Clone()
			if err := m.UnmarshalBinary(tc.b); err == nil {
				t.Fatalf("UnmarshalBinary accepted %x as %+v", tc.b, m)
			}
			if !m.Equal(before) {
				t.Fatal("a failed decode changed the Meta")
			}
		})
	}
	var m Meta
	if err := m.UnmarshalBinary(good); err != nil {
		t.Fatalf("the unmodified encoding does not decode: %v", err)
	}
}

func TestMetaClone(t *testing.T) {
	a := validMeta()
	b := a.Clone()
	b.Extra["rack"] = "changed"
	if a.Extra["rack"] != "r3" {
		t.Fatal("Clone shares Extra")
	}
}
