package memory

import (
	"context"
	"slices"
	"sync"

	"github.com/mandate-dev/mandate/services/executor"
)

var _ executor.RelayLeaser = (*Store)(nil)

// TryRelayLease implements executor.RelayLeaser: the store is one
// process's, so its lease is a mutex, taken without waiting. It is held
// until release (idempotent); a holder whose context ends must still call
// it.
func (s *Store) TryRelayLease(ctx context.Context) (release func(), ok bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	if !s.relay.TryLock() {
		return nil, false, nil
	}
	var once sync.Once
	return func() { once.Do(s.relay.Unlock) }, true, nil
}

// StillSpooled implements executor.RelayLeaser.
func (s *Store) StillSpooled(ctx context.Context, ids []int64) ([]int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	want := make(map[int64]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, r := range s.spool {
		if want[r.ID] {
			out = append(out, r.ID)
		}
	}
	slices.Sort(out)
	return out, nil
}
