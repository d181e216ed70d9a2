package mcpbridge_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// replica is one bridge of a replicated deployment on a listener of its
// own; it counts what reaches it from the balancer and from its peer.
type replica struct {
	url    string // advertised
	bridge *mcpbridge.Bridge
	srv    *httptest.Server
	// fromBalancer counts requests from the balancer; answers the JSON-RPC
	// responses (elicitation answers) among them; fromPeer the requests
	// another replica forwarded.
	fromBalancer, answers, fromPeer atomic.Int64
	stopOnce                        sync.Once
}

// startReplica starts a bridge with cfg's dependencies and state key,
// advertising its own listener, behind the public resource URL.
func startReplica(t *testing.T, cfg mcpbridge.Config, resource string) *replica {
	t.Helper()
	r := &replica{}
	mux := http.NewServeMux()
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get(mcpbridge.ForwardedHeader) != "" {
			r.fromPeer.Add(1)
		} else {
			r.fromBalancer.Add(1)
			body, _ := io.ReadAll(req.Body)
			req.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body, []byte(`"result"`)) && !bytes.Contains(body, []byte(`"method"`)) {
				r.answers.Add(1)
			}
		}
		mux.ServeHTTP(w, req)
	}))
	r.url = r.srv.URL
	cfg.ResourceURL, cfg.AdvertiseURL = resource, r.srv.URL
	b, err := mcpbridge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.bridge = b
	mux.Handle("/mcp", b.Handler())
	t.Cleanup(r.stop)
	return r
}

// stop loses the replica: its sessions end and its port closes.
func (r *replica) stop() {
	r.stopOnce.Do(func() {
		r.bridge.Close()
		r.srv.Close()
	})
}

// balancer is a plain round-robin reverse proxy, no sticky sessions; a
// replica marked down (as a health check would) gets no requests.
type balancer struct {
	url     string
	next    atomic.Uint64
	down    []atomic.Bool
	proxies []*httputil.ReverseProxy
}

func newBalancer(t *testing.T, replicas ...*replica) *balancer {
	t.Helper()
	lb := &balancer{down: make([]atomic.Bool, len(replicas))}
	tr := &http.Transport{}
	for _, r := range replicas {
		u, err := url.Parse(r.url)
		if err != nil {
			t.Fatal(err)
		}
		lb.proxies = append(lb.proxies, &httputil.ReverseProxy{
			Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
			Transport:     tr,
			FlushInterval: -1,
		})
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// Buffer the request body first, as nginx does by default
		// (proxy_request_buffering): the proxy's write of it then never
		// reads the incoming body after the answer has started.
		if body, err := io.ReadAll(req.Body); err == nil {
			req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		}
		for {
			i := int((lb.next.Add(1) - 1) % uint64(len(lb.proxies)))
			if !lb.down[i].Load() {
				lb.proxies[i].ServeHTTP(w, req)
				return
			}
		}
	}))
	lb.url = srv.URL
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	return lb
}

// sendNextTo makes the balancer's next request go to replica i.
func (lb *balancer) sendNextTo(i int) { lb.next.Store(uint64(i)) }

// replicated is the helpdesk stack with two bridge replicas sharing the
// state key behind a round-robin balancer.
func replicated(t *testing.T) (*stack, *balancer, []*replica) {
	t.Helper()
	st := newHelpdeskStack(t)
	// The balancer's URL is the public resource; it is known only once the
	// balancer listens, and the replicas' URLs only once they do.
	reps := []*replica{startReplica(t, st.cfg, "http://mcp.test/mcp"), startReplica(t, st.cfg, "http://mcp.test/mcp")}
	lb := newBalancer(t, reps...)
	return st, lb, reps
}

// ownerOf is the index of the replica a session id names.
func ownerOf(t *testing.T, id string, reps []*replica) int {
	t.Helper()
	parts := strings.Split(id, ".")
	if len(parts) != 3 {
		t.Fatalf("session id %q does not name its owner", id)
	}
	owner, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range reps {
		if r.url == string(owner) {
			return i
		}
	}
	t.Fatalf("session id names %q, no replica", owner)
	return -1
}

