package executor

import (
	"context"
	"log/slog"
)

// redactHandler redacts the executor's log lines as results are: the message and every
// string, error and Stringer value (a tool's panic value, an error it returned after
// its call was abandoned) go through the secret values and RedactText.
type redactHandler struct {
	h   slog.Handler
	box *secretBox
}

func (r *redactHandler) Enabled(ctx context.Context, l slog.Level) bool { return r.h.Enabled(ctx, l) }

func (r *redactHandler) Handle(ctx context.Context, rec slog.Record) error {
	msg, _ := r.box.load().text(rec.Message)
	out := slog.NewRecord(rec.Time, rec.Level, msg, rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(r.attr(a))
		return true
	})
	return r.h.Handle(ctx, out)
}

func (r *redactHandler) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i] = r.attr(a)
	}
	return &redactHandler{h: r.h.WithAttrs(red), box: r.box}
}

func (r *redactHandler) WithGroup(name string) slog.Handler {
	return &redactHandler{h: r.h.WithGroup(name), box: r.box}
}

// attr redacts one attribute's value (groups recursively).
func (r *redactHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		s, _ := r.box.load().text(v.String())
		return slog.String(a.Key, s)
	case slog.KindGroup:
		g := v.Group()
		red := make([]any, len(g))
		for i, e := range g {
			red[i] = r.attr(e)
		}
		return slog.Group(a.Key, red...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			s, _ := r.box.load().text(x.Error())
			return slog.String(a.Key, s)
		case interface{ String() string }:
			s, _ := r.box.load().text(x.String())
			return slog.String(a.Key, s)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
