package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/executor/memory"
	"github.com/mandate-dev/mandate/services/executor/outbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// event is the stored event of invocation i in tenant: a refund whose sensitive field the
// executor already withheld.
func event(tenant string, i int) *executor.Event {
	return &executor.Event{Tenant: tenant, Command: "ticket.refund", Subject: fmt.Sprintf("ticket/%d", i), InvocationID: inv(tenant, i),
		UserID: "alice", AgentID: "support-bot",
		Result: []byte(fmt.Sprintf(`{"refund_id":"r-%d","amount_cents":500,"cardholder_reference":"[withheld]"}`, i))}
}

func finish(t *testing.T, st executor.Store, e *executor.Event) {
	t.Helper()
	if err := st.Finish(context.Background(), executor.Finish{Event: e}); err != nil {
		t.Errorf("Finish %s: %v", e.InvocationID, err)
	}
}

// running starts r and stops it (and closes it) when the test ends.
func running(t *testing.T, r *outbox.Relay) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		r.Close()
	})
}

// waitDelivered waits until st has no backlog.
func waitDelivered(t *testing.T, st executor.Store, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		b, err := st.Backlog(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(b) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("backlog after %v: %+v", within, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newRelay(t *testing.T, cfg outbox.Config) *outbox.Relay {
	t.Helper()
	if cfg.Poll == 0 {
		cfg.Poll = 10 * time.Millisecond
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 20*time.Millisecond, 200*time.Millisecond
	}
	r, err := outbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRelayCloudEvents: committed events arrive as CloudEvents on mandate.<tenant>.<command>,
// the invocation id as id and message id, in commit order per tenant, sensitive fields as the
// store holds them (withheld).
func TestRelayCloudEvents(t *testing.T) {
	url := sharedNATS(t)
	stream, prefix := names(t)
	deleteStream(t, url, stream)
	st := memory.New(memory.Options{})
	want := map[string]int64{"acme": 20, "globex": 7}
	for i := range 20 {
		finish(t, st, event("acme", i))
		if i < 7 {
			finish(t, st, event("globex", i))
		}
	}
	r := newRelay(t, outbox.Config{Store: st, URL: url, Stream: stream, Prefix: prefix})
	running(t, r)
	waitDelivered(t, st, 10*time.Second)
	got := readAll(t, url, stream, prefix+".>")
	checkOrdered(t, got, want)
	for _, g := range got {
		e := g.ev
		wantSubject := prefix + "." + e.Tenant + ".ticket.refund"
		switch {
		case g.subject != wantSubject:
			t.Fatalf("subject %q, want %q", g.subject, wantSubject)
		case e.SpecVersion != "1.0" || e.Type != outbox.TypeExecuted || e.Source != "mandate://"+e.Tenant+"/executor" ||
			e.DataContentType != "application/json" || e.Time.IsZero() || e.Subject == "":
			t.Fatalf("CloudEvent attributes %+v", g.raw)
		case e.Data.User != "alice" || e.Data.Agent != "support-bot" || e.Data.Command != "ticket.refund" || e.Data.Outcome != "executed":
			t.Fatalf("data %+v: want who, which agent, which command and the outcome", e.Data)
		case !strings.Contains(string(e.Data.Result), `"refund_id"`) || !strings.Contains(string(e.Data.Result), `"cardholder_reference":"[withheld]"`):
			t.Fatalf("result %s: want the non-sensitive fields and the sensitive one withheld", e.Data.Result)
		}
	}
	if s := r.Stats(); s.Published != sum(want) {
		t.Errorf("stats %+v, want %d published", s, sum(want))
	}
}

// TestRelayBrokerDown: under load, the broker goes away for a while and comes back on the same
// port and store. Commands never wait for it (Finish is the store alone), and once it is back
// every event is delivered, in commit order per tenant, each once.
func TestRelayBrokerDown(t *testing.T) {
	srv := startEmbedded(t)
	stream, prefix := names(t)
	st := memory.New(memory.Options{})
	r := newRelay(t, outbox.Config{Store: st, URL: srv.url(), Stream: stream, Prefix: prefix})
	running(t, r)

	tenants := []string{"acme", "globex", "initech"}
	const perTenant = 300 // over ~1.5 s: before, during and after the outage
	var (
		wg      sync.WaitGroup
		slowest atomic.Int64
	)
	for _, tenant := range tenants {
		wg.Go(func() {
			for i := range perTenant {
				start := time.Now()
				finish(t, st, event(tenant, i))
				if d := int64(time.Since(start)); d > slowest.Load() {
					slowest.Store(d)
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	srv.stop()
	downAt := time.Now()
	const outage = 1 * time.Second
	time.Sleep(outage)
	backlog, _ := st.Backlog(context.Background())
	srv.start()
	t.Logf("broker down for %v under load; backlog when it came back: %+v", time.Since(downAt).Round(time.Millisecond), backlog)
	wg.Wait()
	caughtUp := waitDelivered(t, st, 20*time.Second)

	want := map[string]int64{}
	for _, tenant := range tenants {
		want[tenant] = perTenant
	}
	got := readAll(t, srv.url(), stream, prefix+".>")
	checkOrdered(t, got, want)
	s := r.Stats()
	t.Logf("%d events delivered (%d published, %d duplicate acks, %d failed passes); caught up %v after the writers ended; slowest Finish %v",
		len(got), s.Published, s.Duplicates, s.Failures, caughtUp.Round(time.Millisecond), time.Duration(slowest.Load()))
	if s.Failures == 0 {
		t.Error("the relay saw no failure: the broker was not down")
	}
	if len(backlog) == 0 {
		t.Error("no backlog built up while the broker was down: the outage was not under load")
	}
}

// TestRelayTwice: two relays (two executor replicas) on one store publish the same backlog;
// JetStream's duplicate window keeps one copy of each event, in commit order per tenant.
func TestRelayTwice(t *testing.T) {
	url := sharedNATS(t)
	stream, prefix := names(t)
	deleteStream(t, url, stream)
	st := memory.New(memory.Options{})
	want := map[string]int64{"acme": 200, "globex": 100}
	for i := range 200 {
		finish(t, st, event("acme", i))
		if i < 100 {
			finish(t, st, event("globex", i))
		}
	}
	a := newRelay(t, outbox.Config{Store: st, URL: url, Stream: stream, Prefix: prefix, Batch: 16})
	b := newRelay(t, outbox.Config{Store: st, URL: url, Stream: stream, Prefix: prefix, Batch: 16})
	running(t, a)
	running(t, b)
	// More while both run.
	for i := 200; i < 300; i++ {
		finish(t, st, event("acme", i))
	}
	want["acme"] = 300
	waitDelivered(t, st, 15*time.Second)
	got := readAll(t, url, stream, prefix+".>")
	checkOrdered(t, got, want)
	sa, sb := a.Stats(), b.Stats()
	t.Logf("relay A %+v, relay B %+v: %d events, each once in the stream", sa, sb, len(got))
	if sa.Published+sb.Published != sum(want) {
		t.Errorf("the relays stored %d events, want %d: the stream dropped or kept a duplicate", sa.Published+sb.Published, sum(want))
	}
}

// TestRelayRestart: a relay that stops resumes from the cursor; events it published before
// its cursor moved are dropped as duplicates by the stream.
func TestRelayRestart(t *testing.T) {
	url := sharedNATS(t)
	stream, prefix := names(t)
	deleteStream(t, url, stream)
	st := memory.New(memory.Options{})
	for i := range 10 {
		finish(t, st, event("acme", i))
	}
	first := newRelay(t, outbox.Config{Store: st, URL: url, Stream: stream, Prefix: prefix})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	waitDelivered(t, st, 10*time.Second)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	first.Close()
	// A crash after publishing and before the cursor moved: rewind it by re-publishing
	// through a fresh store that holds the same events plus new ones.
	again := memory.New(memory.Options{})
	for i := range 15 {
		finish(t, again, event("acme", i))
	}
	second := newRelay(t, outbox.Config{Store: again, URL: url, Stream: stream, Prefix: prefix})
	running(t, second)
	waitDelivered(t, again, 10*time.Second)
	checkOrdered(t, readAll(t, url, stream, prefix+".>"), map[string]int64{"acme": 15})
	if s := second.Stats(); s.Duplicates != 10 || s.Published != 5 {
		t.Errorf("second relay %+v, want 10 duplicates and 5 published", s)
	}
}

// TestRelayNoBroker: a relay whose broker never answers starts at once, keeps the backlog and
// never blocks the store.
func TestRelayNoBroker(t *testing.T) {
	srv := startEmbedded(t)
	url := srv.url()
	srv.stop()
	st := memory.New(memory.Options{})
	start := time.Now()
	r := newRelay(t, outbox.Config{Store: st, URL: url})
	if d := time.Since(start); d > time.Second {
		t.Fatalf("New took %v with the broker down", d)
	}
	running(t, r)
	for i := range 50 {
		finish(t, st, event("acme", i))
	}
	time.Sleep(200 * time.Millisecond)
	b, err := st.Backlog(context.Background())
	if err != nil || len(b) != 1 || b[0].Delivered != 0 || b[0].Head != 50 {
		t.Fatalf("backlog %+v, %v; want acme's 50 events undelivered", b, err)
	}
	if evs, _ := st.Events(context.Background(), "acme", 0, 0); len(evs) != 50 {
		t.Fatalf("%d events queryable, want 50", len(evs))
	}
	if r.Stats().Failures == 0 {
		t.Error("no failed pass recorded")
	}
}

// TestPurger: delivered events and expired keys go on the ticker; undelivered events stay
// unless the purger is told there is no relay.
func TestPurger(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name        string
		undelivered bool
		delivered   int64
		wantKept    int
	}{
		{"delivered only", false, 6, 4},
		{"without a relay", true, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := memory.New(memory.Options{})
			for i := range 10 {
				e := event("acme", i)
				e.Time = time.Now().Add(-time.Hour)
				finish(t, st, e)
			}
			key := executor.IdemKey{Tenant: "acme", User: "alice", Command: "ticket.refund", Key: "k"}
			if _, err := st.Reserve(ctx, key, executor.Reservation{Digest: "d", TTL: time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			if tt.delivered > 0 {
				if err := st.MarkDelivered(ctx, "acme", tt.delivered); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(5 * time.Millisecond)
			pctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- outbox.Purger{Store: st, Every: 10 * time.Millisecond, KeepEvents: time.Minute, Undelivered: tt.undelivered}.Run(pctx)
			}()
			deadline := time.Now().Add(5 * time.Second)
			for {
				evs, _ := st.Events(ctx, "acme", 0, 0)
				if len(evs) == tt.wantKept {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d events kept, want %d", len(evs), tt.wantKept)
				}
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if saved, err := st.Reserve(ctx, key, executor.Reservation{Digest: "other", TTL: time.Hour}); err != nil || saved != nil {
				t.Fatalf("Reserve after purge = %v, %v; want the expired key free", saved, err)
			}
		})
	}
}
