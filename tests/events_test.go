package tests

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDevRelaysEvents: `mandate dev --events-url` relays an executed ticket.refund to NATS
// JetStream as a CloudEvent whose id is the invocation id, without the sensitive
// cardholder_reference, and `mandate events tail` prints it.
func TestDevRelaysEvents(t *testing.T) {
	const natsURL = "nats://127.0.0.1:4222"
	nc, err := nats.Connect(natsURL, nats.Timeout(time.Second))
	if err != nil {
		if os.Getenv("MANDATE_REQUIRE_POSTGRES") == "1" {
			t.Fatalf("NATS at %s does not answer: %v", natsURL, err)
		}
		t.Skipf("NATS at %s does not answer (%v): start nats-server -js to run this test", natsURL, err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	stream, prefix := "MANDATE_E2E_"+strings.ToUpper(id), "me2e"+id
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, stream)
	})

	dev := startDev(t, "--events-url", natsURL, "--events-stream", stream, "--events-subject-prefix", prefix)
	const secret = "CH4242424242"
	input := `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"2500"},"reason":"Customer was charged twice","cardholder_reference":"` + secret + `"}`
	url := dev.base + "/v1/commands/ticket.refund:execute"
	code, body := do(t, http.MethodPost, url, dev.tokens["carol"], `{"input":`+input+`}`)
	if code != 422 || body["code"] != "confirmation.required" {
		t.Fatalf("refund: %d %v, want confirmation.required", code, body)
	}
	challenge := body["challenge_id"].(string)
	if code, body := do(t, http.MethodPost, dev.base+"/v1/challenges/"+challenge+":decide", dev.tokens["carol"], `{"decision":"DECISION_APPROVE"}`); code != 200 {
		t.Fatalf("approve: %d %v", code, body)
	}
	code, body = do(t, http.MethodPost, url, dev.tokens["carol"], `{"input":`+input+`,"approval_grant_id":"`+challenge+`"}`)
	if code != 200 {
		t.Fatalf("refund with the grant: %d %v", code, body)
	}
	inv, _ := body["invocation_id"].(string)
	if inv == "" {
		t.Fatalf("no invocation_id in %v", body)
	}

	// `mandate events tail` prints the stream's events (--all: those already relayed too).
	root, _ := filepath.Abs("..")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tailCmd := exec.CommandContext(ctx, mandateBinary(t, root), "events", "tail", "--events-url", natsURL,
		"--tenant", "acme", "--command", "ticket.refund", "--events-subject-prefix", prefix, "--all")
	stdout, _ := tailCmd.StdoutPipe()
	var stderr syncBuffer
	tailCmd.Stderr = &stderr
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The relay creates the stream on its first pass: wait for it before tailing.
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.Stream(sctx, stream)
		scancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream %s never appeared: %v\n%s", stream, err, tail(dev.out.String(), 3000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := tailCmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = tailCmd.Wait() }()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(15 * time.Second):
		t.Fatalf("mandate events tail printed nothing: %s", stderr.String())
	}
	if strings.Contains(line, secret) {
		t.Fatalf("the event carries the sensitive cardholder_reference: %s", line)
	}
	var ev struct {
		SpecVersion string `json:"specversion"`
		ID          string `json:"id"`
		Type        string `json:"type"`
		Source      string `json:"source"`
		Data        struct {
			User    string          `json:"user"`
			Command string          `json:"command"`
			Outcome string          `json:"outcome"`
			Result  json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(line), &ev); err != nil {
		t.Fatalf("not a CloudEvent: %v: %s", err, line)
	}
	if ev.SpecVersion != "1.0" || ev.ID != inv || ev.Type != "dev.mandate.command.executed.v1" || ev.Source != "mandate://acme/executor" ||
		ev.Data.User != "carol" || ev.Data.Command != "ticket.refund" || ev.Data.Outcome != "executed" || !strings.Contains(string(ev.Data.Result), "refund_id") {
		t.Fatalf("event %s, want the refund's CloudEvent with id %s", line, inv)
	}
}
