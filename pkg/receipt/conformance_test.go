package receipt_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/storage/migrate"
	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

// backend is a receipt store with the transactions it runs in.
type backend[Tx any] struct {
	store receipt.Store[Tx]
	inTx  func(ctx context.Context, fn func(tx Tx) error) error
}

// receiptsSet is the migration a backend would write: SchemaSQL copied into its schema.
var receiptsSet = migrate.Set{Service: "receipttest", FS: fstest.MapFS{
	"0001_receipts.sql": {Data: []byte(receipt.SchemaSQL)},
}}

func memoryBackend(*testing.T) backend[receipt.MemoryTx] {
	m := receipt.NewMemory()
	return backend[receipt.MemoryTx]{store: m, inTx: m.InTx}
}

func postgresBackend(t *testing.T) backend[pgx.Tx] {
	pool := pgtest.New(t, receiptsSet)
	return backend[pgx.Tx]{store: receipt.NewPostgres("receipttest"), inTx: func(ctx context.Context, fn func(pgx.Tx) error) error {
		return pg.InTx(ctx, pool, fn)
	}}
}

func TestConformance(t *testing.T) {
	t.Run("memory", func(t *testing.T) { conformance(t, memoryBackend) })
	t.Run("postgres", func(t *testing.T) { conformance(t, postgresBackend) })
}

var t0 = time.Date(2026, 5, 1, 9, 30, 0, 123456789, time.FixedZone("CEST", 2*3600))

func executed(id string) receipt.Receipt {
	return receipt.Receipt{InvocationID: id, State: receipt.Executed, Method: "/shop.v1.Shop/Buy", Result: []byte{8, 1}, RecordedAt: t0}
}

