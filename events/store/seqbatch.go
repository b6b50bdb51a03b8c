package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// DirectBatch sends one batched direct get to subject (<api prefix>.DIRECT.GET.<stream>)
// for at most batch messages from sequence from on whose subjects match filter, and
// hands each to fn with its sequence (its subject is its Nats-Subject header). It returns the sequence of the last one (0: none) and whether matching
// messages are left after it, as the server counted them. A reader that may not create
// consumers follows a stream this way: one request per batch, nothing left behind.
// It bounds an undeadlined ctx to 10 s; no answer (a request the credentials refuse is
// dropped) or a status (503: the stream serves no direct gets) is an error.
func DirectBatch(ctx context.Context, nc *nats.Conn, subject string, from uint64, filter string, batch int, fn func(seq uint64, m *nats.Msg)) (last uint64, more bool, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return 0, false, fmt.Errorf("store: batched get: %w", err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // a closed subscription
	req, _ := json.Marshal(seqBatchReq{Seq: max(from, 1), NextFor: filter, Batch: batch})
	if err := nc.PublishRequest(subject, inbox, req); err != nil {
		return 0, false, fmt.Errorf("store: batched get: %w", err)
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return last, false, fmt.Errorf("store: batched get %s from %d: %w (no answer: direct gets refused?)", subject, from, err)
		}
		if m.Header.Get("Nats-Sequence") == "" { // a status, not a stored message
			switch m.Header.Get("Status") {
			case "404": // nothing from there on
				return last, false, nil
			case "204": // end of batch: what is left after it
				pending, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
				return last, pending > 0 && last > 0, nil
			}
			return last, false, fmt.Errorf("store: batched get %s from %d: status %s %s", subject, from, m.Header.Get("Status"), m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil || seq <= last {
			return last, false, fmt.Errorf("store: batched get %s: sequence %q after %d", subject, m.Header.Get("Nats-Sequence"), last)
		}
		last = seq
		fn(seq, m)
	}
}
