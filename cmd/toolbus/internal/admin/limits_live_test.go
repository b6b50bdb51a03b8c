package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events/eventstest"
)

// docJSON is the first json block after the anchor in the Markdown file.
func docJSON(t *testing.T, file, anchor string) string {
	t.Helper()
	return docFence(t, file, anchor, "json")
}

// editLimits is the doc's edit of deployment.json in dir: its fragment's key set to the
// fragment's value, with the fields in set (by the fragment's names) changed. The
// fragment must be a key of deployment.json (Settings, no unknown field) whose value
// names every field of set.
func editLimits(t *testing.T, dir, fragment string, set map[string]int) {
	t.Helper()
	doc := "{" + fragment + "}"
	dec := json.NewDecoder(strings.NewReader(doc))
	dec.DisallowUnknownFields()
	var s Settings
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("the doc's deployment.json fragment is not one of its keys: %v\n%s", err, fragment)
	}
	var frag map[string]map[string]any
	if err := json.Unmarshal([]byte(doc), &frag); err != nil || len(frag) != 1 {
		t.Fatalf("the doc's fragment: %v, %d keys, want one:\n%s", err, len(frag), fragment)
	}
	file := filepath.Join(dir, SettingsFile)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var settings map[string]json.RawMessage
	if err := json.Unmarshal(b, &settings); err != nil {
		t.Fatal(err)
	}
	for key, v := range frag {
		if _, ok := settings[key]; !ok {
			t.Fatalf("init's %s has no %q, the key the doc edits:\n%s", SettingsFile, key, b)
		}
		for f, n := range set {
			if _, ok := v[f]; !ok {
				t.Fatalf("the doc's fragment has no field %q:\n%s", f, fragment)
			}
			v[f] = n
		}
		if settings[key], err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	out, err := json.MarshalIndent(settings, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, append(out, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
}

// docPush runs the doc's sh block (toolbus admin lines) with the admin's entry, pushing
// to url: what it printed.
func (l *liveAdmin) docPush(url string, lines []string) string {
	l.t.Helper()
	var out strings.Builder
	for _, line := range lines {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		args, ok := strings.CutPrefix(line, "toolbus admin ")
		if !ok {
			l.t.Fatalf("a line of the block that is not toolbus admin: %s", line)
		}
		out.WriteString(l.adm(url, strings.Fields(args)...))
	}
	if out.Len() == 0 {
		l.t.Fatalf("the block ran nothing: %q", lines)
	}
	return out.String()
}

// subscribeUpTo makes n subscriptions on nc and then one more: an error if any of
// the n, or if the one more is not refused with maximum subscriptions exceeded (the
// connection staying open).
func subscribeUpTo(nc *nats.Conn, prefix string, n int) error {
	for i := range n {
		if _, err := nc.SubscribeSync(fmt.Sprintf("%s.%d", prefix, i)); err != nil {
			return err
		}
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	if err := nc.LastError(); err != nil {
		return fmt.Errorf("%d subscriptions (the cap): %w", n, err)
	}
	if _, err := nc.SubscribeSync(prefix + ".over"); err != nil {
		return err
	}
	_ = nc.Flush()
	if err := nc.LastError(); !errors.Is(err, nats.ErrMaxSubscriptionsExceeded) {
		return fmt.Errorf("subscription %d (cap %d) not refused with maximum subscriptions exceeded: %v", n+1, n, err)
	}
	if nc.IsClosed() {
		return errors.New("the connection closed on its refused subscription")
	}
	return nil
}

// hears is an error unless nc, subscribed to subj, hears what it publishes there.
func hears(nc *nats.Conn, subj string) error {
	sub, err := nc.SubscribeSync(subj)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Publish(subj, []byte("x")); err != nil {
		return err
	}
	if _, err := sub.NextMsg(5 * time.Second); err != nil {
		return fmt.Errorf("does not hear itself on %s: %w (last error %v)", subj, err, nc.LastError())
	}
	return nil
}

// TestAdminTenantLimitsPush runs docs/deployment-and-security.md's "Changing them
// later" of the tenant account limits as written on a live deployment (the accounts
// layout, operator mode, the full resolver toolbus admin init writes, the server never
// restarted nor reloaded): the doc's edit of deployment.json (its key and field names,
// with conns 2 and subs 5) and its toolbus admin push. Team alpha holds three
// connections before (the control: the cap was 1,000); after the push the server
// closes the newest, refuses a third again and refuses the sixth subscription of a
// connection that stayed, while team beta connects up to its own cap and the core's
// roles connect beyond it. The doc's edit as written (conns 2000) and a push again: a
// third connection of alpha is taken and its connection subscribes again. Beside it,
// servers on the auth-users.conf and auth-nkeys.conf the push rewrote keep the old cap
// (a fourth connection of alpha fits) until their reload, which cuts alpha to 2
// connections, refuses one more and caps a connection's subscriptions at 5.
func TestAdminTenantLimitsPush(t *testing.T) {
	const conns, subs = 2, 5
	doc := filepath.Join("..", "..", "..", "..", "docs", "deployment-and-security.md")
	fragment, lines := docJSON(t, doc, "tenant-limits-change"), docBlock(t, doc, "tenant-limits-change")
	ctx := eventstest.Context(t, time.Minute)
	l := newLiveAdmin(t, ctx)
	l.adm("", "init", "-auth", "all")
	l.adm("", "add-team", "alpha", "calc")
	l.adm("", "add-team", "beta", "web")
	srv, _ := l.serve()
	url, loaded := srv.ClientURL(), srv.ConfigTime()
	confs := []*confServer{startConf(t, l.dir, "users"), startConf(t, l.dir, "nkeys")}

	// Before: alpha's three connections fit (the cap is 1,000), on both servers.
	var alpha []*nats.Conn
	for range 3 {
		alpha = append(alpha, l.must("executor-alpha.creds"))
	}
	for _, c := range confs {
		for range 3 {
			c.must("executor-alpha")
		}
	}

	editLimits(t, l.dir, fragment, map[string]int{"conns": conns, "subs": subs})
	out := l.docPush(url, lines)
	for _, want := range []string{"changed   account of team alpha: pushed to the running servers",
		"changed   account of team beta: pushed to the running servers",
		"unchanged (files byte for byte as they were): admin, planner, injector, executor-alpha, executor-beta\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("toolbus admin push does not say %q:\n%s", want, out)
		}
	}

	// The server closed alpha's newest connection over the cap; the two oldest stay.
	eventstest.Eventually(t, 10*time.Second, func() error {
		if !alpha[2].IsClosed() {
			return errors.New("alpha's third connection is not closed by the lowered cap")
		}
		return nil
	})
	for i, nc := range alpha[:2] {
		if err := nc.Flush(); err != nil || nc.IsClosed() {
			t.Fatalf("alpha's connection %d after the push: %v", i+1, err)
		}
	}
	if _, err := l.connect("executor-alpha.creds"); err == nil || !strings.Contains(err.Error(), "maximum account active connections exceeded") {
		t.Fatalf("alpha's third connection after the push (cap %d): %v, want maximum account active connections exceeded", conns, err)
	}
	if err := subscribeUpTo(alpha[0], "limits.sub", subs); err != nil {
		t.Fatalf("alpha's connection after the push (cap %d subscriptions): %v", subs, err)
	}
	// Beta connects up to its own cap and works; the core's roles are not capped.
	for range conns {
		if err := hears(l.must("executor-beta.creds"), "limits.echo.beta"); err != nil {
			t.Fatalf("beta: %v", err)
		}
	}
	for range conns + 1 {
		if err := l.must("planner.creds").Flush(); err != nil {
			t.Fatalf("planner: %v", err)
		}
	}

	// The servers on auth-users.conf and auth-nkeys.conf keep the cap they loaded (a
	// fourth connection fits) until their reload, which keeps as many of alpha's
	// connections as the new cap allows (nats-server picks which), refuses one more and
	// caps their subscriptions.
	for _, c := range confs {
		c.must("executor-alpha")
		c.reload()
		var open []*nats.Conn
		eventstest.Eventually(t, 10*time.Second, func() error {
			open = nil
			for _, nc := range c.held {
				if !nc.IsClosed() {
					open = append(open, nc)
				}
			}
			if len(open) != conns {
				return fmt.Errorf("%s: alpha holds %d of its 4 connections after the reload, want %d", c.kind, len(open), conns)
			}
			return nil
		})
		if _, err := c.connect("executor-alpha"); err == nil || !strings.Contains(err.Error(), "maximum account active connections exceeded") {
			t.Errorf("%s: alpha's connection after the reload (cap %d): %v, want maximum account active connections exceeded", c.kind, conns, err)
		}
		if err := subscribeUpTo(open[0], "limits.sub", subs); err != nil {
			t.Errorf("%s: alpha's connection after the reload (cap %d subscriptions): %v", c.kind, subs, err)
		}
	}

	// The doc's edit as written raises the caps again: a third connection is taken,
	// and the connection at its old subscription cap subscribes again.
	editLimits(t, l.dir, fragment, nil)
	l.docPush(url, lines)
	eventstest.Eventually(t, 10*time.Second, func() error {
		nc, err := l.connect("executor-alpha.creds")
		if err != nil {
			return fmt.Errorf("alpha's third connection after the raise: %w", err)
		}
		defer nc.Close()
		return hears(nc, "limits.echo.alpha")
	})
	if err := hears(alpha[0], "limits.after"); err != nil {
		t.Errorf("alpha's connection at its old subscription cap after the raise: %v", err)
	}
	if !srv.ConfigTime().Equal(loaded) || alpha[0].Stats().Reconnects != 0 || alpha[0].IsClosed() {
		t.Error("the server reloaded, or alpha's first connection did not stay")
	}
}

// confServer is an in-process server on a deployment's auth-users.conf or
// auth-nkeys.conf (kind "users" or "nkeys"), and the connections must made on it.
type confServer struct {
	t    *testing.T
	kind string
	dir  string
	srv  *server.Server
	opts *server.Options
	held []*nats.Conn
}

func startConf(t *testing.T, dir, kind string) *confServer {
	t.Helper()
	c := &confServer{t: t, kind: kind, dir: dir}
	opts, err := server.ProcessConfigFile(c.conf())
	if err != nil {
		t.Fatal(err)
	}
	c.srv, c.opts = eventstest.StartServer(t, opts), opts
	return c
}

func (c *confServer) conf() string { return filepath.Join(c.dir, "auth-"+c.kind+".conf") }

// connect connects as user with its password, or its nkey seed.
func (c *confServer) connect(user string) (*nats.Conn, error) {
	var auth nats.Option
	if c.kind == "nkeys" {
		var err error
		if auth, err = nats.NkeyOptionFromSeed(filepath.Join(c.dir, user+".nk")); err != nil {
			return nil, err
		}
	} else {
		pw, err := os.ReadFile(filepath.Join(c.dir, user+".password"))
		if err != nil {
			return nil, err
		}
		auth = nats.UserInfo(user, string(bytes.TrimSpace(pw)))
	}
	return nats.Connect(c.srv.ClientURL(), auth, nats.NoReconnect(), nats.Timeout(5*time.Second))
}

func (c *confServer) must(user string) *nats.Conn {
	c.t.Helper()
	nc, err := c.connect(user)
	if err != nil {
		c.t.Fatalf("%s on auth-%s.conf: %v", user, c.kind, err)
	}
	c.t.Cleanup(nc.Close)
	c.held = append(c.held, nc)
	return nc
}

// reload reloads the server from its config as it is now (kill -HUP).
func (c *confServer) reload() {
	c.t.Helper()
	newOpts, err := server.ProcessConfigFile(c.conf())
	if err != nil {
		c.t.Fatal(err)
	}
	newOpts.Host, newOpts.Port, newOpts.HTTPHost, newOpts.HTTPPort = c.opts.Host, c.opts.Port, c.opts.HTTPHost, c.opts.HTTPPort
	newOpts.StoreDir, newOpts.NoLog, newOpts.NoSigs = c.opts.StoreDir, true, true
	if err := c.srv.ReloadOptions(newOpts); err != nil {
		c.t.Fatalf("%s: reload: %v", c.kind, err)
	}
}