// TestReplicasBehindRoundRobin: a go-sdk client whose requests a
// round-robin balancer spreads over two replicas initialises, lists tools
// and calls them as with one bridge; the replica that does not hold the
// session forwards its share to the one that does.
func TestReplicasBehindRoundRobin(t *testing.T) {
	st, lb, reps := replicated(t)
	st.url = lb.url
	cs, _ := st.client(t, token(t, "acme", "alice", "support-bot"), clientOptions{})
	owner := ownerOf(t, cs.ID(), reps)
	for i := range 6 {
		tools, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatalf("tools/list %d: %v", i, err)
		}
		if len(tools.Tools) == 0 {
			t.Fatalf("tools/list %d: no tools", i)
		}
		res, err := call(t, cs, "ticket.search", `{"query":"charged twice"}`, nil)
		if err != nil {
			t.Fatalf("tools/call %d: %v", i, err)
		}
		if res.IsError {
			t.Fatalf("tools/call %d refused: %+v", i, refusalOf(t, res))
		}
	}
	other := 1 - owner
	if reps[other].fromBalancer.Load() < 6 || reps[owner].fromBalancer.Load() < 6 {
		t.Fatalf("the balancer sent %d and %d requests; want both replicas to get their share",
			reps[0].fromBalancer.Load(), reps[1].fromBalancer.Load())
	}
	if got, want := reps[owner].fromPeer.Load(), reps[other].fromBalancer.Load(); got != want {
		t.Fatalf("the owner got %d forwarded requests; the other replica received %d", got, want)
	}
	if n := reps[other].fromPeer.Load(); n != 0 {
		t.Fatalf("the owner forwarded %d requests", n)
	}
}

// TestElicitationAnswerOnAnotherReplica: finance-bot's refund needs carol's
// confirmation by form. The call waits on the session's owner for the
// answer; whichever replica the call and the answer POST land on, the
// answer reaches the waiting call and the refund runs once.
func TestElicitationAnswerOnAnotherReplica(t *testing.T) {
	for _, tc := range []struct {
		name string
		// callOnOwner: the call lands on the owner and the answer on the
		// other replica; else the other way round.
		callOnOwner bool
	}{{"answer on the other replica", true}, {"call on the other replica", false}} {
		t.Run(tc.name, func(t *testing.T) {
			st, lb, reps := replicated(t)
			st.url = lb.url
			cs, rec := st.client(t, token(t, "acme", "carol", "finance-bot"),
				clientOptions{form: true, answer: &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}})
			owner := ownerOf(t, cs.ID(), reps)
			other := 1 - owner
			if tc.callOnOwner {
				lb.sendNextTo(owner)
			} else {
				lb.sendNextTo(other)
			}
			res, err := call(t, cs, "ticket.refund", refundInput, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.IsError {
				t.Fatalf("confirmed refund refused: %+v", refusalOf(t, res))
			}
			if forms, _, _ := rec.counts(); forms != 1 {
				t.Fatalf("%d forms, want 1", forms)
			}
			answeredAt := other
			if !tc.callOnOwner {
				answeredAt = owner
			}
			if reps[answeredAt].answers.Load() != 1 || reps[1-answeredAt].answers.Load() != 0 {
				t.Fatalf("answers reached replicas %d and %d from the balancer", reps[0].answers.Load(), reps[1].answers.Load())
			}
			if reps[owner].fromPeer.Load() == 0 {
				t.Fatal("nothing was forwarded to the owner")
			}
			if n := st.gateway.Refunds(); n != 1 {
				t.Fatalf("gateway counted %d refunds, want 1", n)
			}
		})
	}
}

// rawPost sends one tools/list for session id to a replica directly and
// returns the status and how long the answer took.
func rawPost(t *testing.T, to, tok, id string, header ...string) (int, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, to+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Mcp-Protocol-Version", legacyProtocol)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, time.Since(start)
}

