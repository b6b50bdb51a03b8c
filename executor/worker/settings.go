package worker

import (
	"fmt"
	"os"
	"time"

	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/executor"
)

// Settings are the executor's own TOOLBUS_* variables. The toolbus binary's executor
// role (its configuration embeds Settings) and Serve (EnvConfig embeds it) read them
// through this one struct, so a variable the binary honours cannot be missed by an
// executor of your own.
type Settings struct {
	ExecutorTools    []string      `envconfig:"EXECUTOR_TOOLS" desc:"serve only these tools of the packs (deployments may overlap: each tool has one shared queue)"`
	Team             string        `envconfig:"TEAM" desc:"team owning the tools this executor serves (recorded as their owner in the catalog; its instance records are keyed by it: with per-team credentials, the team of the credentials)"`
	ReplaceContracts bool          `envconfig:"EXECUTOR_REPLACE_CONTRACTS" desc:"replace registered tool contracts that differ from this executor's without a version bump (an owner changing its tools on purpose)"`
	ProgressInterval time.Duration `envconfig:"EXECUTOR_PROGRESS_INTERVAL" default:"1s" desc:"least time between two tool.progress events of one call (a report made sooner replaces the pending one)"`
	ParkAfter        time.Duration `envconfig:"EXECUTOR_PARK_AFTER" default:"2m" desc:"an executor's tool queue idle this long stops pulling until a call is published for it (needs subscribe permission on toolbus.*.tool.requested.<tool>); negative: never"`
	CallTimeout      time.Duration `envconfig:"CALL_TIMEOUT" default:"30s" desc:"default tool timeout"`
	MaxOutput        int           `envconfig:"MAX_OUTPUT_BYTES" default:"16384" desc:"default bound of what the model reads of one result"`
}

// Validate reports the first setting out of range.
func (s Settings) Validate() error {
	var err error
	switch {
	case s.CallTimeout < 0:
		err = workerconfig.InvalidField("CallTimeout", s.CallTimeout, "0s (the tool's own) or more")
	case s.MaxOutput < 0:
		err = workerconfig.InvalidField("MaxOutput", s.MaxOutput, "1 or more")
	}
	return err
}

// Config is the worker configuration of these settings on the shared ones.
func (s Settings) Config(wc workerconfig.WorkerConfig) Config {
	return Config{WorkerConfig: wc, Tools: s.ExecutorTools, Team: s.Team, ReplaceContracts: s.ReplaceContracts,
		ProgressInterval: s.ProgressInterval, ParkAfter: s.ParkAfter}
}

// ExecutorOptions are the executor options of these settings for instance: its default
// timeout and output bound, and the secrets every result, error and progress text is
// redacted of (Secrets).
func (s Settings) ExecutorOptions(instance string, conn connect.Options) []executor.Option {
	return []executor.Option{executor.WithInstance(instance), executor.WithDefaultTimeout(s.CallTimeout),
		executor.WithDefaultMaxOutputBytes(s.MaxOutput), executor.WithSecrets(Secrets(conn)...)}
}

// Secrets are the values no tool may leak: toolbus's own credentials (its NATS
// password, token, nkey seed) and the model providers' API keys of the environment.
func Secrets(conn connect.Options) []string {
	return append(conn.Secrets(), os.Getenv("OPENAI_API_KEY"), os.Getenv("ANTHROPIC_API_KEY"))
}

// validate wraps Validate's error as the executor's.
func (s Settings) validate() error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("executor: config: %w", err)
	}
	return nil
}
