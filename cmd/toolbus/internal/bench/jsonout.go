package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// WriteJSON writes v, a report of this package, as indented JSON to path when set, and
// says where on out.
func WriteJSON(path string, v any, out io.Writer) error {
	if path == "" {
		return nil
	}
	b, _ := json.MarshalIndent(v, "", "  ")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	fmt.Fprintf(out, "\nwritten to %s\n", path)
	return nil
}
