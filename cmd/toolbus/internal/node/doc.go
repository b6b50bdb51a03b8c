// Package node is one toolbus process as the binary runs it: its configuration (Config,
// read from the TOOLBUS_* variables that `toolbus env` lists), its bus (a server's, or an
// embedded server it starts and sets up) and the roles it runs on that bus (planner,
// executor, injector) with their telemetry. cmd/toolbus is the command line on top.
package node
