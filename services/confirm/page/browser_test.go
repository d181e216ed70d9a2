package page_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/mandate-dev/mandate/internal/browsertest"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/api"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
	"github.com/mandate-dev/mandate/services/confirm/memory"
	"github.com/mandate-dev/mandate/services/confirm/page"
)

// confirmServer runs the confirm service as `mandate confirm` would: gRPC +
// REST, with the approval page mounted on the HTTP listener.
type confirmServer struct {
	base    string
	store   *memory.Store
	confirm *confirm.Service
}

func startConfirmServer(t *testing.T) *confirmServer {
	t.Helper()
	return startConfirmServerWith(t, confirmtest.Commands())
}

// startConfirmServerWith is startConfirmServer over the declarations cmds.
func startConfirmServerWith(t *testing.T, cmds confirm.Commands) *confirmServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dir := dirmem.New()
	if _, err := directory.Apply(ctx, dir, []byte(confirmtest.Policy)); err != nil {
		t.Fatal(err)
	}
	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{"mandate"}, Issuers: []string{issuer}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	srv, err := server.New(server.Config{Name: "mandate.v1.ConfirmService", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + srv.HTTPAddr()
	store := memory.New(memory.Options{})
	svc, err := confirm.New(confirm.Config{Store: store, Directory: directory.Direct(dir), Commands: cmds, ApprovalBaseURL: base, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	api.New(svc, quiet).Register(srv)
	srv.HandleGateway(api.Gateway)
	h, err := page.New(page.Config{Confirm: svc, Sessions: store, Directory: directory.Direct(dir), LoginSecret: devSecret, Issuers: []string{issuer}, BaseURL: base, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv.Handle(page.Pattern, h)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
		store.Close()
	})
	for range 100 {
		if resp, err := http.Get(base + "/healthz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &confirmServer{base: base, store: store, confirm: svc}
}

func (s *confirmServer) open(t *testing.T, inv string) confirm.Challenge {
	t.Helper()
	c, err := s.confirm.Open(context.Background(), botForAlice, confirm.OpenRequest{
		Command: "ticket.refund", InvocationDigest: confirmtest.Digest(inv), InvocationID: inv,
		// The executor should have withheld the card reference; the page must
		// not show it even though it did not.
		ArgumentsJSON:  `{"ticket_id":"T-1042","amount_cents":1250,"cardholder_reference":"4111-1111-SECRET"}`,
		WithheldFields: []string{"/cardholder_reference"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (s *confirmServer) state(t *testing.T, id string) confirm.Challenge {
	t.Helper()
	c, err := s.store.Get(context.Background(), "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestBrowser drives headless Chromium through the approval page: sign in
// with the one-time link, read the prompt, approve one challenge and
// decline another, and have a form without its CSRF token refused.
func TestBrowser(t *testing.T) {
	bin := browsertest.Chromium(t)
	s := startConfirmServer(t)
	first, second, third := s.open(t, "inv-approve"), s.open(t, "inv-decline"), s.open(t, "inv-forged")

	ctx := newBrowser(t, bin)

	link, err := page.LoginURL(s.base, devSecret, issuer, "alice", "acme", 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Sign in: the link's page moves on to the list of waiting requests.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(link),
		chromedp.WaitVisible(chromedp.ID("pending")),
	); err != nil {
		t.Fatalf("signing in: %v", err)
	}
	cookies, err := chromedp.Run(ctx, func(ctx context.Context, tgt *chromedp.Target) ([]*network.Cookie, error) {
		res, err := cdp.Call(ctx, tgt, network.GetCookies, network.GetCookiesParams{URLs: []string{s.base + "/approve/"}})
		return res.Cookies, err
	})
	if err != nil {
		t.Fatal(err)
	}
	var session *network.Cookie
	for _, c := range cookies {
		if c.Name == page.CookieName {
			session = c
		}
	}
	if session == nil || !session.HTTPOnly || session.SameSite != network.CookieSameSiteStrict || session.Path != "/approve" {
		t.Fatalf("session cookie %+v", session)
	}

	// Open the first challenge from the list and read the prompt.
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`a[href="/approve/`+first.ID+`"]`)),
		chromedp.WaitVisible(chromedp.ID("title")),
	); err != nil {
		t.Fatalf("opening the challenge: %v", err)
	}
	title := text(t, ctx, chromedp.Text(chromedp.ID("title")))
	withheld := text(t, ctx, chromedp.Text(chromedp.CSS(`#withheld li.withheld`)))
	html := text(t, ctx, chromedp.OuterHTML(chromedp.CSS("html")))
	if title != "Refund a ticket (ticket.refund)" {
		t.Fatalf("title %q", title)
	}
	if !strings.Contains(withheld, "/cardholder_reference") || !strings.Contains(withheld, "withheld") {
		t.Fatalf("withheld field shown as %q", withheld)
	}
	if strings.Contains(html, "4111-1111-SECRET") {
		t.Fatal("the page shows the sensitive value")
	}

	// Approve it.
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.ID("approve")),
		chromedp.WaitVisible(chromedp.CSS(`#challenge[data-state="APPROVED"]`)),
	); err != nil {
		t.Fatalf("approving: %v", err)
	}
	if c := s.state(t, first.ID); c.State != confirm.StateApproved || c.DecisionChannel != confirm.ChannelApprovalPage || c.DecidedBy != "alice" {
		t.Fatalf("after Approve: state %s, channel %q, decided by %q", c.State, c.DecisionChannel, c.DecidedBy)
	}

	// Decline the second.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(s.base+"/approve/"+second.ID),
		chromedp.WaitVisible(chromedp.ID("decline")),
		chromedp.Click(chromedp.ID("decline")),
		chromedp.WaitVisible(chromedp.CSS(`#challenge[data-state="DECLINED"]`)),
	); err != nil {
		t.Fatalf("declining: %v", err)
	}
	if c := s.state(t, second.ID); c.State != confirm.StateDeclined || c.DecisionChannel != confirm.ChannelApprovalPage || c.DecidedBy != "alice" {
		t.Fatalf("after Decline: state %s, channel %q, decided by %q", c.State, c.DecisionChannel, c.DecidedBy)
	}

	// A form stripped of its CSRF token is refused, in the browser …
	if err := chromedp.Do(ctx,
		chromedp.Navigate(s.base+"/approve/"+third.ID),
		chromedp.WaitVisible(chromedp.ID("approve")),
		func(ctx context.Context, tgt *chromedp.Target) (chromedp.Void, error) {
			_, err := chromedp.Evaluate[int](`(() => { const f = document.querySelectorAll('input[name=csrf]'); f.forEach(e => e.remove()); return f.length })()`)(ctx, tgt)
			return chromedp.Void{}, err
		},
		chromedp.Click(chromedp.ID("approve")),
		chromedp.WaitVisible(chromedp.ID("message")),
	); err != nil {
		t.Fatalf("submitting without CSRF token: %v", err)
	}
	if message := text(t, ctx, chromedp.Text(chromedp.ID("message"))); !strings.Contains(message, "Refused") {
		t.Fatalf("a form without CSRF token got %q", message)
	}
	// … and by status code: a POST with the browser's session cookie but no
	// token gets 403.
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, s.base+"/approve/"+third.ID,
		strings.NewReader(url.Values{"decision": {"approve"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(&http.Cookie{Name: session.Name, Value: session.Value})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("POST without CSRF token: %d, want 403", resp.StatusCode)
	}
	if c := s.state(t, third.ID); c.State != confirm.StatePending {
		t.Fatalf("the forged forms moved the challenge to %s", c.State)
	}
}

// newBrowser starts headless Chromium for the test; the returned context
// ends it, at the latest after 90 s.
func newBrowser(t *testing.T, bin string) context.Context {
	t.Helper()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(bin),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	t.Cleanup(cancelAlloc)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelTab)
	// The browser lives as long as the context of the first Run: a timeout
	// on it bounds the whole test.
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// text runs an action that reads a string and fails the test on error.
func text(t *testing.T, ctx context.Context, a chromedp.Action[string]) string {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