// conformance is what every Store does, whatever keeps the receipts.
func conformance[Tx any](t *testing.T, open func(t *testing.T) backend[Tx]) {
	ctx := context.Background()
	get := func(t *testing.T, b backend[Tx], id string) (receipt.Receipt, bool) {
		t.Helper()
		var (
			r     receipt.Receipt
			found bool
		)
		if err := b.inTx(ctx, func(tx Tx) (err error) {
			r, found, err = b.store.Get(ctx, tx, id)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return r, found
	}
	record := func(b backend[Tx], r receipt.Receipt) error {
		return b.inTx(ctx, func(tx Tx) error { return b.store.Record(ctx, tx, r) })
	}

	t.Run("unknown invocation", func(t *testing.T) {
		if r, found := get(t, open(t), "inv-none"); found {
			t.Fatalf("found %+v", r)
		}
	})

	t.Run("executed receipt reads back normalised", func(t *testing.T) {
		b := open(t)
		if err := record(b, executed("inv-1")); err != nil {
			t.Fatal(err)
		}
		r, found := get(t, b, "inv-1")
		want := executed("inv-1")
		want.RecordedAt = t0.UTC().Truncate(time.Microsecond)
		if !found || r.InvocationID != want.InvocationID || r.State != want.State || r.Method != want.Method ||
			!bytes.Equal(r.Result, want.Result) || !r.RecordedAt.Equal(want.RecordedAt) || r.RecordedAt.Location() != time.UTC {
			t.Fatalf("got %+v (found %v), want %+v", r, found, want)
		}
	})

	t.Run("second receipt is refused and the first kept", func(t *testing.T) {
		b := open(t)
		if err := record(b, executed("inv-2")); err != nil {
			t.Fatal(err)
		}
		again := executed("inv-2")
		again.Result = []byte{8, 2}
		if err := record(b, again); !errors.Is(err, receipt.ErrExecuted) {
			t.Fatalf("second receipt: err = %v, want ErrExecuted", err)
		}
		if r, _ := get(t, b, "inv-2"); !bytes.Equal(r.Result, []byte{8, 1}) {
			t.Fatalf("result = %v, want the first", r.Result)
		}
	})

	t.Run("fence refuses a later effect", func(t *testing.T) {
		b := open(t)
		var fence receipt.Receipt
		if err := b.inTx(ctx, func(tx Tx) (err error) {
			fence, err = receipt.Resolve(ctx, tx, b.store, "inv-3", t0)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if fence.State != receipt.NotExecuted || fence.Method != "" || len(fence.Result) != 0 {
			t.Fatalf("fence = %+v", fence)
		}
		if err := record(b, executed("inv-3")); !errors.Is(err, receipt.ErrFenced) {
			t.Fatalf("effect after the fence: err = %v, want ErrFenced", err)
		}
		if r, _ := get(t, b, "inv-3"); r.State != receipt.NotExecuted {
			t.Fatalf("state = %s, want not_executed", r.State)
		}
		// Asking again answers the same, without a second fence.
		if err := b.inTx(ctx, func(tx Tx) (err error) {
			fence, err = receipt.Resolve(ctx, tx, b.store, "inv-3", t0.Add(time.Hour))
			return err
		}); err != nil || !fence.RecordedAt.Equal(t0.Truncate(time.Microsecond)) {
			t.Fatalf("second resolve = %+v, %v; want the first fence", fence, err)
		}
	})

	t.Run("resolve of an executed invocation", func(t *testing.T) {
		b := open(t)
		if err := record(b, executed("inv-4")); err != nil {
			t.Fatal(err)
		}
		var r receipt.Receipt
		if err := b.inTx(ctx, func(tx Tx) (err error) {
			r, err = receipt.Resolve(ctx, tx, b.store, "inv-4", t0)
			return err
		}); err != nil || r.State != receipt.Executed || !bytes.Equal(r.Result, []byte{8, 1}) {
			t.Fatalf("resolve = %+v, %v", r, err)
		}
	})

	t.Run("receipt rolls back with its transaction", func(t *testing.T) {
		b := open(t)
		boom := errors.New("the effect's next write failed")
		err := b.inTx(ctx, func(tx Tx) error {
			if err := b.store.Record(ctx, tx, executed("inv-5")); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v", err)
		}
		if r, found := get(t, b, "inv-5"); found {
			t.Fatalf("rolled-back receipt found: %+v", r)
		}
		if err := record(b, executed("inv-5")); err != nil {
			t.Fatalf("recording after the rollback: %v", err)
		}
	})

	t.Run("malformed receipts", func(t *testing.T) {
		b := open(t)
		long := make([]byte, receipt.MaxInvocationIDLen+1)
		for i := range long {
			long[i] = 'x'
		}
		for name, r := range map[string]receipt.Receipt{
			"no id":                     {State: receipt.Executed, Method: "/a/B", RecordedAt: t0},
			"long id":                   {InvocationID: string(long), State: receipt.Executed, Method: "/a/B", RecordedAt: t0},
			"executed without a method": {InvocationID: "inv-6", State: receipt.Executed, RecordedAt: t0},
			"fence with a result":       {InvocationID: "inv-6", State: receipt.NotExecuted, Result: []byte{1}, RecordedAt: t0},
			"unknown state":             {InvocationID: "inv-6", State: "maybe", Method: "/a/B", RecordedAt: t0},
			"no time":                   {InvocationID: "inv-6", State: receipt.Executed, Method: "/a/B"},
		} {
			if err := record(b, r); !errors.Is(err, receipt.ErrInvalid) {
				t.Errorf("%s: err = %v, want ErrInvalid", name, err)
			}
		}
		if _, found := get(t, b, "inv-6"); found {
			t.Error("a malformed receipt was stored")
		}
	})

	t.Run("a fence waits for a delivery in flight", func(t *testing.T) {
		b := open(t)
		holding := make(chan struct{})
		delivered := make(chan error, 1)
		go func() {
			delivered <- b.inTx(ctx, func(tx Tx) error {
				if _, found, err := b.store.Get(ctx, tx, "inv-7"); err != nil || found {
					return errors.Join(err, errors.New("unexpected receipt"))
				}
				close(holding)
				// The effect takes a while; a fence that did not wait would slip in here and
				// make the Record below fail.
				time.Sleep(100 * time.Millisecond)
				return b.store.Record(ctx, tx, executed("inv-7"))
			})
		}()
		<-holding
		var r receipt.Receipt
		err := b.inTx(ctx, func(tx Tx) (err error) {
			r, err = receipt.Resolve(ctx, tx, b.store, "inv-7", t0)
			return err
		})
		if derr := <-delivered; derr != nil {
			t.Fatalf("delivery: %v", derr)
		}
		if err != nil || r.State != receipt.Executed {
			t.Fatalf("resolve during the delivery = %+v, %v; want executed", r, err)
		}
	})
}
