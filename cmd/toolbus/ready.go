package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/toolbus/toolbus/internal/door"
)

// cmdReady asks this host's /readyz (at TOOLBUS_METRICS_ADDR, or the URL given) and exits
// 0 when it answers 200: the health check of images without a shell or curl (compose's
// healthcheck runs `toolbus ready` in the container).
func cmdReady(ctx context.Context, cfg Config, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ready", "ready [URL]   (exit 0 when /readyz at TOOLBUS_METRICS_ADDR, or URL, answers 200)", stderr)
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	u := fs.Arg(0)
	if u == "" {
		if cfg.MetricsAddr == "" {
			return &exitError{code: 2, msg: "ready: set TOOLBUS_METRICS_ADDR (the role serves /readyz there) or give the URL"}
		}
		host, port, err := net.SplitHostPort(cfg.MetricsAddr)
		if err != nil {
			return &exitError{code: 2, msg: fmt.Sprintf("ready: TOOLBUS_METRICS_ADDR %q: %v", cfg.MetricsAddr, err)}
		}
		if host == "" || door.IsWildcard(host) {
			host = "127.0.0.1"
		}
		u = "http://" + net.JoinHostPort(host, port) + "/readyz"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return &exitError{code: 2, msg: "ready: " + err.Error()}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return &exitError{code: 1, msg: "ready: " + err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return &exitError{code: 1, msg: fmt.Sprintf("ready: %s answered %d: %s", u, resp.StatusCode, body)}
	}
	fmt.Fprintf(stdout, "ready: %s\n", u)
	return nil
}
