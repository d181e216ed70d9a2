package oauth_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/oauth"
)

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// docServer serves client ID metadata documents on 127.0.0.1, counting the
// connections it accepts and the requests of each path.
type docServer struct {
	*httptest.Server
	ln   *countingListener
	mu   sync.Mutex
	hits map[string]int
}

func newDocServer(t *testing.T) *docServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &docServer{ln: &countingListener{Listener: ln}, hits: map[string]int{}}
	d.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.hits[r.URL.Path]++
		d.mu.Unlock()
		switch {
		case r.URL.Path == "/moved.json":
			http.Redirect(w, r, "/target.json", http.StatusFound)
		case strings.HasPrefix(r.URL.Path, "/good"):
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, `{"client_id":%q,"client_name":"Doc","redirect_uris":[%q]}`, d.URL+r.URL.Path, cb)
		default:
			http.NotFound(w, r)
		}
	}))
	d.Listener = d.ln
	d.Start()
	t.Cleanup(d.Close)
	return d
}

func (d *docServer) hitsOf(path string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hits[path]
}

func (d *docServer) totalHits() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, v := range d.hits {
		n += v
	}
	return n
}

// logBuffer collects a server's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// refusedPage is the error page of an authorization request whose
// client_id is id, asked from the address addr; it fails the test unless
// the request was refused with a page rather than sent on.
func refusedPage(t *testing.T, h *harness, id, addr string) string {
	t.Helper()
	rec := authorizeFrom(h, id, addr)
	if rec.Code != http.StatusBadRequest || rec.Header().Get("Location") != "" {
		t.Fatalf("%s: %d %q, want the error page", id, rec.Code, rec.Header().Get("Location"))
	}
	return rec.Body.String()
}

// authorizeFrom asks h's authorization endpoint, from addr, to authorize
// the client id.
func authorizeFrom(h *harness, id, addr string) *httptest.ResponseRecorder {
	_, challenge := pkce("fetch")
	req := httptest.NewRequest(http.MethodGet, h.srv.URL+"/authorize?"+authParams(id, cb, challenge, "").Encode(), nil)
	req.RemoteAddr = addr
	rec := httptest.NewRecorder()
	h.as.Handler().ServeHTTP(rec, req)
	return rec
}

// uniformPages checks that every page is the same page.
func uniformPages(t *testing.T, pages map[string]string) {
	t.Helper()
	var first, firstName string
	for name, p := range pages {
		if first == "" {
			first, firstName = p, name
			continue
		}
		if p != first {
			t.Errorf("the error page of %q differs from that of %q: it tells what the URL answered", name, firstName)
		}
	}
}

// TestFetchRefusesNonPublicTargets: outside loopback-dev a client_id whose
// host is, or resolves to, a loopback address gets no connection; in
// loopback-dev the same listener does (the control), and unspecified,
// private, link-local (cloud metadata) and carrier-grade NAT addresses are
// still refused by the dialer. Every refusal has the page of a document
// that is not found.
func TestFetchRefusesNonPublicTargets(t *testing.T) {
	docs := newDocServer(t)
	port := docs.ln.Addr().(*net.TCPAddr).Port
	pages := map[string]string{}

	var strictLog logBuffer
	strict := newHarness(t, func(c *oauth.Config) { c.Logger = slog.New(slog.NewTextHandler(&strictLog, nil)) })
	for _, host := range []string{"127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "0.0.0.0"} {
		id := fmt.Sprintf("https://%s:%d/good.json", host, port)
		pages["strict "+host] = refusedPage(t, strict, id, "192.0.2.1:5000")
	}
	if n := docs.ln.accepted.Load(); n != 0 {
		t.Fatalf("outside loopback-dev the loopback listener accepted %d connections", n)
	}
	if got := strings.Count(strictLog.String(), "is not a public unicast address"); got != 4 {
		t.Errorf("%d refusals by the dialer logged, want 4:\n%s", got, strictLog.String())
	}

	var devLog logBuffer
	dev := newHarness(t, func(c *oauth.Config) {
		c.LoopbackDev = true
		c.Logger = slog.New(slog.NewTextHandler(&devLog, nil))
	})
	pages["dev 0.0.0.0"] = refusedPage(t, dev, fmt.Sprintf("https://0.0.0.0:%d/good.json", port), "127.0.0.1:5000")
	if n := docs.ln.accepted.Load(); n != 0 {
		t.Fatalf("the unspecified address reached the loopback listener in loopback-dev (%d connections)", n)
	}
	for _, host := range []string{"169.254.169.254", "10.0.0.1", "192.168.1.1", "172.16.0.1", "100.64.0.1"} {
		pages["dev "+host] = refusedPage(t, dev, "https://"+host+"/client.json", "127.0.0.1:5000")
	}
	if got := strings.Count(devLog.String(), "is not a public unicast address"); got != 6 {
		t.Errorf("%d refusals by the dialer logged, want 6:\n%s", got, devLog.String())
	}
	pages["dev redirect"] = refusedPage(t, dev, docs.URL+"/moved.json", "127.0.0.1:5000")
	if n := docs.hitsOf("/target.json"); n != 0 {
		t.Errorf("a redirect was followed (%d requests to its target)", n)
	}
	pages["dev not found"] = refusedPage(t, dev, docs.URL+"/none.json", "127.0.0.1:5000")
	// The control: loopback-dev reaches the listener, and its document works.
	before := docs.ln.accepted.Load()
	_, challenge := pkce("fetch")
	if p := dev.browser().get("/authorize?" + authParams(docs.URL+"/good.json", cb, challenge, "").Encode()); p.status != http.StatusSeeOther {
		t.Fatalf("the loopback document in loopback-dev: %d %q", p.status, p.body)
	}
	if docs.ln.accepted.Load() == before {
		t.Fatal("the control fetch made no connection: the listener does not count")
	}
	uniformPages(t, pages)
}

