package store

import (
	"context"
	"fmt"
)

// PutOutput keeps a whole tool output in the object store and returns its reference
// ("objectstore://toolbus_outputs/<name>").
func (s *Store) PutOutput(ctx context.Context, name string, data []byte) (string, error) {
	if _, err := s.outputs.PutBytes(ctx, name, data); err != nil {
		return "", fmt.Errorf("store: put output %s: %w", name, err)
	}
	return OutputRefPrefix + name, nil
}

// OutputRefPrefix starts the reference of an output kept in the object store.
const OutputRefPrefix = "objectstore://" + BucketOutputs + "/"

// Output reads a whole output kept by PutOutput.
func (s *Store) Output(ctx context.Context, ref string) ([]byte, error) {
	name := ref
	if len(ref) > len(OutputRefPrefix) && ref[:len(OutputRefPrefix)] == OutputRefPrefix {
		name = ref[len(OutputRefPrefix):]
	}
	data, err := s.outputs.GetBytes(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("store: get output %s: %w", name, err)
	}
	return data, nil
}
