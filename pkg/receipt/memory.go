package receipt

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// MemoryTx is what an in-memory backend's transaction offers [Memory]: a way to undo a write
// when the transaction rolls back. Undo functions run in reverse order of registration.
type MemoryTx interface {
	OnRollback(undo func())
}

// Memory is an in-memory Store for backends that keep their records in memory, and for tests.
// It assumes what in-memory stores usually give: transactions that run one at a time (under
// the backend's lock), so Get needs no lock of its own to keep a delivery and a fence apart.
// The zero value is not usable; call NewMemory.
type Memory struct {
	mu       sync.Mutex // guards receipts against readers outside the backend's lock
	receipts map[string]Receipt

	txMu sync.Mutex // serialises InTx
}

var _ Store[MemoryTx] = (*Memory)(nil)

// NewMemory returns an empty Memory.
func NewMemory() *Memory { return &Memory{receipts: map[string]Receipt{}} }

// Get implements Store.
func (m *Memory) Get(ctx context.Context, _ MemoryTx, invocationID string) (Receipt, bool, error) {
	if err := ctx.Err(); err != nil {
		return Receipt{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.receipts[invocationID]
	if ok {
		r = r.normalize() // a copy: the caller may not change the stored result
	}
	return r, ok, nil
}

// Record implements Store.
func (m *Memory) Record(ctx context.Context, tx MemoryTx, r Receipt) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := r.Validate(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.receipts[r.InvocationID]; ok {
		return conflict(r.InvocationID, old.State)
	}
	// The undo first: a transaction that already ended panics before anything is written.
	tx.OnRollback(func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.receipts, r.InvocationID)
	})
	m.receipts[r.InvocationID] = r.normalize()
	return nil
}

// errTxDone reports a MemoryTx used after its InTx returned.
var errTxDone = errors.New("receipt: memory transaction already ended")

// InTx runs fn in a transaction of m alone, one at a time, for a backend whose only in-memory
// state is its receipts (and for tests): what fn recorded is undone when it returns an error or
// panics. A backend with its own in-memory store passes its own transactions instead.
func (m *Memory) InTx(ctx context.Context, fn func(tx MemoryTx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.txMu.Lock()
	defer m.txMu.Unlock()
	tx := &memoryTx{}
	committed := false
	defer func() {
		tx.done = true
		if !committed {
			for i := len(tx.undo) - 1; i >= 0; i-- {
				tx.undo[i]()
			}
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	committed = true
	return nil
}

type memoryTx struct {
	undo []func()
	done bool
}

func (t *memoryTx) OnRollback(undo func()) {
	if t.done {
		panic(errTxDone)
	}
	t.undo = append(t.undo, undo)
}

// conflict is the error of recording a receipt for an invocation that has one in state.
func conflict(invocationID string, state State) error {
	if state == NotExecuted {
		return fmt.Errorf("invocation %s: %w", invocationID, ErrFenced)
	}
	return fmt.Errorf("invocation %s: %w", invocationID, ErrExecuted)
}
