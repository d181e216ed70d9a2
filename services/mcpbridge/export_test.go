package mcpbridge

import "time"

// Principals is the number of principals whose server the Bridge keeps.
func (b *Bridge) Principals() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.servers)
}

// Advance moves the clock of requestState expiry forward by d.
func (b *Bridge) Advance(d time.Duration) { b.skew.Add(int64(d)) }

// SealSessionID is a session id as a bridge with state key key and
// advertised URL owner issues it.
func SealSessionID(key []byte, owner string) string {
	b := &Bridge{cfg: Config{StateKey: key}, advertise: owner}
	return b.newSessionID()
}