// TestForgedSessionIDs: a session id the replicas did not seal is
// answered 404 by the replica that got it and is never forwarded, whatever
// address it names; a ForwardedHeader a client sets is ignored.
func TestForgedSessionIDs(t *testing.T) {
	st, lb, reps := replicated(t)
	var trapped atomic.Int64
	trap := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { trapped.Add(1) }))
	t.Cleanup(trap.Close)
	tok := token(t, "acme", "alice", "support-bot")
	st.url = lb.url
	lb.sendNextTo(1)
	cs, _ := st.client(t, tok, clientOptions{})
	if owner := ownerOf(t, cs.ID(), reps); owner != 1 {
		t.Fatalf("session on replica %d, want 1", owner)
	}
	genuine := cs.ID()
	parts := strings.Split(genuine, ".")
	enc := base64.RawURLEncoding
	otherKey := []byte("another-key-0123456789abcdef01234567")
	cases := []struct{ name, id string }{
		{"random", "RANDOMSESSIONID"},
		{"names the trap, MAC of the genuine id", parts[0] + "." + enc.EncodeToString([]byte(trap.URL)) + "." + parts[2]},
		{"sealed with another key, naming the trap", mcpbridge.SealSessionID(otherKey, trap.URL)},
		{"sealed with another key, naming the other replica", mcpbridge.SealSessionID(otherKey, reps[1].url)},
		{"genuine id with its MAC cut short", genuine[:len(genuine)-4]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := reps[1].fromPeer.Load()
			if status, _ := rawPost(t, reps[0].url, tok, tc.id); status != http.StatusNotFound {
				t.Fatalf("HTTP %d, want 404", status)
			}
			if n := reps[1].fromPeer.Load() - before; n != 0 {
				t.Fatalf("forwarded %d requests to the other replica", n)
			}
		})
	}
	if n := trapped.Load(); n != 0 {
		t.Fatalf("the address a forged id named was contacted %d times", n)
	}
	t.Run("client-set forwarded mark", func(t *testing.T) {
		// Replica 0 must not take the client's mark for a replica's: it
		// forwards, and replica 1 answers.
		before := reps[1].fromPeer.Load()
		if status, _ := rawPost(t, reps[0].url, tok, genuine, mcpbridge.ForwardedHeader, "forged"); status != http.StatusOK {
			t.Fatalf("HTTP %d, want 200", status)
		}
		if reps[1].fromPeer.Load() != before+1 {
			t.Fatal("the request was not forwarded to the owner")
		}
	})
}

// TestOwnerLost: once the replica holding a session is gone, the other
// answers that session's requests 404 (session not found) at once, the
// go-sdk client reports its session missing, and a new session works.
func TestOwnerLost(t *testing.T) {
	st, lb, reps := replicated(t)
	tok := token(t, "acme", "alice", "support-bot")
	st.url = lb.url
	lb.sendNextTo(0)
	cs, _ := st.client(t, tok, clientOptions{})
	if owner := ownerOf(t, cs.ID(), reps); owner != 0 {
		t.Fatalf("session on replica %d, want 0", owner)
	}
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	reps[0].stop()
	lb.down[0].Store(true) // the balancer's health check notices

	status, took := rawPost(t, reps[1].url, tok, cs.ID())
	if status != http.StatusNotFound || took > time.Second {
		t.Fatalf("HTTP %d after %v, want 404 at once", status, took)
	}
	if _, err := cs.ListTools(context.Background(), nil); !errors.Is(err, mcp.ErrSessionMissing) {
		t.Fatalf("tools/list on the lost session: %v, want ErrSessionMissing", err)
	}
	fresh, _ := st.client(t, tok, clientOptions{})
	if _, err := fresh.ListTools(context.Background(), nil); err != nil {
		t.Fatalf("tools/list on a new session: %v", err)
	}

	// An owner whose address does not answer at all (a host that is gone)
	// is given up after the dial timeout.
	gone := mcpbridge.SealSessionID(stateKey, "http://10.255.255.1:8085")
	status, took = rawPost(t, reps[1].url, tok, gone)
	if status != http.StatusNotFound || took > mcpbridge.ForwardDialTimeout+time.Second {
		t.Fatalf("HTTP %d after %v, want 404 within the dial timeout", status, took)
	}
}

// TestAdvertiseURLSettings: forwarding needs the state key that seals the
// owner into session ids, and an advertised URL other replicas can dial.
func TestAdvertiseURLSettings(t *testing.T) {
	st := newHelpdeskStack(t)
	cases := []struct {
		name      string
		advertise string
		key       []byte
		ok        bool
	}{
		{"address of its own", "http://10.0.0.5:8085", stateKey, true},
		{"https with a trailing slash", "https://bridge-0.bridge.svc:8085/", stateKey, true},
		{"no state key", "http://10.0.0.5:8085", nil, false},
		{"no scheme", "10.0.0.5:8085", stateKey, false},
		{"query", "http://10.0.0.5:8085/?x=1", stateKey, false},
		{"user info", "http://u:p@10.0.0.5:8085", stateKey, false},
		{"another scheme", "ftp://10.0.0.5:8085", stateKey, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := st.cfg
			cfg.AdvertiseURL, cfg.StateKey = tc.advertise, tc.key
			b, err := mcpbridge.New(cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("New: %v, want ok=%v", err, tc.ok)
			}
			if b != nil {
				b.Close()
			}
		})
	}
}
