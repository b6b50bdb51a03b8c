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
	"github.com/toolbus/toolbus/events/store"
)

// scope says which subjects of a stream a client may read, and of which run: runOf
// returns the run a subject (a literal one, no wildcard) belongs to, "" when it belongs
// to none (the catalog); ok is false for a subject outside what the stream offers.
type scope func(subject string) (run string, ok bool)

// scopes are the streams the service reads, by name. The buckets of claims, instances
// and secrets are not among them: a client needs none.
func (s *Service) scopes() map[string]scope {
	stream := s.bus.Config().Stream
	inRun := func(prefix string, pos int) scope {
		return func(subject string) (string, bool) {
			rest, ok := strings.CutPrefix(subject, prefix)
			if !ok {
				return "", false
			}
			toks := strings.Split(rest, ".")
			if len(toks) <= pos || !toolbus.ValidRunID(toks[pos]) {
				return "", false
			}
			return toks[pos], true
		}
	}
	kv := store.KeyPrefix
	return map[string]scope{
		stream:                                    inRun(events.SubjectPrefix+".", 0),
		store.BucketStream(store.BucketRuns):      inRun(kv(store.BucketRuns), 0),
		store.BucketStream(store.BucketHistory):   inRun(kv(store.BucketHistory), 0),
		store.BucketStream(store.BucketApprovals): inRun(kv(store.BucketApprovals), 0),
		store.BucketStream(store.BucketOutputs):   inRun(kv(store.BucketOutputs), 1),
		store.BucketStream(store.BucketTools): func(subject string) (string, bool) {
			key, ok := strings.CutPrefix(subject, kv(store.BucketTools))
			return "", ok && toolbus.ValidToolName(key)
		},
	}
}

// api answers one request of the JetStream API subset (op is the API subject after the
// prefix: STREAM.INFO.<stream>, DIRECT.GET.<stream>[.<subject>]).
func (s *Service) api(ctx context.Context, id, op string, body []byte) *nats.Msg {
	scopes := s.scopes()
	switch {
	case strings.HasPrefix(op, "STREAM.INFO."):
		name := strings.TrimPrefix(op, "STREAM.INFO.")
		if _, ok := scopes[name]; !ok {
			return apiError(404, 10059, "stream not found")
		}
		return s.streamInfo(ctx, name)
	case strings.HasPrefix(op, "DIRECT.GET."):
		name, subject, _ := strings.Cut(strings.TrimPrefix(op, "DIRECT.GET."), ".")
		in, ok := scopes[name]
		if !ok {
			return notFound()
		}
		req, err := directRequest(subject, body)
		if err != nil {
			return refusal(400, "toolbus read service: "+err.Error())
		}
		// The run's token is literal (a valid run id): wildcards may follow it only.
		target := req.NextFor + req.LastFor
		run, ok := in(target)
		if !ok {
			return refusal(400, "toolbus read service: "+target+" is not a subject of "+name+" a client reads: name one run (no wildcard in its token)")
		}
		if run != "" && !s.visible(ctx, id, run) {
			return notFound()
		}
		return s.directGet(ctx, name, req)
	}
	return apiError(403, 10000, "toolbus read service: "+op+" is not offered to client accounts: it answers STREAM.INFO and DIRECT.GET")
}

// getRequest is a direct get a client may send: the next message on a subject from a
// sequence, or the last message on a subject. No batch, no multi-subject get, no get by
// sequence alone.
type getRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
}

// directRequest reads a direct get's request: subject is the last-by-subject form's
// subject ("" in the body form).
func directRequest(subject string, body []byte) (getRequest, error) {
	if subject != "" {
		if len(bytes.TrimSpace(body)) > 0 {
			return getRequest{}, errors.New("a direct get by subject carries no body")
		}
		return getRequest{LastFor: subject}, nil
	}
	var req getRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return getRequest{}, fmt.Errorf("direct get: want {\"seq\":N,\"next_by_subj\":S} or {\"last_by_subj\":S}: %w", err)
	}
	switch {
	case req.LastFor != "" && req.NextFor == "" && req.Seq == 0:
	case req.NextFor != "" && req.LastFor == "":
	default:
		return getRequest{}, errors.New("direct get: want {\"seq\":N,\"next_by_subj\":S} or {\"last_by_subj\":S}")
	}
	return req, nil
}

