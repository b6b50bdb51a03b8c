package executor

import (
	"strconv"
	"unicode/utf8"
)

// truncation marker parts: "\n…[truncated: kept K of N bytes]…\n".
const (
	markerHead = "\n…[truncated: kept "
	markerMid  = " of "
	markerTail = " bytes]…\n"
	// minKeep is the least text worth keeping around a marker; below it TruncateText
	// cuts the head only.
	minKeep = 16
)

func markerLen(kept, total int) int {
	return len(markerHead) + len(markerMid) + len(markerTail) + digits(kept) + digits(total)
}

func digits(n int) int {
	d := 1
	for n >= 10 {
		n /= 10
		d++
	}
	return d
}

// TruncateText bounds s to max bytes. When s is longer, it keeps a head and a tail of s
// and puts the marker "\n…[truncated: kept K of N bytes]…\n" between them, where K is the
// number of bytes of s kept and N is len(s); the marker counts inside max. Cuts never
// split a UTF-8 sequence, so the result is valid UTF-8 when s is. kept is len(s) when
// nothing was cut. When max is too small to hold the marker, only a head of s is kept.
func TruncateText(s string, max int) (out string, kept int) {
	n := len(s)
	if n <= max {
		return s, n
	}
	if max <= 0 {
		return "", 0
	}
	budget := max - markerLen(n, n) // K <= n, so this marker is the longest
	if budget < minKeep {
		h := cutBefore(s, max)
		return s[:h], h
	}
	headWant := budget - budget/2
	tailWant := budget / 2
	h := cutBefore(s, headWant)
	t := cutAfter(s, n-tailWant)
	kept = h + (n - t)
	b := make([]byte, 0, h+markerLen(kept, n)+(n-t))
	b = append(b, s[:h]...)
	b = append(b, markerHead...)
	b = strconv.AppendInt(b, int64(kept), 10)
	b = append(b, markerMid...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, markerTail...)
	b = append(b, s[t:]...)
	return string(b), kept
}

// cutBefore returns the largest i <= at that does not split a UTF-8 sequence of s.
func cutBefore(s string, at int) int {
	if at >= len(s) {
		return len(s)
	}
	for i := at; i > 0 && at-i < utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			return i
		}
	}
	if at < utf8.UTFMax {
		return 0
	}
	return at // not valid UTF-8 here anyway
}

// cutAfter returns the smallest i >= at that does not split a UTF-8 sequence of s.
func cutAfter(s string, at int) int {
	if at <= 0 {
		return 0
	}
	for i := at; i < len(s) && i-at < utf8.UTFMax; i++ {
		if utf8.RuneStart(s[i]) {
			return i
		}
	}
	if len(s)-at < utf8.UTFMax {
		return len(s)
	}
	return at
}
