package tests

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// TestWebhooksFromTheConfirmService (issue 27 §4), as an adopter's
// receiver sees them: `mandate confirm` runs with --webhook-url and
// --webhook-secret (here from MANDATE_WEBHOOK_URL and
// MANDATE_WEBHOOK_SECRET) pointing at a receiver on loopback that checks
// each delivery by the Standard Webhooks specification itself — the HMAC
// of id.timestamp.body under the secret's bytes — without any of Mandate's
// code. finance-bot's refund opens a challenge: the receiver learns it
// waits, with the approval URL and the amount, before anyone tells carol;
// carol approves: the receiver learns who decided. Neither delivery holds
// the sensitive cardholder reference, nor any argument.
func TestWebhooksFromTheConfirmService(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	type delivery struct {
		id   string
		body string
		ev   struct {
			Type string         `json:"type"`
			Data map[string]any `json:"data"`
		}
	}
	var (
		mu  sync.Mutex
		got []delivery
	)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id, ts, sig := r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"), r.Header.Get("webhook-signature")
		sec, err := strconv.ParseInt(ts, 10, 64)
		if err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute {
			t.Errorf("webhook-timestamp %q is not a recent Unix time", ts)
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id + "." + ts + "."))
		mac.Write(body)
		want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
		ok := false
		for _, s := range strings.Fields(sig) {
			ok = ok || hmac.Equal([]byte(s), []byte(want))
		}
		if id == "" || !ok {
			t.Errorf("a delivery does not verify: id %q signature %q", id, sig)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		d := delivery{id: id, body: string(body)}
		if err := json.Unmarshal(body, &d.ev); err != nil {
			t.Errorf("a delivery is not JSON: %s", body)
		}
		mu.Lock()
		got = append(got, d)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rcv.Close()
	waitFor := func(kind, challenge string) delivery {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			mu.Lock()
			for _, d := range got {
				if d.ev.Type == kind && d.ev.Data["challenge_id"] == challenge {
					mu.Unlock()
					return d
				}
			}
			mu.Unlock()
		}
		t.Fatalf("no %s webhook for %s", kind, challenge)
		return delivery{}
	}

	tp := newTopology(t, topologyOptions{env: []string{"MANDATE_WEBHOOK_URL=" + rcv.URL, "MANDATE_WEBHOOK_SECRET=" + secret}})
	bot := tp.token("acme", "carol", "finance-bot")
	r := tp.rest("executor", http.MethodPost, "/v1/commands/ticket.refund:execute", bot, `{"input":`+refundInput+`}`, "Idempotency-Key", "webhook-refund-1")
	challenge, _ := r.body["challenge_id"].(string)
	if r.status != http.StatusUnprocessableEntity || challenge == "" {
		t.Fatalf("the refund: %d %s", r.status, r.raw)
	}
	opened := waitFor("challenge.opened", challenge)
	data := opened.ev.Data
	if data["state"] != "PENDING" || data["command"] != "ticket.refund" || data["requester_agent"] != "finance-bot" ||
		!strings.HasSuffix(data["approval_url"].(string), "/approve/"+challenge) || !strings.Contains(opened.body, "25.00") {
		t.Errorf("the opened webhook says %s", opened.body)
	}
	if _, err := tp.decide(tp.token("acme", "carol", ""), challenge, mandatev1.Decision_DECISION_APPROVE); err != nil {
		t.Fatal(err)
	}
	decided := waitFor("challenge.decided", challenge)
	if decided.ev.Data["state"] != "APPROVED" || decided.ev.Data["decided_by"] != "carol" || decided.id == opened.id {
		t.Errorf("the decided webhook says %s (id %s)", decided.body, decided.id)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, d := range got {
		if strings.Contains(d.body, "CH4242424242") || strings.Contains(d.body, "charged twice") {
			t.Errorf("a webhook carries an argument: %s", d.body)
		}
	}
}
