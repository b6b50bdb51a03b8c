package executor_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/testutil"
)

// leaks reports whether out still gives secret away: as is, URL-unescaped, or decoded
// from any run of base64 (either alphabet, any alignment) or hex characters. It decodes
// independently of the executor, so it checks the redaction rather than restating it.
func leaks(out, secret string) bool {
	if strings.Contains(out, secret) {
		return true
	}
	for _, un := range []func(string) (string, error){url.QueryUnescape, url.PathUnescape} {
		if u, err := un(out); err == nil && strings.Contains(u, secret) {
			return true
		}
	}
	isB64 := func(r rune) bool {
		return r < 128 && (r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("+/-_", r))
	}
	for _, run := range strings.FieldsFunc(out, func(r rune) bool { return !isB64(r) }) {
		for shift := 0; shift < 4 && shift < len(run); shift++ {
			r := run[shift:]
			if len(r)%4 == 1 {
				r = r[:len(r)-1]
			}
			for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
				if b, _ := enc.DecodeString(r); bytes.Contains(b, []byte(secret)) {
					return true
				}
			}
		}
	}
	isHex := func(r rune) bool { return r >= '0' && r <= '9' || r >= 'a' && r <= 'f' || r >= 'A' && r <= 'F' }
	for _, run := range strings.FieldsFunc(out, func(r rune) bool { return !isHex(r) }) {
		for shift := 0; shift < 2 && shift < len(run); shift++ {
			h := run[shift:]
			if b, _ := hex.DecodeString(h[:len(h)/2*2]); bytes.Contains(b, []byte(secret)) {
				return true
			}
		}
	}
	return false
}

