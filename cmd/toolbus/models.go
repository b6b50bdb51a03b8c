package main

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/toolbus/toolbus/internal/bench"
	"github.com/toolbus/toolbus/planner"
)

// newModel builds the model named by TOOLBUS_MODEL:
//
//	script:incident | script:approval | script:noop
//	                                  built-in scripted models (no network)
//	script:<file.json>                a script file written by hand (planner.LoadScriptFile)
//	replay:<file>                     answers from a cassette (no network)
//	openai:<model>                    OpenAI Chat Completions, or any compatible server
//	openai-responses:<model>          OpenAI Responses
//	anthropic:<model>                 Anthropic Messages
//
// Providers read their standard environment: OPENAI_API_KEY, OPENAI_BASE_URL,
// ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL. TOOLBUS_RECORD=<file.jsonl> wraps the model
// with a recorder that appends every exchange to that cassette.
func newModel(cfg Config) (planner.Model, error) {
	m, err := baseModel(cfg)
	if err != nil {
		return nil, err
	}
	if path := os.Getenv("TOOLBUS_RECORD"); path != "" {
		rec, err := planner.OpenRecorder(m, path, cfg.logger())
		if err != nil {
			return nil, err
		}
		m = rec // the file stays open for the life of the process
	}
	return m, nil
}

func baseModel(cfg Config) (planner.Model, error) {
	kind, arg, _ := strings.Cut(cfg.Model, ":")
	log := cfg.logger()
	switch kind {
	case "script":
		switch arg {
		case "incident", "":
			return IncidentScript(), nil
		case "approval":
			return ApprovalScript(), nil
		case "noop":
			return bench.NoopScript(4, 3), nil
		}
		if _, err := os.Stat(arg); err != nil {
			return nil, fmt.Errorf("unknown script %q: not a built-in script (incident, approval, noop) nor a readable script file: %w", arg, err)
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
			return nil, fmt.Errorf("TOOLBUS_MODEL=%s needs OPENAI_API_KEY (or OPENAI_BASE_URL for a local OpenAI-compatible server)", cfg.Model)
		}
		return providerModel(kind, arg, key, base, log)
	case "anthropic":
		if arg == "" {
			return nil, fmt.Errorf("TOOLBUS_MODEL=anthropic:<model> needs a model name, e.g. anthropic:claude-sonnet-4-5")
		}
		key, base := os.Getenv("ANTHROPIC_API_KEY"), os.Getenv("ANTHROPIC_BASE_URL")
		if key == "" && base == "" && os.Getenv("ANTHROPIC_AUTH_TOKEN") == "" {
			return nil, fmt.Errorf("TOOLBUS_MODEL=%s needs ANTHROPIC_API_KEY", cfg.Model)
		}
		return providerModel(kind, arg, key, base, log)
	}
	return nil, fmt.Errorf("unknown model %q (TOOLBUS_MODEL: script:incident, script:<file.json>, replay:<file>, openai:<model>, openai-responses:<model>, anthropic:<model>)", cfg.Model)
}

// modelSet serves the models that runs name (RunStarted.Model, toolbus run --model):
// the planner's own (TOOLBUS_MODEL) and any other this process can build (a script, a
// cassette, a provider whose key is set), each built once and kept.
type modelSet struct {
	cfg Config

	mu     sync.Mutex
	models map[string]planner.Model
}

func newModelSet(cfg Config, own planner.Model) *modelSet {
	return &modelSet{cfg: cfg, models: map[string]planner.Model{cfg.Model: own}}
}

// resolve returns the model named name, building it on first use; the error says why
// this planner cannot serve it (no such model, no API key, no such file).
func (s *modelSet) resolve(name string) (planner.Model, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.models[name]; ok {
		return m, nil
	}
	cfg := s.cfg
	cfg.Model = name
	m, err := newModel(cfg)
	if err != nil {
		return nil, err
	}
	s.models[name] = m
	return m, nil
}
