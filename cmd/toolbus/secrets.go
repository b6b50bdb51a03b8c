package main

import (
	"os"
	"strings"
)

// secretValues are the values of this process's own credentials, which the executor
// redacts from every tool output by value (executor.WithSecrets): a tool that prints its
// environment, a file or a config it found must not hand them to the model, the stream or
// the console. They are the NATS password and token, the nkey seed and the credentials
// file's JWT and seed, and the model providers' API keys.
func (c Config) secretValues() []string {
	out := []string{c.Password, c.Token}
	for _, f := range []string{c.NKeySeed, c.Creds} {
		if f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the connection reports an unreadable file
		}
		for _, line := range strings.Split(string(b), "\n") {
			// The JWT and the seed; not the file's "-----BEGIN ..." armour and prose.
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "---") && !strings.Contains(line, " ") {
				out = append(out, line)
			}
		}
	}
	for _, k := range []string{"OPENAI_API_KEY", "ANTHROPIC_API_KEY"} {
		out = append(out, os.Getenv(k))
	}
	return out
}
