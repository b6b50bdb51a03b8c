package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
)

// Tenancy in the console. A user whose access-list line names teams (`teams=a,b`, see
// internal/door) is restricted to those teams:
//
//   - tools: the tools page lists the tools those teams own and the tools no team owns
//     (as the MCP door's tools/list does), the executor instances of those teams (and the
//     team-less ones), and the open calls of the tools it lists;
//   - runs: a run is visible when the user started it (its principal is the user's name,
//     as for the runs the MCP door starts with the same name) or approves it (its start
//     lists the user's name among its approvers), or when the core requested
//     a call of a tool one of the user's teams owns (never from what a team writes). The runs list shows only visible runs; a run's page,
//     its raw events and its live stream answer 403 for the others; the live stream of
//     every run forwards only the events of visible runs;
//   - decisions: the user may approve, deny or answer a waiting call of a visible run
//     when they started the run or their teams own the call's tool, and cancel a run only
//     when they started it; any other decision is refused with 403 and the buttons are
//     not shown. In a visible run they neither started nor approve, other teams' calls are withheld
//     with their owner named (withhold.go).
//
// A user without teams, and the anonymous reader of a public console
// (TOOLBUS_CONSOLE_PUBLIC_READ), see everything, as before; the anonymous reader still
// cannot act. Where a decision is applied (the injector) is unchanged: this is the
// door's policy, not the bus's.

// viewer is who reads a page: restricted to teams, or not at all.
type viewer struct {
	name  string
	teams []string
	// restricted is set for a signed-in user whose line names teams.
	restricted bool
}

// viewerOf returns the request's viewer.
func viewerOf(r *http.Request) viewer {
	u, ok := userOf(r)
	if !ok || len(u.Teams) == 0 {
		return viewer{name: u.Name}
	}
	return viewer{name: u.Name, teams: u.Teams, restricted: true}
}

// seesTool reports whether the viewer sees a tool whose catalog entry names owner: a
// tool of one of its teams or of no team.
func (v viewer) seesTool(owner string) bool {
	return !v.restricted || owner == "" || slices.Contains(v.teams, owner)
}

// seesTeam reports whether the viewer sees an executor instance of team.
func (v viewer) seesTeam(team string) bool { return v.seesTool(team) }

// ownsTool reports whether one of the viewer's teams owns the tool (never a tool of no
// team: a restricted user decides those only on the runs they started).
func (v viewer) ownsTool(owner string) bool {
	return !v.restricted || owner != "" && slices.Contains(v.teams, owner)
}

// describe names the viewer in refusals.
func (v viewer) describe() string {
	return fmt.Sprintf("console user %s (teams %s)", v.name, strings.Join(v.teams, ","))
}

// errHidden is wrapped by the refusal of a run the viewer may not see.
var errHidden = errors.New("console: forbidden")

// owners maps each catalog tool to its owner ("" for none).
func (c *server) owners(ctx context.Context) (map[string]string, error) {
	contracts, err := c.bus.Contracts(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(contracts))
	for _, tc := range contracts {
		out[tc.Name] = tc.Owner
	}
	return out, nil
}

// visibility decides which runs one viewer sees, reading the catalog once.
type visibility struct {
	c     *server
	v     viewer
	owned []string // the tools the viewer's teams own
}

// visibilityOf returns the viewer's run visibility.
func (c *server) visibilityOf(ctx context.Context, v viewer) (*visibility, error) {
	vis := &visibility{c: c, v: v}
	if !v.restricted {
		return vis, nil
	}
	owners, err := c.owners(ctx)
	if err != nil {
		return nil, err
	}
	for tool, owner := range owners {
		if owner != "" && slices.Contains(v.teams, owner) {
			vis.owned = append(vis.owned, tool)
		}
	}
	slices.Sort(vis.owned)
	return vis, nil
}

// sees reports whether the viewer sees run: the run's first run.started names it (its
// principal or one of its approvers), or the core requested a call of a tool of the viewer's teams in
// it (events.Bus.Requested: one direct get per such tool; none for an unrestricted
// viewer). Only what the core wrote decides: nothing a team writes into a run (a log
// line, a result on its tool's subject) makes the run visible to its users.
func (vis *visibility) sees(ctx context.Context, run string) (bool, error) {
	if !vis.v.restricted {
		return true, nil
	}
	rs, err := vis.c.bus.RunStarted(ctx, run)
	switch {
	case err == nil && rs.NamesDecider(vis.v.name):
		return true, nil
	case err != nil && !errors.Is(err, events.ErrRunNotFound):
		return false, err
	}
	for _, tool := range vis.owned {
		if ok, err := runlog.Requested(ctx, vis.c.bus, run, tool); ok || err != nil {
			return ok, err
		}
	}
	return false, nil
}

// mustSee answers 403 (and false) when the request's viewer may not see run.
func (c *server) mustSee(w http.ResponseWriter, r *http.Request, run string) bool {
	v := viewerOf(r)
	if !v.restricted {
		return true
	}
	ok, err := c.seesRun(r.Context(), v, run)
	if err != nil {
		c.fail(w, err)
		return false
	}
	if !ok {
		http.Error(w, fmt.Sprintf("%v: %s may not see run %s: it names %s neither as principal nor as approver, and called no tool of those teams",
			errHidden, v.describe(), run, v.name), http.StatusForbidden)
	}
	return ok
}

// seesRun reports whether v sees run.
func (c *server) seesRun(ctx context.Context, v viewer, run string) (bool, error) {
	vis, err := c.visibilityOf(ctx, v)
	if err != nil {
		return false, err
	}
	return vis.sees(ctx, run)
}

