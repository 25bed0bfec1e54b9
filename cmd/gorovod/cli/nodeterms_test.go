package cli

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gorovod/gorovod/cluster/kube/api"
)

// The selectors of --require-node and --prefer-node: each operator of
// kubectl's -l syntax becomes its node selector operator, weights parse and
// default, and bad input is refused with an error naming what is wrong. A
// parsed term is one the spec's own check (api.Spec.Validate) accepts.
func TestParseNodeTerms(t *testing.T) {
	req := func(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
	}
	terms := func(rs ...corev1.NodeSelectorRequirement) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: rs}
	}
	for _, tc := range []struct {
		in     string
		want   corev1.NodeSelectorTerm
		weight int32
	}{
		{"zone=z1", terms(req("zone", corev1.NodeSelectorOpIn, "z1")), 1},
		{"zone==z1:100", terms(req("zone", corev1.NodeSelectorOpIn, "z1")), 100},
		{"example.com/pool=b:50", terms(req("example.com/pool", corev1.NodeSelectorOpIn, "b")), 50},
		{"zone!=z1", terms(req("zone", corev1.NodeSelectorOpNotIn, "z1")), 1},
		{"zone in (z2, z1):7", terms(req("zone", corev1.NodeSelectorOpIn, "z1", "z2")), 7},
		{"zone notin (z1,z2)", terms(req("zone", corev1.NodeSelectorOpNotIn, "z1", "z2")), 1},
		{"gpu", terms(req("gpu", corev1.NodeSelectorOpExists)), 1},
		{"!example.com/spot : 3", terms(req("example.com/spot", corev1.NodeSelectorOpDoesNotExist)), 3},
		{"cores>8", terms(req("cores", corev1.NodeSelectorOpGt, "8")), 1},
		{"cores<64", terms(req("cores", corev1.NodeSelectorOpLt, "64")), 1},
		// Commas: one term, every requirement (sorted by key).
		{"zone in (z1,z2),disk=ssd,!spot:20", terms(req("disk", corev1.NodeSelectorOpIn, "ssd"), req("spot", corev1.NodeSelectorOpDoesNotExist),
			req("zone", corev1.NodeSelectorOpIn, "z1", "z2")), 20},
		{"zone=", terms(req("zone", corev1.NodeSelectorOpIn, "")), 1}, // an empty value is a label value
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parsePreferNode(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			want := corev1.PreferredSchedulingTerm{Weight: tc.weight, Preference: tc.want}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("--prefer-node %q: %+v, want %+v", tc.in, got, want)
			}
			spec := api.Spec{Image: "i", Command: []string{"t"}, MinWorkers: 1, PreferredNodeAffinity: []corev1.PreferredSchedulingTerm{got},
				RequiredNodeAffinity: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{got.Preference}}}
			if err := spec.Validate(); err != nil {
				t.Fatalf("--prefer-node %q: the spec refuses the term: %v", tc.in, err)
			}
			if !strings.Contains(tc.in, ":") {
				term, err := parseNodeTerm(tc.in)
				if err != nil || !reflect.DeepEqual(term, tc.want) {
					t.Fatalf("--require-node %q: %+v, %v; want %+v", tc.in, term, err, tc.want)
				}
			}
		})
	}
	for _, tc := range []struct {
		name, in string
		prefer   bool // --prefer-node (else --require-node)
		want     string
	}{
		{"empty", "", false, "empty selector (it would match every node)"},
		{"blank", "  ", true, "empty selector"},
		{"only a weight", ":5", true, "empty selector"},
		{"weight 0", "zone=z1:0", true, `weight "0" (after the last ':'): want an integer 1 to 100`},
		{"weight 101", "zone=z1:101", true, `weight "101"`},
		{"weight not a number", "zone=z1:high", true, `weight "high"`},
		{"weight missing after ':'", "zone=z1:", true, `weight ""`},
		{"negative weight", "zone=z1:-5", true, `weight "-5"`},
		{"a weight on a requirement", "zone=z1:5", false, "no label key or value holds ':'"},
		{"two colons", "zone=a:b:5", true, "no label key or value holds ':'"},
		{"':' in a set", "zone in (a:b)", true, `weight "b)"`},
		{"unclosed set", "zone in (z1,z2", false, "not a label selector: unable to parse requirement: found '', expected: ',' or ')'"},
		{"set without parentheses", "zone in z1", true, "not a label selector"},
		{"bad key", "-zone=z1", false, `selector: Invalid value: "-zone"`},
		{"bad value", "zone=z 1", true, "not a label selector"},
		{"value too long", "zone=" + strings.Repeat("z", 64), false, "must be no more than 63 characters"},
		{"Gt not an integer", "cores>many", true, "the value must be an integer"},
		{"Gt without a value", "cores>", false, "not a label selector"},
		{"trailing comma", "zone=z1,", true, "not a label selector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.prefer {
				_, err = parsePreferNode(tc.in)
			} else {
				_, err = parseNodeTerm(tc.in)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%q: error %v, want one saying %q", tc.in, err, tc.want)
			}
		})
	}
}
