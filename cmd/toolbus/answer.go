package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
	"github.com/toolbus/toolbus/decide"
	"github.com/toolbus/toolbus/events"
)

// cmdAnswer answers the question a running call asked (executor.Ask) with one JSON
// object that its schema must accept, or declines it: the tool reads the answer and
// goes on. Only the run's principal's answer counts (the executor ignores others').
func cmdAnswer(ctx context.Context, cfg Config, log *slog.Logger, args []string, out, errOut io.Writer) error {
	fs := newFlagSet("answer", `answer <run> <call_id> '{"field": ...}' | --decline [--who name]`, errOut)
	decline := fs.Bool("decline", false, "decline to answer (the tool reads decline)")
	by := fs.String("who", "", "who answers (default $USER; in a client account its identity; only the run's principal's answer counts)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return flagError(err)
	}
	if len(pos) != 3-btoi(*decline) || !toolbus.ValidRunID(pos[0]) {
		return usageError(fs, `answer: give the run id, the call id and the answer (one JSON object), or --decline`)
	}
	c, err := node.OpenAs(ctx, cfg, log, who(*by))
	if err != nil {
		return err
	}
	defer c.Close()
	q, err := decide.OpenQuestion(ctx, c.Bus, pos[0], pos[1])
	if err != nil {
		return refusal(err)
	}
	content := ""
	if !*decline {
		content = pos[2]
	}
	a, err := decide.Answer(q, who(*by), content, *decline)
	if err != nil {
		return refusal(err)
	}
	if _, err := c.Bus.PublishEvent(ctx, events.ToolAnswerEvent(events.Source("cli", cfg.Instance), a)); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s the question of call %s %s of run %s (%q), by %s\n", map[bool]string{true: "declined", false: "answered"}[*decline], q.CallID, q.Tool, q.RunID, q.Message, a.Who)
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
