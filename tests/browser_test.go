package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mandate-dev/mandate/internal/browsertest"
)

// TestApprovalInBrowser: an agent's refund waits for a human; carol signs
// in with the link `mandate dev` printed, approves in a real browser, and
// the waiting call completes; a declined one is refused with
// confirmation.refused and moves no money.
func TestApprovalInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary and a browser")
	}
	chrome := browsertest.Chromium(t)
	dev := startDev(t)
	base := dev.base
	var carolLink string
	sc := bufio.NewScanner(strings.NewReader(dev.out.String()))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "carol" && strings.Contains(f[1], "/approve/login?t=") {
			carolLink = f[1]
		}
	}
	if carolLink == "" {
		t.Fatalf("no sign-in link for carol:\n%s", dev.out.String())
	}
	bot := dev.tokens["finance-bot@carol"]
	execute := base + "/v1/commands/ticket.refund:execute"
	refund := func(amount, grant string) (int, map[string]any) {
		body := `{"input":{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"` + amount + `"},"reason":"Charged twice","cardholder_reference":"CH4242424242"}`
		if grant != "" {
			body += `,"approval_grant_id":"` + grant + `"`
		}
		return do(t, http.MethodPost, execute, bot, body+"}")
	}

	browser := headlessChromium(t, chrome, 90*time.Second)
	if err := chromedp.Do(browser, chromedp.Navigate(carolLink), chromedp.WaitVisible(chromedp.ID("pending"))); err != nil {
		t.Fatalf("carol signing in: %v", err)
	}

	for _, tc := range []struct {
		name, amount, button, state string
		wantStatus                  int
		wantCode                    string
	}{
		{"approve", "2500", "approve", "APPROVED", 200, ""},
		{"decline", "1000", "decline", "DECLINED", 403, "confirmation.refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := refund(tc.amount, "")
			if code != 422 || body["code"] != "confirmation.required" {
				t.Fatalf("first call: %d %v", code, body)
			}
			challenge, approvalURL := body["challenge_id"].(string), body["approval_url"].(string)
			// The agent waits for the human's answer.
			decided := make(chan string, 1)
			go func() {
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, base+"/v1/challenges/"+challenge+":await", nil)
				req.Header.Set("Authorization", "Bearer "+bot)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					decided <- "error: " + err.Error()
					return
				}
				defer func() { _ = resp.Body.Close() }()
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					var msg struct {
						Result struct {
							State string `json:"state"`
						} `json:"result"`
					}
					if json.Unmarshal(sc.Bytes(), &msg) == nil && msg.Result.State != "" && msg.Result.State != "CHALLENGE_STATE_PENDING" {
						decided <- msg.Result.State
						return
					}
				}
				decided <- "stream ended"
			}()
			if err := chromedp.Do(browser,
				chromedp.Navigate(approvalURL),
				chromedp.WaitVisible(chromedp.ID(tc.button)),
				chromedp.Click(chromedp.ID(tc.button)),
				chromedp.WaitVisible(chromedp.CSS(`#challenge[data-state="`+tc.state+`"]`)),
			); err != nil {
				t.Fatalf("clicking %s: %v", tc.button, err)
			}
			select {
			case state := <-decided:
				if state != "CHALLENGE_STATE_"+tc.state {
					t.Fatalf("the waiting agent saw %q", state)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the waiting agent never heard the decision")
			}
			code, body = refund(tc.amount, challenge)
			if code != tc.wantStatus || (tc.wantCode != "" && body["code"] != tc.wantCode) {
				t.Fatalf("call with the grant: %d %v", code, body)
			}
			if tc.wantCode == "" && !strings.Contains(tail(jsonString(body), 2000), "REFUND_STATUS_ACCEPTED") {
				t.Fatalf("refund result: %v", body)
			}
		})
	}
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// headlessChromium starts Chromium at path with the flags this machine
// needs (no sandbox, no background networking) and a fresh profile, and
// returns a browser context that ends after timeout or with the test.
func headlessChromium(t *testing.T, path string, timeout time.Duration) context.Context {
	t.Helper()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("no-first-run", true), chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(t.TempDir()))
	browser, cancelTab := chromedp.NewContext(allocCtx)
	browser, cancel := context.WithTimeout(browser, timeout)
	t.Cleanup(func() { cancel(); cancelTab(); cancelAlloc() })
	return browser
}
