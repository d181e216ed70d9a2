package confirm_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/memory"
)

// hookReceiver is a webhook receiver on loopback: it verifies every
// delivery's signature as a Standard Webhooks receiver does, answers the
// next fail deliveries 500, and keeps what it accepted.
type hookReceiver struct {
	t   *testing.T
	key []byte
	srv *httptest.Server

	mu       sync.Mutex
	fail     int
	attempts map[string]int // by webhook-id, every attempt
	accepted []receivedHook
}

type receivedHook struct {
	id    string
	event confirm.WebhookEvent
	body  string
}

func newHookReceiver(t *testing.T, key []byte) *hookReceiver {
	r := &hookReceiver{t: t, key: key, attempts: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if err := confirm.VerifyWebhook(r.key, req.Header, body, time.Now(), 5*time.Minute); err != nil {
			t.Errorf("a delivery does not verify: %v", err)
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		id := req.Header.Get("webhook-id")
		r.attempts[id]++
		if r.fail > 0 {
			r.fail--
			http.Error(w, "try later", http.StatusInternalServerError)
			return
		}
		var ev confirm.WebhookEvent
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Errorf("a delivery is not JSON: %v", err)
		}
		r.accepted = append(r.accepted, receivedHook{id: id, event: ev, body: string(body)})
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *hookReceiver) failNext(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = n
}

func (r *hookReceiver) got() []receivedHook {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.accepted)
}

func (r *hookReceiver) attemptsOf(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts[id]
}

var hookKey = []byte("0123456789abcdef0123456789abcdef")

// TestWebhooks (issue 27 §4): every challenge opened, decided and expired
// reaches the receiver as one signed delivery (Standard Webhooks: it
// verifies with the secret, and fails with another), with what a chat or
// e-mail bridge needs — what, who asks, the risk, the amounts, the expiry,
// the approval URL, who decided — and never the call's arguments. A
// delivery the receiver refuses is retried with backoff under the same
// webhook-id until it is taken, then never again; one refused past the
// attempts is given up. An expired challenge is notified once however
// often the relay looks.
func TestWebhooks(t *testing.T) {
	f := setup(t, false)
	ctx := context.Background()
	rcv := newHookReceiver(t, hookKey)
	reader := sdkmetric.NewManualReader()
	relay := confirm.NewWebhookRelay(f.store, f.svc, confirm.WebhookConfig{
		URL: rcv.srv.URL, Key: hookKey, MaxAttempts: 3,
		Backoff:       func(int) time.Duration { return time.Second },
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})
	round := func(want int) {
		t.Helper()
		n, err := relay.Once(ctx)
		if err != nil || n != want {
			t.Fatalf("a relay round delivered %d (%v), want %d", n, err, want)
		}
	}

	// Opened, then decided.
	refund := f.open(t, botForAlice, "ticket.refund")
	round(1)
	if _, err := f.svc.Decide(ctx, alice, refund.ID, true, "api"); err != nil {
		t.Fatal(err)
	}
	round(1)
	round(0)
	got := rcv.got()
	if len(got) != 2 || got[0].event.Type != "challenge.opened" || got[1].event.Type != "challenge.decided" {
		t.Fatalf("received %+v, want opened then decided", got)
	}
	opened, decided := got[0].event.Data, got[1].event.Data
	if opened.ChallengeID != refund.ID || opened.Tenant != "acme" || opened.Command != "ticket.refund" || opened.State != "PENDING" ||
		opened.RequesterUser != "alice" || opened.RequesterAgent != "support-bot" || opened.Title == "" || opened.Summary == "" ||
		opened.Risk == "" || opened.ApprovalURL != f.svc.ApprovalURL(refund.ID) || !opened.ExpiresAt.Equal(refund.ExpiresAt) {
		t.Errorf("the opened notice says %+v", opened)
	}
	if decided.State != "APPROVED" || decided.DecidedBy != "alice" || decided.DecisionChannel != "api" || decided.DecidedAt.IsZero() {
		t.Errorf("the decided notice says %+v", decided)
	}
	if got[0].id == got[1].id {
		t.Error("two events share a webhook-id")
	}
	for _, h := range got {
		if strings.Contains(h.body, "cardholder") || strings.Contains(h.body, "withheld") || strings.Contains(h.body, "T-1") {
			t.Errorf("a delivery carries the call's arguments: %s", h.body)
		}
	}
	if err := confirm.VerifyWebhook([]byte("another key, another receiver!!"), http.Header{
		"Webhook-Id": {got[0].id}, "Webhook-Timestamp": {"0"}, "Webhook-Signature": {"v1,AAAA"},
	}, []byte(got[0].body), time.Unix(0, 0), time.Minute); err == nil {
		t.Error("a delivery verifies under another key")
	}

	// Expired: once, however often the relay looks.
	payout := f.open(t, botForAlice, "ticket.refund")
	round(1)
	f.clock.Advance(confirm.DefaultTTL + time.Minute)
	round(1)
	round(0)
	got = rcv.got()
	if last := got[len(got)-1].event; last.Type != "challenge.expired" || last.Data.ChallengeID != payout.ID || last.Data.State != "EXPIRED" {
		t.Fatalf("the last delivery is %+v, want payout's expiry", last)
	}
	if n := len(got); n != 4 {
		t.Fatalf("%d deliveries, want 4", n)
	}

	// Refused twice, taken the third time: retried under one webhook-id.
	rcv.failNext(2)
	f.open(t, botForAlice, "ticket.refund")
	round(0)
	f.clock.Advance(2 * time.Second)
	round(0)
	f.clock.Advance(2 * time.Second)
	round(1)
	f.clock.Advance(2 * time.Second)
	round(0)
	got = rcv.got()
	if n := rcv.attemptsOf(got[len(got)-1].id); len(got) != 5 || n != 3 {
		t.Fatalf("%d deliveries, the last after %d attempts; want 5, the last after 3", len(got), n)
	}

	// Refused past the attempts: given up, never claimed again.
	rcv.failNext(100)
	f.open(t, botForAlice, "ticket.refund")
	for range 5 {
		round(0)
		f.clock.Advance(2 * time.Second)
	}
	if len(rcv.got()) != 5 {
		t.Fatal("a given-up notice was delivered")
	}
	// 5 delivered; 2 failed attempts before the fifth; 2 failed and 1
	// given up for the last.
	if got := webhookCounts(t, reader); got[confirm.WebhookDelivered] != 5 || got[confirm.WebhookFailed] != 4 || got[confirm.WebhookGivenUp] != 1 || got[confirm.WebhookDropped] != 0 {
		t.Fatalf("%s = %v, want delivered 5, failed 4, given_up 1", confirm.MetricWebhooks, got)
	}
}

