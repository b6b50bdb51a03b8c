package mcpconformance_test

import (
	"errors"
	"testing"
)

// TestRerunLateProgressOnlyForProgress: a suite whose only unexpected failure is the
// progress scenario passes when a run of it alone passes, and fails when none does; a
// suite with any other unexpected failure fails without a rerun.
func TestRerunLateProgressOnlyForProgress(t *testing.T) {
	const head = "✗ completion-complete: 0 passed, 1 failed\n\x1b[33mExpected failures (in baseline):\x1b[0m\n  ~ completion-complete\n" +
		"\x1b[31mUnexpected failures (not in baseline):\x1b[0m\n"
	suiteErr := errors.New("exit status 1")
	for _, tc := range []struct {
		name       string
		out        string
		alonePass  bool
		wantErr    bool
		wantReruns int
	}{
		{"progress alone, rerun passes", head + "          ✗ tools-call-with-progress\n", true, false, 1},
		{"progress alone, reruns fail", head + "          ✗ tools-call-with-progress\n", false, true, 3},
		{"another scenario too", head + "  ✗ tools-call-with-progress\n  ✗ ping\n", true, true, 0},
		{"another scenario only", head + "  ✗ ping\n", true, true, 0},
		{"no unexpected list", "✗ ping: 0 passed, 1 failed\n", true, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reruns := 0
			err := rerunLateProgress(t, tc.out, t.TempDir(), suiteErr, func() error {
				reruns++
				if tc.alonePass {
					return nil
				}
				return errors.New("failed alone")
			})
			if (err != nil) != tc.wantErr || reruns != tc.wantReruns {
				t.Errorf("err %v after %d reruns; want error %v after %d", err, reruns, tc.wantErr, tc.wantReruns)
			}
		})
	}
}