// TestIsPublic: the address classes the dialer refuses.
func TestIsPublic(t *testing.T) {
	for addr, public := range map[string]bool{
		"8.8.8.8": true, "1.1.1.1": true, "2606:4700:4700::1111": true, "2a00:1450:4001:82b::200e": true,
		"127.0.0.1": false, "127.8.9.10": false, "::1": false, "0.0.0.0": false, "0.1.2.3": false, "::": false,
		"10.1.2.3": false, "172.16.0.1": false, "172.31.255.255": false, "192.168.0.1": false, "fc00::1": false, "fd12:3456::1": false,
		"169.254.169.254": false, "169.254.0.1": false, "fe80::1": false,
		"100.64.0.1": false, "100.127.255.254": false, "224.0.0.1": false, "239.255.255.250": false, "ff02::1": false, "ff0e::1": false,
		"255.255.255.255": false, "240.0.0.1": false, "192.0.2.1": false, "198.51.100.1": false, "203.0.113.1": false, "198.18.0.1": false,
		"192.0.0.8": false, "2001:db8::1": false, "3fff::1": false, "2002:a00:1::1": false, "2001::1": false,
		"64:ff9b::a00:1": false, "64:ff9b:1::1": false, "::ffff:10.0.0.1": false, "::ffff:8.8.8.8": true, "::10.0.0.1": false,
		"fec0::1": false, "100::1": false,
	} {
		if got := oauth.IsPublic(netip.MustParseAddr(addr)); got != public {
			t.Errorf("IsPublic(%s) = %v, want %v", addr, got, public)
		}
	}
	for _, c := range []struct {
		network, addr string
		loopback, ok  bool
	}{
		{"tcp4", "127.0.0.1:443", true, true},
		{"tcp6", "[::1]:443", true, true},
		{"tcp4", "127.0.0.1:443", false, false},
		{"tcp6", "[::ffff:127.0.0.1]:443", false, false},
		{"tcp4", "10.0.0.1:443", true, false},
		{"tcp4", "169.254.169.254:80", true, false},
		{"tcp4", "0.0.0.0:443", true, false},
		{"tcp4", "8.8.8.8:443", false, true},
		{"udp4", "8.8.8.8:53", false, false},
	} {
		err := oauth.CheckDialAddress(c.network, c.addr, c.loopback)
		if (err == nil) != c.ok {
			t.Errorf("CheckDialAddress(%s, %s, loopback %v) = %v, want ok %v", c.network, c.addr, c.loopback, err, c.ok)
		}
	}
}

