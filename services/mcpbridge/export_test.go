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
