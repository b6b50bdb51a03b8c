package toolbus_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/toolbus/toolbus/internal/testutil"
)

var (
	mdFence   = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")
	mdCode    = regexp.MustCompile("`[^`\n]*`")
	mdHeading = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$`)
	mdAnchor  = regexp.MustCompile(`<a (?:id|name)="([^"]+)"`)
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdInline  = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// headingSlug is the anchor GitHub gives a heading: lower case, punctuation other than
// hyphens and underscores dropped, spaces made hyphens.
func headingSlug(h string) string {
	h = mdInline.ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// mdAnchors returns the anchors a Markdown text offers: one per heading (a repeated
// heading gets -1, -2...) and every explicit <a id>.
func mdAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range mdHeading.FindAllStringSubmatch(mdFence.ReplaceAllString(text, ""), -1) {
		s := headingSlug(m[1])
		if n, dup := seen[s]; dup {
			seen[s] = n + 1
			s += "-" + strconv.Itoa(n+1)
		} else {
			seen[s] = 0
		}
		out[s] = true
	}
	for _, m := range mdAnchor.FindAllStringSubmatch(text, -1) {
		out[m[1]] = true
	}
	return out
}

// Every relative link of the repository's Markdown (README, CONTRACT.md, docs/,
// deploy/, examples/...) names a file that exists and, into a Markdown file, an anchor
// that file has: a newcomer following the documents never lands on nothing.
func TestDocLinks(t *testing.T) {
	docs := testutil.MarkdownFiles(t, ".")
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		anchors[path] = mdAnchors(string(b))
		return anchors[path]
	}
	links := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		text := mdCode.ReplaceAllString(mdFence.ReplaceAllString(string(b), ""), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			links++
			target, anchor, _ := strings.Cut(link, "#")
			path := doc
			if target != "" {
				path = filepath.Join(filepath.Dir(doc), target)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %q: no such file %s", doc, link, path)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !anchorsOf(path)[anchor] {
				t.Errorf("%s: link %q: %s has no heading or anchor %q", doc, link, path, anchor)
			}
		}
	}
	if links < 50 {
		t.Fatalf("checked only %d relative links: is the link pattern still right?", links)
	}
}

func TestHeadingSlug(t *testing.T) {
	for _, c := range []struct{ heading, want string }{
		{"Guarantees and how they are kept", "guarantees-and-how-they-are-kept"},
		{"Eighth round (issue 28): reads of a mirrored stream, instances read by change", "eighth-round-issue-28-reads-of-a-mirrored-stream-instances-read-by-change"},
		{"Routing CPU at 1,000 tools: where it goes, designs tried", "routing-cpu-at-1000-tools-where-it-goes-designs-tried"},
		{"Over HTTP: tokens and principals", "over-http-tokens-and-principals"},
		{"`toolbus replay` and [links](x.md)", "toolbus-replay-and-links"},
		{"Progress and long-running tools", "progress-and-long-running-tools"},
	} {
		if got := headingSlug(c.heading); got != c.want {
			t.Errorf("headingSlug(%q) = %q, want %q", c.heading, got, c.want)
		}
	}
}
