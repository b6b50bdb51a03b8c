package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/audit"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/executor"
)

// genMode is one credential kind deploy/nats/gen issues: the server config it writes
// and how a user connects with it.
type genMode struct {
	name string
	conf func(natsjwt.Result) string
	opt  func(t *testing.T, res natsjwt.Result, user string) nats.Option
}

// genModes are the credential kinds of deploy/nats/gen: user/password, nkeys and
// operator/JWT, each against a server started from the config the generator wrote.
func genModes() []genMode {
	return []genMode{
		{"user-password", func(r natsjwt.Result) string { return r.UsersConfig }, func(t *testing.T, r natsjwt.Result, u string) nats.Option {
			pw, err := os.ReadFile(r.Passwords[u])
			if err != nil {
				t.Fatal(err)
			}
			return nats.UserInfo(u, string(pw))
		}},
		{"nkeys", func(r natsjwt.Result) string { return r.NkeysConfig }, func(t *testing.T, r natsjwt.Result, u string) nats.Option {
			o, err := nats.NkeyOptionFromSeed(r.Seeds[u])
			if err != nil {
				t.Fatal(err)
			}
			return o
		}},
		{"jwt", func(r natsjwt.Result) string { return r.Config }, func(_ *testing.T, r natsjwt.Result, u string) nats.Option {
			return nats.UserCredentials(r.Creds[u])
		}},
	}
}

