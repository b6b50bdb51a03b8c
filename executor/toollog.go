package executor

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"
)

// Logs to the caller.
//
// A tool logs with the logger Logger(ctx) returns, with the context it was given:
// each record becomes a LogRecord handed to the call's log sink (WithLogSink), which
// the bus worker publishes as a tool.log event, and `toolbus mcp` sends to the host
// that called the tool as notifications/message at the level the host set. The message
// and the attributes are redacted as results are (the executor's secrets and their
// encodings, the built-in patterns, the tool's RedactFields keys). A record made when no
// call is running under the context (the call returned, timed out or was cancelled) is
// dropped.

// LogRecord is one line a tool logged.
type LogRecord struct {
	// Level is the MCP (syslog) level of the record: debug, info, notice, warning or
	// error (slog levels map to the nearest: below Info debug, below Warn info, below
	// Error warning, else error).
	Level   string
	Message string
	// Attrs are the record's attributes as a canonical JSON object (nil when none).
	Attrs json.RawMessage
	At    time.Time
}

// LogSink receives the log records of a running call (WithLogSink). It is called on
// the tool's goroutine and must not block.
type LogSink func(LogRecord)

type logSinkKey struct{}

// WithLogSink returns a context whose calls hand their log records to sink (the bus
// worker's publisher). Without one, Logger's records are dropped.
func WithLogSink(ctx context.Context, sink LogSink) context.Context {
	return context.WithValue(ctx, logSinkKey{}, sink)
}

// Logger returns the logger of the call running under ctx: what it logs reaches the
// run's readers and the MCP host that called the tool. Under a context that is not a
// running call's it returns a logger that drops every record.
func Logger(ctx context.Context) *slog.Logger {
	c, _ := ctx.Value(progressKey{}).(*callCtx)
	return slog.New(&callLogHandler{c: c})
}

// MCPLevel is the MCP (syslog) level of a slog level.
func MCPLevel(l slog.Level) string {
	switch {
	case l < slog.LevelInfo:
		return "debug"
	case l < slog.LevelWarn:
		return "info"
	case l < slog.LevelError:
		return "warning"
	}
	return "error"
}

// callLogHandler hands a call's records to its log sink.
type callLogHandler struct {
	c      *callCtx
	attrs  []slog.Attr
	groups []string
}

func (h *callLogHandler) Enabled(context.Context, slog.Level) bool {
	return h.c != nil && h.c.logSink != nil
}

func (h *callLogHandler) Handle(_ context.Context, r slog.Record) error {
	if !h.Enabled(context.Background(), r.Level) || !h.c.running() {
		return nil
	}
	obj := map[string]any{}
	for _, a := range h.attrs { // already under the groups opened before them
		addAttr(obj, nil, a)
	}
	r.Attrs(func(a slog.Attr) bool { addAttr(obj, h.groups, a); return true })
	h.c.logSink(MCPLevel(r.Level), r.Message, obj, r.Time)
	return nil
}

func (h *callLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	n := *h
	n.attrs = append(append([]slog.Attr(nil), h.attrs...), qualify(h.groups, as)...)
	return &n
}

func (h *callLogHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	n := *h
	n.groups = append(append([]string(nil), h.groups...), name)
	return &n
}

// qualify puts the attributes of WithAttrs under the groups opened before them.
func qualify(groups []string, as []slog.Attr) []slog.Attr {
	for i := len(groups) - 1; i >= 0; i-- {
		args := make([]any, len(as))
		for j, a := range as {
			args[j] = a
		}
		as = []slog.Attr{slog.Group(groups[i], args...)}
	}
	return as
}

// addAttr adds a (under groups) to obj as plain JSON values.
func addAttr(obj map[string]any, groups []string, a slog.Attr) {
	for _, g := range groups {
		sub, ok := obj[g].(map[string]any)
		if !ok {
			sub = map[string]any{}
			obj[g] = sub
		}
		obj = sub
	}
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		if a.Key == "" {
			for _, ga := range v.Group() {
				addAttr(obj, nil, ga)
			}
			return
		}
		for _, ga := range v.Group() {
			addAttr(obj, []string{a.Key}, ga)
		}
		return
	}
	if a.Key == "" {
		return
	}
	switch v.Kind() {
	case slog.KindTime:
		obj[a.Key] = v.Time().UTC().Format(time.RFC3339Nano)
	case slog.KindDuration:
		obj[a.Key] = v.Duration().String()
	default:
		x := v.Any()
		if err, ok := x.(error); ok {
			x = err.Error()
		}
		if _, err := json.Marshal(x); err != nil {
			x = v.String()
		}
		obj[a.Key] = x
	}
}

// running reports whether the call is still running (a record after it ended is
// dropped).
func (c *callCtx) running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.checkLocked()
	}
	return c.err == nil
}

// logSinkFor returns the function that redacts a call's records and hands them to the
// sink of ctx (nil when ctx has none).
func (c *call) logSinkFor(ctx context.Context) func(level, msg string, attrs map[string]any, at time.Time) {
	sink, _ := ctx.Value(logSinkKey{}).(LogSink)
	if sink == nil {
		return nil
	}
	sv, keys := c.e.secretValues(), c.ent.redact
	return func(level, msg string, attrs map[string]any, at time.Time) {
		rec := LogRecord{Level: level, At: at}
		rec.Message, _ = sv.text(msg)
		if len(attrs) > 0 {
			if b, err := marshalJSON(attrs); err == nil {
				if v, err := decodeJSON(b); err == nil {
					v, _ = redactValue(v, keys, sv)
					v, _ = sv.split(v)
					rec.Attrs = appendCanonical(nil, v)
				}
			}
		}
		sink(rec)
	}
}
