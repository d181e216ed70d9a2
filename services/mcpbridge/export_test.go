package mcpbridge

// Principals is the number of principals whose server the Bridge keeps.
func (b *Bridge) Principals() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.servers)
}