// TestFetchFailureCached: a client_id whose document fails is fetched once
// however often it is asked for within FailureTTL, also by requests at the
// same time, and answered with the same page; after FailureTTL it is
// fetched again. The memory of failures is bounded.
func TestFetchFailureCached(t *testing.T) {
	docs := newDocServer(t)
	h := newHarness(t, func(c *oauth.Config) { c.LoopbackDev = true })
	missing := docs.URL + "/missing.json"
	first := refusedPage(t, h, missing, "127.0.0.1:5000")
	second := refusedPage(t, h, missing, "127.0.0.1:5000")
	if n := docs.hitsOf("/missing.json"); n != 1 {
		t.Fatalf("a failing URL asked for twice was fetched %d times, want 1", n)
	}
	if first != second {
		t.Error("the page of a remembered failure differs from the first one's")
	}
	h.advance(oauth.FailureTTL + 1)
	refusedPage(t, h, missing, "127.0.0.1:5000")
	if n := docs.hitsOf("/missing.json"); n != 2 {
		t.Fatalf("after FailureTTL: %d fetches, want 2", n)
	}

	// At the same time: one fetch, whoever asks first; the others wait for
	// it or find its failure remembered.
	var wg sync.WaitGroup
	pages := make([]string, 8)
	for i := range pages {
		wg.Go(func() {
			pages[i] = authorizeFrom(h, docs.URL+"/together.json", fmt.Sprintf("198.51.100.%d:5000", i+1)).Body.String()
		})
	}
	wg.Wait()
	for i, p := range pages {
		if p != first {
			t.Errorf("request %d at the same time got another page: %q", i, p)
		}
	}
	if n := docs.hitsOf("/together.json"); n != 1 {
		t.Fatalf("8 requests at once for a failing URL made %d fetches, want 1", n)
	}

	for i := range oauth.MaxFailures + 100 {
		oauth.RememberFailure(h.as, fmt.Sprintf("https://example.com/%d.json", i))
	}
	if failures, _ := oauth.FetchMemory(h.as); failures != oauth.MaxFailures {
		t.Fatalf("%d failures remembered, want the cap %d", failures, oauth.MaxFailures)
	}
}

// TestFetchRateLimited: a flood of distinct client_ids makes at most
// FetchBurstPerAddr fetches from one address and FetchBurst from all,
// then one per FetchEveryPerAddr (resp. per 1/FetchRate s) as time passes;
// a refused request has the page of any failed fetch, and the per-address
// memory is bounded.
func TestFetchRateLimited(t *testing.T) {
	docs := newDocServer(t)
	h := newHarness(t, func(c *oauth.Config) { c.LoopbackDev = true })
	pages := map[string]string{}
	for i := range 3 * oauth.FetchBurstPerAddr {
		pages[fmt.Sprint("one address ", i)] = refusedPage(t, h, fmt.Sprintf("%s/flood/%d.json", docs.URL, i), "192.0.2.1:5000")
	}
	if n := docs.totalHits(); n != oauth.FetchBurstPerAddr {
		t.Fatalf("%d requests from one address made %d fetches, want %d", 3*oauth.FetchBurstPerAddr, n, oauth.FetchBurstPerAddr)
	}
	h.advance(oauth.FetchEveryPerAddr)
	for i := range 3 {
		refusedPage(t, h, fmt.Sprintf("%s/later/%d.json", docs.URL, i), "192.0.2.1:5000")
	}
	if n := docs.totalHits(); n != oauth.FetchBurstPerAddr+1 {
		t.Fatalf("after %v: %d fetches, want %d", oauth.FetchEveryPerAddr, n, oauth.FetchBurstPerAddr+1)
	}
	// The addresses of one IPv6 /64 share an allowance.
	for i := range 2 * oauth.FetchBurstPerAddr {
		refusedPage(t, h, fmt.Sprintf("%s/v6/%d.json", docs.URL, i), fmt.Sprintf("[2001:db8:1:2::%x]:5000", i+1))
	}
	if n := docs.hitsOfPrefix("/v6/"); n != oauth.FetchBurstPerAddr {
		t.Fatalf("one /64 made %d fetches, want %d", n, oauth.FetchBurstPerAddr)
	}
	uniformPages(t, pages)

	// Many addresses: the global allowance bounds them together.
	all := newHarness(t, func(c *oauth.Config) { c.LoopbackDev = true })
	start := docs.totalHits()
	flood := oauth.MaxAddrs + 500
	for i := range flood {
		refusedPage(t, all, fmt.Sprintf("%s/many/%d.json", docs.URL, i), fmt.Sprintf("10.%d.%d.%d:5000", i>>16&255, i>>8&255, i&255))
	}
	if n := docs.totalHits() - start; n != oauth.FetchBurst {
		t.Fatalf("%d requests from as many addresses made %d fetches, want %d", flood, n, oauth.FetchBurst)
	}
	if _, addrs := oauth.FetchMemory(all.as); addrs > oauth.MaxAddrs {
		t.Fatalf("%d per-address limiters kept, want at most %d", addrs, oauth.MaxAddrs)
	}
	all.advance(time.Second / oauth.FetchRate)
	refusedPage(t, all, docs.URL+"/many/after.json", "203.0.113.9:5000")
	if n := docs.totalHits() - start; n != oauth.FetchBurst+1 {
		t.Fatalf("a second later: %d fetches, want %d", n, oauth.FetchBurst+1)
	}
}

func (d *docServer) hitsOfPrefix(prefix string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for p, v := range d.hits {
		if strings.HasPrefix(p, prefix) {
			n += v
		}
	}
	return n
}
