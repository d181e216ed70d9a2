package mcpbridge

import (
	"time"

	"github.com/mandate-dev/mandate/services/mcpbridge/internal/sealed"
)

// Principals is the number of principals whose server the Bridge keeps.
func (b *Bridge) Principals() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.servers)
}

// Sweep runs one pass of the idle sweep as if the time were now.
func (b *Bridge) Sweep(now time.Time) { b.dropIdle(now) }

// SealSessionID is a session id as a bridge with state key key and
// advertised URL owner issues it.
func SealSessionID(key []byte, owner string) string {
	b := &Bridge{sealer: sealed.New(key, owner)}
	return b.newSessionID()
}
