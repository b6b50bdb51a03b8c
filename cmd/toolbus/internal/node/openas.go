package node

import (
	"context"
	"log/slog"
)

// OpenAs opens the node for a command that acts for who (answer, approve, deny, respond,
// cancel), once this account may act for who (events.Bus.CheckBound): one home for that
// check, so a refusal names the grant before anything is read.
func OpenAs(ctx context.Context, cfg Config, log *slog.Logger, who string) (*Conn, error) {
	c, err := Open(ctx, cfg, log, false)
	if err != nil {
		return nil, err
	}
	if err := c.Bus.CheckBound(ctx, who); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
