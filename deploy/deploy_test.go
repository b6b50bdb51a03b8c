// Package deploy_test checks the deployment files as their own tools would: the NATS
// configurations with nats-server's option parser (what `nats-server -t` runs), with the
// flags their comments document, and docker-compose.yml against the Compose
// Specification's schema plus the rules toolbus ships them with.
package deploy_test

import (
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"sigs.k8s.io/yaml"
)

// configure parses args as nats-server's main does (ConfigureOptions), then builds the
// server (option validation), without starting it.
func configure(t *testing.T, args ...string) (*server.Options, error) {
	t.Helper()
	fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	opts, err := server.ConfigureOptions(fs, args, func() {}, func() {}, func() {})
	if err != nil {
		return nil, err
	}
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, err
	}
	s.Shutdown()
	return opts, nil
}

// TestNATSConfigsStartAsDocumented parses every configuration of deploy/nats the way
// its comment and the README say to run it: each starts, keeps JetStream's store in the
// file (and says -sd is refused, as nats-server does), and serves monitoring on loopback
// only, also when -m overrides the port.
func TestNATSConfigsStartAsDocumented(t *testing.T) {
	for _, role := range []string{"ADMIN", "PLANNER", "EXECUTOR", "INJECTOR", "CLIENT"} {
		t.Setenv("TOOLBUS_"+role+"_PASSWORD", "pw-"+strings.ToLower(role))
	}
	t.Setenv("NATS_SERVER_NAME", "nats-1")
	cases := []struct {
		name string
		args []string
	}{
		{"single", []string{"-c", "nats/single.conf"}},
		{"single as the fault suite runs it", []string{"-c", "nats/single.conf", "-a", "127.0.0.1", "-p", "14222", "-m", "18222"}},
		{"strict", []string{"-c", "nats/strict.conf"}},
		{"cluster", []string{"-c", "nats/cluster.conf"}},
		{"cluster-strict", []string{"-c", "nats/cluster-strict.conf"}},
		{"auth-users (docker-compose.yml)", []string{"-c", "nats/auth-users.conf"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts, err := configure(t, tc.args...)
			if err != nil {
				t.Fatalf("nats-server %s: %v", strings.Join(tc.args, " "), err)
			}
			if !opts.JetStream || opts.StoreDir == "" {
				t.Errorf("JetStream %v with store %q: want JetStream with the file's store_dir", opts.JetStream, opts.StoreDir)
			}
			if opts.HTTPPort == 0 || opts.HTTPHost != "127.0.0.1" {
				t.Errorf("monitoring on %s:%d, want 127.0.0.1", opts.HTTPHost, opts.HTTPPort)
			}
		})
	}
	t.Run("-sd is refused beside store_dir, as the files say", func(t *testing.T) {
		_, err := configure(t, "-c", "nats/single.conf", "-sd", t.TempDir())
		if err == nil || !strings.Contains(err.Error(), "Duplicate 'store_dir'") {
			t.Fatalf("single.conf with -sd: %v; the comments of deploy/nats say nats-server refuses it", err)
		}
	})
}

// composeFile is docker-compose.yml decoded (YAML anchors and merge keys resolved).
func composeFile(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return doc
}

// TestComposeSchema validates docker-compose.yml against the Compose Specification's
// JSON schema (testdata/compose-spec.json, the one docker compose uses), with its
// "duration" format.
func TestComposeSchema(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "compose-spec.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	schemaDoc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("compose-spec.json", schemaDoc); err != nil {
		t.Fatal(err)
	}
	c.RegisterFormat(&jsonschema.Format{Name: "duration", Validate: func(v any) error {
		return nil // compose's own check parses Go durations; the values here are literals like 10s
	}})
	sch, err := c.Compile("compose-spec.json")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(composeFile(t))
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Validate(v); err != nil {
		t.Fatalf("docker-compose.yml does not follow the Compose Specification:\n%v", err)
	}
}

// TestComposeSecureAsShipped: every long-running service has a health check, toolbus
// init waits for a healthy NATS, the client for ready roles, each role runs with its own
// NATS user, and nothing is published beyond 127.0.0.1.
func TestComposeSecureAsShipped(t *testing.T) {
	services, _ := composeFile(t)["services"].(map[string]any)
	if len(services) == 0 {
		t.Fatal("no services")
	}
	dependsHealthy := func(svc map[string]any, on, cond string) bool {
		d, _ := svc["depends_on"].(map[string]any)
		m, _ := d[on].(map[string]any)
		return m["condition"] == cond
	}
	for name, v := range services {
		svc := v.(map[string]any)
		for _, p := range asSlice(svc["ports"]) {
			if s, _ := p.(string); !strings.HasPrefix(s, "127.0.0.1:") {
				t.Errorf("%s publishes %v beyond 127.0.0.1", name, p)
			}
		}
		hc, _ := svc["healthcheck"].(map[string]any)
		oneShot := name == "init" || name == "client"
		monitoring := name == "prometheus" || name == "grafana"
		if !oneShot && !monitoring && (hc == nil || hc["disable"] == true || hc["test"] == nil) {
			t.Errorf("%s has no health check", name)
		}
		env, _ := svc["environment"].(map[string]any)
		switch name {
		case "planner", "executor", "injector", "client":
			if env["TOOLBUS_NATS_USER"] != name {
				t.Errorf("%s connects as NATS user %v, want its own role", name, env["TOOLBUS_NATS_USER"])
			}
		case "init":
			if env["TOOLBUS_NATS_USER"] != "admin" {
				t.Errorf("init connects as %v, want admin", env["TOOLBUS_NATS_USER"])
			}
		}
	}
	if !dependsHealthy(services["init"].(map[string]any), "nats", "service_healthy") {
		t.Error("toolbus init does not wait for a healthy NATS")
	}
	for _, role := range []string{"planner", "executor", "injector"} {
		if !dependsHealthy(services[role].(map[string]any), "init", "service_completed_successfully") {
			t.Errorf("%s does not wait for toolbus init", role)
		}
		if !dependsHealthy(services["client"].(map[string]any), role, "service_healthy") {
			t.Errorf("the client does not wait for a ready %s", role)
		}
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}
