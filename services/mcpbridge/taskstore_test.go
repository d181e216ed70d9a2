package mcpbridge

import (
	"sync"
	"testing"
)

// TestTaskReservationIsTakenOverByItsTask: a task-augmented call counts
// against its owner's cap while it is served, and its task takes the
// reservation over when it is stored, in one step. So a task is never
// counted twice — as waiting and as reserved — in the moment between its
// answer reaching the client and the handler releasing the reservation
// (CI saw a second task refused at a cap of 2 in that moment); and a
// release after the take-over gives back nothing.
func TestTaskReservationIsTakenOverByItsTask(t *testing.T) {
	s := newTaskStore()
	const owner, limit = "carol/payout-bot", 2
	first := s.reserve(owner, limit)
	if first == nil {
		t.Fatal("the first reservation was refused")
	}
	s.add(&task{id: "t1", owner: owner, status: taskWorking, done: make(chan struct{}), ttl: 1 << 40}, first)
	// The first call's handler has not released yet: the next call fits.
	second := s.reserve(owner, limit)
	if second == nil {
		t.Fatal("a second task refused at a cap of 2 while the first's handler had not returned")
	}
	s.release(first) // the first handler returns: nothing more to give back
	if third := s.reserve(owner, limit); third != nil {
		t.Fatal("a third call fits beside one waiting task and one reservation at a cap of 2")
	}
	s.release(second)
	s.release(second) // twice: once
	if n := s.reserved[owner]; n != 0 {
		t.Fatalf("%d reservations left after every call ended", n)
	}

	// Concurrent calls of one owner never pass the cap together.
	c := newTaskStore()
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		won []*taskReservation
	)
	for range 20 {
		wg.Go(func() {
			if r := c.reserve(owner, limit); r != nil {
				mu.Lock()
				won = append(won, r)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(won) != limit {
		t.Fatalf("%d of 20 concurrent calls reserved, want %d", len(won), limit)
	}
}
