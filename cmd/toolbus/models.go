package main

import (
	"fmt"
	"strings"

	"github.com/toolbus/toolbus/planner"
)

// newModel builds the model named by TOOLBUS_MODEL.
func newModel(cfg Config) (planner.Model, error) {
	kind, arg, _ := strings.Cut(cfg.Model, ":")
	switch kind {
	case "script":
		switch arg {
		case "incident", "":
			return IncidentScript(), nil
		case "noop":
			return NoopScript(4, 3), nil
		}
		return nil, fmt.Errorf("unknown script %q (want incident or noop)", arg)
	}
	return nil, fmt.Errorf("unknown model %q (TOOLBUS_MODEL)", cfg.Model)
}
