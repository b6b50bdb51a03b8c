package events

import (
	"testing"

	"github.com/kelseyhightower/envconfig"
)

// TestConfigDefaultTags: the envconfig default tags of Config (what the toolbus binary
// reads with no TOOLBUS_* variable set) are the Default* constants that setDefaults
// applies to a zero Config, so a default is changed in one place or this test fails.
func TestConfigDefaultTags(t *testing.T) {
	var fromTags Config
	// A prefix no environment sets: only the default tags apply.
	if err := envconfig.Process("TOOLBUS_DEFAULT_TAGS_TEST_UNSET", &fromTags); err != nil {
		t.Fatal(err)
	}
	var fromCode Config
	fromCode.setDefaults()
	if fromTags != fromCode {
		t.Fatalf("the envconfig default tags of Config disagree with its Default* constants:\ntags: %+v\ncode: %+v", fromTags, fromCode)
	}
}
