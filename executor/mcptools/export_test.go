package mcptools

// OnSessionEnded sets a function the supervisor calls when a session ended, before it
// marks it so (set it before Start).
func (p *Provider) OnSessionEnded(f func()) { p.sessionEnded = f }
