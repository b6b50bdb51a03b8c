package faults_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// newClusterAccounts is the accounts layout (operator/JWT: `toolbus admin init`, teams
// alpha and beta, a client alice bound to her identity) on a 3-node JetStream cluster,
// stream and buckets R3: each node runs the generated auth-jwt.conf with its own store
// (and so its own full resolver directory, under it) and a cluster block, as
// docs/deployment-and-security.md ("The accounts layout on a cluster") says.
func newClusterAccounts(t *testing.T) *accounts {
	t.Helper()
	c := newAccountsEnv(t, events.Config{Replicas: 3, InstanceTTL: 30 * time.Second})
	for i := range 3 {
		name := "n" + strconv.Itoa(i+1)
		c.nodes = append(c.nodes, &natsNode{name: name, port: freePort(t), httpPort: freePort(t), clusterPort: freePort(t),
			store: filepath.Join(c.dir, name+"-store"), conf: filepath.Join(c.dir, name+".conf")})
	}
	base := filepath.Join(c.dir, "store")
	c.admin("init", "-listen", "127.0.0.1:4222", "-store", base)
	c.admin("add-team", "alpha", "append_a")
	c.admin("add-team", "beta", "append_b")
	c.admin("add-client", "alice", "alice")
	conf := string(readFile(t, filepath.Join(c.genDir, "auth-jwt.conf")))
	for _, n := range c.nodes {
		nc := strings.ReplaceAll(conf, base, n.store) + "\ncluster {\n  name: toolbus\n}\n"
		if err := os.WriteFile(n.conf, []byte(nc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c.up("append_a,append_b")
	return c
}

// TestFaultClusterAccountsResolver: in the accounts layout on a 3-node cluster, a grant
// pushed while a node is down (kill -9) reaches that node when it comes back on its old
// store: alpha's credentials, connected to it alone, reach the granted tool's queue
// within a minute (the full resolver's sync interval; with the 2 minutes it had, the
// node went on serving the account JWT from before the grant). CONTROL: the same
// request on a node that was up answers at once after the push, and on the node that
// comes back the request for a tool alpha was never granted stays unanswered.
func TestFaultClusterAccountsResolver(t *testing.T) {
	suite(t)
	start := time.Now()
	c := newClusterAccounts(t)
	clusterTeamSecrets(c)
	n1, n3 := c.nodes[0], c.nodes[2]
	// A pull of the tool's queue that waits for nothing (requestOn): a team imports no
	// consumer info, only its queues' pulls and acks.
	queueInfo := func(tool string) string {
		return "JS.core.API.CONSUMER.MSG.NEXT." + events.QueueStreamName(events.DefaultStream) + "." + events.ToolConsumer(tool)
	}
	n3.proc.kill()
	out := c.admin("grant", "alpha", "append_c", "-push")
	c.eventually("the stream answering on two nodes", 2*time.Minute, func() error {
		ctx, cancel := c.op()
		defer cancel()
		_, err := c.bus.EventStream().Info(ctx)
		return err
	})
	c.initTools("append_c")
	reachesOn(c.env, n1, c.creds("executor-alpha"), queueInfo("append_c"), 30*time.Second)
	c.startNode(n3)
	waitNodeAs(c.env, n3, c.creds("admin"))
	back := time.Now()
	reachesOn(c.env, n3, c.creds("executor-alpha"), queueInfo("append_c"), time.Minute)
	t.Logf("the grant reached %s %v after it came back", n3.name, time.Since(back).Round(time.Millisecond))
	if err := requestOn(n3, c.creds("executor-alpha"), queueInfo("append_b")); err == nil {
		t.Errorf("alpha's credentials reach beta's queue on %s", n3.name)
	}
	t.Logf("took %v\n%s", time.Since(start).Round(time.Millisecond), out)
}

// clusterTeamSecrets: on the R3 secrets bucket a team's executor reads its own shared
// secrets (MCP OAuth tokens) by its exported direct gets, which the bucket keeps serving
// replicated (no core role reads them for it); beta's stay unread by alpha (the writes
// go through the write service, checked in TestTeamAccountSecrets). CONTROL: the core (admin) reads beta's secret as written.
func clusterTeamSecrets(c *accounts) {
	t := c.t
	ctx, cancel := c.op()
	defer cancel()
	coreBeta, err := c.bus.Secrets(ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	coreAlpha, err := c.bus.Secrets(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	for team, s := range map[string]*store.Secrets{"alpha": coreAlpha, "beta": coreBeta} {
		if _, ok, err := s.Swap(ctx, "tok", []byte(team+"-token"), 0); err != nil || !ok {
			t.Fatalf("the core writes %s's secret: %v %v", team, ok, err)
		}
	}
	nc, err := nats.Connect(c.urls(), nats.UserCredentials(c.creds("executor-alpha")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cfg := c.cfg
	cfg.APIPrefix = "JS.core.API"
	bus, err := events.Open(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	alpha, err := bus.Secrets(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	c.eventually("alpha reading its own secret on R3", time.Minute, func() error {
		ctx, cancel := c.op()
		defer cancel()
		v, rev, err := alpha.Load(ctx, "tok")
		if err != nil {
			return err
		}
		if string(v) != "alpha-token" || rev == 0 {
			return fmt.Errorf("alpha's secret: %q rev %d", v, rev)
		}
		return nil
	})
	stolen, err := bus.Secrets(ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	if v, _, err := stolen.Load(ctx, "tok"); err == nil {
		t.Errorf("alpha read beta's secret on R3: %q", v)
	}
	if v, _, err := coreBeta.Load(ctx, "tok"); err != nil || string(v) != "beta-token" {
		t.Errorf("CONTROL: the core reads beta's secret: %q %v", v, err)
	}
}

// TestFaultClusterAccountsRuns: in the accounts layout on a 3-node cluster (R3), the
// core roles connect to n1, alpha's executor to n2 and beta's to n3, each team with its
// own credentials; alice starts runs that call both teams' tools. n3 (no core role on
// it) is killed -9 with runs in flight: they complete, each call once (counted by side
// effect), and beta's credentials reach nothing of alpha's calls; then the node leading
// the event stream is killed with runs in flight, with the same outcome. A team's
// executor reads its catalog entry, claims and instances by direct gets, which a
// replicated bucket does not serve (provision turns them off so that reads go to the
// leader): it reads them through the core's read service (events.TeamReadPrefix). A grant
// to alpha is pushed while the second runs are in flight: they complete the same way,
// and alpha, not beta, reaches the granted tool's queue on every node that is up.
func TestFaultClusterAccountsRuns(t *testing.T) {
	suite(t)
	start := time.Now()
	c := newClusterAccounts(t)
	e := c.env
	file := filepath.Join(e.dir, "side-effects")
	on := func(n *natsNode, user string) []string {
		return []string{"TOOLBUS_NATS_URL=" + n.url(), "TOOLBUS_NATS_CREDS=" + c.creds(user)}
	}
	executor := func(inst, team string, n *natsNode) *proc {
		return e.faultbusRole("executor", inst, append(on(n, "executor-"+team), "TOOLBUS_TEAM="+team, "TOOLBUS_NATS_API_PREFIX=JS.core.API",
			"TOOLBUS_EXECUTOR_TOOLS=append_"+team[:1], "TOOLBUS_FAULT_APPEND_TOOLS=append_"+team[:1], "TOOLBUS_FAULT_APPEND_FILE="+file)...)
	}
	n1, n3 := e.nodes[0], e.nodes[2]
	e.faultbusRole("planner", "planner-1", append(on(n1, "planner"), "TOOLBUS_MODEL=append_a+append_b:2x3:100-600")...)
	e.toolbusRole("injector", "injector-1", on(n1, "injector")...)
	executor("alpha-1", "alpha", e.nodes[1])
	executor("beta-1", "beta", n3)
	e.waitReady([]string{"append_a", "append_b"}, "planner", "injector", "executor")
	alice, err := nats.Connect(n1.url(), nats.UserCredentials(c.creds("client-alice")), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(alice.Close)
	aliceCfg := e.cfg
	aliceCfg.ReadPrefix = events.ReadAPIPrefix("alice")
	var aliceBus *events.Bus
	e.eventually("alice's bus through the read service", time.Minute, func() error {
		aliceBus, err = events.Open(e.ctx, alice, aliceCfg)
		return err
	})
	submit := func(runs []string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, len(runs))
		for i, run := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := e.op()
				defer cancel()
				errs[i] = aliceBus.StartRun(ctx, events.Source("faults", "alice"), toolbus.RunStarted{
					RunID: run, Model: "faultbus", Principal: toolbus.Principal{ID: "alice"},
					Messages: []toolbus.Message{{Role: toolbus.RoleUser, Content: "run " + run}},
				})
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("alice's starts: %v", err)
		}
	}
	resultsAtLeast := func(n int) {
		t.Helper()
		e.eventually(fmt.Sprintf("%d results stored", n), 2*time.Minute, func() error {
			if c := e.count(events.FilterToolFinished); c < n {
				return fmt.Errorf("%d results", c)
			}
			return nil
		})
	}
	first := runIDs("alice-a", 8)
	submit(first)
	resultsAtLeast(8)
	n3.proc.kill()
	t.Logf("killed %s (beta's executor's node) with %d results stored", n3.name, e.count(events.FilterToolFinished))
	e.waitCompleted(first, 3*time.Minute)
	e.startNode(n3)
	waitNodeAs(e, n3, c.creds("admin"))
	if leaks := e.probeFromTeam(c.creds("executor-beta"), "append_b", "append_a", first[0]); len(leaks) > 0 {
		t.Errorf("executor-beta's credentials reached append_a's calls in the cluster:\n  %s", strings.Join(leaks, "\n  "))
	}
	second := runIDs("alice-b", 8)
	before := e.count(events.FilterToolFinished)
	submit(second)
	// An admin push with these runs in flight: a grant to alpha, pushed to every server.
	pushed := c.admin("grant", "alpha", "append_c", "-push")
	resultsAtLeast(before + 8)
	info, err := e.bus.EventStream().Info(e.ctx)
	if err != nil || info.Cluster == nil {
		t.Fatalf("stream info: %v", err)
	}
	for _, n := range e.nodes {
		if n.name == info.Cluster.Leader {
			n.proc.kill()
			t.Logf("killed %s, the stream leader", n.name)
		}
	}
	e.waitCompleted(second, 3*time.Minute)
	all := append(append([]string{}, first...), second...)
	st := e.checkRuns(e.tally(), all, 3, 2)
	n := checkSideEffects(t, file, all, 3, 2)
	// The push reached every server that is up: alpha pulls its new tool's queue on
	// each; beta's credentials reach it on none (no tenant reaches more than before).
	c.initTools("append_c")
	pull := "JS.core.API.CONSUMER.MSG.NEXT." + events.QueueStreamName(events.DefaultStream) + "." + events.ToolConsumer("append_c")
	for _, node := range e.nodes {
		if node.name == info.Cluster.Leader {
			continue // killed above
		}
		reachesOn(e, node, c.creds("executor-alpha"), pull, time.Minute)
		if err := requestOn(node, c.creds("executor-beta"), pull); err == nil {
			t.Errorf("beta's credentials reach alpha's new queue on %s", node.name)
		}
	}
	t.Logf("%s; %d side effects, each once, with a grant pushed while runs were in flight; took %v\n%s", st, n, time.Since(start).Round(time.Millisecond), pushed)
}

// reachesOn waits until user's credentials, connected to node n alone, get an answer on
// subject (a JetStream API request through their account's imports).
func reachesOn(e *env, n *natsNode, creds, subject string, d time.Duration) {
	e.t.Helper()
	e.eventually(filepath.Base(creds)+" reaching "+subject+" on "+n.name, d, func() error {
		return requestOn(n, creds, subject)
	})
}

// requestOn sends one request on subject with creds, connected to node n alone, and
// returns an error unless it is answered without a JetStream error. Its body asks a pull
// for one message without waiting: an empty queue answers at once (404, no messages).
func requestOn(n *natsNode, creds, subject string) error {
	nc, err := nats.Connect(n.url(), nats.UserCredentials(creds), nats.Timeout(time.Second), nats.NoReconnect())
	if err != nil {
		return err
	}
	defer nc.Close()
	m, err := nc.Request(subject, []byte(`{"batch":1,"no_wait":true}`), 2*time.Second)
	if err != nil {
		return err
	}
	if strings.Contains(string(m.Data), `"error"`) {
		return errors.New(string(m.Data))
	}
	return nil
}
