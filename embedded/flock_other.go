//go:build !unix

package embedded

import "os"

// flock is a no-op where flock(2) does not exist: the directory is not guarded there.
func flock(*os.File) error { return nil }

func funlock(*os.File) {}
