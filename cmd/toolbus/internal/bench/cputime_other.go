//go:build !unix

package bench

import "time"

// cpuTime is not measured on this platform: the CPU columns of the bench read 0.
func cpuTime() time.Duration { return 0 }
