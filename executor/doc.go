// Package executor is the executor core of toolbus: it runs one LLM tool call through a
// fixed series of gates and turns whatever happens into exactly one toolbus.ToolResult.
// It is a library with no bus dependency (go list -deps links neither NATS nor CloudEvents);
// the bus worker (package executor/worker) and the tool packs are built on it.
//
// # Tools
//
// A Tool is a name, a description, a JSON Schema of its arguments object and a Func.
// Register it in a Registry (schemas are compiled once there, remote and file $refs are
// refused), or register a typed Go function with RegisterFunc, which derives the input
// schema from the Go type. Tool.Contract gives the catalog entry, which
// toolbus.OpenAITools, toolbus.AnthropicTools and toolbus.MCPTools turn into the shapes the
// model APIs want.
//
// # Gates
//
// Executor.Execute checks, in this order, and stops at the first gate that fails; the
// tool's Func runs only if gates 1 to 5 pass:
//
//  1. The tool is registered under exactly this name: else rejected / unknown_tool.
//  2. The arguments are exactly one JSON object: else rejected / invalid_arguments.
//     Empty or blank arguments are invalid (never read as {}), as are trailing commas,
//     truncated JSON, several values, and any non-object value; the message says what
//     is wrong, with the byte offset and the text near it.
//  3. The arguments match the input schema: else rejected / invalid_arguments. The
//     message lists every violation with its JSON pointer ("(root)" for the whole
//     object), and Error.Details is a []Violation, [{"path":"/limit","message":"..."}].
//     Validation uses github.com/santhosh-tekuri/jsonschema/v6 (formats asserted) on
//     every call; schemas are compiled once, at Register.
//  4. The Authorizer, if any, allows the principal: else rejected / not_authorized with
//     the authorizer's error text (or *Error message). A context already done before
//     this gate gives cancelled or timed_out.
//  5. A concurrency slot is free (Tool.MaxConcurrency); waiting for it ends with the
//     context or the tool's timeout: timed_out / timeout or cancelled / cancelled.
//  6. The Func runs in its own goroutine under min(tool timeout, ctx deadline); the
//     timeout counts from the start of Execute, so it includes the wait of gate 5.
//     The outcome is: a deadline -> timed_out / timeout (retryable); ctx cancelled ->
//     cancelled / cancelled; a panic (or runtime.Goexit) -> failed /
//     tool_internal_error, with the panic value and stack logged at error level and
//     never shown; an *Error (possibly wrapped) -> failed with its code (tool_error when
//     empty), message, retryable flag and details; any other error -> failed /
//     tool_error with the error text; otherwise succeeded. A Func that ignores its
//     context is abandoned at the deadline: Execute returns at once, while the goroutine
//     leaks until the Func returns (it keeps its concurrency slot until then; its late
//     result is discarded and logged at warn level).
//  7. If the tool has an OutputSchema, the output must match it: else failed /
//     invalid_tool_output. The bad output is not put in Output or Content, and the
//     violation messages name only paths and schema keywords, not the output's values.
//     An output that cannot be encoded as JSON (or a json.RawMessage that is not JSON)
//     is invalid_tool_output too. A nil output (nil, a nil pointer, JSON null, an empty
//     json.RawMessage) is an empty result: succeeded, Output and Content "null", not
//     checked against the schema.
//  8. The content for the model is built (see below).
//
// # Statuses and error codes
//
// Statuses are those of the contract: succeeded, failed, rejected (stopped before the
// tool ran, so before any side effect), timed_out and cancelled. Error codes are
// events.CodeUnknownTool, CodeInvalidArguments, CodeNotAuthorized, CodeTimeout,
// CodeCancelled, CodeToolError, CodeToolInternalError, CodeInvalidToolOutput, or the
// tool's own code from an *Error. Only timeout is retryable unless a tool says
// otherwise with NewRetryableError. (CodeApprovalDenied is produced by the bus worker,
// which checks approvals of NeedsApproval tools before calling Execute.)
//
// # Result content
//
// ToolResult.Content is what the model reads. It is always valid UTF-8, redacted,
// deterministic and at most MaxOutputBytes long (Tool.MaxOutputBytes, else the executor
// default, 16384), and never holds a stack trace.
//
// For a succeeded call, the output is encoded as JSON, decoded into generic values and
// re-encoded compactly with object keys sorted, so equal outputs give equal bytes
// (numbers are kept as written, HTML characters are not escaped). ToolResult.Output holds that whole JSON
// (redacted, never truncated) and Content holds the same text, truncated if needed. An
// output that is a string (a Go string, or JSON whose top level is a string) is used as
// the text itself: Content is the string, Output its JSON encoding.
//
// For every other result, Content is a small JSON object the model can act on:
//
//	{"error":{"code":"invalid_arguments","message":"...","retryable":false}}
//
// with the same code, message and retryable flag as ToolResult.Error. Error.Details
// (violations, a tool's *Error details) is for programs and is not part of Content; the
// message alone says what to fix. Long messages are cut so that the object fits in the
// bound and stays valid JSON.
//
// # Redaction
//
// Secrets are replaced with "[REDACTED]" in Output, Content, error messages and error
// details, and ToolResult.Redactions counts the replacements; progress messages
// (Progress) and what the executor logs (a tool's panic value) go through the same
// redaction. The values of WithSecrets are matched as they are and in their hex, URL
// (query and path escaping) and base64 (standard and URL alphabets, at any alignment
// inside a longer encoded text) encodings, in every string, and across adjacent string
// values of one JSON output or details (a secret split into two fields or elements is
// replaced piece by piece); a secret split across two payloads or encoded otherwise is
// not found. Error messages are also
// cut at anything that looks like a Go stack trace ("goroutine N [", "file.go:12"). RedactText finds bearer
// and basic credentials, OpenAI and Anthropic keys (sk-..., sk-ant-...), GitHub tokens
// (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_), Slack tokens (xox?-, xapp-), AWS access
// key ids (AKIA/ASIA...) and secret access keys, PEM private key blocks, passwords in
// URLs (scheme://user:[REDACTED]@host) and JWTs, in every string of a JSON output (and
// in object keys). In addition, the values of the tool's RedactFields keys, and of
// aws_secret_access_key / secretAccessKey keys, are replaced wherever they occur in the
// JSON; keys are matched ignoring case and the characters '_' and '-', so "api_key"
// also covers "apiKey" and "API-KEY". Redaction happens before truncation, so a
// truncation never cuts a secret in half and leaks its beginning.
//
// # Truncation
//
// TruncateText bounds content: it keeps a head and a tail, cut on UTF-8 boundaries, and
// puts "\n…[truncated: kept K of N bytes]…\n" between them, the marker counting inside
// the bound. ToolResult.Truncated reports N (OriginalBytes) and K (KeptBytes, the bytes of
// the original text kept, not counting the marker).
//
// # Call metadata
//
// The bus worker puts a CallInfo in the context (WithCallInfo); Execute copies its Attempt
// into ToolResult.Attempt (1 without it), and tools with side effects read the
// IdempotencyKey with CallInfoFrom.
package executor
