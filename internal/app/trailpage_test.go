package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/auditcmd"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/app/confirmcmd"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/server/inprocess"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/audit"
	auditmem "github.com/mandate-dev/mandate/services/audit/memory"
	auditpg "github.com/mandate-dev/mandate/services/audit/postgres"
	confirmmem "github.com/mandate-dev/mandate/services/confirm/memory"
	"github.com/mandate-dev/mandate/services/confirm/page"
)

// trailPolicy: olive (acme) and gail (globex) hold audit.read; alice does
// not, and support-bot acts for her.
const trailPolicy = `version: 1
tenants:
  - id: acme
    roles:
      support: [ticket.read]
      ops: [audit.read]
    users:
      - {id: alice, org: support, roles: [support]}
      - {id: olive, org: ops, roles: [ops]}
    agents:
      - {id: support-bot, user: alice}
  - id: globex
    roles:
      ops: [audit.read]
    users:
      - {id: gail, org: ops, roles: [ops]}
`

// hostileText is what a backend's message or an agent's name might carry:
// markup, bidi overrides that reverse "25.00 EUR", a long unbroken word.
const hostileText = `"><script>alert(1)</script><img src=x onerror=alert(1)> ` + "\u202eRUE 00.52\u202c \u2066\u200f\u2069 " +
	`javascript:alert(1) </bdi></code>+`

// trailFixture is the confirm service's pages, wired as `mandate dev`
// wires them (confirmcmd.Build), reading an audit service (auditcmd.Build)
// through the same in-process channel, on the confirm service's identity.
type trailFixture struct {
	base      string
	devSecret []byte
	dir       *dirmem.Store
	// executor appends rows on the executor's own authority; confirm
	// calls as the confirm service, relaying nobody.
	executor, confirm mandatev1.AuditServiceClient
}

type trailOptions struct {
	store audit.Store
	// auditDevSecret is the dev secret the audit service trusts; empty:
	// the one that signs the sign-in links.
	auditDevSecret []byte
}

