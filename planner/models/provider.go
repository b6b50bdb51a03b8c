//go:build !toolbus_lite

package models

import (
	"log/slog"

	"github.com/toolbus/toolbus/planner"
	"github.com/toolbus/toolbus/planner/anthropic"
	"github.com/toolbus/toolbus/planner/openai"
)

// providerModel builds the model of a provider SDK: kind is openai, openai-responses or
// anthropic, the key and base URL already checked.
func providerModel(kind, model, key, base string, log *slog.Logger) (planner.Model, error) {
	switch kind {
	case "openai":
		return openai.NewChat(openai.ChatOptions{APIKey: key, BaseURL: base, Model: model, Logger: log})
	case "openai-responses":
		return openai.NewResponses(openai.ResponsesOptions{APIKey: key, BaseURL: base, Model: model, Logger: log})
	}
	return anthropic.New(anthropic.Options{APIKey: key, BaseURL: base, Model: model, Logger: log})
}
