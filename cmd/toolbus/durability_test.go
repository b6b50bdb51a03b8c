package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
)

// TOOLBUS_DURABILITY picks the embedded server's fsync mode; a bad value is an error.
func TestDurabilityMode(t *testing.T) {
	for _, c := range []struct {
		mode   string
		strict bool
	}{{"", false}, {"default", false}, {"strict", true}, {"STRICT", true}} {
		t.Run("mode="+c.mode, func(t *testing.T) {
			cfg, err := node.Load()
			if err != nil {
				t.Fatal(err)
			}
			cfg.URL, cfg.DataDir, cfg.Durability = "", t.TempDir(), c.mode
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			conn, err := node.Open(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), true)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if got := conn.Server.SyncAlways(); got != c.strict {
				t.Fatalf("TOOLBUS_DURABILITY=%q: sync always = %v, want %v", c.mode, got, c.strict)
			}
		})
	}
	cfg, err := node.Load()
	if err != nil {
		t.Fatal(err)
	}
	cfg.URL, cfg.DataDir, cfg.Durability = "", t.TempDir(), "paranoid"
	if _, err := node.Open(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), true); err == nil {
		t.Fatal("TOOLBUS_DURABILITY=paranoid accepted")
	}
}
