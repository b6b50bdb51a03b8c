package telemetry

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// NewLogger returns the logger of level (debug, info, warn or error; empty: info) and
// format (text or json; empty: text) writing to out: what TOOLBUS_LOG_LEVEL and
// TOOLBUS_LOG_FORMAT set, alike for the toolbus binary and custom executors.
func NewLogger(level, format string, out io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	switch l := strings.ToLower(strings.TrimSpace(level)); l {
	case "":
		lvl = slog.LevelInfo
	case "debug", "info", "warn", "error":
		_ = lvl.UnmarshalText([]byte(l)) // one of slog's names: it parses
	default:
		return nil, fmt.Errorf("TOOLBUS_LOG_LEVEL %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(strings.TrimSpace(format)) {
	case "", "text":
		return slog.New(slog.NewTextHandler(out, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(out, opts)), nil
	}
	return nil, fmt.Errorf("TOOLBUS_LOG_FORMAT %q: want text or json", format)
}
