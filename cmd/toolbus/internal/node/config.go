package node

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor/worker"
	"github.com/toolbus/toolbus/fair"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/intake"
	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/telemetry"
)

// Config is every setting of toolbus, read from TOOLBUS_* environment variables.
// `toolbus env` prints them with their defaults.
type Config struct {
	// DataDir of the embedded server's file store.
	DataDir string `envconfig:"DATA_DIR" default:"./data" desc:"file store of the embedded server"`
	// Listen address of the embedded server (host:port); empty listens on 127.0.0.1 with a
	// random port.
	Listen string `envconfig:"LISTEN" desc:"embedded server address (host:port); empty: in-process only (random port on 127.0.0.1)"`
	// Durability of the embedded server: default or strict (fsync every write).
	Durability string `envconfig:"DURABILITY" default:"default" desc:"embedded server: default (fsync every 2 min: survives a process crash) or strict (fsync every write: survives a power loss)"`

	connect.Options
	events.Config
	// WorkerConfig is the shared settings of every role: TOOLBUS_INSTANCE,
	// TOOLBUS_CONCURRENCY, TOOLBUS_ACK_WAIT, TOOLBUS_MAX_DELIVER, TOOLBUS_GRACE. Unset,
	// they take the defaults of package events (envDefaults shows them in toolbus env).
	workerconfig.WorkerConfig
	// Shares are the fair scheduler's (package fair), run by the injectors when the queue
	// stream stages calls (TOOLBUS_FAIR_SHARE at init).
	fair.Shares

	Tools     string `envconfig:"TOOLS" default:"demo" desc:"built-in tool packs served by executors (demo, diag: diag's panic, big_output, sleep... only when asked for)"`
	MCPConfig string `envconfig:"MCP_CONFIG" desc:"JSON file of MCP servers whose tools executors serve (mcpServers: command/args/env or url/headers/oauth)"`
	// Settings are the executor's (worker.Settings): the same struct Serve reads.
	worker.Settings

	// Record is the cassette every model exchange is appended to (models.Options.Record).
	Record string `envconfig:"RECORD" desc:"append every model exchange to this JSONL cassette (replay it with TOOLBUS_MODEL=replay:<file>)"`
	Model  string `envconfig:"MODEL" default:"script:incident" desc:"model: script:incident, replay:<file>, openai:<model>, openai-responses:<model>, anthropic:<model>"`
	// MaxSteps is the step limit of runs that set none (unset: injector.DefaultMaxSteps).
	MaxSteps int `envconfig:"MAX_STEPS" desc:"default step limit of a run"`
	// MaxCallsPerStep caps the calls of one step that run; the rest are rejected
	// (too_many_calls). Unset: planner.DefaultMaxCallsPerStep.
	MaxCallsPerStep int `envconfig:"MAX_CALLS_PER_STEP" desc:"calls of one step that run; the rest get a rejected result (too_many_calls)"`
	// MaxAnswerBytes bounds a model answer (planner.Config.MaxAnswerBytes).
	MaxAnswerBytes int           `envconfig:"MAX_ANSWER_BYTES" desc:"largest model answer (JSON bytes) recorded; a larger one fails the run model_answer_too_large after one model call (0: the server's max_payload less 16 KiB)"`
	RunTimeout     time.Duration `envconfig:"RUN_TIMEOUT" default:"10m" desc:"default run deadline, from its start"`
	// MaxRunTimeout caps every run's deadline (a client may ask for any).
	MaxRunTimeout time.Duration `envconfig:"MAX_RUN_TIMEOUT" default:"24h" desc:"cap of any run's deadline, from its start (0: no cap)"`
	TokenBudget   int64         `envconfig:"TOKEN_BUDGET" desc:"default token budget of a run (0: none)"`
	// The quota of each principal (injector.Quota), checked by the injector when a run
	// starts: a run beyond it fails with code quota_exceeded.
	MaxRunsInFlight int      `envconfig:"MAX_RUNS_IN_FLIGHT" desc:"runs of one principal in flight at once, per injector; a run started beyond it fails quota_exceeded (0: no bound)"`
	StartsPerSecond float64  `envconfig:"STARTS_PER_SECOND" desc:"new runs per second of one principal, per injector (bursts of as many); a run started beyond it fails quota_exceeded (0: no bound)"`
	MaxStartBytes   int      `envconfig:"MAX_START_BYTES" desc:"largest run.started (JSON bytes of its data) the injector starts; a larger one fails quota_exceeded (0: no bound)"`
	FailOn          []string `envconfig:"FAIL_ON" default:"unknown_tool,tool_internal_error,invalid_tool_output,permission_denied" desc:"error codes that fail a run"`
	// ReadService: the injector also serves the read service of clients in accounts of
	// their own (package reads).
	ReadService bool `envconfig:"READ_SERVICE" default:"true" desc:"the injector also answers the read service of clients in accounts of their own (toolbus_read.<identity>.>): the runs, outputs and catalog an identity may see"`
	// WriteService: the injector also admits the writes of teams and clients in accounts
	// of their own (package intake), with the tenants' bounds.
	WriteService bool `envconfig:"WRITE_SERVICE" default:"true" desc:"the injector also admits the writes of teams and clients in accounts of their own (toolbus_write.>): their form, only the headers toolbus writes, sizes and bytes per second"`
	// TenantBytesPerSecond is on by default (intake.DefaultBytesPerSecond, which
	// TestTenantBytesDefault holds the tag to): a tenant's writes are bounded out of the box.
	TenantBytesPerSecond float64 `envconfig:"TENANT_BYTES_PER_SECOND" default:"1048576" desc:"bytes per second (subject, headers, data and 64 bytes a message) one team or client identity in an account of its own may store, per injector; a write beyond it is refused at once, code 429 quota_exceeded (0: no bound)"`
	// TenantStreamShare is a tenant's share of the event stream (intake.StreamShare).
	TenantStreamShare int `envconfig:"TENANT_STREAM_SHARE" default:"10" desc:"percent of TOOLBUS_STREAM_MAX_BYTES one team or client identity may hold in the event stream within its retention, per injector, so that a tenant at its share cannot push the others' new runs to the admission line (90%); a write beyond it is refused, code 507 store_full (0: no share; nothing without TOOLBUS_STREAM_MAX_BYTES)"`
	// TenantClaimsBytes bounds a team's claims (intake.Limits.ClaimsShare), on by default.
	TenantClaimsBytes int64 `envconfig:"TENANT_CLAIMS_BYTES" default:"1073741824" desc:"bytes of claims one team in an account of its own may write within the retention (TOOLBUS_RETENTION, the claims' TTL), per injector, so that its claims cannot fill the store the others' claims live in; a write beyond it is refused, code 507 store_full (0: no bound)"`
	TenantBytesBurst  int   `envconfig:"TENANT_BYTES_BURST" desc:"bytes a tenant may store at once beyond TOOLBUS_TENANT_BYTES_PER_SECOND (0: a minute of the rate, at least the server's max_payload)"`
	// The bounds of a team's keys of each shared bucket (intake.BucketBounds).
	TenantBucketKeys map[string]int `envconfig:"TENANT_BUCKET_KEYS" desc:"most keys of one team (secrets, instances) or tool (claims, outputs) in a shared bucket, as bucket:keys,... over the defaults secrets:16,instances:256,outputs:2048; a new key beyond it is refused at once, code 507 store_full (0: no bound)"`
	TenantValueBytes map[string]int `envconfig:"TENANT_VALUE_BYTES" desc:"largest value of a tenant's key in a shared bucket, as bucket:bytes,... over the defaults secrets:65536,instances:262144,claims:65536,outputs:131072; a larger one is refused, code 400 (0: no bound)"`
	// Deciders may decide on and cancel every run besides its principal and approvers.
	Deciders []string `envconfig:"DECIDERS" desc:"identities (besides a run's principal and the approvers its start lists) who may approve, deny, respond to and cancel every run; * lets anyone. Unset: * on the embedded server (one party), nobody else when TOOLBUS_NATS_URL names a shared server"`

	// MetricsAddr serves /metrics, /healthz and /readyz (host:port) for every role of the
	// process; empty serves nothing.
	MetricsAddr string `envconfig:"METRICS_ADDR" desc:"address (host:port) of /metrics, /healthz and /readyz for the roles of this process; empty: none"`

	ConsoleAddr string `envconfig:"CONSOLE_ADDR" desc:"web console address (host:port) of toolbus console, and of toolbus up when set"`
	// The console's users (see access.go for the access-list format).
	ConsoleUsers        string   `envconfig:"CONSOLE_USERS" desc:"console users, inline: entries 'NAME sha256:HEX [teams=a,b]' separated by ';' (toolbus token NAME makes one)"`
	ConsoleUsersFile    string   `envconfig:"CONSOLE_USERS_FILE" desc:"console users file, one 'NAME sha256:HEX [teams=a,b]' per line; re-read when it changes (delete a line to revoke)"`
	ConsolePublicRead   bool     `envconfig:"CONSOLE_PUBLIC_READ" desc:"let anyone who reaches the console read every run without signing in (actions still need a user)"`
	ConsoleAllowedHosts []string `envconfig:"CONSOLE_ALLOWED_HOSTS" desc:"Host names the console answers besides loopback and its listen host (DNS rebinding guard)"`

	// The HTTP door of `toolbus mcp --http` (see access.go for the access-list format).
	MCPHostApprovals       bool          `envconfig:"MCP_HOST_APPROVALS" default:"true" desc:"toolbus mcp asks the host's user to decide a call that needs approval (false: it waits for toolbus approve or the console)"`
	MCPTokens              string        `envconfig:"MCP_TOKENS" desc:"access list of toolbus mcp --http, inline: entries 'NAME sha256:HEX [teams=a,b]' separated by ';' (toolbus token NAME makes one)"`
	MCPTokensFile          string        `envconfig:"MCP_TOKENS_FILE" desc:"access list file of toolbus mcp --http, one 'NAME sha256:HEX [teams=a,b]' per line; re-read when it changes (delete a line to revoke)"`
	MCPStateKeyFile        string        `envconfig:"MCP_STATE_KEY_FILE" desc:"file of the key (at least 32 bytes, e.g. base64 of 32 random ones) that seals the requestState of toolbus mcp --http's input_required answers: the same in every replica, so any resumes a round trip (none: a random key per process)"`
	MCPAllowedHosts        []string      `envconfig:"MCP_ALLOWED_HOSTS" desc:"Host names toolbus mcp --http answers besides loopback and its listen host (DNS rebinding guard)"`
	MCPAllowedOrigins      []string      `envconfig:"MCP_ALLOWED_ORIGINS" desc:"browser origins (https://app.example) allowed to call toolbus mcp --http besides its own"`
	MCPSessionTimeout      time.Duration `envconfig:"MCP_SESSION_TIMEOUT" default:"30m" desc:"toolbus mcp --http closes a session idle this long"`
	MCPMaxSessions         int           `envconfig:"MCP_MAX_SESSIONS" default:"100" desc:"live sessions of toolbus mcp --http, all tokens together; a new one beyond it gives up its token's oldest session, or gets 503 when its token holds none"`
	MCPMaxSessionsPerToken int           `envconfig:"MCP_MAX_SESSIONS_PER_TOKEN" default:"10" desc:"live sessions of toolbus mcp --http per token; a new one beyond it gives up the token's oldest session"`

	LogLevel  string `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	LogFormat string `envconfig:"LOG_FORMAT" default:"text" desc:"text or json"`

	// LogOut is where logs go (default os.Stderr): the stderr of the command.
	LogOut io.Writer `ignored:"true"`
}

const envPrefix = connect.EnvPrefix

// Load reads the configuration from the TOOLBUS_* environment variables, refusing
// settings out of range with the variable named.
func Load() (Config, error) {
	var c Config
	if err := envconfig.Process(envPrefix, &c); err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	if _, err := telemetry.NewLogger(c.LogLevel, c.LogFormat, io.Discard); err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	// Empty (TOOLBUS_LOG_LEVEL= set but empty) means the default.
	c.LogLevel = cmp.Or(strings.ToLower(strings.TrimSpace(c.LogLevel)), "info")
	if err := c.validate(); err != nil {
		return c, err
	}
	if c.Instance == "" {
		h, _ := os.Hostname()
		c.Instance = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	return c, nil
}

// validate refuses settings out of range, naming the variable: the checks are the
// Validate methods of the worker configs, so they cannot disagree with the workers.
func (c Config) validate() error {
	var err error
	switch {
	case c.WorkerConfig.Validate() != nil:
		err = c.WorkerConfig.Validate()
	case c.MaxSteps < 0:
		err = workerconfig.InvalidField("MaxSteps", c.MaxSteps, fmt.Sprintf("1 or more (unset: %d)", injector.DefaultMaxSteps))
	case c.RunTimeout < 0:
		err = workerconfig.InvalidField("RunTimeout", c.RunTimeout, "0s (none) or more")
	case c.MaxAnswerBytes < 0:
		err = workerconfig.InvalidField("MaxAnswerBytes", c.MaxAnswerBytes, "0 (the server's bound) or more")
	case c.MaxRunTimeout < 0:
		err = workerconfig.InvalidField("MaxRunTimeout", c.MaxRunTimeout, "0s (no cap) or more")
	case c.TokenBudget < 0:
		err = workerconfig.InvalidField("TokenBudget", c.TokenBudget, "0 (none) or more")
	case c.MaxRunsInFlight < 0:
		err = workerconfig.InvalidField("MaxRunsInFlight", c.MaxRunsInFlight, "0 (no bound) or more")
	case c.StartsPerSecond < 0:
		err = workerconfig.InvalidField("StartsPerSecond", c.StartsPerSecond, "0 (no bound) or more")
	case c.MaxStartBytes < 0:
		err = workerconfig.InvalidField("MaxStartBytes", c.MaxStartBytes, "0 (no bound) or more")
	case c.TenantBucketKeys != nil || c.TenantValueBytes != nil:
		if _, err = intake.BucketBounds(c.TenantBucketKeys, c.TenantValueBytes); err != nil {
			err = fmt.Errorf("config: %s, %s: %w", envName("TenantBucketKeys"), envName("TenantValueBytes"), err)
			break
		}
		fallthrough
	default:
		if err = c.Settings.Validate(); err == nil {
			err = planner.Config{MaxCallsPerStep: c.MaxCallsPerStep}.Validate()
		}
		if err == nil {
			err = c.Shares.Validate()
		}
	}
	var ce *workerconfig.ConfigError
	if errors.As(err, &ce) {
		return fmt.Errorf("config: %s %v: want %s", envName(ce.Field), ce.Value, strings.ReplaceAll(ce.Want, "0: default", "unset or 0: default"))
	}
	return err
}

// envName is the variable of a field of Config (MaxSteps: TOOLBUS_MAX_STEPS), found
// through the envconfig tags, embedded structs included.
func envName(field string) string {
	var find func(t reflect.Type) string
	find = func(t reflect.Type) string {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				if n := find(f.Type); n != "" {
					return n
				}
				continue
			}
			if tag := f.Tag.Get("envconfig"); f.Name == field && tag != "" {
				return envPrefix + "_" + tag
			}
		}
		return ""
	}
	if n := find(reflect.TypeOf(Config{})); n != "" {
		return n
	}
	return field
}

// SyncAlways reports whether TOOLBUS_DURABILITY asks for strict durability.
func (c Config) SyncAlways() (bool, error) {
	switch strings.ToLower(strings.TrimSpace(c.Durability)) {
	case "", "default":
		return false, nil
	case "strict":
		return true, nil
	}
	return false, fmt.Errorf("config: TOOLBUS_DURABILITY %q: want default or strict", c.Durability)
}

// Logger is the logger of TOOLBUS_LOG_LEVEL and TOOLBUS_LOG_FORMAT (checked by Load),
// on LogOut.
func (c Config) Logger() *slog.Logger {
	log, err := telemetry.NewLogger(c.LogLevel, c.LogFormat, cmp.Or[io.Writer](c.LogOut, os.Stderr))
	if err != nil {
		return slog.Default()
	}
	return log
}

func (c Config) packs() []string {
	var out []string
	for _, p := range strings.Split(c.Tools, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// DefaultLimits are the limits the workers give runs that set none.
func (c Config) DefaultLimits() toolbus.DefaultLimits {
	return toolbus.DefaultLimits{MaxSteps: c.MaxSteps, RunTimeout: c.RunTimeout, TokenBudget: c.TokenBudget, MaxRunTimeout: c.MaxRunTimeout}
}
