package node

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/kelseyhightower/envconfig"

	"github.com/toolbus/toolbus/events/workerconfig"
	"github.com/toolbus/toolbus/injector"
	"github.com/toolbus/toolbus/planner"
)

// envDescriptions describe the variables whose fields (in other packages) carry no desc
// tag, so that `toolbus env` explains every variable.
var envDescriptions = map[string]string{
	"TOOLBUS_STREAM":            "JetStream stream of the events",
	"TOOLBUS_RETENTION":         "how long events are kept",
	"TOOLBUS_DUPLICATE_WINDOW":  "window in which the stream drops a republished event (same id)",
	"TOOLBUS_MEMORY_STORAGE":    "keep the stream and buckets in memory (tests, demos)",
	"TOOLBUS_REPLICAS":          "replicas of the stream and buckets (1, or 3 on a cluster)",
	"TOOLBUS_INSTANCE_TTL":      "an executor instance leaves the catalog this long after its last heartbeat",
	"TOOLBUS_OUTPUTS_MAX_BYTES": "size bound of the bucket of large tool outputs (-1: none)",
	"TOOLBUS_STREAM_MAX_BYTES":  "size bound of the event stream (0: none); full, it refuses new events and the injectors refuse new runs from 90% (quota_exceeded); toolbus init sets it",
}

// envDefaults are the defaults of the variables whose default lives in a worker package
// (one place for each), so they carry no default tag.
var envDefaults = map[string]string{
	"TOOLBUS_CONCURRENCY":        strconv.Itoa(workerconfig.DefaultConcurrency),
	"TOOLBUS_ACK_WAIT":           workerconfig.DefaultAckWait.String(),
	"TOOLBUS_MAX_DELIVER":        fmt.Sprintf("%d (injector %d)", workerconfig.DefaultMaxDeliver, injector.DefaultMaxDeliver),
	"TOOLBUS_GRACE":              workerconfig.DefaultGrace.String(),
	"TOOLBUS_MAX_STEPS":          strconv.Itoa(injector.DefaultMaxSteps),
	"TOOLBUS_MAX_CALLS_PER_STEP": strconv.Itoa(planner.DefaultMaxCallsPerStep),
}

// EnvVar is one variable of `toolbus env`: its name, default ("-" when none) and meaning.
type EnvVar struct{ Name, Default, Meaning string }

// EnvVars returns every TOOLBUS_* variable of Config, in the order of its fields. It is
// what `toolbus env` prints and what docs/configuration.md shows (TestConfigurationDoc).
func EnvVars(cfg Config) ([]EnvVar, error) {
	// envconfig renders the variables through a template; a unit separator keeps the
	// columns apart so that missing descriptions can be filled in here.
	const sep = "\x1f"
	var raw bytes.Buffer
	format := `{{range .}}{{usage_key .}}` + sep + `{{usage_default .}}` + sep + `{{usage_description .}}` + "\n{{end}}"
	if err := envconfig.Usagef(envPrefix, &cfg, &raw, format); err != nil {
		return nil, fmt.Errorf("env: %w", err)
	}
	var vars []EnvVar
	for _, line := range strings.Split(strings.TrimRight(raw.String(), "\n"), "\n") {
		f := strings.SplitN(line, sep, 3)
		if len(f) != 3 {
			continue
		}
		v := EnvVar{Name: strings.TrimSpace(f[0]), Default: strings.TrimSpace(f[1]), Meaning: strings.TrimSpace(f[2])}
		if v.Meaning == "" {
			v.Meaning = envDescriptions[v.Name]
		}
		if v.Default == "" {
			v.Default = envDefaults[v.Name]
		}
		if v.Default == "" {
			v.Default = "-"
		}
		vars = append(vars, v)
	}
	return vars, nil
}

// EnvModelCredentials names the providers' own variables, which the planner's model
// adapters read as the providers' SDKs do.
const EnvModelCredentials = "OPENAI_API_KEY, OPENAI_BASE_URL, ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL"
