package reads

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
)

// MaxFollows bounds the live follows of one identity at once (each lasts at most
// events.FollowMax): one beyond it is refused at once (status 429). They are counted
// apart from PerIdentity, so that follows never keep an identity's reads waiting.
const MaxFollows = 8

// followPoll is how often a follow looks for a new event when no doorbell rang: the
// doorbell (a subscription to the run's subjects) needs the core user's permission to
// subscribe them; without it a follow is live within this.
const followPoll = time.Second

// dispatchFollow starts a follow of the request's run in a goroutine of its own, within
// MaxFollows of the identity its subject names.
func (s *Service) dispatchFollow(ctx context.Context, m *nats.Msg) {
	toks := strings.Split(m.Subject, ".")
	if m.Reply == "" || len(toks) != 3 {
		return
	}
	id, run := toks[1], toks[2]
	key := events.FollowServicePrefix + "." + id
	busy := fmt.Sprintf("toolbus read service: %d follows of %s at once: end one, or follow again when one ends", MaxFollows, id)
	s.admit(m, key, MaxFollows, busy, func() { s.follow(ctx, id, run, m) })
}

// follow answers a follow request of identity id: when the run's first run.started
// names id a decider (the rule of every read), each stored event of the run from the
// sequence asked for, in stream order, as a direct get answers it, until the run's
// outcome (then an end), events.FollowMax (an end naming the next sequence) or the
// service stopping; a heartbeat while nothing is stored. Only stored events are sent:
// what a tenant publishes and the stream refuses is never relayed. A run that is not
// visible is answered as one that does not exist.
func (s *Service) follow(ctx context.Context, id, run string, m *nats.Msg) {
	if id == events.NoIdentityToken || events.IdentityToken(id) != id || !toolbus.ValidRunID(run) {
		s.respond(m, refusal(400, "toolbus read service: a follow names an identity and one run id"))
		return
	}
	var req events.FollowRequest
	if len(bytes.TrimSpace(m.Data)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(m.Data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			s.respond(m, refusal(400, "toolbus read service: a follow's body is {\"from_seq\":N} or empty"))
			return
		}
	}
	fctx, cancel := context.WithTimeout(ctx, events.FollowMax)
	defer cancel()
	lctx, lcancel := context.WithTimeout(fctx, requestTimeout)
	// Refused before anything else is asked of the core's JetStream: a stream info per
	// follow of another's run, 8 at a time, is on the server's one info queue.
	if !s.visible(lctx, id, run) {
		lcancel()
		s.respond(m, notFound())
		return
	}
	name := s.bus.Config().Stream
	st, err := s.stream(lctx, name)
	next := req.From
	if err == nil && next == 0 {
		var info *jetstream.StreamInfo
		if info, err = st.Info(lctx); err == nil {
			next = info.State.LastSeq + 1
		}
	}
	lcancel()
	if err != nil {
		s.respond(m, refusal(503, "toolbus read service: "+err.Error()))
		return
	}
	bell := make(chan struct{}, 1)
	if sub, err := s.bus.Conn().Subscribe(events.SubjectRun(run), func(*nats.Msg) {
		select {
		case bell <- struct{}{}:
		default:
		}
	}); err == nil {
		defer func() { _ = sub.Unsubscribe() }()
	}
	s.respond(m, followStatus(events.FollowIdle, "following run "+run+" from sequence "+strconv.FormatUint(next, 10)))
	idle := time.NewTimer(events.FollowIdleEvery)
	defer idle.Stop()
	poll := time.NewTicker(followPoll)
	defer poll.Stop()
	filter := events.SubjectRun(run)
	for {
		raw, err := events.GetMsg(fctx, st, next, filter)
		switch {
		case err == nil:
			next = raw.Sequence + 1
			s.respond(m, storedMsg(name, raw))
			if events.IsFinalOutcome(raw.Subject) {
				s.respond(m, followStatus(events.FollowEnd, "run "+run+" ended"))
				return
			}
			idle.Reset(events.FollowIdleEvery)
			continue
		case fctx.Err() != nil:
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			s.log.Warn("reads: follow", "run", run, "err", err)
			s.respond(m, refusal(503, "toolbus read service: "+err.Error()))
			return
		}
		select {
		case <-bell:
		case <-poll.C:
		case <-idle.C:
			s.respond(m, followStatus(events.FollowIdle, "no event stored"))
			idle.Reset(events.FollowIdleEvery)
		case <-fctx.Done():
			s.respond(m, followStatus(events.FollowEnd, "the follow ended ("+context.Cause(fctx).Error()+"): follow again from sequence "+strconv.FormatUint(next, 10)))
			return
		}
	}
}

// followStatus is a follow's message that carries no event.
func followStatus(code, desc string) *nats.Msg {
	h := nats.Header{}
	h.Set("Status", code)
	h.Set("Description", desc)
	return &nats.Msg{Header: h}
}