// Principals bound to credentials: an administrator issues client credentials bound to
// alice and to bob (go run ./deploy/nats/gen with "clients" grants). For each credential
// kind, the server refuses alice's credentials starting a run for bob, approving or
// cancelling as bob (a permissions violation, nothing stored); what alice may publish
// under her own identity but with a body claiming bob is terminated by its consumer as
// a subject mismatch and shows in the replay; the executor's authorizer is given the
// bound principal of every run; the audit records alice as the approver and the
// injector names her as the canceller.
func TestSecurityPrincipalsBound(t *testing.T) {
	t.Parallel()
	perms := filepath.Join("..", "deploy", "nats", "permissions.conf")
	grants := natsjwt.Grants{Clients: map[string][]string{"alice": {"alice"}, "bob": {"bob"}}}
	for _, mode := range genModes() {
		t.Run(mode.name, func(t *testing.T) {
			res, err := natsjwt.GenerateGrants(perms, t.TempDir(), grants, natsjwt.WithBcryptCost(bcrypt.MinCost))
			if err != nil {
				t.Fatal(err)
			}
			srv := startConfigured(t, mode.conf(res), nil)
			opts := map[string][]nats.Option{}
			for _, u := range natsjwt.Users(nil, grants) {
				opts[u.Name] = []nats.Option{mode.opt(t, res, u.Name), nats.Timeout(30 * time.Second)}
			}
			var (
				mu   sync.Mutex
				seen = map[string][]string{} // run -> principal ids the authorizer was given
			)
			auth := executor.AuthorizerFunc(func(ctx context.Context, p toolbus.Principal, _ string, _ json.RawMessage) error {
				ci, _ := executor.CallInfoFrom(ctx)
				mu.Lock()
				seen[ci.RunID] = append(seen[ci.RunID], p.ID)
				mu.Unlock()
				return nil
			})
			deploy := newDeployTool()
			held := make(chan string, 8)
			// The injector's decision policy is the binary's on a shared server (no
			// TOOLBUS_DECIDERS): a run's principal and the approvers its start lists.
			s := startSecuredExec(t, srv.ClientURL(), opts, matrixModel(), []executor.Option{executor.WithAuthorizer(auth)},
				[]string{}, deploy.tool(), holdUntilDone(held))
			tr := watchTerminations(t, s.conns["admin"])
			as := map[string]*events.Bus{}
			for _, who := range []string{"alice", "bob"} {
				u := natsjwt.ClientUser(who)
				nc, err := connectAs(t, srv.ClientURL(), u, s.viol, opts[u]...)
				if err != nil {
					t.Fatalf("%s connects: %v", u, err)
				}
				if as[who], err = events.Open(s.ctx, nc, events.Config{}); err != nil {
					t.Fatal(err)
				}
			}
			alice, bob := as["alice"], as["bob"]
			admin := s.buses["admin"]
			src := events.Source("cli", "principals")
			start := func(b *events.Bus, run, principal string, approvers ...string) error {
				ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
				defer cancel()
				return b.StartRun(ctx, src, toolbus.RunStarted{RunID: run, Principal: toolbus.Principal{ID: principal},
					Approvers: approvers, Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "go"}}})
			}
			// notDecider waits for the injector to terminate #seq as a decision by someone
			// the policy does not name.
			notDecider := func(seq uint64, consumer string) {
				t.Helper()
				if a := tr.wait(t, seq); a.Consumer != consumer || !strings.Contains(a.Reason, "may not decide on or cancel run") {
					t.Fatalf("#%d terminated by %s (%q), want %s refusing a decider the policy does not name", seq, a.Consumer, a.Reason, consumer)
				}
			}
			// refused checks that alice's credentials were refused subject by the server
			// and that the stream holds nothing there.
			refused := func(what string, err error, subject string) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s: published", what)
				}
				eventstest.Eventually(t, 10*time.Second, func() error {
					if s.viol.has(natsjwt.ClientUser("alice"), subject) {
						return nil
					}
					return fmt.Errorf("%s: no permissions violation on %s: %v", what, subject, s.viol.all())
				})
				if raw, err := admin.EventStream().GetMsg(s.ctx, 1, jetstream.WithGetMsgSubject(subject)); !errors.Is(err, jetstream.ErrMsgNotFound) {
					t.Fatalf("%s: the stream has #%v on %s (%v)", what, raw, subject, err)
				}
				t.Logf("%s: refused by the server (%v)", what, err)
			}
			forge := func(b *events.Bus, subject string, e events.Envelope) uint64 {
				t.Helper()
				ack, err := b.Publish(s.ctx, subject, e.Meta, e.Data)
				if err != nil {
					t.Fatalf("publish on %s: %v", subject, err)
				}
				return ack.Sequence
			}
			mismatchInReplay := func(run string, seq uint64) {
				t.Helper()
				for _, v := range replayOf(t, s.ctx, admin, run).Violations {
					if v.Code == audit.ViolationSubjectMismatch && v.Seq == seq {
						return
					}
				}
				t.Fatalf("the replay of %s does not report #%d as a subject mismatch", run, seq)
			}

			// Alice runs as alice.
			okRun := "plain-" + mode.name
			if err := start(alice, okRun, "alice"); err != nil {
				t.Fatal(err)
			}
			s.waitOutcome(okRun, toolbus.RunCompleted)

			// Alice as bob: refused by the server; under her own subject with bob in the
			// body: terminated, and no run starts.
			asBob := "as-bob-" + mode.name
			refused("run.started for bob", start(alice, asBob, "bob"), events.SubjectRunStarted(asBob, "bob"))
			claims := "claims-bob-" + mode.name
			forged := events.RunStartedEvent(src, toolbus.RunStarted{RunID: claims, Principal: toolbus.Principal{ID: "bob"},
				Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "go"}}})
			seq := forge(alice, events.SubjectRunStarted(claims, "alice"), forged)
			mismatchTerminated(t, tr, seq, events.ConsumerInjectorStarted)
			mismatchInReplay(claims, seq)
			for _, run := range []string{asBob, claims} {
				if _, err := admin.RunStarted(s.ctx, run); !errors.Is(err, events.ErrRunNotFound) {
					t.Fatalf("run %s started: %v", run, err)
				}
			}

			// Bob's run waits for approval of a deploy. Alice approving as bob is refused by
			// the server; a decision under her subject naming bob is terminated; her own
			// approval is terminated by the decision policy (she is neither bob nor one of
			// his approvers): nothing is recorded and the deploy has not run. Bob's own
			// approval runs it, and the audit says he decided.
			approve := "approve-" + mode.name
			if err := start(bob, approve, "bob"); err != nil {
				t.Fatal(err)
			}
			s.waitOutcome(approve, toolbus.RunWaitingForApproval)
			step, err := alice.Store().CurrentStep(s.ctx, approve)
			if err != nil {
				t.Fatal(err)
			}
			decide := func(b *events.Bus, run, who string) (uint64, error) {
				ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
				defer cancel()
				ack, err := b.PublishApproval(ctx, src, step, toolbus.Approval{RunID: run, CallID: "d", Who: who, Why: "ok"}, true)
				if err != nil {
					return 0, err
				}
				return ack.Sequence, nil
			}
			_, err = decide(alice, approve, "bob")
			refused("approval as bob", err, events.SubjectApproval(approve, true, "bob"))
			seq = forge(alice, events.SubjectApproval(approve, true, "alice"),
				events.ApprovalEvent(src, step, toolbus.Approval{RunID: approve, CallID: "d", Who: "bob"}, true))
			mismatchTerminated(t, tr, seq, events.ConsumerInjectorApprovals)
			mismatchInReplay(approve, seq)
			seq, err = decide(alice, approve, "alice")
			if err != nil {
				t.Fatal(err)
			}
			notDecider(seq, events.ConsumerInjectorApprovals)
			if _, err := admin.Store().StepDecision(s.ctx, approve, step, "d"); !errors.Is(err, events.ErrNotFound) {
				t.Fatalf("a decision was recorded: %v", err)
			}
			if n := deploy.total(); n != 0 {
				t.Fatalf("the deploy ran %d times before bob decided", n)
			}
			if _, err := decide(bob, approve, "bob"); err != nil {
				t.Fatal(err)
			}
			s.waitOutcome(approve, toolbus.RunCompleted)
			decidedBy := func(run string) []string {
				rep := replayOf(t, s.ctx, admin, run)
				if rep.Principal != "bob" {
					t.Fatalf("the audit of %s records principal %q, want bob", run, rep.Principal)
				}
				var by []string
				for _, c := range rep.Calls {
					if c.CallID == "d" {
						by = append(by, c.DecidedBy)
					}
				}
				return by
			}
			if by := decidedBy(approve); !slices.Equal(by, []string{"bob"}) {
				t.Fatalf("the audit records the deploy decided by %v, want bob", by)
			}
			// A run whose start lists alice as an approver: her decision stands.
			listed := "approve-listed-" + mode.name
			if err := start(bob, listed, "bob", "alice"); err != nil {
				t.Fatal(err)
			}
			s.waitOutcome(listed, toolbus.RunWaitingForApproval)
			if _, err := decide(alice, listed, "alice"); err != nil {
				t.Fatal(err)
			}
			s.waitOutcome(listed, toolbus.RunCompleted)
			if by := decidedBy(listed); !slices.Equal(by, []string{"alice"}) {
				t.Fatalf("the audit records the listed approver's deploy decided by %v, want alice", by)
			}

			// Bob's run holds a call. Alice cancelling as bob is refused by the server, her
			// own cancel by the policy, and the call still runs; bob's cancel ends the run,
			// naming him.
			cancelRun := "cancel-" + mode.name
			if err := start(bob, cancelRun, "bob"); err != nil {
				t.Fatal(err)
			}
			waitHeld(t, held, cancelRun)
			cancelAs := func(b *events.Bus, who string) (uint64, error) {
				ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
				defer cancel()
				ack, err := b.PublishCancel(ctx, src, toolbus.Cancel{RunID: cancelRun, Reason: "stop", Who: who})
				if err != nil {
					return 0, err
				}
				return ack.Sequence, nil
			}
			_, err = cancelAs(alice, "bob")
			refused("cancel as bob", err, events.SubjectRunCancel(cancelRun, "bob"))
			seq, err = cancelAs(alice, "alice")
			if err != nil {
				t.Fatal(err)
			}
			notDecider(seq, events.ConsumerInjectorCancel)
			if st, _, err := admin.Store().RunState(s.ctx, cancelRun); err != nil || st.Status.Terminal() {
				t.Fatalf("alice's refused cancel ended bob's run: %+v %v", st, err)
			}
			if _, err := cancelAs(bob, "bob"); err != nil {
				t.Fatal(err)
			}
			if ended := s.waitOutcome(cancelRun, toolbus.RunCancelled); !strings.Contains(ended.Reason, "by bob") {
				t.Fatalf("cancelled: %q, want it to name bob", ended.Reason)
			}

			// The authorizer was given the bound principal of each run, and nothing else.
			mu.Lock()
			defer mu.Unlock()
			want := map[string]string{okRun: "alice", approve: "bob", listed: "bob", cancelRun: "bob"}
			for run, ids := range seen {
				w, ok := want[run]
				if !ok {
					t.Fatalf("the authorizer saw run %s (%v)", run, ids)
				}
				for _, id := range ids {
					if id != w {
						t.Fatalf("the authorizer was given principal %q for %s, want %q", id, run, w)
					}
				}
			}
			for run := range want {
				if len(seen[run]) == 0 {
					t.Fatalf("the authorizer never saw %s", run)
				}
			}
		})
	}
}
