package executor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/internal/testutil"
)

// Fake secrets are assembled at run time so no secret-looking literal sits in the source.
func fake(parts ...string) string { return strings.Join(parts, "") }

var (
	anthropicKey = fake("sk-ant-", "api03-", strings.Repeat("Ab3_", 20))
	openAIKey    = fake("sk-", "proj-", strings.Repeat("9xY", 16))
	openAILegacy = fake("sk-", strings.Repeat("a1B2", 12))
	githubPAT    = fake("github_", "pat_", strings.Repeat("11ABCDEFG0", 6))
	githubOAuth  = fake("gho_", strings.Repeat("Q1w2", 9))
	slackBot     = fake("xox", "b-", "1234567890-", "0987654321-", "AbCdEfGhIjKlMnOpQrStUvWx")
	awsKeyID     = fake("AKIA", "IOSFODNN7", "EXAMPLE")
	awsSTSKeyID  = fake("ASIA", "Y34FZKBOKMUTVV7A")
	awsSecret    = fake("wJalrXUtnFEMI/K7MDENG/", "bPxRfiCYEXAMPLEKEY")
	jwt          = fake("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9", ".", "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ", ".", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
	pemKey       = fake("-----BEGIN ", "RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1c7+9z5Pad7OejecsQ0bu3aozN3tihPmljnnudb9G3HECdnH\nlWu2/a1gB9JW5TBQ+AVpum9Okx7KfqkfBKL9mcHgSL0yWMdjMfNOqNtrQqKlN4kE\n-----END ", "RSA PRIVATE KEY-----")
	encPEM       = fake("-----BEGIN ", "ENCRYPTED PRIVATE KEY-----\nMIIFHDBOBgkqhkiG9w0BBQ0wQTApBgkqhkiG9w0BBQwwHAQI\n-----END ", "ENCRYPTED PRIVATE KEY-----")
)

func TestRedactText(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
		n    int
	}{
		{"bearer header", "Authorization: Bearer " + jwt, "Authorization: Bearer [REDACTED]", 1},
		{"bearer opaque", "curl -H 'authorization: bearer abc123def456ghi789'", "curl -H 'authorization: bearer [REDACTED]'", 1},
		{"bearer prose kept", "use a Bearer token in the header", "use a Bearer token in the header", 0},
		{"basic auth", "Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic [REDACTED]", 1},
		{"basic prose kept", "a basic understanding of things", "a basic understanding of things", 0},
		{"anthropic key", "key=" + anthropicKey + " end", "key=[REDACTED] end", 1},
		{"openai project key", `"api_key": "` + openAIKey + `"`, `"api_key": "[REDACTED]"`, 1},
		{"openai legacy key", openAILegacy, "[REDACTED]", 1},
		{"sk prose kept", "the task-force met; risk-assessment-document-final-version", "the task-force met; risk-assessment-document-final-version", 0},
		{"github pat", "token " + githubPAT, "token [REDACTED]", 1},
		{"github oauth", githubOAuth + ",", "[REDACTED],", 1},
		{"slack", "SLACK_TOKEN=" + slackBot, "SLACK_TOKEN=[REDACTED]", 1},
		{"aws key id", "id " + awsKeyID + " and " + awsSTSKeyID, "id [REDACTED] and [REDACTED]", 2},
		{"aws key id embedded kept", "X" + awsKeyID + "X", "X" + awsKeyID + "X", 0},
		{"aws secret env", "aws_secret_access_key=" + awsSecret, "aws_secret_access_key=[REDACTED]", 1},
		{"aws secret ini", "aws_secret_access_key = " + awsSecret + "\n", "aws_secret_access_key = [REDACTED]\n", 1},
		{"aws secret json", `{"AWS_SECRET_ACCESS_KEY":"` + awsSecret + `"}`, `{"AWS_SECRET_ACCESS_KEY":"[REDACTED]"}`, 1},
		{"aws secret camel", `SecretAccessKey: ` + awsSecret, `SecretAccessKey: [REDACTED]`, 1},
		{"pem", "key:\n" + pemKey + "\ndone", "key:\n[REDACTED]\ndone", 1},
		{"pem encrypted", encPEM, "[REDACTED]", 1},
		{"pem without end", "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\"tail", "[REDACTED]\"tail", 1},
		{"pem public key kept", "-----BEGIN PUBLIC KEY-----\nMIIBIjAN\n-----END PUBLIC KEY-----", "-----BEGIN PUBLIC KEY-----\nMIIBIjAN\n-----END PUBLIC KEY-----", 0},
		{"url password", "postgres://app:p%40ss-w0rd@db.internal:5432/prod", "postgres://app:[REDACTED]@db.internal:5432/prod", 1},
		{"url empty user", "redis://:hunter2@cache:6379", "redis://:[REDACTED]@cache:6379", 1},
		{"url without password kept", "https://user@example.com/x and http://host:8080/path?a=b@c", "https://user@example.com/x and http://host:8080/path?a=b@c", 0},
		{"jwt", "token=" + jwt, "token=[REDACTED]", 1},
		{"nothing", "plain text with numbers 12345 and words", "plain text with numbers 12345 and words", 0},
		{"utf8 around", "é " + openAIKey + " 😀", "é [REDACTED] 😀", 1},
		{"several", awsKeyID + " " + githubOAuth + " " + slackBot, "[REDACTED] [REDACTED] [REDACTED]", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, n := executor.RedactText(tt.in)
			if got != tt.want || n != tt.n {
				t.Errorf("RedactText(%q)\n = %q, %d\nwant %q, %d", tt.in, got, n, tt.want, tt.n)
			}
			if again, n := executor.RedactText(got); again != got || n != 0 {
				t.Errorf("not idempotent: %q -> %q (%d)", got, again, n)
			}
		})
	}
}