func startTrailPage(t *testing.T, o trailOptions) *trailFixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	quiet := slog.New(slog.DiscardHandler)
	devSecret := []byte("dev-secret-trail-0123456789abcdef0123456789")
	serviceSecret := []byte("service-secret-trail-0123456789abcdef01234")
	dirStore := dirmem.New()
	if _, err := directory.Apply(ctx, dirStore, []byte(trailPolicy)); err != nil {
		t.Fatal(err)
	}
	dir := directory.Direct(dirStore)
	var cl clicore.Closers
	if o.store == nil {
		ms := auditmem.New(auditmem.Options{})
		cl.Add(ms.Close)
		o.store = ms
	}
	auditSecret := o.auditDevSecret
	if auditSecret == nil {
		auditSecret = devSecret
	}
	auditUsers, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{DefaultAudience}, Issuers: []string{DefaultIssuer}, DevSecret: auditSecret})
	if err != nil {
		t.Fatal(err)
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{Secret: serviceSecret, Audience: []string{DefaultAudience}, Issuers: []string{DefaultIssuer}})
	if err != nil {
		t.Fatal(err)
	}
	auditAuth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: auditUsers, Services: services, AllowServiceOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	auditSrv, err := server.New(server.Config{Name: "mandate.v1.AuditService", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auditAuth, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	auditcmd.Build(auditcmd.Deps{Store: o.store, Directory: dir, Logger: quiet}, &cl).RegisterAPI(auditSrv)

	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{DefaultAudience}, Issuers: []string{DefaultIssuer}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := server.New(server.Config{Name: "mandate.v1.ConfirmService", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + pub.HTTPAddr()
	confirmSrc, err := identity.NewServiceTokenSource(serviceSecret, DefaultIssuer, DefaultAudience, identity.ConfirmService, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	execSrc, err := identity.NewServiceTokenSource(serviceSecret, DefaultIssuer, DefaultAudience, identity.ExecutorService, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	confirmStore := confirmmem.New(confirmmem.Options{})
	cl.Add(confirmStore.Close)
	svc, err := confirmcmd.Build(confirmcmd.Deps{Store: confirmStore, Sessions: confirmStore, Directory: dir, Manifest: set,
		BaseURL: base, LoginSecret: devSecret, Issuers: []string{DefaultIssuer},
		Audit: inprocess.Conn(auditSrv, confirmSrc), TokenAudience: DefaultAudience, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	svc.Register(pub)
	done := make(chan error, 2)
	go func() { done <- auditSrv.Run(ctx) }()
	go func() { done <- pub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		}
		cl.Close()
	})
	for range 200 {
		if healthy(ctx, base+"/healthz") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &trailFixture{base: base, devSecret: devSecret, dir: dirStore,
		executor: mandatev1.NewAuditServiceClient(inprocess.Conn(auditSrv, execSrc)),
		confirm:  mandatev1.NewAuditServiceClient(inprocess.Conn(auditSrv, confirmSrc))}
}

// row is an outcome row of tenant as the executor appends it.
func row(tenant, inv, user, agent, command, outcome string) *mandatev1.AuditRecord {
	r := &mandatev1.AuditRecord{
		Tenant: tenant, InvocationId: inv, Phase: "outcome", Time: timestamppb.Now(), Channel: "mcp",
		Command: command, Risk: "L1", UserId: user, ActorKind: "user", Outcome: outcome,
	}
	if agent != "" {
		r.ActorKind, r.AgentId, r.Model, r.ModelVersion = "agent", agent, "dev-model", "2026-01"
	}
	if outcome == "refused" {
		r.Stage, r.Code, r.Message = "permission_check", "authorization.permission_denied", "the caller lacks ticket.write"
	}
	return r
}

func (f *trailFixture) append(t *testing.T, recs ...*mandatev1.AuditRecord) {
	t.Helper()
	if _, err := f.executor.Append(context.Background(), &mandatev1.AppendRequest{Records: recs}); err != nil {
		t.Fatal(err)
	}
}

// seed appends acme's and globex's rows: 30 searches, a refused refund, an
// approved refund (client-attested, ceiling L3), one approved on the page,
// one with hostile text and a sensitive-looking argument, and globex's own.
// acme's newest row is 34.
func (f *trailFixture) seed(t *testing.T) {
	t.Helper()
	for i := range 30 {
		f.append(t, row("acme", fmt.Sprintf("search-%02d", i), "alice", "support-bot", "ticket.search", "executed"))
	}
	f.append(t, row("acme", "refund-refused", "alice", "support-bot", "ticket.refund", "refused"))
	elicited := row("acme", "refund-elicited", "alice", "support-bot", "ticket.refund", "executed")
	elicited.Approval = &mandatev1.Approval{ChallengeId: "chal-elicited", Approver: "alice", Channel: "mcp_elicitation", TrustCeiling: "L3", DecidedAt: timestamppb.Now()}
	signedIn := row("acme", "refund-page", "alice", "", "ticket.refund", "executed")
	signedIn.Approval = &mandatev1.Approval{ChallengeId: "chal-page", Approver: "olive", Channel: "approval_page", DecidedAt: timestamppb.Now()}
	f.append(t, elicited, signedIn)
	hostile := row("acme", "hostile", "alice", "support-bot", "ticket.refund", "failed")
	hostile.Stage, hostile.Code, hostile.Message = "dispatch", "backend.failed", hostileText+strings.Repeat("withoutanyspaces", 40)
	hostile.Subject = hostileText
	hostile.ArgumentsJson = `{"cardholder_reference":"CARD-SECRET-4242","reason":"` + strings.ReplaceAll(hostileText, `"`, `\"`) + `"}`
	f.append(t, hostile)
	f.append(t, row("globex", "globex-1", "gail", "", "globex.secret", "executed"))
}

func newBrowserClient(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// signIn returns a client signed in on the approval page as user.
func (f *trailFixture) signIn(t *testing.T, user, tenant string) *http.Client {
	t.Helper()
	link, err := page.LoginURL(f.base, f.devSecret, DefaultIssuer, user, tenant, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c := newBrowserClient(t)
	if code, body := get(t, c, link, nil); code != http.StatusOK || !strings.Contains(body, "signed in as "+user) {
		t.Fatalf("signing in %s: %d %s", user, code, body)
	}
	return c
}

func get(t *testing.T, c *http.Client, u string, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// trailGet fetches the trail page with query q.
func (f *trailFixture) trailGet(t *testing.T, c *http.Client, q string) (int, string) {
	t.Helper()
	u := f.base + page.TrailPath
	if q != "" {
		u += "?" + q
	}
	return get(t, c, u, nil)
}

var seqRE = regexp.MustCompile(`<li class="row" data-seq="(\d+)"`)

// seqs are the rows' sequence numbers in the order the page lists them.
func seqs(body string) []int {
	var out []int
	for _, m := range seqRE.FindAllStringSubmatch(body, -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, n)
	}
	return out
}

var olderRE = regexp.MustCompile(`<input type="hidden" name="page" value="([A-Za-z0-9_-]+)"><button type="submit" id="older">`)

// TestTrailPageIsForAuditReadersOfTheirTenant: a holder of audit.read sees
// the rows of their own tenant, newest first, with the chain verified and
// each row's approval and assurance; a user without audit.read is refused
// (403, visibly) and sees no row; a visitor without a session, or with an
// agent's bearer token, gets the sign-in page; the other tenant's reader
// sees only that tenant's rows; arguments never appear.
func TestTrailPageIsForAuditReadersOfTheirTenant(t *testing.T) {
	f := startTrailPage(t, trailOptions{})
	f.seed(t)

	olive := f.signIn(t, "olive", "acme")
	code, body := f.trailGet(t, olive, "")
	if code != http.StatusOK {
		t.Fatalf("olive: %d %s", code, body)
	}
	got := seqs(body)
	if len(got) != page.TrailPageSize || got[0] != 34 || !slices.IsSortedFunc(got, func(a, b int) int { return b - a }) {
		t.Fatalf("olive's rows: %v, want the %d newest of 34, newest first", got, page.TrailPageSize)
	}
	for _, want := range []string{
		`id="chain">Chain verified: all 34 rows are intact.`,
		`tenant <strong>acme</strong>`,
		// The client-attested approval, with the tenant's ceiling.
		`approved by <bdi class="r-approver">alice</bdi> · assurance <code class="r-assurance">client_attested</code>`,
		`trust ceiling <span class="r-ceiling">L3</span>`,
		// The approval on the page, signed in.
		`approved by <bdi class="r-approver">olive</bdi> · assurance <code class="r-assurance">signed_in</code> <span class="note">(the approver signed in on the approval page)</span> · channel approval_page`,
		// Who, agent, model, the refusal's stage and code.
		`for <bdi class="r-user">alice</bdi> · agent <bdi class="r-agent">support-bot</bdi> · model <bdi class="r-model">dev-model 2026-01</bdi>`,
		`stage <code>permission_check</code> · code <code>authorization.permission_denied</code>`,
		`id="trail-link">Audit trail</a>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("olive's page lacks %s", want)
		}
	}
	for _, never := range []string{"globex", "CARD-SECRET-4242", "cardholder_reference"} {
		if strings.Contains(body, never) {
			t.Errorf("olive's page shows %q", never)
		}
	}
	if _, index := get(t, olive, f.base+page.Pattern, nil); !strings.Contains(index, `href="/approve/audit" id="trail-link"`) {
		t.Error("the inbox does not link the trail page for olive")
	}

	// The other tenant's reader: globex's row only.
	gail := f.signIn(t, "gail", "globex")
	code, body = f.trailGet(t, gail, "")
	if code != http.StatusOK || !slices.Equal(seqs(body), []int{1}) || !strings.Contains(body, "globex.secret") ||
		strings.Contains(body, "ticket.") || !strings.Contains(body, "all 1 rows are intact") {
		t.Fatalf("gail: %d %v\n%s", code, seqs(body), body)
	}

	// A user without audit.read: refused, visibly, and no link to it.
	alice := f.signIn(t, "alice", "acme")
	code, body = f.trailGet(t, alice, "")
	if code != http.StatusForbidden || !strings.Contains(body, "You cannot read the audit trail") ||
		!strings.Contains(body, "audit.read") || len(seqs(body)) != 0 || strings.Contains(body, "ticket.search") {
		t.Fatalf("alice: %d %s", code, body)
	}
	if _, index := get(t, alice, f.base+page.Pattern, nil); strings.Contains(index, "trail-link") {
		t.Error("the inbox links the trail page for alice")
	}

	// No session: the sign-in page, whatever bearer token comes along (an
	// agent's, or olive's own: the page takes no bearer tokens).
	botToken, err := identity.MintDev(f.devSecret, identity.MintRequest{Issuer: DefaultIssuer, Audience: DefaultAudience,
		User: "alice", Tenant: "acme", Agent: "support-bot"})
	if err != nil {
		t.Fatal(err)
	}
	oliveToken, err := identity.MintDev(f.devSecret, identity.MintRequest{Issuer: DefaultIssuer, Audience: DefaultAudience, User: "olive", Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]map[string]string{
		"nothing":            nil,
		"an agent's token":   {"Authorization": "Bearer " + botToken},
		"a reader's token":   {"Authorization": "Bearer " + oliveToken},
		"a forged cookie":    {"Cookie": page.CookieName + "=forged"},
		"on behalf of olive": {"Authorization": "Bearer " + botToken, identity.OnBehalfOfHeader: "Bearer " + oliveToken},
	} {
		code, body := get(t, newBrowserClient(t), f.base+page.TrailPath, h)
		if code != http.StatusUnauthorized || !strings.Contains(body, "Sign in with your link") || len(seqs(body)) != 0 {
			t.Errorf("with %s: %d %s", name, code, body)
		}
	}

	// The confirm service's own identity reads nothing: only the user it
	// relays can.
	if _, err := f.confirm.Query(context.Background(), &mandatev1.QueryRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Query as the confirm service alone: %v", err)
	}
	if _, err := f.confirm.Verify(context.Background(), &mandatev1.VerifyRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Verify as the confirm service alone: %v", err)
	}

	// The sign-in link may lead to the trail page.
	link, err := page.LoginURL(f.base, f.devSecret, DefaultIssuer, "olive", "acme", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, body := get(t, newBrowserClient(t), link+"&next="+url.QueryEscape(page.TrailPath), nil); !strings.Contains(body, `url=/approve/audit"`) {
		t.Errorf("the sign-in does not move on to the trail page:\n%s", body)
	}
}

// TestTrailPageRefusedAfterTheUserLosesAuditRead: the page asks the
// directory on every request; the audit service decides again.
func TestTrailPageRefusedAfterTheUserLosesAuditRead(t *testing.T) {
	f := startTrailPage(t, trailOptions{})
	f.seed(t)
	olive := f.signIn(t, "olive", "acme")
	if code, _ := f.trailGet(t, olive, ""); code != http.StatusOK {
		t.Fatalf("before: %d", code)
	}
	demoted := strings.Replace(trailPolicy, "{id: olive, org: ops, roles: [ops]}", "{id: olive, org: ops, roles: [support]}", 1)
	if _, err := directory.Apply(context.Background(), f.dir, []byte(demoted)); err != nil {
		t.Fatal(err)
	}
	if code, body := f.trailGet(t, olive, ""); code != http.StatusForbidden || len(seqs(body)) != 0 {
		t.Fatalf("after losing audit.read: %d %s", code, body)
	}
}

// TestTrailPageFiltersAndPages: each filter narrows the rows as the audit
// API does; pages are bounded, follow one another without overlap, and
// keep their filters.
func TestTrailPageFiltersAndPages(t *testing.T) {
	f := startTrailPage(t, trailOptions{})
	f.seed(t)
	olive := f.signIn(t, "olive", "acme")
	for _, tc := range []struct {
		query string
		want  []int
	}{
		{"outcome=refused", []int{31}},
		{"outcome=failed", []int{34}},
		{"approver=olive", []int{33}},
		{"approver=alice&command=ticket.refund", []int{32}},
		{"command=ticket.refund", []int{34, 33, 32, 31}},
		{"command=ticket.refund&agent=support-bot", []int{34, 32, 31}},
		{"agent=nobody", nil},
		{"agent=+support-bot+&outcome=refused", []int{31}}, // spaces around a value are trimmed
		{"agent=&command=&outcome=&approver=&size=", nil},  // empty filters filter nothing: checked below
	} {
		code, body := f.trailGet(t, olive, tc.query)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.query, code, body)
		}
		if tc.want == nil && strings.HasPrefix(tc.query, "agent=&") {
			if len(seqs(body)) != page.TrailPageSize {
				t.Errorf("%s: %d rows", tc.query, len(seqs(body)))
			}
			continue
		}
		if got := seqs(body); !slices.Equal(got, tc.want) {
			t.Errorf("%s: rows %v, want %v", tc.query, got, tc.want)
		}
		if tc.want == nil && !strings.Contains(body, `id="no-rows"`) {
			t.Errorf("%s: no 'no rows' note", tc.query)
		}
	}
	// The outcome chosen stays chosen.
	if _, body := f.trailGet(t, olive, "outcome=refused"); !strings.Contains(body, `<option value="refused" selected>`) {
		t.Error("the outcome filter does not show its choice")
	}

	// Pages of 10 of the searches: 30 rows in three pages, no overlap, the
	// filter kept in the form that leads on.
	var all []int
	q := "command=ticket.search&size=10"
	for i := 0; ; i++ {
		code, body := f.trailGet(t, olive, q)
		if code != http.StatusOK {
			t.Fatalf("page %d: %d %s", i, code, body)
		}
		got := seqs(body)
		if len(got) > 10 {
			t.Fatalf("page %d holds %d rows", i, len(got))
		}
		all = append(all, got...)
		if i > 0 && !strings.Contains(body, `id="newest"`) {
			t.Errorf("page %d has no way back to the newest rows", i)
		}
		m := olderRE.FindStringSubmatch(body)
		if m == nil {
			break
		}
		if !strings.Contains(body, `<input type="hidden" name="command" value="ticket.search"><input type="hidden" name="size" value="10"><input type="hidden" name="page"`) {
			t.Fatalf("page %d: the way on drops the filters", i)
		}
		q = "command=ticket.search&size=10&page=" + m[1]
		if i > 5 {
			t.Fatal("paging does not end")
		}
	}
	want := make([]int, 0, 30)
	for s := 30; s >= 1; s-- {
		want = append(want, s)
	}
	if !slices.Equal(all, want) {
		t.Fatalf("the pages hold %v, want 30..1", all)
	}
	// The largest page is bounded.
	if code, body := f.trailGet(t, olive, "size="+strconv.Itoa(page.MaxTrailPageSize)); code != http.StatusOK || len(seqs(body)) != 34 {
		t.Fatalf("size %d: %d, %d rows", page.MaxTrailPageSize, code, len(seqs(body)))
	}
}

// TestTrailPageRefusesBadQueries: every malformed query gets a 400 that
// says what is wrong, never a 500 and never rows.
func TestTrailPageRefusesBadQueries(t *testing.T) {
	f := startTrailPage(t, trailOptions{})
	f.seed(t)
	olive := f.signIn(t, "olive", "acme")
	_, first := f.trailGet(t, olive, "command=ticket.search&size=5")
	m := olderRE.FindStringSubmatch(first)
	if m == nil {
		t.Fatal("no page token")
	}
	for _, tc := range []struct{ query, says string }{
		{"size=" + strconv.Itoa(page.MaxTrailPageSize+1), "size must be a whole number from 1 to 100"},
		{"size=0", "size must be"},
		{"size=-3", "size must be"},
		{"size=ten", "size must be"},
		{"size=99999999999999999999999", "size must be"},
		{"outcome=bogus", "Unknown outcome &#34;bogus&#34;"},
		{"outcome=" + url.QueryEscape("<script>"), "Unknown outcome &#34;&lt;script&gt;&#34;"},
		{"colour=red", "Unknown parameter &#34;colour&#34;"},
		{"agent=a&agent=b", "agent is given more than once"},
		{"agent=" + strings.Repeat("x", 257), "agent is longer than 256 bytes"},
		{"command=" + url.QueryEscape("ticket\x01search"), "command holds invalid UTF-8 or control characters"},
		{"approver=%ff%fe", "approver holds invalid UTF-8"},
		{"agent=%zz", "query is malformed"},
		{"page=" + url.QueryEscape("not a token!"), "page token is malformed"},
		{"page=" + strings.Repeat("A", 200), "page token is malformed"},
		// A token of other filters, or a well-formed one the audit service
		// never issued: the audit service says so.
		{"page=" + m[1], "request.invalid_page_token"},
		{"command=ticket.search&size=5&page=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "request.invalid_page_token"},
		{"q=" + strings.Repeat("x", 5000), "too long"},
	} {
		code, body := f.trailGet(t, olive, tc.query)
		if code != http.StatusBadRequest || !strings.Contains(body, tc.says) || len(seqs(body)) != 0 {
			t.Errorf("%.60s: %d, want 400 saying %q:\n%.2000s", tc.query, code, tc.says, body)
		}
	}
}

// TestTrailPageShowsHostileValuesAsText: a row whose message, subject and
// arguments carry markup and bidi overrides is shown as inert text, the
// overrides as markers, the long message cut; its arguments not at all.
func TestTrailPageShowsHostileValuesAsText(t *testing.T) {
	f := startTrailPage(t, trailOptions{})
	f.seed(t)
	olive := f.signIn(t, "olive", "acme")
	code, body := f.trailGet(t, olive, "outcome=failed")
	if code != http.StatusOK || !slices.Equal(seqs(body), []int{34}) {
		t.Fatalf("%d %v", code, seqs(body))
	}
	doc, err := html.Parse(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for n := range doc.Descendants() {
		if n.Type == html.ElementNode {
			if slices.Contains([]string{"script", "img", "iframe", "object", "embed", "svg"}, n.Data) {
				t.Errorf("the page holds a <%s>", n.Data)
			}
			for _, a := range n.Attr {
				if strings.HasPrefix(a.Key, "on") || a.Key == "src" || a.Key == "style" {
					t.Errorf("<%s %s=%q>", n.Data, a.Key, a.Val)
				}
				if (a.Key == "href" || a.Key == "action") && !strings.HasPrefix(a.Val, "/approve/") {
					t.Errorf("a link leaves the page: %q", a.Val)
				}
			}
		}
		if n.Type == html.TextNode {
			texts = append(texts, n.Data)
		}
	}
	text := strings.Join(texts, "")
	shown := `"><script>alert(1)</script><img src=x onerror=alert(1)> ⟦U+202E⟧RUE 00.52⟦U+202C⟧ ⟦U+2066⟧⟦U+200F⟧⟦U+2069⟧ javascript:alert(1) </bdi></code>+`
	if strings.Count(text, shown) != 2 { // the message and the subject
		t.Errorf("the hostile text is not shown, as text, twice:\n%s", text)
	}
	if !regexp.MustCompile(`(withoutanyspaces)+[a-z]*…`).MatchString(text) || strings.Count(text, "withoutanyspaces") >= 40 {
		t.Error("the long message is not cut")
	}
	for _, c := range []string{"\u202e", "\u202c", "\u2066", "\u2069", "\u200f"} {
		if strings.Contains(body, c) {
			t.Errorf("%q is on the page raw", c)
		}
	}
	if strings.Contains(body, "CARD-SECRET-4242") || strings.Contains(body, "cardholder") {
		t.Error("the row's arguments are on the page")
	}
}

// TestTrailPageShowsABrokenChain: on Postgres, a row edited behind the
// store's back breaks the chain, and the page says where.
func TestTrailPageShowsABrokenChain(t *testing.T) {
	if !pgtest.Available() {
		t.Skip("no Postgres (" + pgtest.URL() + ")")
	}
	pool := pgtest.New(t, auditpg.Migrations)
	st := auditpg.New(pool, auditpg.Options{Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(st.Close)
	f := startTrailPage(t, trailOptions{store: st})
	f.seed(t)
	olive := f.signIn(t, "olive", "acme")
	if _, body := f.trailGet(t, olive, ""); !strings.Contains(body, "Chain verified: all 34 rows are intact.") {
		t.Fatalf("before tampering:\n%s", body)
	}
	// Edit row 31's message as the database's owner could, around the
	// append-only trigger.
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	for _, q := range []string{
		"ALTER TABLE audit.records DISABLE TRIGGER records_append_only",
		"UPDATE audit.records SET message = 'nothing to see' WHERE tenant = 'acme' AND seq = 31",
		"ALTER TABLE audit.records ENABLE TRIGGER records_append_only",
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	code, body := f.trailGet(t, olive, "")
	if code != http.StatusOK || !strings.Contains(body, `<p class="chain chain-broken" id="chain">Chain broken at row 31: hash_mismatch (invocation <code>refund-refused</code>, outcome). The 30 rows before it are intact`) {
		t.Fatalf("after tampering: %d\n%s", code, body)
	}
	// globex's chain is untouched.
	if _, body := f.trailGet(t, f.signIn(t, "gail", "globex"), ""); !strings.Contains(body, "Chain verified: all 1 rows are intact.") {
		t.Fatalf("globex:\n%s", body)
	}
}

// TestTrailPageWhenTheAuditServiceDistrustsTheSignIn: an audit service
// that does not trust the secret signing the sign-in links refuses the
// page's user token; the page says so (502), shows no rows, and the
// trust rules are not bent.
func TestTrailPageWhenTheAuditServiceDistrustsTheSignIn(t *testing.T) {
	f := startTrailPage(t, trailOptions{auditDevSecret: []byte("another-dev-secret-0123456789abcdef012345")})
	code, body := f.trailGet(t, f.signIn(t, "olive", "acme"), "")
	if code != http.StatusBadGateway || !strings.Contains(body, "The audit service did not accept your sign-in") ||
		!strings.Contains(body, "authentication.") || len(seqs(body)) != 0 {
		t.Fatalf("%d %s", code, body)
	}
}

// TestDevServesTheTrailPage: `mandate dev` prints the trail page's URL,
// and olive, signed in with the link it prints, reads acme's trail there
// (through the dev wiring: the internal server's audit API, the dev
// secret, the default audience); alice is refused.
func TestDevServesTheTrailPage(t *testing.T) {
	var out strings.Builder
	d := devSettings{httpAddr: "127.0.0.1:0", grpcAddr: "127.0.0.1:0"}
	d.events.Keep, d.events.PurgeInterval = time.Hour, time.Hour
	var cl clicore.Closers
	defer cl.Close()
	env := func(string) (string, bool) { return "", false }
	ctx, cancel := context.WithCancel(t.Context())
	p, err := startDev(ctx, d, slog.New(slog.DiscardHandler), IO{Stdout: &out, Stderr: io.Discard, Env: env}, &cl)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("mandate dev: %v", err)
		}
	}()
	banner := out.String()
	m := regexp.MustCompile(`audit +(http://\S+/approve/audit) +\(the trail, for users holding audit\.read`).FindStringSubmatch(banner)
	if m == nil {
		t.Fatalf("no trail page URL in the banner:\n%s", banner)
	}
	trailURL := m[1]
	links := map[string]string{}
	origin := strings.TrimSuffix(trailURL, "/approve/audit")
	for _, l := range regexp.MustCompile(`(?m)^  (\w+) +http://\S+?(/approve/login\?t=\S+)$`).FindAllStringSubmatch(banner, -1) {
		// The links name --http-addr, here port 0; the server listens on
		// the port it was given.
		links[l[1]] = origin + l[2]
	}
	for range 200 {
		if healthy(ctx, strings.Replace(trailURL, "/approve/audit", "/healthz", 1)) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for user, want := range map[string]int{"olive": http.StatusOK, "alice": http.StatusForbidden} {
		c := newBrowserClient(t)
		if code, body := get(t, c, links[user], nil); code != http.StatusOK {
			t.Fatalf("signing in %s: %d %s", user, code, body)
		}
		code, body := get(t, c, trailURL, nil)
		if code != want {
			t.Fatalf("%s: %d, want %d:\n%s", user, code, want, body)
		}
		if want == http.StatusOK && !strings.Contains(body, `id="chain">Chain verified`) {
			t.Fatalf("olive's page has no chain status:\n%s", body)
		}
	}
}

// TestTrailPageRefusesASessionOlderThanARevocation: olive is disabled and
// enabled again after she signed in; her session, older than the
// revocation, no longer reads the trail (the page applies the directory's
// revocation to the session's sign-in time, as the audit service does to
// a token's), and a new sign-in does.
func TestTrailPageRefusesASessionOlderThanARevocation(t *testing.T) {
	f := startTrailPage(t, trailOptions{})
	f.seed(t)
	olive := f.signIn(t, "olive", "acme")
	line := "{id: olive, org: ops, roles: [ops]}"
	for _, pol := range []string{
		strings.Replace(trailPolicy, line, "{id: olive, org: ops, roles: [ops], disabled: true}", 1),
		trailPolicy,
	} {
		if _, err := directory.Apply(context.Background(), f.dir, []byte(pol)); err != nil {
			t.Fatal(err)
		}
	}
	code, body := f.trailGet(t, olive, "")
	if code != http.StatusForbidden || !strings.Contains(body, "Your account is not active") || len(seqs(body)) != 0 {
		t.Fatalf("the session from before the revocation: %d %s", code, body)
	}
	time.Sleep(1100 * time.Millisecond) // revocations count in whole seconds
	if code, _ := f.trailGet(t, f.signIn(t, "olive", "acme"), ""); code != http.StatusOK {
		t.Fatalf("a new sign-in: %d", code)
	}
}

// TestTrailPageShowsDecisionRows: an attempt to decide a challenge, as
// the confirm service records it, shows the verdict asked, the decision
// channel and its assurance, and the invocation the challenge belongs to.
func TestTrailPageShowsDecisionRows(t *testing.T) {
	f := startTrailPage(t, trailOptions{})
	decision := &mandatev1.AuditRecord{
		Tenant: "acme", InvocationId: "attempt-1", Phase: "decision", Time: timestamppb.Now(), Channel: "rest",
		Command: "ticket.refund", Risk: "L3", Subject: "chal-1", UserId: "olive", ActorKind: "user", Outcome: "approved",
		ArgumentsJson: `{"challenge_id":"chal-1","invocation_id":"inv-refund","verdict":"approve","decision_channel":"approval_page","assurance":"signed_in"}`,
	}
	if _, err := f.confirm.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{decision}}); err != nil {
		t.Fatal(err)
	}
	code, body := f.trailGet(t, f.signIn(t, "olive", "acme"), "outcome=approved")
	want := `<div class="r-decision">decision asked: <strong>approve</strong> · channel approval_page · assurance <code class="r-d-assurance">signed_in</code> · for invocation <code>inv-refund</code></div>`
	if code != http.StatusOK || !slices.Equal(seqs(body), []int{1}) || !strings.Contains(body, want) {
		t.Fatalf("%d %v, want %s:\n%s", code, seqs(body), want, body)
	}
}