// printer is a tool that prints what its "print" argument says, in the shape "mode" asks.
func printer(t testing.TB, secrets ...string) *executor.Executor {
	t.Helper()
	reg := executor.NewRegistry()
	err := reg.Register(executor.Tool{Name: "print", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(ctx context.Context, args json.RawMessage) (any, error) {
			var in struct {
				Mode  string
				Print []string
			}
			if err := json.Unmarshal(args, &in); err != nil {
				return nil, err
			}
			switch in.Mode {
			case "fields": // one field per piece
				m := map[string]any{}
				for i, p := range in.Print {
					m["part"+string(rune('a'+i))] = p
				}
				return m, nil
			case "array":
				return map[string]any{"env": in.Print}, nil
			case "details":
				return nil, &executor.Error{Code: "tool_error", Message: "login failed", Details: map[string]any{"pieces": in.Print}}
			case "error":
				return nil, executor.NewError("tool_error", strings.Join(in.Print, ""))
			case "progress":
				for i, p := range in.Print {
					if err := executor.Progress(ctx, float64(i), 0, p); err != nil {
						return nil, err
					}
				}
				return "done", nil
			case "panic":
				panic(strings.Join(in.Print, ""))
			}
			return strings.Join(in.Print, ""), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return testutil.Must(executor.New(reg, executor.WithSecrets(secrets...)))
}

// run calls print and returns the result and the progress messages reported.
func run(ex *executor.Executor, mode string, print ...string) (toolbus.ToolResult, []string) {
	args, _ := json.Marshal(map[string]any{"mode": mode, "print": print})
	var (
		mu       sync.Mutex
		messages []string
	)
	ctx := executor.WithProgressSink(context.Background(), func(r executor.ProgressReport) {
		mu.Lock()
		messages = append(messages, r.Message)
		mu.Unlock()
	})
	res := ex.Execute(ctx, toolbus.ToolCall{CallID: "c", Tool: "print", Arguments: string(args)}, toolbus.Principal{ID: "p"})
	mu.Lock()
	defer mu.Unlock()
	return res, slices.Clone(messages)
}

// everything is all the text of a result a reader of the stream sees.
func everything(res toolbus.ToolResult) string {
	all := res.Content + "\n" + string(res.Output)
	if res.Error != nil {
		all += "\n" + res.Error.Message + "\n" + string(res.Error.Details)
	}
	return all
}

// TestSecretsRedactedInProgress: a secret a tool puts in a progress message (the
// tool.progress every role and the console read) is redacted like one in a result, and
// so is a pattern RedactText knows.
func TestSecretsRedactedInProgress(t *testing.T) {
	natsPassword := fake("pl41n-", "n4ts-", "passw0rd")
	ex := printer(t, natsPassword)
	res, msgs := run(ex, "progress", "connecting with password "+natsPassword,
		"header Authorization: Basic "+base64.StdEncoding.EncodeToString([]byte("toolbus:"+natsPassword)),
		"token "+githubOAuth)
	if res.Status != toolbus.StatusSucceeded || len(msgs) != 3 {
		t.Fatalf("status %s, %d reports", res.Status, len(msgs))
	}
	for _, m := range msgs {
		if leaks(m, natsPassword) || strings.Contains(m, githubOAuth) || !strings.Contains(m, executor.Redacted) {
			t.Errorf("progress message not redacted: %q", m)
		}
	}
}

// TestSecretsRedactedInEncodings: the secret base64-encoded (at each of the three
// alignments, in either alphabet), hex-encoded and URL-encoded is redacted from text
// results, JSON outputs and error messages; another value's encoding is left alone.
func TestSecretsRedactedInEncodings(t *testing.T) {
	secret := fake("s3cr3t/", "p@ss w0rd", "+?&")
	other := base64.StdEncoding.EncodeToString([]byte("user:password"))
	ex := printer(t, secret)
	b64 := func(enc *base64.Encoding, prefix string) string {
		return enc.EncodeToString([]byte(prefix + secret + "\n"))
	}
	forms := map[string]string{
		"basic header":        "Authorization: Basic " + b64(base64.StdEncoding, "user:"),
		"base64 offset 0":     b64(base64.StdEncoding, ""),
		"base64 offset 1":     b64(base64.StdEncoding, "x"),
		"base64 offset 2":     b64(base64.StdEncoding, "xy"),
		"base64url offset 1":  b64(base64.URLEncoding, "x"),
		"base64url raw":       b64(base64.RawURLEncoding, "xy"),
		"hex":                 "0x" + hex.EncodeToString([]byte(secret)),
		"hex upper":           strings.ToUpper(hex.EncodeToString([]byte(secret))),
		"query escaped":       "https://h/?pw=" + url.QueryEscape(secret) + "&x=1",
		"path escaped":        "https://h/" + url.PathEscape(secret) + "/x",
		"base64 of base64url": b64(base64.StdEncoding, "id="),
	}
	for name, text := range forms {
		for _, mode := range []string{"text", "array", "error"} {
			t.Run(name+"/"+mode, func(t *testing.T) {
				if !leaks(text, secret) {
					t.Fatalf("the test's own form %q does not carry the secret", text)
				}
				res, _ := run(ex, mode, text, other)
				if all := everything(res); leaks(all, secret) || res.Redactions == 0 {
					t.Fatalf("the secret is still in the result (%d redactions): %s", res.Redactions, all)
				}
				if !strings.Contains(everything(res), other) {
					t.Fatalf("another value's base64 %q was redacted: %s", other, everything(res))
				}
			})
		}
	}
}

// TestSecretsRedactedWhenSplit: a secret split across adjacent string values of one JSON
// output or error details (two fields, two array elements) is redacted piece by piece.
func TestSecretsRedactedWhenSplit(t *testing.T) {
	secret := fake("n4ts-", "Pw", "Pw", "Pw", "Pw")
	ex := printer(t, secret)
	for _, tt := range []struct {
		mode  string
		parts []string
	}{
		{"fields", []string{"pw=" + secret[:5], secret[5:] + ";"}},
		{"array", []string{secret[:3], secret[3:9], secret[9:]}},
		{"array", []string{"x", secret[:9], "", secret[9:], "y"}},
		{"details", []string{secret[:4], secret[4:]}},
		{"fields", []string{hex.EncodeToString([]byte(secret))[:7], hex.EncodeToString([]byte(secret))[7:]}},
	} {
		t.Run(tt.mode, func(t *testing.T) {
			res, _ := run(ex, tt.mode, tt.parts...)
			var joined strings.Builder
			var walk func(v any)
			walk = func(v any) {
				switch x := v.(type) {
				case string:
					joined.WriteString(x)
				case []any:
					for _, e := range x {
						walk(e)
					}
				case map[string]any:
					for _, k := range slices.Sorted(maps.Keys(x)) {
						walk(x[k])
					}
				}
			}
			raw := res.Output
			if res.Error != nil {
				raw = res.Error.Details
			}
			var v any
			if err := json.Unmarshal(raw, &v); err != nil {
				t.Fatalf("%s: %v", raw, err)
			}
			walk(v)
			if leaks(joined.String(), secret) || res.Redactions == 0 {
				t.Fatalf("the pieces still join into the secret (%d redactions): %s", res.Redactions, raw)
			}
		})
	}
}

// TestSecretsRedactedInLogs: what the executor logs of a tool (its panic value) is
// redacted too.
func TestSecretsRedactedInLogs(t *testing.T) {
	secret := fake("n4ts-", "Pw", "Pw", "Pw", "Pw")
	var buf bytes.Buffer
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "boom", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(context.Context, json.RawMessage) (any, error) { panic("cannot log in with " + secret) }}); err != nil {
		t.Fatal(err)
	}
	ex := testutil.Must(executor.New(reg, executor.WithSecrets(secret), executor.WithLogger(slog.New(slog.NewJSONHandler(&buf, nil)))))
	res := ex.Execute(context.Background(), toolbus.ToolCall{CallID: "c", Tool: "boom", Arguments: `{}`}, toolbus.Principal{})
	if res.Status != toolbus.StatusFailed || !strings.Contains(buf.String(), "tool panicked") {
		t.Fatalf("status %s, log %s", res.Status, buf.String())
	}
	if leaks(buf.String(), secret) || !strings.Contains(buf.String(), "cannot log in with "+executor.Redacted) {
		t.Fatalf("the panic value reached the log unredacted: %s", buf.String())
	}
	// What logs beside the executor (the bus worker, MCP servers) gets the same logger.
	buf.Reset()
	ex.Logger().With("server", "db").WithGroup("mcp").Warn("connection ended: "+secret, "error", errors.New("auth "+secret),
		slog.Group("headers", "authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("u:"+secret))))
	if leaks(buf.String(), secret) || strings.Count(buf.String(), executor.Redacted) != 3 {
		t.Fatalf("Logger() let the secret through: %s", buf.String())
	}
}

// FuzzRedactSecrets: whatever surrounds a secret, the text, its base64 (either
// alphabet), hex and URL encodings come out of a result without the secret, and
// redaction never breaks UTF-8.
func FuzzRedactSecrets(f *testing.F) {
	for _, s := range [][3]string{
		{"user:", "hunter2hunter2", "\n"}, {"", "n4ts-PwPwPwPw", ""}, {"x", "p@ss w0rd+?&/", "yz"},
		{"é", "😀😀secret😀", "\xff"}, {"[REDACTED]", "aaaaaaaaaa", "aaaa"}, {"REDACTED", "REDACTED]", "["},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, prefix, secret, suffix string) {
		if len(secret) < executor.MinSecretLen || strings.Contains(executor.Redacted, secret) {
			t.Skip()
		}
		whole := prefix + secret + suffix
		text := strings.Join([]string{whole, base64.StdEncoding.EncodeToString([]byte(whole)),
			base64.RawURLEncoding.EncodeToString([]byte(whole)), hex.EncodeToString([]byte(whole)),
			url.QueryEscape(whole), url.PathEscape(whole)}, " | ")
		ex := printer(t, secret)
		res, _ := run(ex, "text", text)
		if res.Status != toolbus.StatusSucceeded {
			t.Fatalf("%s: %+v", res.Status, res.Error)
		}
		// The output's JSON text may hold the secret's characters across an escape
		// ("\u0001" then "000" for a secret "00010000"): what it says is the string.
		var out string
		if err := json.Unmarshal(res.Output, &out); err != nil {
			t.Fatal(err)
		}
		if leaks(out, secret) || leaks(res.Content, secret) {
			t.Fatalf("secret %q left in %q", secret, out)
		}
	})
}
