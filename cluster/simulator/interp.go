package simulator

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

// timing is a step's length and the part of it spent synchronizing gradients,
// both in seconds, as the traces measure them.
type timing struct{ step, sync float64 }

func (t timing) add(u timing, w float64) timing {
	return timing{t.step + w*u.step, t.sync + w*u.sync}
}

// curve is a piecewise-linear function of the local batch size, through the
// points one placement (or one nodes×replicas group) was measured at.
type curve struct {
	bsz []float64 // increasing
	at  []timing
}

// newCurve sorts the points by batch size; points measured at the same batch
// size are averaged.
func newCurve(bsz []float64, at []timing) curve {
	idx := make([]int, len(bsz))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return bsz[idx[a]] < bsz[idx[b]] })
	var c curve
	for i := 0; i < len(idx); {
		j, sum := i, timing{}
		for ; j < len(idx) && bsz[idx[j]] == bsz[idx[i]]; j++ {
			sum = sum.add(at[idx[j]], 1)
		}
		n := float64(j - i)
		c.bsz = append(c.bsz, bsz[idx[i]])
		c.at = append(c.at, timing{sum.step / n, sum.sync / n})
		i = j
	}
	return c
}

func (c curve) covers(b float64) bool {
	return len(c.bsz) > 0 && b >= c.bsz[0] && b <= c.bsz[len(c.bsz)-1]
}

// eval interpolates linearly; ok is false outside the measured range (the
// traces are not extrapolated).
func (c curve) eval(b float64) (timing, bool) {
	if !c.covers(b) {
		return timing{}, false
	}
	i := sort.SearchFloat64s(c.bsz, b) // c.bsz[i] >= b
	if c.bsz[i] == b {
		return c.at[i], true
	}
	lo, hi := c.bsz[i-1], c.bsz[i]
	w := (b - lo) / (hi - lo)
	return timing{}.add(c.at[i-1], 1-w).add(c.at[i], w), true
}

// point2 is a (nodes, replicas) pair. Both are small integers, so the
// geometric predicates below are exact in int64.
type point2 struct{ x, y int64 }

// triangulation is a Delaunay triangulation of a set of (nodes, replicas)
// points, used to interpolate linearly between the groups the traces measured.
// Points on a common circle (the measured groups lie on a lattice, so there are
// many) admit several Delaunay triangulations; insertion in sorted order with a
// strict in-circle test picks one deterministically.
type triangulation struct {
	pts  []point2
	tris [][3]int // counter-clockwise, indexes into pts
}

// orient is twice the signed area of (a, b, c): > 0 counter-clockwise.
func orient(a, b, c point2) int64 {
	return (b.x-a.x)*(c.y-a.y) - (b.y-a.y)*(c.x-a.x)
}

// inCircle is > 0 when d lies strictly inside the circle through the
// counter-clockwise triangle (a, b, c).
func inCircle(a, b, c, d point2) int64 {
	adx, ady := a.x-d.x, a.y-d.y
	bdx, bdy := b.x-d.x, b.y-d.y
	cdx, cdy := c.x-d.x, c.y-d.y
	ad := adx*adx + ady*ady
	bd := bdx*bdx + bdy*bdy
	cd := cdx*cdx + cdy*cdy
	return adx*(bdy*cd-bd*cdy) - ady*(bdx*cd-bd*cdx) + ad*(bdx*cdy-bdy*cdx)
}

// superSpan bounds the coordinates of the enclosing triangle Bowyer-Watson
// starts from. It must dwarf the data (nodes ≤ 16, replicas ≤ 64 in the
// traces) and keep inCircle's degree-4 terms inside int64.
const superSpan = 1 << 12

