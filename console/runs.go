package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/runlog"
	"github.com/toolbus/toolbus/events/store"
)

// The runs list: every run, newest first, filtered (status, tool, principal, time),
// searched (q: run id, question, principal, model) and paged. The run states come from
// one read of the runs bucket; a run's question and principal from its run.started
// (cached by the bus: it never changes); whether it called a tool from one direct get on
// its tool subjects; its step count from its last model.responded, its calls' results
// from its tool.finished events. Only the rows of the page shown read more than the state.

// runQuery is the runs list's query: its filters, search and page.
type runQuery struct {
	Status, Tool, Principal, Q string
	// Since and Until are as given (a time or a duration before now); since and until
	// are what they mean.
	Since, Until string
	since, until time.Time
	Page, N      int
}

// parseRunQuery reads the query of the runs list; a bad value is an error that names
// the parameter and what it accepts.
func parseRunQuery(v url.Values, now time.Time) (runQuery, error) {
	q := runQuery{
		Status: v.Get("status"), Tool: strings.TrimSpace(v.Get("tool")), Principal: strings.TrimSpace(v.Get("principal")),
		Q: strings.TrimSpace(v.Get("q")), Since: strings.TrimSpace(v.Get("since")), Until: strings.TrimSpace(v.Get("until")),
		Page: 1, N: consolePageSize,
	}
	if q.Status != "" && !slices.Contains(toolbus.RunStatuses, toolbus.RunStatus(q.Status)) {
		return q, fmt.Errorf("unknown status %q: want one of %s", q.Status, statusList(toolbus.RunStatuses))
	}
	if q.Tool != "" && !toolbus.ValidToolName(q.Tool) {
		return q, fmt.Errorf("tool %q: not a tool name", q.Tool)
	}
	var err error
	if q.since, err = parseWhen(q.Since, now); err != nil {
		return q, fmt.Errorf("since: %w", err)
	}
	if q.until, err = parseWhen(q.Until, now); err != nil {
		return q, fmt.Errorf("until: %w", err)
	}
	if p := v.Get("page"); p != "" {
		if q.Page, err = strconv.Atoi(p); err != nil || q.Page < 1 {
			return q, fmt.Errorf("page %q: want a number from 1", p)
		}
	}
	if n := v.Get("n"); n != "" {
		if q.N, err = strconv.Atoi(n); err != nil || q.N < 1 || q.N > consoleMaxPageSize {
			return q, fmt.Errorf("n %q: want a page size from 1 to %d", n, consoleMaxPageSize)
		}
	}
	return q, nil
}

// parseWhen reads a time: RFC 3339, a browser's datetime-local (2026-12-01T17:30, UTC),
// or a duration before now (15m, 24h).
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q: want a time (2026-12-01T17:30, RFC 3339) or a duration before now (15m, 24h)", s)
}

// Filtered reports whether the query filters or searches at all.
func (q runQuery) Filtered() bool {
	return q.Status != "" || q.Tool != "" || q.Principal != "" || q.Q != "" || q.Since != "" || q.Until != ""
}

// link is the list's URL with the query's filters, at page.
func (q runQuery) link(page int) string {
	v := url.Values{}
	for k, val := range map[string]string{"status": q.Status, "tool": q.Tool, "principal": q.Principal, "q": q.Q, "since": q.Since, "until": q.Until} {
		if val != "" {
			v.Set(k, val)
		}
	}
	if q.N != consolePageSize {
		v.Set("n", strconv.Itoa(q.N))
	}
	if page > 1 {
		v.Set("page", strconv.Itoa(page))
	}
	if len(v) == 0 {
		return "/"
	}
	return "/?" + v.Encode()
}

// runRow is one line of the runs list.
type runRow struct {
	store.RunState
	Question, Principal, Model string
	// Steps counts the steps the model answered, as the run page does.
	Steps int
	// Calls counts the run's results by status: a run that completed may have calls
	// that failed or were rejected, which its status does not say.
	Calls  audit.Calls
	Tokens int64
	Age    string
	// Duration is the run's length once it ended; Active runs show the time since
	// StartedAt instead, which the page keeps counting.
	Duration string
	Active   bool
}

// runsView is the runs list page.
type runsView struct {
	Rows     []runRow
	Query    runQuery
	Total    int
	From, To int
	Prev     string
	Next     string
	Statuses []toolbus.RunStatus
	Tools    []string
}

func (c *server) runsPage(w http.ResponseWriter, r *http.Request) {
	q, err := parseRunQuery(r.URL.Query(), time.Now())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var view runsView
	if err := c.hub.read(r.Context(), func(ctx context.Context) error {
		view, err = c.runs(ctx, q, viewerOf(r))
		return err
	}); err != nil {
		c.fail(w, err)
		return
	}
	c.render(w, "runs.html", c.pageData(r, map[string]any{"V": view}))
}

