package executor

import (
	"maps"
	"slices"
	"strings"
)

// Secrets split across strings. A tool can print a secret in pieces: two fields of one
// JSON output ({"user":"...","pass_a":"sec","pass_b":"ret"}) or two elements of an
// array. Value matching finds the pieces only together, so split runs over the string
// values of one JSON value in the order they are written (object keys sorted, as the
// canonical encoding writes them): wherever the concatenation of adjacent strings holds
// a secret value or one of its encodings, each piece of it is replaced. Object keys are
// not part of the concatenation (each key is redacted on its own), and pieces in
// different payloads (two progress messages, two results) are not joined.

// split redacts the secret values that v's string values hold only together, and
// returns the new value and the number of secrets found.
func (sv secretValues) split(v any) (any, int) {
	if len(sv) == 0 {
		return v, 0
	}
	var strs []string
	walkStrings(v, func(s string) (string, bool) { strs = append(strs, s); return s, false })
	if len(strs) < 2 {
		return v, 0
	}
	cuts, n := sv.spans(strs)
	if n == 0 {
		return v, 0
	}
	i := 0
	v = walkStrings(v, func(s string) (string, bool) {
		c := cuts[i]
		i++
		return cutOut(s, c), len(c) > 0
	})
	return v, n
}

// spans finds the secret values in the concatenation of strs that cross a boundary
// between strings, and returns for each string the byte ranges to replace.
func (sv secretValues) spans(strs []string) ([][][2]int, int) {
	starts := make([]int, len(strs)+1)
	for i, s := range strs {
		starts[i+1] = starts[i] + len(s)
	}
	all := strings.Join(strs, "")
	var cuts [][][2]int
	n := 0
	for _, f := range sv {
		for from := 0; ; {
			j := strings.Index(all[from:], f)
			if j < 0 {
				break
			}
			a, b := from+j, from+j+len(f)
			from = b
			first := upperBound(starts, a) - 1
			last := upperBound(starts, b-1) - 1
			if first == last {
				continue // inside one string: already redacted on its own
			}
			if cuts == nil {
				cuts = make([][][2]int, len(strs))
			}
			for k := first; k <= last; k++ {
				lo, hi := max(a, starts[k])-starts[k], min(b, starts[k+1])-starts[k]
				if lo < hi {
					cuts[k] = append(cuts[k], [2]int{lo, hi})
				}
			}
			n++
		}
	}
	return cuts, n
}

// upperBound returns the index of the first element of sorted greater than x.
func upperBound(sorted []int, x int) int {
	i, _ := slices.BinarySearchFunc(sorted, x, func(e, t int) int {
		if e <= t {
			return -1
		}
		return 1
	})
	return i
}

// cutOut replaces the byte ranges of s (possibly overlapping) with Redacted.
func cutOut(s string, ranges [][2]int) string {
	if len(ranges) == 0 {
		return s
	}
	slices.SortFunc(ranges, func(x, y [2]int) int { return x[0] - y[0] })
	var b strings.Builder
	last := 0
	for _, r := range ranges {
		if r[1] <= last {
			continue
		}
		if r[0] >= last {
			b.WriteString(s[last:r[0]])
			b.WriteString(Redacted)
		}
		last = r[1]
	}
	b.WriteString(s[last:])
	return b.String()
}

// walkStrings calls f on every string value of v (not object keys), in the canonical
// order, and puts back what f returns when it reports a change (boxing an unchanged
// string again would allocate).
func walkStrings(v any, f func(string) (string, bool)) any {
	switch x := v.(type) {
	case string:
		if s, changed := f(x); changed {
			return s
		}
	case []any:
		for i, e := range x {
			if s, ok := e.(string); ok {
				if s, changed := f(s); changed {
					x[i] = s
				}
				continue
			}
			walkStrings(e, f)
		}
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if s, ok := x[k].(string); ok {
				if s, changed := f(s); changed {
					x[k] = s
				}
				continue
			}
			walkStrings(x[k], f)
		}
	}
	return v
}
