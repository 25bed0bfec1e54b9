package job

import (
	"slices"
	"testing"
)

// Workers fill the hosts in the Discovery's order, each up to its slots (0:
// no limit); a worker gone frees its slot; a new host list says which hosts
// it dropped; a worker added later gets its host's first share.
func TestPlacement(t *testing.T) {
	p := newPlacement()
	if dropped := p.setHosts([]Host{{"a", 1}, {"b", 1}, {"c", 1}}); dropped != nil {
		t.Fatalf("the first host list dropped %v", dropped)
	}
	p.take("a")
	if h, _ := p.pick(); h != "b" {
		t.Fatalf("with a full, pick() = %q, want b", h)
	}
	p.release("a")
	if h, _ := p.pick(); h != "a" {
		t.Fatalf("with a freed, pick() = %q, want a", h)
	}
	if dropped := p.setHosts([]Host{{"c", 1}, {"d", 1}}); !slices.Equal(dropped, []string{"a", "b"}) {
		t.Fatalf("dropped %v, want [a b]", dropped)
	}
	if p.has("a") || !p.has("d") {
		t.Fatalf("has(a) = %v, has(d) = %v after the new list", p.has("a"), p.has("d"))
	}
	p.share = map[string]int{"c": 3}
	if got, want := []int{p.shareOf("c"), p.shareOf("d")}, []int{3, 1}; !slices.Equal(got, want) {
		t.Fatalf("shares %v, want %v (a host the job did not start on gets 1)", got, want)
	}

	for _, tc := range []struct {
		name    string
		hosts   []Host
		running map[string]int
		want    string // "" when every slot is taken
	}{
		{"first host with a free slot", []Host{{"a", 2}, {"b", 2}}, map[string]int{"a": 1}, "a"},
		{"first host full", []Host{{"a", 2}, {"b", 2}}, map[string]int{"a": 2, "b": 1}, "b"},
		{"every slot taken", []Host{{"a", 1}, {"b", 1}}, map[string]int{"a": 1, "b": 1}, ""},
		{"no limit", []Host{{"a", 0}}, map[string]int{"a": 100}, "a"},
		{"no hosts", nil, map[string]int{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := placement{hosts: tc.hosts, running: tc.running}
			if got, ok := p.pick(); got != tc.want || ok != (tc.want != "") {
				t.Fatalf("pick() = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}
