package replica_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/services/mcpbridge/internal/replica"
	"github.com/mandate-dev/mandate/services/mcpbridge/internal/sealed"
)

var key = bytes.Repeat([]byte{7}, 32)

const self = "http://self.test:8085"

func forwarder(t *testing.T, closed context.Context) *replica.Forwarder {
	t.Helper()
	return replica.New(closed, key, sealed.New(key, self), slog.New(slog.DiscardHandler))
}

// handler answers with its name, and records the request it served.
type handler struct {
	name string
	got  *http.Request
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.got = r
	_, _ = io.WriteString(w, h.name)
}

func never(*http.Request) bool { return false }

func serve(h http.Handler, session string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "http://balancer.test/mcp", strings.NewReader(`{}`))
	if session != "" {
		r.Header.Set("Mcp-Session-Id", session)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestRouteSessionsServesItsOwnHere(t *testing.T) {
	f := forwarder(t, t.Context())
	local := &handler{name: "local"}
	h := f.RouteSessions(local, never)
	for name, id := range map[string]string{
		"no session":  "",
		"own session": sealed.New(key, self).Seal(sealed.SessionLabel),
	} {
		if w := serve(h, id); w.Code != http.StatusOK || w.Body.String() != "local" {
			t.Errorf("%s: %d %q, want 200 local", name, w.Code, w.Body)
		}
	}
	// A request the bridge serves whatever its session (stateless) stays.
	other := sealed.New(key, "http://10.255.255.1:1").Seal(sealed.SessionLabel)
	if w := serve(f.RouteSessions(local, func(*http.Request) bool { return true }), other); w.Body.String() != "local" {
		t.Errorf("a request served here was not: %d %q", w.Code, w.Body)
	}
}

func TestRouteSessionsRefusesForeignIDs(t *testing.T) {
	f := forwarder(t, t.Context())
	h := f.RouteSessions(&handler{name: "local"}, never)
	for name, id := range map[string]string{
		"not sealed":       "ABCDEF",
		"another key":      sealed.New(bytes.Repeat([]byte{8}, 32), "http://evil.test").Seal(sealed.SessionLabel),
		"a task id":        sealed.New(key, "http://other.test").Seal(sealed.TaskLabel),
		"owner not an URL": sealed.New(key, "http://[::1").Seal(sealed.SessionLabel),
	} {
		if w := serve(h, id); w.Code != http.StatusNotFound {
			t.Errorf("%s: %d %q, want 404", name, w.Code, w.Body)
		}
	}
}

func TestRouteSessionsForwardsToTheOwner(t *testing.T) {
	// The owner is a replica: it accepts what this one forwards.
	ownerLocal := &handler{name: "owner"}
	var owner *httptest.Server
	owner = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := replica.New(t.Context(), key, sealed.New(key, owner.URL), slog.New(slog.DiscardHandler))
		checked := &handler{name: "checked"}
		f.AcceptForwarded(checked, f.RouteSessions(ownerLocal, never)).ServeHTTP(w, r)
	}))
	defer owner.Close()

	f := forwarder(t, t.Context())
	id := sealed.New(key, owner.URL).Seal(sealed.SessionLabel)
	w := serve(f.RouteSessions(&handler{name: "local"}, never), id, "Authorization", "Bearer x")
	if w.Code != http.StatusOK || w.Body.String() != "owner" {
		t.Fatalf("forwarded: %d %q, want 200 owner", w.Code, w.Body)
	}
	got := ownerLocal.got
	if got.Header.Get("Mcp-Session-Id") != id || got.Header.Get("Authorization") != "Bearer x" {
		t.Errorf("the owner got headers %v", got.Header)
	}
	if got.Header.Get(replica.ForwardedHeader) != "" {
		t.Errorf("the owner's handlers saw the ForwardedHeader")
	}
}

func TestAcceptForwardedDropsAForgedMark(t *testing.T) {
	f := forwarder(t, t.Context())
	checked, protected := &handler{name: "checked"}, &handler{name: "protected"}
	h := f.AcceptForwarded(checked, protected)
	id := sealed.New(key, self).Seal(sealed.SessionLabel)
	for name, mark := range map[string]string{"forged": "forged", "none": ""} {
		w := serve(h, id, replica.ForwardedHeader, mark)
		if w.Body.String() != "checked" {
			t.Errorf("%s mark: served by %q, want checked", name, w.Body)
		}
		if checked.got.Header.Get(replica.ForwardedHeader) != "" {
			t.Errorf("%s mark: the header reached the handler", name)
		}
	}
}

func TestUnreachableOwnerIsSessionNotFound(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	f := forwarder(t, t.Context())
	id := sealed.New(key, dead.URL).Seal(sealed.SessionLabel)
	if w := serve(f.RouteSessions(&handler{name: "local"}, never), id); w.Code != http.StatusNotFound {
		t.Errorf("unreachable owner: %d %q, want 404", w.Code, w.Body)
	}
	closed, cancel := context.WithCancel(t.Context())
	cancel()
	f = forwarder(t, closed)
	if w := serve(f.RouteSessions(&handler{name: "local"}, never), id); w.Code != http.StatusServiceUnavailable {
		t.Errorf("closed forwarder: %d %q, want 503", w.Code, w.Body)
	}
}

func TestForwardTask(t *testing.T) {
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "task owner")
	}))
	defer owner.Close()
	f := forwarder(t, t.Context())
	r := httptest.NewRequest(http.MethodPost, "http://balancer.test/mcp", strings.NewReader(`{}`))
	w := httptest.NewRecorder()
	f.ForwardTask(w, r, owner.URL)
	if w.Code != http.StatusOK || w.Body.String() != "task owner" {
		t.Errorf("ForwardTask: %d %q", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	f.ForwardTask(w, r, "http://[::1")
	if w.Code != http.StatusNotFound {
		t.Errorf("ForwardTask to a bad URL: %d, want 404", w.Code)
	}
}

func TestTaskMark(t *testing.T) {
	f := forwarder(t, t.Context())
	peer := func(mark string) (string, bool) {
		r := httptest.NewRequest(http.MethodPost, "http://self.test/mcp", nil)
		if mark != "" {
			r.Header.Set(replica.TaskForwardedHeader, mark)
		}
		return f.TaskPeer(r)
	}
	if id, ok := peer(f.TaskMark("T1")); !ok || id != "T1" {
		t.Errorf("TaskPeer(TaskMark(T1)) = %q, %v", id, ok)
	}
	other := replica.New(t.Context(), bytes.Repeat([]byte{8}, 32), sealed.New(key, self), slog.New(slog.DiscardHandler))
	mac, _, _ := strings.Cut(f.TaskMark("T1"), ":")
	for name, mark := range map[string]string{
		"none":        "",
		"no id":       mac + ":",
		"another id":  mac + ":T2",
		"forged":      "AAAA:T1",
		"another key": other.TaskMark("T1"),
	} {
		if id, ok := peer(mark); ok {
			t.Errorf("%s: TaskPeer = %q, true; want refused", name, id)
		}
	}
}
