package wire

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Now is the clock Retry-After dates are read against (tests pin it).
var Now = time.Now

// RetryAfter reads the wait a provider asks for: Retry-After-Ms (milliseconds, sent by
// OpenAI), else Retry-After as seconds or as an HTTP date. A date in the past is a zero
// wait; an unreadable value is ignored.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && !math.IsInf(ms, 0) {
			return floatDuration(ms, time.Millisecond), true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		if secs < 0 || math.IsNaN(secs) {
			return 0, false
		}
		return floatDuration(secs, time.Second), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// floatDuration converts v units to a Duration, saturating instead of overflowing.
func floatDuration(v float64, unit time.Duration) time.Duration {
	d := v * float64(unit)
	if d >= math.MaxInt64 || math.IsInf(d, 1) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(d)
}
