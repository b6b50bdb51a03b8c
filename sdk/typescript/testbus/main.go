// Command testbus runs the bus the TypeScript package's tests (npm test) talk to when
// no TOOLBUS_TEST_NATS_URL is given: an embedded NATS JetStream server on a random
// loopback port with toolbus's stream and buckets set up (provision.Setup), and the
// pipeline's roles on it: a planner (pre-planned runs only: a run that needs a model
// waits), an injector and a Go executor serving the demo and diag
// packs. It prints the server's URL on one line of stdout and stops when stdin closes
// (the test process that started it ended) or on SIGINT/SIGTERM.
//
// With -team it runs the accounts layout instead (events/eventstest.AccountsConf) on a
// nats-server process it builds (events/eventstest.AccountsProcess): a core account
// with the stream, buckets and roles, and a team account (TeamName) granted TeamTools,
// whose queues it provisions in the core; it prints a TeamBus as one line of JSON (the
// URLs with their credentials, the team, its API prefix and tools).
//
//	go run ./testbus         (from sdk/typescript)
//	go run ./testbus -team
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/embedded"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/events/provision"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/planner"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testbus:", err)
		os.Exit(1)
	}
}

func run() error {
	team := flag.Bool("team", false, "run the accounts layout: a core account and the team account "+TeamName)
	flag.Parse()
	dir, err := os.MkdirTemp("", "toolbus-testbus-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var nc *nats.Conn
	var hello string
	if *team {
		srv, err := accountsServer(dir)
		if err != nil {
			return err
		}
		defer srv.Stop()
		if nc, err = nats.Connect(srv.URL, nats.UserInfo("core", "core")); err != nil {
			return err
		}
		tb := TeamBusOf(srv.URL)
		grants, err := srv.ServeGrants()
		if err != nil {
			return err
		}
		defer grants.Close()
		tb.GrantURL = "http://" + grants.Addr().String() + "/grant"
		b, err := json.Marshal(tb)
		if err != nil {
			return err
		}
		hello = string(b)
	} else {
		srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
		if err != nil {
			return err
		}
		defer srv.Stop()
		if nc, err = srv.Connect(); err != nil {
			return err
		}
		hello = srv.ClientURL()
	}
	defer nc.Close()
	roles, err := Pipeline(ctx, nc, log)
	if err != nil {
		return err
	}
	if *team {
		if err := ProvisionQueues(ctx, nc, TeamTools); err != nil {
			stop()
			return errors.Join(err, roles())
		}
	}
	fmt.Println(hello)
	eof := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(eof) }()
	select {
	case <-ctx.Done():
	case <-eof:
	}
	stop()
	return roles()
}

// WaitingModel answers no run: this bus has no model, so a run that is not pre-planned
// stays running (its model call waits until the planner's model timeout) and the
// executor tests' runs, which a test drives call by call, are never ended by the pipeline.
var WaitingModel = planner.ModelFunc(func(ctx context.Context, _ planner.Request) (planner.Response, error) {
	<-ctx.Done()
	return planner.Response{}, ctx.Err()
})

