package heuristics

import (
	"encoding/json"
	"testing"
)

// FuzzParsePluginDecision: whatever a plugin prints, parsing returns a
// decision that validates and names only a member, or an error.
func FuzzParsePluginDecision(f *testing.F) {
	for _, seed := range []string{
		`{"action":"grow","count":2,"reason":"x"}`,
		`{"action":"replace","worker":"w1","reason":"slow","numbers":{"relative":0.4}}`,
		`{"action":"hold","reason":"","settled":true}`,
		`{"action":"shrink","count":1} {"action":"hold"}`,
		` null `, `{"action":"bogus"}`, `{"count":-1}`,
	} {
		f.Add([]byte(seed))
	}
	members := []string{"w0", "w1", "w2"}
	f.Fuzz(func(t *testing.T, out []byte) {
		d, err := parsePluginDecision(out, members)
		if err != nil {
			return
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("accepted an invalid decision %+v: %v", d, err)
		}
		if d.Action == Replace && d.Worker != "w0" && d.Worker != "w1" && d.Worker != "w2" {
			t.Fatalf("accepted a replacement of non-member %q", d.Worker)
		}
		// An accepted decision survives its own encoding.
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parsePluginDecision(b, members); err != nil {
			t.Fatalf("re-encoded decision %s rejected: %v", b, err)
		}
	})
}

// FuzzParseSpec: a configuration file is a spec with a name, or an error.
func FuzzParseSpec(f *testing.F) {
	f.Add([]byte(`{"name":"all-of","of":[{"name":"scaling-efficiency","params":{"threshold":0.2}}]}`))
	f.Add([]byte(`{"name":"fixed-schedule","params":{"schedule":"0:2,50:4"}}`))
	f.Add([]byte(`{"nam":"x"}`))
	f.Add([]byte(`{"name":"goodput","params":{"init_batch":64,"max_batch":512,"max_micro_batch":128,"accumulation":true,"price_per_worker_hour":2,"value_per_hour":20}}`))
	r := NewRegistry()
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSpec(b)
		if err != nil {
			return
		}
		if s.Name == "" {
			t.Fatal("accepted a spec without a name")
		}
		// Building must not panic, whatever the parameters; exec would run
		// LookPath on fuzzed names, which is harmless but slow.
		if s.Name != "exec" {
			_, _ = r.New(s)
		}
	})
}
