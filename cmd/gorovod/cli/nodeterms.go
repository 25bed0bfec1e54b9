package cli

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The node terms of `gorovod submit --require-node` and `--prefer-node`: a
// label selector in kubectl's -l syntax (one node selector term: every
// requirement must hold), and for a preference a weight after the last ':'.
// No label key or value can hold a ':', so the weight is never taken from
// the selector.

// defaultPreferenceWeight is the weight of a --prefer-node without one.
const defaultPreferenceWeight = 1

// parseNodeTerm parses a label selector such as
// `zone in (z1,z2),disk=ssd,!spot` into a node selector term. The
// operators map as a pod's node affinity has them: = and == to In, != to
// NotIn, in, notin, KEY to Exists, !KEY to DoesNotExist, > and < to Gt and
// Lt (an integer). The keys and values are checked as labels; an empty
// selector, which would match every node, is refused.
func parseNodeTerm(s string) (corev1.NodeSelectorTerm, error) {
	if strings.TrimSpace(s) == "" {
		return corev1.NodeSelectorTerm{}, fmt.Errorf("empty selector (it would match every node): want a label selector such as zone=z1 or 'zone in (z1,z2),!spot'")
	}
	if strings.Contains(s, ":") {
		return corev1.NodeSelectorTerm{}, fmt.Errorf("no label key or value holds ':' (a weight after ':' is --prefer-node's only)")
	}
	reqs, err := labels.ParseToRequirements(s, field.WithPath(field.NewPath("selector")))
	if err != nil {
		return corev1.NodeSelectorTerm{}, fmt.Errorf("not a label selector: %w", err)
	}
	ops := map[selection.Operator]corev1.NodeSelectorOperator{
		selection.Equals: corev1.NodeSelectorOpIn, selection.DoubleEquals: corev1.NodeSelectorOpIn, selection.In: corev1.NodeSelectorOpIn,
		selection.NotEquals: corev1.NodeSelectorOpNotIn, selection.NotIn: corev1.NodeSelectorOpNotIn,
		selection.Exists: corev1.NodeSelectorOpExists, selection.DoesNotExist: corev1.NodeSelectorOpDoesNotExist,
		selection.GreaterThan: corev1.NodeSelectorOpGt, selection.LessThan: corev1.NodeSelectorOpLt,
	}
	var term corev1.NodeSelectorTerm
	for _, r := range reqs {
		op, ok := ops[r.Operator()]
		if !ok { // the parser makes no other operator
			return corev1.NodeSelectorTerm{}, fmt.Errorf("operator %q of %s: not one a node selector has", r.Operator(), r.Key())
		}
		e := corev1.NodeSelectorRequirement{Key: r.Key(), Operator: op}
		if v := r.Values(); v.Len() > 0 {
			e.Values = v.List() // sorted
		}
		term.MatchExpressions = append(term.MatchExpressions, e)
	}
	return term, nil
}

// parsePreferNode parses `SELECTOR[:WEIGHT]` (weight 1 to 100, default
// defaultPreferenceWeight) into a preferred scheduling term.
func parsePreferNode(s string) (corev1.PreferredSchedulingTerm, error) {
	selector, weight := s, int64(defaultPreferenceWeight)
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		w := strings.TrimSpace(s[i+1:])
		n, err := strconv.ParseInt(w, 10, 32)
		if err != nil || n < 1 || n > 100 {
			return corev1.PreferredSchedulingTerm{}, fmt.Errorf("weight %q (after the last ':'): want an integer 1 to 100", w)
		}
		selector, weight = s[:i], n
	}
	term, err := parseNodeTerm(selector)
	if err != nil {
		return corev1.PreferredSchedulingTerm{}, err
	}
	return corev1.PreferredSchedulingTerm{Weight: int32(weight), Preference: term}, nil
}
