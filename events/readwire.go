package events

import (
	"strings"
	"time"

	"github.com/toolbus/toolbus"
)

// The read service (package reads, docs/tenancy-design.md "Clients and front doors"): a
// client in an account of its own reaches nothing of the core account's JetStream; it
// reads the runs its identities may see through a service of the core, which answers a
// checked subset of the JetStream API under ReadAPIPrefix(id). The identity is a token
// of the subject because the core exports ReadSubject(id) only to the accounts bound to
// id: a request there comes from such an account.

// ReadServicePrefix is the first token of the read service's subjects.
const ReadServicePrefix = "toolbus_read"

// ReadQueue is the queue group the read service's instances share.
const ReadQueue = "toolbus_read"

// ReadSubject is toolbus_read.<id>: the read service's subjects of identity id (its
// IdentityToken) are under it.
func ReadSubject(id string) string { return ReadServicePrefix + "." + IdentityToken(id) }

// ReadAPIPrefix is the JetStream API prefix of the read service for id: a client opens
// its JetStream with jetstream.NewWithAPIPrefix(nc, ReadAPIPrefix(id))
// (Config.ReadPrefix, TOOLBUS_NATS_READ_PREFIX).
func ReadAPIPrefix(id string) string { return ReadSubject(id) + ".API" }

// ReadRunsSubject is the read service's list of the runs id may see (a JSON array of
// store.RunState).
func ReadRunsSubject(id string) string { return ReadSubject(id) + ".runs" }

// ReadToolsSubject is the read service's list of the tools a client of id may be
// offered: the catalog's contracts that a live executor instance serves, as the core
// decides (a JSON array of toolbus.ToolContract, sorted by name). A client account
// reads no catalog bucket and no instance record itself.
func ReadToolsSubject(id string) string { return ReadSubject(id) + ".tools" }

// FollowServicePrefix is the first token of the read service's live follows: a client
// in an account of its own requests FollowSubject(id, run) and is answered by a stream of
// messages, the run's stored events as they are stored (the core exports it as a service
// whose response is a stream, only to the accounts bound to id). Not under ReadSubject:
// that import answers one message per request, and two imports of one subject would
// both forward it.
const FollowServicePrefix = "toolbus_follow"

// FollowSubject is toolbus_follow.<id>.<run>: the live follow of run by identity id.
func FollowSubject(id, run string) string {
	return FollowServicePrefix + "." + IdentityToken(id) + "." + run
}

// FollowRequest is the body of a follow request (may be empty: the events stored from
// now on).
type FollowRequest struct {
	// From is the stream sequence to follow from (1: the run's first event); 0 is the
	// next event stored.
	From uint64 `json:"from_seq,omitempty"`
}

// The statuses of the read service's follow messages that carry no event (the
// "Status" header; the "Description" header says why). An event is a message without
// one, with the headers a direct get answers (Nats-Subject, Nats-Sequence, ...).
const (
	// FollowIdle is a heartbeat, sent while no event is stored for FollowIdleEvery, so
	// that the follower knows the follow is alive.
	FollowIdle = "100"
	// FollowEnd ends a follow: the run ended (its outcome was the last event sent), or
	// the follow lasted FollowMax (follow again from the next sequence).
	FollowEnd = "204"
)

// FollowIdleEvery is how often a follow with nothing to send says it is alive; a
// follower that hears nothing for a few of these has lost it (follow again). A follow
// silent longer than TenantAnswerGap loses its way back to a client's account.
const FollowIdleEvery = TenantAnswerGap

// FollowMax is the longest one follow lasts: its end names the next sequence, from
// which the follower follows again (Follower does).
const FollowMax = 5 * time.Minute

// ToolReadPrefix is the first token of the subjects on which the core answers an
// executor in a team account what it may know of its own calls' questions: a team may
// not read the run (its answers are on the run's subjects, which name no tool).
const ToolReadPrefix = "toolbus_toolread"

// ToolQuestionSubject is toolbus_toolread.<tool>.question: the state of a question of a
// call of tool (a QuestionQuery, answered with a QuestionState). The core exports it to
// the team the tool is granted to, and answers only of that tool's calls.
func ToolQuestionSubject(tool string) string {
	return ToolReadPrefix + "." + ToolToken(tool) + ".question"
}

// QuestionQuery names a question of a call: its run, step, call and seq (the tool's
// questions numbered from 1 in the order it asks them).
type QuestionQuery struct {
	RunID  string `json:"run_id"`
	Step   int    `json:"step"`
	CallID string `json:"call_id"`
	Seq    int    `json:"seq"`
}

// QuestionState is what the core answers of a question: whether it was asked and the
// answer of the run's principal, if any. Error says why there is no state (the call is
// not one of the tool's, or the run cannot be read).
type QuestionState struct {
	Asked  bool                `json:"asked"`
	Answer *toolbus.ToolAnswer `json:"answer,omitempty"`
	Error  string              `json:"error,omitempty"`
}

// ReadIdentity is the identity whose read service prefix is ReadAPIPrefix(id) (the
// value of TOOLBUS_NATS_READ_PREFIX), "" when prefix is no such prefix.
func ReadIdentity(prefix string) string {
	rest, ok := strings.CutPrefix(prefix, ReadServicePrefix+".")
	id, ok2 := strings.CutSuffix(rest, ".API")
	if !ok || !ok2 || IdentityToken(id) != id {
		return ""
	}
	return id
}
