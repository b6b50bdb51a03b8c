package console

import (
	"testing"
	"time"
)

// TestAxis: marks start at 0, are round, increase, stay within the span, and there are
// a few of them whatever the span.
func TestAxis(t *testing.T) {
	for _, span := range []int64{1, 7, 999, 1000, 2800, 61_000, 3_600_000, 90_000_000} {
		ticks := axis(span)
		if len(ticks) < 2 && span > 1 || len(ticks) > 12 {
			t.Fatalf("span %d: %d marks %v", span, len(ticks), ticks)
		}
		if ticks[0].Pct != 0 || ticks[0].Label != "0" {
			t.Fatalf("span %d: first mark %+v", span, ticks[0])
		}
		for i := 1; i < len(ticks); i++ {
			if ticks[i].Pct <= ticks[i-1].Pct || ticks[i].Pct > 100.0001 || ticks[i].Label == ticks[i-1].Label {
				t.Fatalf("span %d: marks %v", span, ticks)
			}
		}
	}
	if got := axis(2800); got[1].Label != "500ms" || got[len(got)-1].Label != "2.5s" {
		t.Fatalf("axis(2800) = %v", got)
	}
}

// TestPretty: JSON is indented as written (key order, numbers, markup as text: the
// template escapes it), anything else is left alone.
func TestPretty(t *testing.T) {
	for in, want := range map[string]string{
		`{"b":1,"a":2.50,"s":"<i>"}`: "{\n  \"b\": 1,\n  \"a\": 2.50,\n  \"s\": \"<i>\"\n}",
		`[1,2]`:                      "[\n  1,\n  2\n]",
		`not json {`:                 `not json {`,
		`{"broken":`:                 `{"broken":`,
		`42`:                         `42`,
		``:                           ``,
	} {
		if got := pretty(in); got != want {
			t.Errorf("pretty(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDur(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "<1ms", 850 * time.Millisecond: "850ms", 1234 * time.Millisecond: "1.2s", 12 * time.Second: "12s",
		245 * time.Second: "4m05s", 2*time.Hour + 3*time.Minute: "2h03m",
	} {
		if got := dur(d); got != want {
			t.Errorf("dur(%v) = %q, want %q", d, got, want)
		}
	}
}
