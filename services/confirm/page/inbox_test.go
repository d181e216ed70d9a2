package page_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/net/html"

	"github.com/mandate-dev/mandate/internal/browsertest"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
	"github.com/mandate-dev/mandate/services/confirm/page"
)

// refundArgs is a sample refund of 2,500.00 EUR with a sensitive card
// reference the executor did not withhold.
const refundArgs = `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"250000"},"reason":"late delivery","cardholder_reference":"CH4242424242"}`

func parse(t *testing.T, body string) *html.Node {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func openInbox(t *testing.T, svc *confirm.Service) (refund, payout confirm.Challenge) {
	t.Helper()
	var err error
	refund, err = svc.Open(context.Background(), botForAlice, confirm.OpenRequest{
		Command: "ticket.refund", InvocationDigest: confirmtest.Digest("inv-inbox-refund"), InvocationID: "inv-inbox-refund",
		ArgumentsJSON: refundArgs, TTL: 2 * time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	payout, err = svc.Open(context.Background(), botForAlice, confirm.OpenRequest{
		Command: "payment.payout", InvocationDigest: confirmtest.Digest("inv-inbox-payout"), InvocationID: "inv-inbox-payout",
		ArgumentsJSON: `{"vendor":"V-7"}`,
	})
	if err != nil {
		t.Fatal(err)
	}
	return refund, payout
}

// TestInboxOnThePage: the index lists what the signed-in human may decide
// with amount and relative expiry, a four-eyes request under the
// requester's own "waiting for another approver" and in the approver's
// inbox, and never a sensitive value.
func TestInboxOnThePage(t *testing.T) {
	// Once signed in, the page's clock reads 30 minutes after the store
	// opened the requests; the refund expires 2 h after opening.
	var fixed atomic.Pointer[time.Time]
	f := newFixtureWith(t, func() time.Time {
		if at := fixed.Load(); at != nil {
			return *at
		}
		return time.Now()
	}, sampleCommands(t))
	alice, _ := f.signIn(t, "alice", "acme")
	carol, _ := f.signIn(t, "carol", "acme")
	refund, payout := openInbox(t, f.confirm)
	at := refund.CreatedAt.Add(30 * time.Minute)
	fixed.Store(&at)
	r := do(t, alice, http.MethodGet, f.srv.URL+"/approve/", nil, nil)
	doc := parse(t, r.body)
	pending, others := textOf(byID(doc, "pending")), textOf(byID(doc, "others"))
	for _, want := range []string{"Refund a ticket (ticket.refund)", "support-bot acting for alice", "2,500.00 EUR", "risk L3", "expires in 1 h 30 min"} {
		if !strings.Contains(pending, want) {
			t.Errorf("alice's inbox lacks %q: %s", want, pending)
		}
	}
	if strings.Contains(pending, "payment.payout") || !strings.Contains(others, "Pay out to a vendor (payment.payout)") {
		t.Errorf("alice's four-eyes payout: inbox %q, others %q", pending, others)
	}
	if strings.Contains(r.body, "CH4242424242") {
		t.Fatal("the inbox shows the sensitive value")
	}
	r = do(t, carol, http.MethodGet, f.srv.URL+"/approve/", nil, nil)
	doc = parse(t, r.body)
	if p := textOf(byID(doc, "pending")); !strings.Contains(p, "payment.payout") || strings.Contains(p, "ticket.refund") || byID(doc, "others") != nil {
		t.Errorf("carol's inbox: %s", r.body)
	}
	if !strings.Contains(r.body, `href="/approve/`+payout.ID+`"`) || strings.Contains(r.body, refund.ID) {
		t.Errorf("carol's links: %s", r.body)
	}
}

// TestBrowserInbox: in Chromium, the approver signs in, reads the amount
// and the expiry in the inbox, and the link leads to the decision page.
func TestBrowserInbox(t *testing.T) {
	bin := browsertest.Chromium(t)
	s := startConfirmServerWith(t, sampleCommands(t))
	refund, _ := openInbox(t, s.confirm)
	ctx := newBrowser(t, bin)
	link, err := page.LoginURL(s.base, devSecret, issuer, "alice", "acme", 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(link), chromedp.WaitVisible(chromedp.ID("pending"))); err != nil {
		t.Fatalf("signing in: %v", err)
	}
	item := `#pending a[href="/approve/` + refund.ID + `"]`
	amount := text(t, ctx, chromedp.Text(chromedp.CSS(`#pending li .amount`)))
	expires := text(t, ctx, chromedp.Text(chromedp.CSS(`#pending li .expires`)))
	others := text(t, ctx, chromedp.Text(chromedp.ID("others")))
	if amount != "2,500.00 EUR" {
		t.Fatalf("amount %q", amount)
	}
	if !regexp.MustCompile(`^expires in 1 h [0-9]+ min$`).MatchString(expires) {
		t.Fatalf("expiry %q", expires)
	}
	if !strings.Contains(others, "payment.payout") {
		t.Fatalf("the requester's four-eyes payout is not under others: %q", others)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(item)), chromedp.WaitVisible(chromedp.ID("approve"))); err != nil {
		t.Fatalf("opening the request from the inbox: %v", err)
	}
	if title := text(t, ctx, chromedp.Text(chromedp.ID("title"))); title != "Refund a ticket (ticket.refund)" {
		t.Fatalf("title %q", title)
	}
}