// webhookCounts reads MetricWebhooks by result.
func webhookCounts(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != confirm.MetricWebhooks {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value("result")
				out[v.AsString()] += dp.Value
			}
		}
	}
	return out
}

// TestWebhookSecret: a secret is "whsec_" and the base64 of at least 24
// bytes; anything else is refused with what is wrong.
func TestWebhookSecret(t *testing.T) {
	good := confirm.WebhookSecretPrefix + base64.StdEncoding.EncodeToString(hookKey)
	if k, err := confirm.ParseWebhookSecret(good); err != nil || string(k) != string(hookKey) {
		t.Fatalf("ParseWebhookSecret(%q) = %q, %v", good, k, err)
	}
	for _, bad := range []string{"", base64.StdEncoding.EncodeToString(hookKey), "whsec_not base64!", "whsec_" + base64.StdEncoding.EncodeToString([]byte("short"))} {
		if _, err := confirm.ParseWebhookSecret(bad); err == nil {
			t.Errorf("ParseWebhookSecret(%q) accepted", bad)
		}
	}
}

// TestWebhooksWithoutAURL: without a receiver the relay drops notices as
// they come due, so that none piles up.
func TestWebhooksWithoutAURL(t *testing.T) {
	f := setup(t, false)
	relay := confirm.NewWebhookRelay(f.store, f.svc, confirm.WebhookConfig{})
	f.open(t, botForAlice, "ticket.refund")
	if n, err := relay.Once(context.Background()); err != nil || n != 0 {
		t.Fatalf("Once = %d, %v", n, err)
	}
	left, err := f.store.ClaimNotices(context.Background(), 10, time.Minute)
	if err != nil || len(left) != 0 {
		t.Fatalf("%d notices left (%v), want none", len(left), err)
	}
}

// TestTheRelayPurgesPastRetention: the relay's round deletes challenges
// that expired longer ago than the store keeps them (confirm.Purger), so a
// running confirm service's store stays bounded; one still within
// retention stays readable as EXPIRED.
func TestTheRelayPurgesPastRetention(t *testing.T) {
	f := setup(t, false)
	relay := confirm.NewWebhookRelay(f.store, f.svc, confirm.WebhookConfig{})
	old := f.open(t, botForAlice, "ticket.refund")
	// Expired, within retention, when the next challenge opens (the memory
	// store's Create sweeps too, so only the relay can drop it later).
	f.clock.Advance(old.ExpiresAt.Sub(f.clock.Now()) + memory.DefaultRetain/2)
	recent := f.open(t, botForAlice, "ticket.refund")
	f.clock.Advance(memory.DefaultRetain/2 + time.Second)
	if _, err := f.store.Get(context.Background(), "acme", old.ID); err != nil {
		t.Fatalf("before the relay's round: %v", err)
	}
	if _, err := relay.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Get(context.Background(), "acme", old.ID); !errors.Is(err, confirm.ErrNotFound) {
		t.Fatalf("a challenge past retention after the relay's round: %v, want ErrNotFound", err)
	}
	if _, err := f.store.Get(context.Background(), "acme", recent.ID); err != nil {
		t.Fatalf("a challenge within retention: %v", err)
	}
}
