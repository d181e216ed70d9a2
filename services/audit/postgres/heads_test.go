package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/audit/postgres"
)

// TestHeadMove holds the fast path's head move (move_heads) to its contract: it advances the heads
// only when every one is exactly (seq and hash) where the rows were chained onto, and otherwise
// fails with 40001 and changes nothing. A wrong hash at the right seq must fail too: after a
// failed predecessor the next batch's seqs are free, so only this check keeps a gap out of
// the chain.
func TestHeadMove(t *testing.T) {
	pool := pgtest.New(t, postgres.Migrations)
	ctx := ctxFor(t)
	h := func(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }
	if _, err := pool.Exec(ctx, `INSERT INTO audit.heads (tenant, seq, hash) VALUES ('acme', 5, $1), ('globex', 7, $2)`, h(5), h(7)); err != nil {
		t.Fatal(err)
	}
	type head struct {
		seq  int64
		hash []byte
	}
	read := func() map[string]head {
		t.Helper()
		out := map[string]head{}
		rows, _ := pool.Query(ctx, "SELECT tenant, seq, hash FROM audit.heads")
		var (
			tenant string
			hd     head
		)
		if _, err := pgx.ForEachRow(rows, []any{&tenant, &hd.seq, &hd.hash}, func() error {
			out[tenant] = head{hd.seq, bytes.Clone(hd.hash)}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	move := func(tenants []string, oldSeq []int64, oldHash [][]byte, newSeq []int64, newHash [][]byte) error {
		_, err := pool.Exec(ctx, postgres.SQLMoveHeads, tenants, oldSeq, oldHash, newSeq, newHash)
		return err
	}
	before := read()
	for _, tc := range []struct {
		name    string
		tenants []string
		oldSeq  []int64
		oldHash [][]byte
		message string
	}{
		{"stale seq", []string{"acme"}, []int64{4}, [][]byte{h(5)}, "moved concurrently"},
		{"right seq, other hash", []string{"acme"}, []int64{5}, [][]byte{h(6)}, "moved concurrently"},
		{"one of two stale", []string{"acme", "globex"}, []int64{5, 6}, [][]byte{h(5), h(7)}, "moved concurrently"},
		{"missing head", []string{"acme", "initech"}, []int64{5, 0}, [][]byte{h(5), h(0)}, "missing"},
	} {
		newSeq, newHash := make([]int64, len(tc.tenants)), make([][]byte, len(tc.tenants))
		for i := range newSeq {
			newSeq[i], newHash[i] = 20, h(20)
		}
		err := move(tc.tenants, tc.oldSeq, tc.oldHash, newSeq, newHash)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40001" || !bytes.Contains([]byte(pgErr.Message), []byte(tc.message)) {
			t.Fatalf("%s: err = %v; want 40001 %q", tc.name, err, tc.message)
		}
		if got := read(); got["acme"].seq != before["acme"].seq || got["globex"].seq != before["globex"].seq {
			t.Fatalf("%s: heads changed by a failed move: %v", tc.name, got)
		}
	}
	if err := move([]string{"acme", "globex"}, []int64{5, 7}, [][]byte{h(5), h(7)}, []int64{9, 8}, [][]byte{h(9), h(8)}); err != nil {
		t.Fatal(err)
	}
	if got := read(); got["acme"].seq != 9 || !bytes.Equal(got["acme"].hash, h(9)) || got["globex"].seq != 8 || !bytes.Equal(got["globex"].hash, h(8)) {
		t.Fatalf("heads after the move: %v", got)
	}

	// A move that waits for a transaction holding the head sees what it committed: chained onto
	// the head before that commit, it fails; chained onto the committed head, it succeeds.
	for _, tc := range []struct {
		name            string
		oldSeq, wantSeq int64
		oldHash         []byte
		fails           bool
	}{
		{"chained onto the head before", 9, 10, h(9), true},
		{"chained onto the committed head", 10, 11, h(10), false},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cur := read()["acme"]
		if _, err := tx.Exec(ctx, postgres.SQLMoveHeads, []string{"acme"}, []int64{cur.seq}, [][]byte{cur.hash}, []int64{10}, [][]byte{h(10)}); err != nil {
			t.Fatal(err)
		}
		var (
			wg   sync.WaitGroup
			werr error
		)
		wg.Go(func() {
			werr = move([]string{"acme"}, []int64{tc.oldSeq}, [][]byte{tc.oldHash}, []int64{tc.wantSeq}, [][]byte{h(byte(tc.wantSeq))})
		})
		time.Sleep(100 * time.Millisecond) // let the move reach the lock (if it does not, it sees the commit anyway)
		if err := tx.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if tc.fails != (werr != nil) {
			t.Fatalf("%s: err = %v, want failure %v", tc.name, werr, tc.fails)
		}
		want := int64(10)
		if !tc.fails {
			want = tc.wantSeq
		}
		if got := read()["acme"].seq; got != want {
			t.Fatalf("%s: acme head at %d, want %d", tc.name, got, want)
		}
		if tc.fails {
			// Reset so that the next case starts from the head before: acme at 9.
			if _, err := pool.Exec(ctx, "UPDATE audit.heads SET seq = 9, hash = $1 WHERE tenant = 'acme'", h(9)); err != nil {
				t.Fatal(err)
			}
		}
	}
}
