package executor

import (
	"encoding/base64"
	"encoding/hex"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Redacted replaces every secret the executor finds.
const Redacted = "[REDACTED]"

// redactRule finds one kind of secret. re has exactly one capturing group: the secret
// span that is replaced by Redacted; the rest of the match (a "Bearer " prefix, a URL's
// scheme and user, an "aws_secret_access_key=" key) is kept.
type redactRule struct {
	name string
	// triggers are literals, one of which must occur for re to possibly match; they
	// are matched case-insensitively when fold is set (then they are lower case).
	triggers []string
	fold     bool
	re       *regexp.Regexp
	// skip, if set, keeps a candidate secret that is most likely prose.
	skip func(secret string) bool
}

// pemBody is one unit of a PEM body: base64, whitespace, RFC 1421 headers, or an
// escaped newline (a PEM block inside JSON text).
const pemBody = `(?:[A-Za-z0-9+/=\s:,.\-]|\\[nrt])`

var redactRules = []redactRule{
	{
		name:     "pem_private_key",
		triggers: []string{"PRIVATE KEY"},
		// A whole block, or (no END line) the header and the body that follows it.
		re: regexp.MustCompile(`(-----BEGIN[A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*-----(?:` + pemBody +
			`*?-----END[A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*-----|` + pemBody + `*))`),
	},
	{
		name:     "url_password",
		triggers: []string{"://"},
		re:       regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@"'\\\[\]?#<>]*:([^\s/@"'\\\[\]?#<>]+)@`),
	},
	{
		name:     "jwt",
		triggers: []string{"eyJ"},
		re:       regexp.MustCompile(`\b(eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*)`),
	},
	{
		name:     "bearer",
		triggers: []string{"bearer"},
		fold:     true,
		re:       regexp.MustCompile(`(?i)\bbearer\s+([A-Za-z0-9._~+/\-]+=*)`),
		skip:     isProseWord,
	},
	{
		name:     "basic_auth",
		triggers: []string{"basic"},
		fold:     true,
		re:       regexp.MustCompile(`(?i)\bbasic\s+([A-Za-z0-9+/]{8,}={0,2})`),
		skip:     isProseWord,
	},
	{
		name:     "openai_anthropic_key",
		triggers: []string{"sk-"},
		re:       regexp.MustCompile(`\b(sk-[A-Za-z0-9_\-]{20,})`),
		skip:     func(s string) bool { return !strings.ContainsAny(s, "0123456789") },
	},
	{
		name:     "github_token",
		triggers: []string{"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"},
		re:       regexp.MustCompile(`\b((?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})`),
	},
	{
		name:     "slack_token",
		triggers: []string{"xox", "xapp-"},
		re:       regexp.MustCompile(`\b(xox[abposr]-[A-Za-z0-9\-]{10,}|xapp-[A-Za-z0-9\-]{10,})`),
	},
	{
		name:     "aws_access_key_id",
		triggers: []string{"AKIA", "ASIA"},
		re:       regexp.MustCompile(`\b((?:AKIA|ASIA)[A-Z0-9]{16})\b`),
	},
	{
		name:     "aws_secret_access_key",
		triggers: []string{"secret"},
		fold:     true,
		re:       regexp.MustCompile(`(?i)\b(?:aws_?)?secret_?access_?key\\?["']?\s*[:=]\s*\\?["']?([A-Za-z0-9/+=]{16,})`),
		// A number (a JSON number after "secret_access_key": in JSON text) is no secret.
		skip: func(s string) bool { return strings.Trim(s, "0123456789eE+") == "" },
	},
}

// isProseWord reports whether a Bearer/Basic candidate is an ordinary word ("Bearer
// token", "basic functionality") rather than a credential.
func isProseWord(s string) bool {
	if len(s) >= 24 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i] | 0x20
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// containsFold reports whether s contains lit (lower-case ASCII) ignoring ASCII case.
func containsFold(s, lit string) bool {
	n := len(lit)
	c0 := lit[0]
	for i := 0; i+n <= len(s); i++ {
		if s[i]|0x20 != c0 {
			continue
		}
		j := 1
		for ; j < n; j++ {
			if s[i+j]|0x20 != lit[j] {
				break
			}
		}
		if j == n {
			return true
		}
	}
	return false
}

func (r *redactRule) mayMatch(s string) bool {
	for _, t := range r.triggers {
		if r.fold {
			if containsFold(s, t) {
				return true
			}
		} else if strings.Contains(s, t) {
			return true
		}
	}
	return false
}

// apply replaces the secrets r finds in s.
func (r *redactRule) apply(s string) (string, int) {
	locs := r.re.FindAllStringSubmatchIndex(s, -1)
	if len(locs) == 0 {
		return s, 0
	}
	var b strings.Builder
	n, last := 0, 0
	for _, loc := range locs {
		start, end := loc[2], loc[3]
		if start < 0 || (r.skip != nil && r.skip(s[start:end])) {
			continue
		}
		if n == 0 {
			b.Grow(len(s))
		}
		b.WriteString(s[last:start])
		b.WriteString(Redacted)
		last = end
		n++
	}
	if n == 0 {
		return s, 0
	}
	b.WriteString(s[last:])
	return b.String(), n
}

// maxRedactPasses bounds how often the rules are re-run until nothing changes (a
// replacement can, in theory, expose a new word boundary to an earlier rule).
const maxRedactPasses = 4

// RedactText replaces secrets in s with "[REDACTED]" and returns the result and the number
// of replacements. It finds bearer and basic credentials ("Bearer xxx"), OpenAI and
// Anthropic style keys (sk-..., sk-ant-...), GitHub tokens (ghp_, gho_, ghu_, ghs_, ghr_,
// github_pat_), Slack tokens (xox?-, xapp-), AWS access key ids (AKIA/ASIA + 16) and
// "aws_secret_access_key=..." values, PEM private key blocks, passwords in URLs
// (scheme://user:pass@host becomes scheme://user:[REDACTED]@host) and JWTs. Text that
// holds none of the rules' trigger literals is returned as is without running any
// regular expression. Redacting the result again finds nothing new.
//
// The output is valid UTF-8 when s is, and replacements never cross a JSON string
// boundary, so redacting JSON text keeps it valid JSON.
func RedactText(s string) (string, int) {
	total := 0
	for pass := 0; pass < maxRedactPasses; pass++ {
		changed := 0
		for i := range redactRules {
			r := &redactRules[i]
			if !r.mayMatch(s) {
				continue
			}
			var n int
			s, n = r.apply(s)
			changed += n
		}
		total += changed
		if changed == 0 {
			break
		}
	}
	return s, total
}

// MinSecretLen is the shortest secret value WithSecrets redacts: a shorter value would
// also match ordinary words and numbers.
const MinSecretLen = 8

// secretValues are the exact texts to redact wherever they occur (WithSecrets): each
// secret's value and its encodings (secretForms), longest first.
type secretValues []string

// secretBox holds the secret values of an executor: those of WithSecrets, and those
// AddSecrets adds while it runs. Readers load the current set without a lock.
type secretBox struct {
	mu  sync.Mutex // serializes add
	raw []string
	cur atomic.Pointer[secretValues]
}

// load returns the current values (none on a nil box).
func (b *secretBox) load() secretValues {
	if b == nil {
		return nil
	}
	if p := b.cur.Load(); p != nil {
		return *p
	}
	return nil
}

// add adds values (those shorter than MinSecretLen are ignored, as by newSecretValues).
func (b *secretBox) add(values ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	fresh := false
	for _, v := range values {
		if len(v) >= MinSecretLen && !slices.Contains(b.raw, v) {
			b.raw = append(b.raw, v)
			fresh = true
		}
	}
	if fresh {
		sv := newSecretValues(b.raw)
		b.cur.Store(&sv)
	}
}

// newSecretValues keeps the values of at least MinSecretLen bytes and adds their
// encodings, longest first (a form that contains another is replaced whole).
func newSecretValues(values []string) secretValues {
	var out secretValues
	for _, v := range values {
		if len(v) < MinSecretLen || strings.Contains(Redacted, v) {
			continue
		}
		for _, f := range secretForms(v) {
			if len(f) >= MinSecretLen && !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// secretForms returns v and the forms a tool prints it in: hexadecimal (lower and upper
// case), URL encoding (query and path escaping) and base64 (standard and URL alphabets).
// A value base64-encoded inside a longer text (a "user:secret" header, a file) is
// encoded at one of three alignments; each form is the part of the encoding that only
// the value's bytes decide (the characters that mix in a neighbour's bits are left
// out), so it is found whatever surrounds the value.
func secretForms(v string) []string {
	h := hex.EncodeToString([]byte(v))
	forms := []string{v, h, strings.ToUpper(h), url.QueryEscape(v), url.PathEscape(v)}
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for k := range 3 {
			forms = append(forms, base64Core(enc, v, k))
		}
	}
	return forms
}

// base64Core returns the characters of the base64 encoding of v, preceded by k bytes,
// that depend on v's bytes alone.
func base64Core(enc *base64.Encoding, v string, k int) string {
	b := enc.EncodeToString(append(make([]byte, k, k+len(v)), v...))
	start := [3]int{0, 2, 3}[k] // the first characters hold bits of the k bytes before
	end := len(b)
	if (k+len(v))%3 != 0 {
		end-- // the last character holds bits of the byte after v
	}
	return b[start:end]
}

// text replaces the secret values in s, then what RedactText finds.
func (sv secretValues) text(s string) (string, int) {
	s, n := sv.literal(s)
	s, m := RedactText(s)
	return s, n + m
}

// literal replaces the secret values (and their encodings) in s.
func (sv secretValues) literal(s string) (string, int) {
	n := 0
	for _, v := range sv {
		if c := strings.Count(s, v); c > 0 {
			s = strings.ReplaceAll(s, v, Redacted)
			n += c
		}
	}
	return s, n
}

// sink returns s with each report's message redacted as results are (nil for nil).
func (sv secretValues) sink(s ProgressSink) ProgressSink {
	if s == nil {
		return nil
	}
	return func(r ProgressReport) {
		r.Message, _ = sv.text(r.Message)
		s(r)
	}
}

// redactValue redacts a decoded JSON value (map[string]any, []any, string, json.Number,
// bool, nil) in place where possible and returns the new value and the number of
// replacements: values of keys in keys (normalized, see normalizeKey) become Redacted,
// and every string (and object key) goes through RedactText and the secret values.
func redactValue(v any, keys []string, sv secretValues) (any, int) {
	switch x := v.(type) {
	case string:
		s, n := sv.text(x)
		return s, n
	case []any:
		total := 0
		for i, e := range x {
			var n int
			x[i], n = redactValue(e, keys, sv)
			total += n
		}
		return x, total
	case map[string]any:
		total := 0
		var renames [][2]string
		for k, e := range x {
			if isRedactKey(k, keys) {
				if s, ok := e.(string); ok && s == Redacted {
					continue
				}
				x[k] = Redacted
				total++
				continue
			}
			var n int
			x[k], n = redactValue(e, keys, sv)
			total += n
			if nk, n := sv.text(k); n > 0 {
				renames = append(renames, [2]string{k, nk})
				total += n
			}
		}
		for _, rn := range renames {
			x[rn[1]] = x[rn[0]]
			delete(x, rn[0])
		}
		return x, total
	}
	return v, 0
}

func isRedactKey(k string, keys []string) bool {
	for _, f := range keys {
		if keyMatches(k, f) {
			return true
		}
	}
	return false
}

// keyMatches reports whether k equals norm (see normalizeKey) ignoring ASCII case and
// the characters '_' and '-', without allocating.
func keyMatches(k, norm string) bool {
	j := 0
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c == '_' || c == '-' {
			continue
		}
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if j >= len(norm) || norm[j] != c {
			return false
		}
		j++
	}
	return j == len(norm)
}
