package memory

import (
	"context"
	"slices"

	"github.com/mandate-dev/mandate/services/executor"
)

var _ executor.RelayLeaser = (*Store)(nil)

// TryRelayLease implements executor.RelayLeaser: the store is one
// process's, so its lease is a mutex, taken without waiting. It is held
// until Release (idempotent); a holder whose context ends must still call
// it.
func (s *Store) TryRelayLease(ctx context.Context, own []int64) (*executor.RelayLease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !s.relay.TryLock() {
		return nil, nil
	}
	left, oldest := s.stillSpooled(own)
	return executor.NewRelayLease(s.relay.Unlock, left, oldest), nil
}

// stillSpooled is those of ids still spooled, in increasing order, and
// the oldest spooled id (0: none).
func (s *Store) stillSpooled(ids []int64) (left []int64, oldest int64) {
	want := make(map[int64]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.spool {
		if want[r.ID] {
			left = append(left, r.ID)
		}
	}
	if len(s.spool) > 0 {
		oldest = s.spool[0].ID // the spool is in id order
	}
	slices.Sort(left)
	return left, oldest
}