// Pipeline sets the bus up on nc and runs a planner (pre-planned runs only), an
// injector and a Go executor of the demo and diag packs until ctx ends; wait waits for
// them to stop.
func Pipeline(ctx context.Context, nc *nats.Conn, log *slog.Logger) (wait func() error, err error) {
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	bus, _, err := provision.Setup(sctx, nc, events.Config{})
	if err != nil {
		return nil, err
	}
	reg := executor.NewRegistry()
	if err := packs.Register(reg, "demo", "diag"); err != nil {
		return nil, err
	}
	exec, err := executor.New(reg, executor.WithLogger(log), executor.WithInstance("go-exec-1"))
	if err != nil {
		return nil, err
	}
	wc := func(instance string) workerconfig.WorkerConfig {
		return workerconfig.WorkerConfig{Instance: instance, Logger: log, Grace: time.Second}
	}
	w, err := worker.New(bus, exec, worker.Config{WorkerConfig: wc("go-exec-1")})
	if err != nil {
		return nil, err
	}
	cat, err := bus.Store().WatchCatalog(ctx, log)
	if err != nil {
		return nil, err
	}
	p, err := planner.New(bus, WaitingModel, cat, planner.Config{WorkerConfig: wc("planner-1")})
	if err != nil {
		return nil, err
	}
	// The decision policy: a run's principal and approvers, and ops (test/outsider-cancel.test.ts).
	inj, err := injector.New(bus, injector.Config{WorkerConfig: wc("injector-1"), Deciders: Deciders})
	if err != nil {
		return nil, err
	}
	errs := make(chan error, 3)
	for _, r := range []func(context.Context) error{w.Run, p.Run, inj.Run} {
		go func() { errs <- r(ctx) }()
	}
	// The Go tools are in the catalog before the URL is handed out.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if _, ok := cat.Lookup("calculator"); ok {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("the Go executor's tools never reached the catalog")
		}
	}
	return func() error {
		var all []error
		for range 3 {
			all = append(all, <-errs)
		}
		return errors.Join(all...)
	}, nil
}

// Deciders is the injector's TOOLBUS_DECIDERS (npm_test.go's pipeline has the same).
var Deciders = []string{"ops"}

// TeamName and TeamTools are the team account of -team and the tools the core exports
// to it (test/team.test.ts serves them).
const TeamName = "alpha"

var TeamTools = []string{"team_count", "team_pay", "team_hang"}

// TeamBus is what the TypeScript tests of the accounts layout are given (test/helpers.ts).
type TeamBus struct {
	URL          string   `json:"url"`
	CoreUser     string   `json:"core_user"`
	CorePassword string   `json:"core_password"`
	TeamUser     string   `json:"team_user"`
	TeamPassword string   `json:"team_password"`
	TeamName     string   `json:"team_name"`
	APIPrefix    string   `json:"api_prefix"`
	Tools        []string `json:"tools"`
	// GrantURL, when set, takes a POST whose body lists the tools the team is granted
	// from then on, comma-separated (eventstest.AccountsProcess.ServeGrants): a revocation under running executors.
	GrantURL string `json:"grant_url,omitempty"`
}

// TeamBusOf is the TeamBus of an accounts server at url (users core/core and
// TeamName/TeamName, as eventstest.AccountsConf renders them).
func TeamBusOf(url string) TeamBus {
	return TeamBus{URL: url, CoreUser: "core", CorePassword: "core", TeamUser: TeamName, TeamPassword: TeamName,
		TeamName: TeamName, APIPrefix: eventstest.TeamAPIPrefix, Tools: TeamTools}
}

// accountsServer starts the server of the accounts layout for TeamName and TeamTools: a
// nats-server process, since the tests regrant (a reload) under running connections
// (eventstest.AccountsProcess), with the core's write service beside it.
func accountsServer(dir string) (*eventstest.AccountsProcess, error) {
	srv, err := eventstest.StartAccountsProcess(dir, TeamName, TeamTools)
	if err != nil {
		return nil, err
	}
	// The core's write service (every injector runs it): the team's writes reach the
	// core's streams only through it. It lives as long as the process.
	nc, err := nats.Connect(srv.URL, nats.UserInfo("core", "core"))
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("the write service: %w", err)
	}
	go func() {
		if err := intake.New(nc, intake.Limits{}, nil).Serve(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "testbus: write service:", err)
		}
	}()
	return srv, nil
}

// ProvisionQueues creates the durable queues of tools in the core account (what
// `toolbus init --tools` does): a team account binds them and never creates one.
func ProvisionQueues(ctx context.Context, nc *nats.Conn, tools []string) error {
	bus, err := events.Open(ctx, nc, events.Config{})
	if err != nil {
		return err
	}
	for _, tool := range tools {
		if _, err := provision.Consumer(ctx, bus, provision.ToolConsumerConfig(tool, 0, 0)); err != nil {
			return fmt.Errorf("the queue of %s: %w", tool, err)
		}
	}
	return nil
}