// mayDecide reports whether v may decide a waiting call of tool (owned by owner) in a
// run started by principal, and why not.
func (v viewer) mayDecide(principal, tool, owner string) (bool, string) {
	if !v.restricted || principal == v.name || v.ownsTool(owner) {
		return true, ""
	}
	return false, fmt.Sprintf("%s may not decide call of %s: the tool is %s, and the run was started by %s",
		v.describe(), tool, ownerText(owner), principalText(principal))
}

// mayCancel reports whether v may cancel a run started by principal.
func (v viewer) mayCancel(principal string) (bool, string) {
	if !v.restricted || principal == v.name {
		return true, ""
	}
	return false, fmt.Sprintf("%s may not cancel a run started by %s: a team-restricted user cancels only the runs they started",
		v.describe(), principalText(principal))
}

func ownerText(owner string) string {
	if owner == "" {
		return "no team's"
	}
	return "team " + owner + "'s"
}

func principalText(p string) string {
	if p == "" {
		return "nobody named"
	}
	return p
}

// principalOf returns the principal of run ("" when it has none or no run.started).
func (c *server) principalOf(ctx context.Context, run string) (string, error) {
	rs, err := c.bus.RunStarted(ctx, run)
	if errors.Is(err, events.ErrRunNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return rs.Principal.ID, nil
}

// deciders returns which of the waiting calls v may decide.
func (c *server) deciders(ctx context.Context, v viewer, principal string, waiting []toolbus.ToolCall) map[string]bool {
	out := map[string]bool{}
	var owners map[string]string
	if v.restricted {
		owners, _ = c.owners(ctx) // unreadable: no team tools, the principal still decides
	}
	for _, call := range waiting {
		out[call.CallID], _ = v.mayDecide(principal, call.Tool, owners[call.Tool])
	}
	return out
}

// streamFilter decides, for one live stream of every run, which notes its viewer gets.
type streamFilter struct {
	vis  *visibility
	seen map[string]bool // run -> visible, as last decided
}

// pass reports whether the note of subject reaches the stream. A run once visible stays
// so; an invisible run becomes visible when it requests a tool of the viewer's teams
// (read from the subject, no bus read) or, for a run not seen before, by sees.
func (f *streamFilter) pass(ctx context.Context, subject string) bool {
	if f == nil || !f.vis.v.restricted || subject == "" {
		return true
	}
	tok := strings.Split(subject, ".")
	if len(tok) < 3 {
		return false
	}
	run := tok[1]
	if vis, known := f.seen[run]; known && vis {
		return true
	}
	if len(tok) == 5 && tok[2] == "tool" && tok[3] == "requested" && slices.Contains(f.vis.owned, tok[4]) {
		f.seen[run] = true
		return true
	}
	if _, known := f.seen[run]; known {
		return false
	}
	if len(f.seen) > consoleMaxStreamRuns {
		clear(f.seen)
	}
	ok, err := f.vis.sees(ctx, run)
	f.seen[run] = ok && err == nil
	return f.seen[run]
}

// consoleMaxStreamRuns bounds the runs one stream's filter remembers.
const consoleMaxStreamRuns = 10000

// mayDecide answers 403 (and false) when the request's viewer may not decide a call of
// tool in run.
func (c *server) mayDecide(w http.ResponseWriter, r *http.Request, run, tool string) bool {
	v, principal, ok := c.actor(w, r, run)
	if !ok || !v.restricted {
		return ok
	}
	owners, err := c.owners(r.Context())
	if err != nil {
		c.fail(w, err)
		return false
	}
	ok, why := v.mayDecide(principal, tool, owners[tool])
	return refuse(w, ok, why)
}

// actor is what every act on run (a decision, a cancel) checks first: the decision
// policy (policyAllows), then, for a restricted viewer, the run's principal, on which
// its rights hang. ok is false when the request is answered already (refused, failed).
func (c *server) actor(w http.ResponseWriter, r *http.Request, run string) (v viewer, principal string, ok bool) {
	v = viewerOf(r)
	if !c.policyAllows(w, r, v, run) {
		return v, "", false
	}
	if !v.restricted {
		return v, "", true
	}
	principal, err := c.principalOf(r.Context(), run)
	if err != nil {
		c.fail(w, err)
		return v, "", false
	}
	return v, principal, true
}

// refuse answers 403 with why when a restricted viewer may not act (ok false), and
// passes ok on.
func refuse(w http.ResponseWriter, ok bool, why string) bool {
	if !ok {
		http.Error(w, fmt.Sprintf("%v: %s", errHidden, why), http.StatusForbidden)
	}
	return ok
}

// policyAllows answers 403 (and false) when the injector's decision policy would refuse
// v's decision or cancel of run: its principal, the approvers its start lists and
// TOOLBUS_DECIDERS may (an unknown run is left to the handler, which says so).
func (c *server) policyAllows(w http.ResponseWriter, r *http.Request, v viewer, run string) bool {
	if c.policy == nil {
		return true
	}
	rs, err := c.bus.RunStarted(r.Context(), run)
	if errors.Is(err, events.ErrRunNotFound) {
		return true
	}
	if err != nil {
		c.fail(w, err)
		return false
	}
	if err := rs.CheckDecider(c.policy, v.name); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return false
	}
	return true
}

// mayCancel answers 403 (and false) when the request's viewer may not cancel run.
func (c *server) mayCancel(w http.ResponseWriter, r *http.Request, run string) bool {
	v, principal, ok := c.actor(w, r, run)
	if !ok || !v.restricted {
		return ok
	}
	ok, why := v.mayCancel(principal)
	return refuse(w, ok, why)
}
