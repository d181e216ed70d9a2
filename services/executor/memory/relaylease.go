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
func (s *Store) StillSpooled(ctx context.Context, ids []int64) (left []int64, oldest int64, err error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
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
	return left, oldest, nil
}
