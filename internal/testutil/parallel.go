package testutil

import (
	"flag"
	"runtime"
	"strconv"
)

// RaiseParallel sets -test.parallel to n when the command line did not set it and n is
// above its default (GOMAXPROCS). It is for a package whose tests mostly wait (on
// servers, processes, acknowledgement waits and leases) rather than compute: at the
// default, two cores run two of them at a time and their waits add up. Call it from
// TestMain before m.Run.
func RaiseParallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && n > runtime.GOMAXPROCS(0) {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}
