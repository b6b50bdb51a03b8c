// Package models builds the planner.Model that a name such as script:incident,
// replay:<file> or openai:gpt-4.1 stands for (TOOLBUS_MODEL, toolbus run --model), and the
// set of models a planner serves by name. The provider SDKs are linked only without the
// toolbus_lite build tag.
package models

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/toolbus/toolbus/planner"
)

// Options are what building a model needs besides its name.
type Options struct {
	// Logger logs the providers' retries and the recorder's errors (default slog.Default).
	Logger *slog.Logger
	// Record, when set, appends every exchange to this JSONL cassette (TOOLBUS_RECORD).
	Record string
	// Scripts are more built-in scripted models, by name (script:<name>), beside
	// incident and approval.
	Scripts map[string]func() planner.Model
}

// New builds the model named name (TOOLBUS_MODEL):
//
//	script:incident | script:approval built-in scripted models (no network), and those
//	                                  of Options.Scripts
//	script:<file.json>                a script file written by hand (planner.LoadScriptFile)
//	replay:<file>                     answers from a cassette (no network)
//	openai:<model>                    OpenAI Chat Completions, or any compatible server
//	openai-responses:<model>          OpenAI Responses
//	anthropic:<model>                 Anthropic Messages
//
// Providers read their standard environment: OPENAI_API_KEY, OPENAI_BASE_URL,
// ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL. Options.Record wraps the model with a recorder
// that appends every exchange to that cassette.
func New(name string, o Options) (planner.Model, error) {
	m, err := Base(name, o)
	if err != nil {
		return nil, err
	}
	if path := o.Record; path != "" {
		rec, err := planner.OpenRecorder(m, path, o.logger())
		if err != nil {
			return nil, err
		}
		m = rec // the file stays open for the life of the process
	}
	return m, nil
}

func (o Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.Default()
	}
	return o.Logger
}

// Base builds the model named name, without the recorder of Options.Record: what New
// wraps, and what a client checks before it starts an in-process planner.
func Base(name string, o Options) (planner.Model, error) {
	kind, arg, _ := strings.Cut(name, ":")
	log := o.logger()
	switch kind {
	case "script":
		switch arg {
		case "incident", "":
			return IncidentScript(), nil
		case "approval":
			return ApprovalScript(), nil
		}
		if script, ok := o.Scripts[arg]; ok {
			return script(), nil
		}
		if planner.IsInlineScript(name) {
			return planner.ParseInlineScript(name) // shipped with the run: no file here
		}
		if _, err := os.Stat(arg); err != nil {
			return nil, fmt.Errorf("unknown script %q: not a built-in script (%s) nor a readable script file: %w", arg, o.builtins(), err)
		}
		return planner.LoadScriptFile(arg)
	case "replay":
		if arg == "" {
			return nil, fmt.Errorf("TOOLBUS_MODEL=replay:<file> needs a cassette file")
		}
		return planner.OpenReplay(arg)
	case "openai", "openai-responses":
		if arg == "" {
			return nil, fmt.Errorf("TOOLBUS_MODEL=%s:<model> needs a model name, e.g. %s:gpt-4.1", kind, kind)
		}
		key, base := os.Getenv("OPENAI_API_KEY"), os.Getenv("OPENAI_BASE_URL")
		if key == "" && base == "" {
			return nil, fmt.Errorf("TOOLBUS_MODEL=%s needs OPENAI_API_KEY (or OPENAI_BASE_URL for a local OpenAI-compatible server)", name)
		}
		return providerModel(kind, arg, key, base, log)
	case "anthropic":
		if arg == "" {
			return nil, fmt.Errorf("TOOLBUS_MODEL=anthropic:<model> needs a model name, e.g. anthropic:claude-sonnet-4-5")
		}
		key, base := os.Getenv("ANTHROPIC_API_KEY"), os.Getenv("ANTHROPIC_BASE_URL")
		if key == "" && base == "" && os.Getenv("ANTHROPIC_AUTH_TOKEN") == "" {
			return nil, fmt.Errorf("TOOLBUS_MODEL=%s needs ANTHROPIC_API_KEY", name)
		}
		return providerModel(kind, arg, key, base, log)
	}
	return nil, fmt.Errorf("unknown model %q (TOOLBUS_MODEL: script:incident, script:<file.json>, replay:<file>, openai:<model>, openai-responses:<model>, anthropic:<model>)", name)
}

// builtins names the built-in scripts, for an error.
func (o Options) builtins() string {
	names := []string{"incident", "approval"}
	for name := range o.Scripts {
		names = append(names, name)
	}
	slices.Sort(names[2:])
	return strings.Join(names, ", ")
}

// Ship returns the model name a client puts in its run for name: a script file that
// exists here (script:<path>) travels with the run (planner.InlineScript), so that a
// planner on another host serves it; any other name is the planner's to resolve.
func Ship(name string) (string, error) {
	kind, arg, _ := strings.Cut(name, ":")
	if kind != "script" || arg == "" || planner.IsInlineScript(name) {
		return name, nil
	}
	if fi, err := os.Stat(arg); err != nil || fi.IsDir() {
		return name, nil // a built-in script, or a file on the planner's host
	}
	return planner.InlineScript(arg)
}

// Set serves the models that runs name (RunStarted.Model, toolbus run --model): the
// planner's own (TOOLBUS_MODEL) and any other this process can build (a script, a
// cassette, a provider whose key is set), each built once and kept.
type Set struct {
	opts Options

	mu     sync.Mutex
	models map[string]planner.Model
}

// NewSet returns the set of a planner whose own model, named name, is own.
func NewSet(name string, own planner.Model, o Options) *Set {
	return &Set{opts: o, models: map[string]planner.Model{name: own}}
}

// Resolve returns the model named name, building it on first use; the error says why
// this planner cannot serve it (no such model, no API key, no such file).
func (s *Set) Resolve(name string) (planner.Model, error) {
	if planner.IsInlineScript(name) {
		return New(name, s.opts) // each run's own: built per step (cheap), never kept
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.models[name]; ok {
		return m, nil
	}
	m, err := New(name, s.opts)
	if err != nil {
		return nil, err
	}
	s.models[name] = m
	return m, nil
}
