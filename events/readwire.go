package events

import (
	"strings"

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