func TestRedactKeepsJSONValid(t *testing.T) {
	doc, _ := json.Marshal(map[string]any{"pem": pemKey, "url": "mysql://root:toor@db/x", "auth": "Bearer " + jwt,
		"nested": []string{awsKeyID, "aws_secret_access_key=" + awsSecret}})
	got, n := executor.RedactText(string(doc))
	if !json.Valid([]byte(got)) || n != 5 {
		t.Fatalf("redacted JSON (%d) invalid or incomplete: %s", n, got)
	}
	for _, s := range []string{"MIIE", "toor", awsKeyID, awsSecret, "SflKxw"} {
		if strings.Contains(got, s) {
			t.Errorf("%q left in %s", s, got)
		}
	}
}

func FuzzRedact(f *testing.F) {
	for _, s := range []string{
		"", "plain", "Bearer " + jwt, "Basic dXNlcjpwYXNzd29yZA==", anthropicKey, openAIKey, githubPAT, githubOAuth, slackBot,
		awsKeyID + awsKeyID, "aws_secret_access_key=" + awsSecret, pemKey, encPEM, "-----BEGIN PRIVATE KEY-----",
		"https://u:p@h", "a://b:c@d://e:f@g", `{"secret_access_key":12345678901234567890}`, `{"secretAccessKey":1e+1000000000000000}`, jwt + "." + jwt, `{"k":"Bearer x\"y"}`, "bearer bearer bearer abcdefgh1",
		"\xff\xfe sk-" + strings.Repeat("1", 30), "ghp_" + strings.Repeat("é", 30), "x://:[REDACTED]@",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out, n := executor.RedactText(s)
		if n < 0 || (n == 0 && out != s) {
			t.Fatalf("count %d for %q -> %q", n, s, out)
		}
		if utf8.ValidString(s) && !utf8.ValidString(out) {
			t.Fatalf("invalid UTF-8 from valid input %q: %q", s, out)
		}
		if again, n2 := executor.RedactText(out); n2 != 0 || again != out {
			t.Fatalf("second pass found %d more in %q: %q", n2, out, again)
		}
		if json.Valid([]byte(s)) && !json.Valid([]byte(out)) {
			t.Fatalf("redaction broke JSON %q: %q", s, out)
		}
	})
}