// runs reads the list: every run state the viewer sees (tenancy.go), filtered and
// searched, then the page's rows.
func (c *server) runs(ctx context.Context, q runQuery, v viewer) (runsView, error) {
	view := runsView{Query: q, Statuses: toolbus.RunStatuses}
	states, err := c.bus.Runs(ctx)
	if err != nil {
		return view, err
	}
	vis, err := c.visibilityOf(ctx, v)
	if err != nil {
		return view, err
	}
	if contracts, err := c.bus.Contracts(ctx); err == nil {
		for _, tc := range contracts {
			if v.seesTool(tc.Owner) {
				view.Tools = append(view.Tools, tc.Name)
			}
		}
		sort.Strings(view.Tools)
	}
	sort.SliceStable(states, func(i, j int) bool { return states[i].StartedAt.After(states[j].StartedAt) })
	var match []store.RunState
	for _, st := range states {
		ok, err := c.matches(ctx, q, st)
		if err == nil && ok {
			ok, err = vis.sees(ctx, st.RunID)
		}
		if err != nil {
			return view, err
		}
		if ok {
			match = append(match, st)
		}
	}
	view.Total = len(match)
	from := min((q.Page-1)*q.N, len(match))
	to := min(from+q.N, len(match))
	if from > 0 {
		view.Prev = q.link(q.Page - 1)
	}
	if to < len(match) {
		view.Next = q.link(q.Page + 1)
	}
	view.From, view.To = from+1, to
	now := time.Now()
	for _, st := range match[from:to] {
		view.Rows = append(view.Rows, c.runRow(ctx, st, now))
	}
	return view, nil
}

// matches reports whether a run passes the query's filters and search, reading its
// run.started (cached) only when the state cannot tell, and its tool subjects only for
// a tool filter.
func (c *server) matches(ctx context.Context, q runQuery, st store.RunState) (bool, error) {
	if q.Status != "" && string(st.Status) != q.Status {
		return false, nil
	}
	if !q.since.IsZero() && st.StartedAt.Before(q.since) || !q.until.IsZero() && st.StartedAt.After(q.until) {
		return false, nil
	}
	if q.Principal != "" || q.Q != "" {
		rs, err := c.bus.RunStarted(ctx, st.RunID)
		if err != nil && !errors.Is(err, events.ErrRunNotFound) {
			return false, err
		}
		var principal, question, model string
		if rs != nil {
			principal, question, model = rs.Principal.ID, lastUserMessage(rs.Messages), rs.Model
		}
		if q.Principal != "" && principal != q.Principal {
			return false, nil
		}
		if q.Q != "" {
			needle := strings.ToLower(q.Q)
			if !slices.ContainsFunc([]string{st.RunID, question, principal, model}, func(s string) bool {
				return strings.Contains(strings.ToLower(s), needle)
			}) {
				return false, nil
			}
		}
	}
	if q.Tool != "" {
		if ok, err := runlog.Requested(ctx, c.bus, st.RunID, q.Tool); !ok || err != nil {
			return false, err
		}
	}
	return true, nil
}

// runRow reads what a line shows beyond the run's state. A detail that cannot be read
// is left out rather than failing the list.
func (c *server) runRow(ctx context.Context, st store.RunState, now time.Time) runRow {
	row := runRow{RunState: st, Age: audit.Age(now.Sub(st.StartedAt)), Active: !st.Status.Terminal()}
	if rs, err := c.bus.RunStarted(ctx, st.RunID); err == nil {
		row.Question, row.Principal, row.Model = audit.OneLine(lastUserMessage(rs.Messages), 160), rs.Principal.ID, audit.ModelName(rs.Model)
	}
	if ev, err := runlog.Last(ctx, c.bus, events.SubjectModelResponded(st.RunID)); err == nil && ev.Err == nil {
		row.Steps = ev.Meta.Step + 1
	}
	if calls, err := audit.CountCalls(ctx, c.bus, st.RunID); err == nil {
		row.Calls = calls
	}
	step := st.Step
	if row.Active {
		if s, err := c.bus.Store().CurrentStep(ctx, st.RunID); err == nil {
			step = s
		}
	} else {
		row.Duration = dur(st.UpdatedAt.Sub(st.StartedAt))
	}
	if st.Ended != nil && st.Status != toolbus.RunWaitingForApproval {
		row.Tokens = st.Ended.Usage.Total()
	} else if u, err := c.bus.Store().UsageSoFar(ctx, st.RunID, step); err == nil {
		row.Tokens = u.Total()
	}
	return row
}

// lastUserMessage is the run's question: its last user message.
func lastUserMessage(msgs []toolbus.Message) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == toolbus.RoleUser {
			return msgs[i].Content
		}
	}
	return ""
}

// statusList is statuses separated by commas.
func statusList(statuses []toolbus.RunStatus) string {
	s := make([]string, len(statuses))
	for i, st := range statuses {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}
