package reads

import (
	"bytes"
	"context"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// PerTeam bounds the team reads of one team the service works on at once (a 429 beyond
// it). Higher than PerIdentity: a team's executors read their claims at every call, and
// on a replicated deployment every such read comes here (events.TeamReadPrefix).
const PerTeam = 256

// dispatchTeam works on a team read (events.TeamReadSubject) within PerTeam.
func (s *Service) dispatchTeam(ctx context.Context, m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	team, _, _, _ := events.ParseTeamRead(m.Subject)
	busy := "toolbus read service: " + team + "'s reads in progress are at their bound: retry when one is answered"
	s.admit(m, events.TeamReadPrefix+"."+team, PerTeam, busy, func() {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		s.respond(m, s.teamRead(hctx, m))
	})
}

// teamRead answers a team's executor the last message of a subject, as the direct get
// in subject form it stands for would (the leader's copy: the service reads through the
// stream's leader where the stream serves no direct gets). The core's export to the team
// pins the team and the subjects (accounts.TeamExports); the service checks their shape
// again and answers nothing else: no wildcard, no stream or bucket but those a team's
// direct gets reach (never the secrets: the service's credentials do not read them).
func (s *Service) teamRead(ctx context.Context, m *nats.Msg) *nats.Msg {
	team, name, subject, ok := events.ParseTeamRead(m.Subject)
	if !ok || len(bytes.TrimSpace(m.Data)) > 0 {
		return refusal(400, "toolbus read service: a team read is toolbus_teamread.<stream>.<subject>, with no body")
	}
	if !literal(subject) || !s.teamReads(team, name, subject) {
		return refusal(400, "toolbus read service: "+subject+" of "+name+" is not a subject a team reads")
	}
	return s.directGet(ctx, name, getRequest{LastFor: subject})
}

// teamReads reports whether subject of stream name is of a shape a team's direct gets
// reach (accounts.TeamExports): its tools' claims and catalog entries, its own instance
// records, a tool's result in a run.
func (s *Service) teamReads(team, name, subject string) bool {
	kv := func(bucket string) (string, bool) {
		return strings.CutPrefix(subject, store.KeyPrefix(bucket))
	}
	switch name {
	case s.bus.Config().Stream:
		t := strings.Split(subject, ".")
		return len(t) == 5 && t[0] == events.SubjectPrefix && t[2] == "tool" && t[3] == "finished"
	case store.BucketStream(store.BucketClaims), store.BucketStream(store.BucketTools):
		// Of the shape toolbus writes there (store.TeamKeyShape); the import pins the
		// team's tools.
		bucket := strings.TrimPrefix(name, "KV_")
		key, ok := kv(bucket)
		return ok && store.TeamKeyShape(bucket, team, key)
	case store.BucketStream(store.BucketInstances):
		key, ok := kv(store.BucketInstances)
		return ok && strings.HasPrefix(key, team+".")
	}
	return false
}

// literal reports whether subject names one subject: no empty token, no wildcard.
func literal(subject string) bool {
	for _, t := range strings.Split(subject, ".") {
		if t == "" || t == "*" || t == ">" {
			return false
		}
	}
	return true
}
