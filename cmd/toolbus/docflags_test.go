package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/internal/testutil"
)

// docCommand is one toolbus command line quoted in a Markdown file: a line of a code
// block or an inline code span.
type docCommand struct {
	where string // file:line
	cmd   string // the command after "toolbus"
	flags []string
}

var (
	docToolbus = regexp.MustCompile(`(?:^|[\s/(])toolbus ([a-z]+)((?: +[^\s|;&>)]+)*)`)
	helpFlag   = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9-]*)`)
	codeSpan   = regexp.MustCompile("`([^`]+)`")
)

// docCommands finds the toolbus command lines of the Markdown text: every line of a
// fenced code block and every inline code span (a span may run over the line breaks of
// its paragraph). Flags are the tokens that start with - (a lone "-" is stdin; "--"
// ends the flags, and what follows is not read). A span of flags only ("-k 4") is
// read as flags of flagsFor when that is set (a document about one command), and
// skipped otherwise: prose quotes flags of many things.
func docCommands(path, text, flagsFor string) []docCommand {
	var out []docCommand
	flagsOf := func(args string) []string {
		var flags []string
		for _, tok := range strings.Fields(args) {
			if tok == "--" {
				break
			}
			if tok == "-" || !strings.HasPrefix(tok, "-") {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimLeft(tok, "-"), "=")
			if name = strings.TrimRight(name, ",.:'\""); name != "" {
				flags = append(flags, name)
			}
		}
		return flags
	}
	add := func(line int, s string, span bool) {
		ms := docToolbus.FindAllStringSubmatch(s, -1)
		if span && len(ms) == 0 && strings.HasPrefix(s, "-") && flagsFor != "" {
			out = append(out, docCommand{where: path + ":" + strconv.Itoa(line), cmd: flagsFor, flags: flagsOf(s)})
			return
		}
		for _, m := range ms {
			out = append(out, docCommand{where: path + ":" + strconv.Itoa(line), cmd: m[1], flags: flagsOf(m[2])})
		}
	}
	var (
		para   strings.Builder
		starts []int // the offset in para of each of its lines
		first  int   // the line number of its first line
	)
	flush := func() {
		p := para.String()
		for _, m := range codeSpan.FindAllStringSubmatchIndex(p, -1) {
			line := first
			for i, off := range starts {
				if off <= m[0] {
					line = first + i
				}
			}
			add(line, p[m[2]:m[3]], true)
		}
		para.Reset()
		starts = starts[:0]
	}
	fenced := false
	for i, l := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(strings.TrimSpace(l), "```"):
			flush()
			fenced = !fenced
		case fenced:
			add(i+1, l, false)
		case strings.TrimSpace(l) == "":
			flush()
		default:
			if para.Len() == 0 {
				first = i + 1
			} else {
				para.WriteByte(' ')
			}
			starts = append(starts, para.Len())
			para.WriteString(l)
		}
	}
	flush()
	return out
}

// flagSpansOf names the command whose flags a document quotes alone, as `-k 4`.
var flagSpansOf = map[string]string{"docs/performance.md": "bench", "cmd/toolbus/internal/bench/ROUNDS.md": "bench"}

// TestDocCommandFlags holds every toolbus command line the repository's Markdown quotes
// to the CLI: the command exists, and each flag it passes is one its -h lists.
func TestDocCommandFlags(t *testing.T) {
	noServerEnv(t)
	cmds := usageCommands(t)
	flagsOf := map[string][]string{}
	for _, name := range cmds {
		if name == "version" {
			continue
		}
		code, out, errOut := cli(t, name, "-h")
		wantCode(t, name+" -h", code, 0, out, errOut)
		for _, m := range helpFlag.FindAllStringSubmatch(out, -1) {
			flagsOf[name] = append(flagsOf[name], m[1])
		}
	}
	root := filepath.Join("..", "..")
	var checked int
	for _, path := range testutil.MarkdownFiles(t, root) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, path)
		for _, dc := range docCommands(rel, string(b), flagSpansOf[filepath.ToSlash(rel)]) {
			if !slices.Contains(cmds, dc.cmd) {
				continue // prose such as "toolbus runs" in a sentence names no command line
			}
			checked++
			for _, f := range dc.flags {
				if !slices.Contains(flagsOf[dc.cmd], f) {
					t.Errorf("%s: toolbus %s has no flag -%s (its -h lists %v)", dc.where, dc.cmd, f, flagsOf[dc.cmd])
				}
			}
		}
	}
	t.Logf("%d toolbus command lines checked", checked)
	if checked < 30 {
		t.Fatalf("found only %d toolbus command lines in the Markdown files", checked)
	}
}

// TestDocCommands checks the parser on lines the docs use.
func TestDocCommands(t *testing.T) {
	text := "Run `bin/toolbus bench -k 4 -storage file -cpuprofile cpu.prof`, then\n" +
		"```\n" +
		"toolbus run --max-steps=3 \"what is up?\" | jq .\n" +
		"echo '{}' | toolbus call noop - --timeout 2s -- -notaflag\n" +
		"```\n" +
		"and `toolbus runs` in prose, `bin/toolbus bench\n-hops -k 1` over two lines,\n" +
		"then `-repeat 3` alone.\n"
	got := docCommands("x.md", text, "bench")
	want := []docCommand{
		{"x.md:1", "bench", []string{"k", "storage", "cpuprofile"}},
		{"x.md:3", "run", []string{"max-steps"}},
		{"x.md:4", "call", []string{"timeout"}},
		{"x.md:6", "runs", nil},
		{"x.md:6", "bench", []string{"hops", "k"}},
		{"x.md:8", "bench", []string{"repeat"}},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d commands %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i].where != want[i].where || got[i].cmd != want[i].cmd || !slices.Equal(got[i].flags, want[i].flags) {
			t.Errorf("command %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestDocCommandTable holds the table "Every command" of docs/commands.md to the usage:
// every command the usage lists has a row (the first cell names it: `toolbus x`, or
// `y` beside it in the same cell).
func TestDocCommandTable(t *testing.T) {
	section := docSection(t, "docs/commands.md", "## Every command")
	first := regexp.MustCompile("(?m)^\\| (.*?) \\|")
	word := regexp.MustCompile("`(?:toolbus )?([a-z]+)\\b")
	listed := map[string]bool{}
	for _, row := range first.FindAllStringSubmatch(section, -1) {
		for _, w := range word.FindAllStringSubmatch(row[1], -1) {
			listed[w[1]] = true
		}
	}
	for _, name := range usageCommands(t) {
		if !listed[name] {
			t.Errorf("docs/commands.md, \"Every command\": no row for toolbus %s (its usage lists it)", name)
		}
	}
}