// stream returns the core's stream of that name, looked up once.
func (s *Service) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	s.mu.Lock()
	st, ok := s.streams[name]
	s.mu.Unlock()
	if ok {
		return st, nil
	}
	st, err := s.bus.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.streams[name] = st
	s.mu.Unlock()
	return st, nil
}

// directGet reads the message and answers it as the server answers a direct get: its
// headers, the stream, subject, sequence and time headers, and its data.
func (s *Service) directGet(ctx context.Context, name string, req getRequest) *nats.Msg {
	st, err := s.stream(ctx, name)
	if err != nil {
		return refusal(503, "toolbus read service: "+err.Error())
	}
	var raw *jetstream.RawStreamMsg
	if req.LastFor != "" {
		raw, err = events.GetLastMsg(ctx, st, req.LastFor)
	} else {
		raw, err = events.GetMsg(ctx, st, req.Seq, req.NextFor)
	}
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return notFound()
	case err != nil:
		s.log.Warn("reads: direct get", "stream", name, "err", err)
		return refusal(503, "toolbus read service: "+err.Error())
	}
	return storedMsg(name, raw)
}

// storedMsg is a stored message of stream name as a direct get answers it.
func storedMsg(name string, raw *jetstream.RawStreamMsg) *nats.Msg {
	h := nats.Header{}
	for k, v := range raw.Header {
		h[k] = append([]string(nil), v...)
	}
	// A status in a stored message's headers would read as the answer's status (a 404,
	// hiding the message and every later one from the reader): no event carries one.
	h.Del("Status")
	h.Del("Description")
	h.Set(jetstream.StreamHeader, name)
	h.Set(jetstream.SubjectHeader, raw.Subject)
	h.Set(jetstream.SequenceHeader, strconv.FormatUint(raw.Sequence, 10))
	h.Set(jetstream.TimeStampHeaer, raw.Time.UTC().Format(time.RFC3339Nano))
	return &nats.Msg{Header: h, Data: raw.Data}
}

// streamInfo answers a stream's info with its configuration and the last sequence and
// time of its state: nothing that lists or counts the subjects or messages of others.
func (s *Service) streamInfo(ctx context.Context, name string) *nats.Msg {
	st, err := s.stream(ctx, name)
	if err != nil {
		return apiError(503, 10008, "toolbus read service: "+err.Error())
	}
	info, err := st.Info(ctx)
	if err != nil {
		return apiError(503, 10008, "toolbus read service: "+err.Error())
	}
	cfg := info.Config
	// The service answers direct gets whatever the core's stream does.
	cfg.AllowDirect, cfg.MirrorDirect = true, false
	cfg.Sources, cfg.Mirror, cfg.SubjectTransform, cfg.RePublish = nil, nil, nil, nil
	type state struct {
		LastSeq  uint64    `json:"last_seq"`
		LastTime time.Time `json:"last_ts"`
	}
	out := struct {
		Type    string                 `json:"type"`
		Config  jetstream.StreamConfig `json:"config"`
		Created time.Time              `json:"created"`
		State   state                  `json:"state"`
	}{"io.nats.jetstream.api.v1.stream_info_response", cfg, info.Created, state{info.State.LastSeq, info.State.LastTime}}
	data, err := json.Marshal(out)
	if err != nil {
		return apiError(500, 10000, "toolbus read service: "+err.Error())
	}
	return &nats.Msg{Data: data}
}

// apiError is a JetStream API error response.
func apiError(code, errCode int, desc string) *nats.Msg {
	data, _ := json.Marshal(map[string]any{"type": "io.nats.jetstream.api.v1.stream_info_response",
		"error": map[string]any{"code": code, "err_code": errCode, "description": desc}})
	return &nats.Msg{Data: data}
}