// newTriangulation triangulates pts (Bowyer-Watson). Coordinates must lie in
// [0, superSpan/16]; duplicates are not allowed.
func newTriangulation(pts []point2) (*triangulation, error) {
	if len(pts) < 3 {
		return nil, fmt.Errorf("triangulation needs at least 3 points, got %d", len(pts))
	}
	for _, p := range pts {
		if p.x < 0 || p.y < 0 || p.x > superSpan/16 || p.y > superSpan/16 {
			return nil, fmt.Errorf("point (%d, %d) outside the supported range [0, %d]", p.x, p.y, superSpan/16)
		}
	}
	n := len(pts)
	all := append(slices.Clone(pts),
		point2{-superSpan, -superSpan}, point2{superSpan, -superSpan}, point2{0, superSpan})
	tris := [][3]int{{n, n + 1, n + 2}}
	for i := 0; i < n; i++ {
		p := all[i]
		type edge struct{ a, b int }
		count := map[edge]int{}
		var edges []edge
		kept := tris[:0]
		var bad [][3]int
		for _, t := range tris {
			if inCircle(all[t[0]], all[t[1]], all[t[2]], p) > 0 {
				bad = append(bad, t)
			} else {
				kept = append(kept, t)
			}
		}
		for _, t := range bad {
			for k := 0; k < 3; k++ {
				a, b := t[k], t[(k+1)%3]
				key := edge{min(a, b), max(a, b)}
				if count[key] == 0 {
					edges = append(edges, edge{a, b})
				}
				count[key]++
			}
		}
		tris = kept
		for _, e := range edges {
			if count[edge{min(e.a, e.b), max(e.a, e.b)}] != 1 {
				continue // shared by two removed triangles: interior to the cavity
			}
			t := [3]int{e.a, e.b, i}
			if o := orient(all[e.a], all[e.b], p); o < 0 {
				t = [3]int{e.b, e.a, i}
			} else if o == 0 {
				continue // p lies on this boundary edge: no triangle
			}
			tris = append(tris, t)
		}
	}
	out := &triangulation{pts: all[:n]}
	for _, t := range tris {
		if t[0] < n && t[1] < n && t[2] < n {
			out.tris = append(out.tris, t)
		}
	}
	return out, nil
}

// locate returns the vertices of a triangle containing q (on its boundary
// included) and q's barycentric weights in it.
func (tr *triangulation) locate(qx, qy float64) (verts [3]int, w [3]float64, ok bool) {
	const eps = 1e-12
	for _, t := range tr.tris {
		a, b, c := tr.pts[t[0]], tr.pts[t[1]], tr.pts[t[2]]
		area := float64(orient(a, b, c))
		w0 := ((float64(b.x)-qx)*(float64(c.y)-qy) - (float64(b.y)-qy)*(float64(c.x)-qx)) / area
		w1 := ((float64(c.x)-qx)*(float64(a.y)-qy) - (float64(c.y)-qy)*(float64(a.x)-qx)) / area
		w2 := 1 - w0 - w1
		if w0 >= -eps && w1 >= -eps && w2 >= -eps {
			return t, [3]float64{max(w0, 0), max(w1, 0), max(w2, 0)}, true
		}
	}
	return verts, w, false
}

// interpolator gives the step time of a (nodes, replicas, local batch)
// configuration from measurements of others.
type interpolator interface {
	eval(nodes, replicas int, bsz float64) (timing, error)
}

// scatter interpolates step times measured at scattered (nodes, replicas)
// groups, each at several local batch sizes: linearly in the batch size within
// a group and linearly across groups on their Delaunay triangulation. Because
// every group was measured at the same batch sizes, the traces are a product
// of the (nodes, replicas) set and the batch-size axis, and a 3-D Delaunay
// triangulation of them (what the original simulator uses) splits each prism
// of this scheme into tetrahedra in one of several equally valid ways; this
// interpolant is the one that does not depend on that choice.
type scatter struct {
	tri    *triangulation
	groups []curve // by point index
}

func newScatter(keys []point2, groups []curve) (*scatter, error) {
	tri, err := newTriangulation(keys)
	if err != nil {
		return nil, err
	}
	return &scatter{tri: tri, groups: groups}, nil
}

func (s *scatter) eval(nodes, replicas int, bsz float64) (timing, error) {
	verts, w, ok := s.tri.locate(float64(nodes), float64(replicas))
	if !ok {
		return timing{}, fmt.Errorf("%d nodes × %d replicas lies outside the measured configurations", nodes, replicas)
	}
	var out timing
	for k, v := range verts {
		if w[k] == 0 {
			continue
		}
		at, ok := s.groups[v].eval(bsz)
		if !ok {
			p := s.tri.pts[v]
			return timing{}, fmt.Errorf("local batch size %g outside what %d nodes × %d replicas was measured at", bsz, p.x, p.y)
		}
		out = out.add(at, w[k])
	}
	if math.IsNaN(out.step) {
		return timing{}, fmt.Errorf("interpolation failed at %d nodes × %d replicas, batch %g", nodes, replicas, bsz)
	}
	return out, nil
}
