package events

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/toolbus/toolbus"
)

// Fair share (docs/fair-share.md). With Config.FairShare the queue stream stores each
// call first on its tool's staging subject, toolbus_stage.<tool>, which no executor
// reads; the core's scheduler (package fair) moves the calls to the tool's queue
// subject (SubjectQueue) in a fair order by tenant, keeping only about what the tool's
// executors can take released. Nothing but the server writes the staging subjects (the
// queue stream's source), so a staged call is the core's tool.requested as stored.

// FairConsumer is the durable the scheduler pulls the staged calls from (created by
// `toolbus init` with the queue stream: no role but admin creates consumers there).
const FairConsumer = "fair"

// StagePrefix is the first token of the staging subjects.
const StagePrefix = "toolbus_stage"

// SubjectStage is toolbus_stage.<tool>: where a call waits for the scheduler.
func SubjectStage(tool string) string { return StagePrefix + "." + ToolToken(tool) }

// StageDestination is the queue stream's subject transform with fair share: the call
// published on toolbus.<run>.tool.requested.<tool> is stored as toolbus_stage.<tool>.
const StageDestination = StagePrefix + ".{{wildcard(2)}}"

// Headers of a call the scheduler released onto its queue subject.
const (
	// FairStagedHeader is the sequence of the staged call the release copies: a
	// restarted scheduler reads them to release nothing twice.
	FairStagedHeader = "Toolbus-Fair-Staged"
	// FairLowHeader is the scheduler's low-water mark when it released the call: every
	// staged call at or below it was released, so a restarted scheduler starts above it.
	FairLowHeader = "Toolbus-Fair-Low"
	// FairCallSubjectHeader is the subject the released call was published on
	// (CallSubject), which the staged copy's Nats-Stream-Source named.
	FairCallSubjectHeader = "Toolbus-Call-Subject"
)

// FairHeldSubject is toolbus_fair.held.<tool>: the scheduler answers a request there
// with the tool's held calls of every tenant (fair.Held), which `toolbus call`, `toolbus run`
// and the console show as the reason a call waits. Only the core's roles may ask it
// (deploy/nats/permissions.conf): tenants ask FairHeldForSubject.
func FairHeldSubject(tool string) string { return FairHeldPrefix + "." + FairHeldToken(tool) }

// FairHeldToken is the held view's subject token of tool: its name when it is a valid
// tool name, else the name with each byte outside [A-Za-z0-9_-] written %XX (a name of
// more than maxHeldName bytes: %~ and a hash of it). A call of a tool no subject may
// name (a model's "search.web") waits on UnknownToolToken's queue with every other such
// call, but its held view is its own: '%' is in no tool name, and the encoding is one to
// one, so no two tools share a token.
func FairHeldToken(tool string) string {
	if toolbus.ValidToolName(tool) {
		return tool
	}
	if len(tool) > maxHeldName {
		sum := sha256.Sum256([]byte(tool))
		return "%~" + hex.EncodeToString(sum[:16]) // ~ is written %7E in the others
	}
	var b strings.Builder
	b.WriteByte('%') // the empty name too has a token, and no valid name starts so
	for i := 0; i < len(tool); i++ {
		c := tool[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// maxHeldName bounds the tool names FairHeldToken writes out (a subject stays short).
const maxHeldName = 128

// FairHeldForSubject is toolbus_fair.held.<tool>.<identity>: the scheduler answers with
// that identity's held calls only. The identity is the subject's, which the credentials
// bind (a bound client may publish only its identities' subjects, a client account
// imports only its identities'), never the request's body: a tenant learns nothing of
// who else calls the tool.
func FairHeldForSubject(tool, identity string) string {
	return FairHeldSubject(tool) + "." + IdentityToken(identity)
}

// FairHeldPrefix is the prefix of FairHeldSubject: the scheduler listens on its ".*".
const FairHeldPrefix = "toolbus_fair.held"