// TestWithSecretsRedactsByValue: the values of the process's own secrets are replaced
// wherever a tool puts them (text, structured output, error message), even when they
// match no pattern; values shorter than MinSecretLen are not (they would hit words).
func TestWithSecretsRedactsByValue(t *testing.T) {
	natsPassword := fake("pl41n-", "n4ts-", "passw0rd")
	reg := executor.NewRegistry()
	echo := func(ctx context.Context, args json.RawMessage) (any, error) {
		var in struct{ Mode string }
		_ = json.Unmarshal(args, &in)
		switch in.Mode {
		case "json":
			return map[string]any{"env": []any{"TOOLBUS_NATS_PASSWORD=" + natsPassword, "short"}, natsPassword: 1}, nil
		case "error":
			return nil, executor.NewError("tool_error", "login failed with "+natsPassword+" (short)")
		}
		return "PASSWORD=" + natsPassword + " and again " + natsPassword + "; short", nil
	}
	if err := reg.Register(executor.Tool{Name: "echo", Description: "echoes", InputSchema: json.RawMessage(`{"type":"object"}`), Func: echo}); err != nil {
		t.Fatal(err)
	}
	e := testutil.Must(executor.New(reg, executor.WithSecrets(natsPassword, "short", "")))
	for _, mode := range []string{"text", "json", "error"} {
		t.Run(mode, func(t *testing.T) {
			res := e.Execute(context.Background(), toolbus.ToolCall{CallID: "c", Tool: "echo", Arguments: `{"mode":"` + mode + `"}`}, toolbus.Principal{ID: "p"})
			all := res.Content + string(res.Output)
			if res.Error != nil {
				all += res.Error.Message
			}
			if strings.Contains(all, natsPassword) {
				t.Fatalf("the secret value reached the result: %s", all)
			}
			if !strings.Contains(all, executor.Redacted) || res.Redactions == 0 {
				t.Fatalf("nothing redacted (%d): %s", res.Redactions, all)
			}
			if !strings.Contains(all, "short") {
				t.Fatalf("a value under MinSecretLen was redacted: %s", all)
			}
			if len(res.Output) > 0 && !json.Valid(res.Output) {
				t.Fatalf("output is no longer JSON: %s", res.Output)
			}
		})
	}
}

// TestAddSecretsRedactsFromThenOn: a value added while the executor runs (an OAuth
// access token obtained after New) is redacted in results and log lines from then on.
func TestAddSecretsRedactsFromThenOn(t *testing.T) {
	const token = "tok-added-after-new-0123"
	reg := executor.NewRegistry()
	if err := reg.Register(executor.Tool{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`),
		Func: func(context.Context, json.RawMessage) (any, error) { return "the token is " + token, nil }}); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	e := testutil.Must(executor.New(reg, executor.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))))
	call := toolbus.ToolCall{CallID: "c1", Tool: "echo", Arguments: `{}`}
	if r := e.Execute(context.Background(), call, toolbus.Principal{}); !strings.Contains(string(r.Output), token) {
		t.Fatalf("before AddSecrets the output is the tool's: %s", r.Output)
	}
	e.AddSecrets(token)
	r := e.Execute(context.Background(), call, toolbus.Principal{})
	if strings.Contains(string(r.Output), token) || !strings.Contains(string(r.Output), executor.Redacted) {
		t.Fatalf("after AddSecrets the token is redacted: %s", r.Output)
	}
	e.Logger().Info("token " + token)
	if strings.Contains(logs.String(), token) {
		t.Fatalf("a log line carries the added secret: %s", logs.String())
	}
}
