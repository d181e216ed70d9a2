package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/audittest"
	"github.com/mandate-dev/mandate/services/audit/postgres"
)

// TestAnnouncementsAreSpaced commits a burst of appends one by one and counts the NOTIFYs the
// database delivers: far fewer than commits, since a Store sends at most one per
// AnnounceEvery. Every row still reaches a watcher on another Store that is woken only by
// notifications (its poll is an hour away), so no commit went unannounced.
func TestAnnouncementsAreSpaced(t *testing.T) {
	_, dsn := pgtest.NewURL(t, postgres.Migrations)
	ctx := ctxFor(t)
	open := func(opts postgres.Options) *postgres.Store {
		pool, err := pg.Open(ctx, dsn, pg.Options{MaxConns: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		opts.Logger = quiet
		st := postgres.New(pool, opts)
		t.Cleanup(st.Close)
		return st
	}
	writer := open(postgres.Options{AnnounceEvery: 200 * time.Millisecond})
	remote := open(postgres.Options{WatchPoll: time.Hour})

	listener, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = listener.Close(context.Background()) }()
	if _, err := listener.Exec(ctx, "LISTEN "+postgres.Channel); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch, err := remote.Watch(wctx, "acme", 0)
	if err != nil {
		t.Fatal(err)
	}

	const commits = 30
	w := newWriter(t, writer, audit.WriterOptions{Unbatched: true}) // a transaction per append
	for i := range commits {
		if _, err := w.Append(ctx, audittest.Rec("acme", fmt.Sprintf("inv-%d", i), audit.PhaseIntent)); err != nil {
			t.Fatal(err)
		}
	}
	for seq := int64(1); seq <= commits; seq++ {
		select {
		case r := <-watch:
			if r.Seq != seq {
				t.Fatalf("watch delivered seq %d, want %d", r.Seq, seq)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the remote watcher never heard of seq %d: a commit went unannounced", seq)
		}
	}

	heard := 0
	for {
		nctx, ncancel := context.WithTimeout(ctx, time.Second)
		n, err := listener.WaitForNotification(nctx)
		ncancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if n.Payload != "acme" {
			t.Fatalf("notification payload %q, want the tenant", n.Payload)
		}
		heard++
	}
	if heard == 0 || heard > commits/3 {
		t.Fatalf("%d commits were announced by %d NOTIFYs; want at least one and far fewer than commits", commits, heard)
	}
	t.Logf("%d commits, %d NOTIFYs", commits, heard)
}
