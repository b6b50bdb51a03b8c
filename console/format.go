package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/toolbus/toolbus/audit"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

// funcs are the templates' helpers. None returns HTML: everything stays text for
// html/template to escape.
func funcs() template.FuncMap {
	return template.FuncMap{
		// x is a position on the 0-1000 axis of a timeline row, from a percentage.
		"x":      func(pct float64) string { return fmt.Sprintf("%.1f", pct*10) },
		"ms":     ms,
		"dur":    dur,
		"pretty": pretty,
		// model names a run's model; a script the run carries is named by its size.
		"model": audit.ModelName,
		"rawjson": func(b json.RawMessage) string {
			return pretty(string(b))
		},
		"unixms": func(t time.Time) int64 { return t.UnixMilli() },
		// since is the time elapsed since t, as the page's script keeps counting it.
		"since": func(t time.Time) string { return dur(time.Since(t)) },
		"stamp": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
		// showCode reports whether a code says more than the status it goes with (a
		// cancelled run's code is "cancelled": shown once).
		"showCode": func(status, code string) bool { return code != "" && code != status },
	}
}

// ms renders a duration in milliseconds.
func ms(v int64) string {
	if v <= 0 {
		return "<1ms"
	}
	return dur(time.Duration(v) * time.Millisecond)
}

// dur renders a duration for a person: 850ms, 12.3s, 4m05s, 2h03m.
func dur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return "<1ms"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	}
	return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
}

// pretty indents s when it is JSON (keys in their order, numbers as written, no HTML
// escaping: the template escapes); anything else is returned as is.
func pretty(s string) string {
	t := strings.TrimSpace(s)
	if t == "" || (t[0] != '{' && t[0] != '[') {
		return s
	}
	var b bytes.Buffer
	if json.Indent(&b, []byte(t), "", "  ") != nil {
		return s
	}
	return b.String()
}

// tick is one labelled mark of a time axis, at Pct percent of its length.
type tick struct {
	Pct   float64
	Label string
}

// axis returns the marks of a time axis span milliseconds long: 0 and round steps
// (1, 2 or 5 times a power of ten) that give at most about six marks.
func axis(span int64) []tick {
	if span <= 0 {
		span = 1
	}
	raw := float64(span) / 6
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	step := pow
	for _, m := range []float64{1, 2, 5, 10} {
		if m*pow >= raw {
			step = m * pow
			break
		}
	}
	step = max(step, 1)
	var out []tick
	for v := 0.0; v <= float64(span)+0.5; v += step {
		out = append(out, tick{Pct: v * 100 / float64(span), Label: axisLabel(int64(v))})
	}
	return out
}

// axisLabel renders an axis mark: 0, 250ms, 1.5s, 2m.
func axisLabel(v int64) string {
	d := time.Duration(v) * time.Millisecond
	switch {
	case v == 0:
		return "0"
	case d < time.Second:
		return fmt.Sprintf("%dms", v)
	case d < time.Minute:
		return trimZero(fmt.Sprintf("%.1f", d.Seconds())) + "s"
	case d < time.Hour:
		return trimZero(fmt.Sprintf("%.1f", d.Minutes())) + "m"
	}
	return trimZero(fmt.Sprintf("%.1f", d.Hours())) + "h"
}

func trimZero(s string) string { return strings.TrimSuffix(s, ".0") }

func itoa(n int) string { return strconv.Itoa(n) }
