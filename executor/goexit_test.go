package executor_test

import "runtime"

func runtimeGoexit() { runtime.Goexit() }
