package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/toolbus/toolbus/cmd/toolbus/internal/node"
)

// cmdEnv prints every TOOLBUS_* variable: name, default and meaning.
func cmdEnv(cfg Config, out io.Writer) error {
	vars, err := node.EnvVars(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "toolbus reads its settings from these environment variables (unset: the default).")
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIABLE\tDEFAULT\tMEANING")
	for _, v := range vars {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", v.Name, v.Default, v.Meaning)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("env: %w", err)
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "Model credentials (planner): "+node.EnvModelCredentials+".")
	return nil
}
