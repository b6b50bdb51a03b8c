package mcptools

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/toolbus/toolbus/executor/mcptools/mcpauth"
)

// The configuration: the "mcpServers" file MCP hosts use, each server's tool policy,
// and the "${NAME}" values read from the environment, checked before anything connects.

// ErrConfig is wrapped by the errors of LoadConfig and New for an unusable configuration.
var ErrConfig = errors.New("mcptools: invalid configuration")

// Server is one entry of "mcpServers": either Command (stdio) or URL (streamable HTTP),
// and the policy of its tools.
type Server struct {
	// Command starts a stdio server (looked up in PATH) with Args. Its environment is
	// Env and nothing else of the executor's but PATH and HOME: never the executor's
	// TOOLBUS_* settings nor its NATS credentials. A value "${NAME}" is the executor's
	// variable NAME (for a key the server needs), except TOOLBUS_* and NATS_* ones.
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// URL of a streamable HTTP server, with Headers sent on every request.
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	// OAuth authorizes the HTTP server's requests as the MCP specification says
	// (package mcpauth): the grant, the client's identity and credentials.
	OAuth *mcpauth.Config `json:"oauth,omitempty"`
	Policy
}

// Policy is what an operator allows of a server's tools. Tool names are the server's own
// (not the toolbus <server>__<tool> names); "*" in a list means every tool.
type Policy struct {
	// AllowTools, when set, are the only tools served; DenyTools are never served.
	AllowTools []string `json:"allowTools,omitempty"`
	DenyTools  []string `json:"denyTools,omitempty"`
	// NeedsApproval are the tools whose calls wait for a person's approval.
	NeedsApproval []string `json:"needsApproval,omitempty"`
	// Timeout bounds each call of the server's tools ("30s"; empty: Options.Timeout).
	Timeout Duration `json:"timeout,omitempty"`
}

// serves reports whether the policy lets the tool be served.
func (p Policy) serves(tool string) bool {
	if matchAny(p.DenyTools, tool) {
		return false
	}
	return len(p.AllowTools) == 0 || matchAny(p.AllowTools, tool)
}

func matchAny(list []string, tool string) bool {
	return slices.Contains(list, tool) || slices.Contains(list, "*")
}

// Duration is a time.Duration written as a Go duration string in JSON ("30s", "2m").
type Duration time.Duration

// UnmarshalJSON reads "30s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("duration %q: want a positive Go duration such as \"30s\"", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes "30s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// inheritedEnv are the only variables of the executor a stdio server gets besides its
// own Env: enough to find and run its interpreter (npx, uvx, node).
var inheritedEnv = []string{"PATH", "HOME"}

// forbiddenEnvPrefixes are the executor's variables no server may be given by "${NAME}":
// toolbus's own settings and credentials.
var forbiddenEnvPrefixes = []string{"TOOLBUS_", "NATS_"}

// childEnv is the environment of a stdio server: PATH and HOME, then env with "${NAME}"
// values read from lookup.
func childEnv(env map[string]string, lookup func(string) (string, bool)) []string {
	var out []string
	for _, k := range inheritedEnv {
		if v, ok := lookup(k); ok {
			if _, own := env[k]; !own {
				out = append(out, k+"="+v)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		v := env[k]
		if name, ok := envRef(v); ok {
			v, _ = lookup(name)
		}
		out = append(out, k+"="+v)
	}
	return out
}

// envRef returns NAME of a value "${NAME}".
func envRef(v string) (string, bool) {
	if strings.HasPrefix(v, "${") && strings.HasSuffix(v, "}") && len(v) > 3 {
		return v[2 : len(v)-1], true
	}
	return "", false
}

// Config is the content of a TOOLBUS_MCP_CONFIG file.
type Config struct {
	MCPServers map[string]Server `json:"mcpServers"`
}

// LoadConfig reads and checks a configuration file.
func LoadConfig(path string) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("mcptools: read config: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%w: %s: %v", ErrConfig, path, err)
	}
	return c.Resolve(os.LookupEnv)
}

// Resolve returns c with the "${NAME}" values of its servers' oauth objects read from
// lookup (os.LookupEnv), checked.
func (c Config) Resolve(lookup func(string) (string, bool)) (Config, error) {
	servers := make(map[string]Server, len(c.MCPServers))
	for name, s := range c.MCPServers {
		if s.OAuth != nil {
			o, err := s.OAuth.Resolve(lookup)
			if err != nil {
				return c, fmt.Errorf("%w: server %q: %w", ErrConfig, name, err)
			}
			s.OAuth = &o
		}
		servers[name] = s
	}
	c.MCPServers = servers
	return c, c.check()
}

// OAuth reports whether a server of c uses OAuth.
func (c Config) OAuth() bool {
	for _, s := range c.MCPServers {
		if s.OAuth != nil {
			return true
		}
	}
	return false
}

func (c Config) check() error {
	for name, s := range c.MCPServers {
		if (s.Command == "") == (s.URL == "") {
			return fmt.Errorf("%w: server %q needs exactly one of command (stdio) or url (streamable HTTP)", ErrConfig, name)
		}
		if name == "" {
			return fmt.Errorf("%w: a server has an empty name", ErrConfig)
		}
		if s.OAuth != nil {
			if s.URL == "" {
				return fmt.Errorf("%w: server %q: oauth applies to an HTTP server (url), not a command", ErrConfig, name)
			}
			if err := s.OAuth.Check(); err != nil {
				return fmt.Errorf("%w: server %q: %w", ErrConfig, name, err)
			}
		}
		for k, v := range s.Env {
			if ref, ok := envRef(v); ok {
				for _, p := range forbiddenEnvPrefixes {
					if strings.HasPrefix(strings.ToUpper(ref), p) {
						return fmt.Errorf("%w: server %q: env %s=${%s}: the executor's %s* variables are its own settings and credentials, never given to a tool", ErrConfig, name, k, ref, p)
					}
				}
			}
		}
	}
	return nil
}
