//go:build !race

package faults_test

// raceEnabled: the test binary was built with -race.
const raceEnabled = false
