package identity

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/failure"
)

func whoamiHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, describe(r.Context()))
	})
}

func TestHTTPMiddleware(t *testing.T) {
	f := newGRPCFixture(t)
	srv := httptest.NewServer(f.authenticator(t, false).HTTPMiddleware(whoamiHandler()))
	t.Cleanup(srv.Close)

	tests := []struct {
		name      string
		path      string
		headers   map[string][]string
		status    int
		code      string
		challenge string
		want      string
	}{
		{"health passes without a token", "/healthz", nil, http.StatusOK, "", "", "anonymous"},
		{"missing credentials", "/v1/things", nil, http.StatusUnauthorized, failure.CodeAuthenticationMissingCredentials, "Bearer", ""},
		{"garbage token", "/v1/things", map[string][]string{"Authorization": {"Bearer junk"}},
			http.StatusUnauthorized, failure.CodeAuthenticationInvalidToken, `Bearer error="invalid_token"`, ""},
		{"expired token", "/v1/things", map[string][]string{"Authorization": {"Bearer " + f.expired}},
			http.StatusUnauthorized, failure.CodeAuthenticationTokenExpired, `Bearer error="invalid_token"`, ""},
		{"health is only the exact path", "/healthz/../v1/things", nil, http.StatusUnauthorized, failure.CodeAuthenticationMissingCredentials, "Bearer", ""},
		{"user token", "/v1/things", map[string][]string{"Authorization": {"Bearer " + f.userTok}},
			http.StatusOK, "", "", "kind=user tenant=acme user=u-42 agent= model= via= service="},
		{"service on behalf of an agent", "/v1/things", map[string][]string{
			"Authorization": {"Bearer " + f.svcTok}, "X-Mandate-On-Behalf-Of": {"Bearer " + f.agentTok}},
			http.StatusOK, "", "", "kind=agent tenant=acme user=u-42 agent=agent-7 model=claude-x via=gateway service="},
		{"user pretending to be a service", "/v1/things", map[string][]string{
			"Authorization": {"Bearer " + f.userTok}, "X-Mandate-On-Behalf-Of": {"Bearer " + f.agentTok}},
			http.StatusUnauthorized, failure.CodeAuthenticationNotAService, `Bearer error="invalid_token"`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+tc.path, nil)
			must(t, err)
			req.URL.Path = tc.path // keep dot segments: the client must not clean them
			for k, vs := range tc.headers {
				for _, v := range vs {
					req.Header.Add(k, v)
				}
			}
			resp, err := srv.Client().Do(req)
			must(t, err)
			defer func() { _ = resp.Body.Close() }()
			body, err := io.ReadAll(resp.Body)
			must(t, err)
			if resp.StatusCode != tc.status {
				t.Fatalf("status = %d, want %d (body %s)", resp.StatusCode, tc.status, body)
			}
			if tc.code == "" {
				if string(body) != tc.want {
					t.Errorf("body = %q, want %q", body, tc.want)
				}
				return
			}
			if got := resp.Header.Get("WWW-Authenticate"); got != tc.challenge {
				t.Errorf("WWW-Authenticate = %q, want %q", got, tc.challenge)
			}
			if got := resp.Header.Get("Content-Type"); got != "application/problem+json" {
				t.Errorf("Content-Type = %q", got)
			}
			var p map[string]any
			must(t, json.Unmarshal(body, &p))
			if p["type"] != "about:blank" || p["title"] != "Unauthorized" || p["status"] != float64(401) ||
				p["code"] != tc.code || p["detail"] == "" || len(p) != 5 {
				t.Errorf("problem = %v, want code %q", p, tc.code)
			}
			for _, tok := range []string{f.userTok, f.expired, f.svcTok, f.agentTok} {
				if strings.Contains(string(body), tok) {
					t.Error("problem body echoes a token")
				}
			}
		})
	}
}

// TestHTTPTransportPropagation is the HTTP twin of TestOnBehalfOfPropagation:
// a frontend handler calls a backend through Transport.
func TestHTTPTransportPropagation(t *testing.T) {
	f := newGRPCFixture(t)
	backend := httptest.NewServer(f.authenticator(t, false).HTTPMiddleware(whoamiHandler()))
	t.Cleanup(backend.Close)

	src, err := NewServiceTokenSource(serviceSecret, testIssuer, testAudience, "frontend", time.Hour)
	must(t, err)
	src.now, src.token = fixedNow, ""
	client := &http.Client{Transport: &Transport{Source: src, Base: backend.Client().Transport}}
	frontendAuth, err := NewAuthenticator(AuthenticatorConfig{Users: f.users})
	must(t, err)
	frontend := httptest.NewServer(frontendAuth.HTTPMiddleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, backend.URL+"/v1/whoami", nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// A forwarded Authorization header must be replaced, not appended.
		req.Header.Set("Authorization", r.Header.Get("Authorization"))
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer func() { _ = resp.Body.Close() }()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})))
	t.Cleanup(frontend.Close)
	t.Cleanup(client.CloseIdleConnections)

	tests := []struct {
		name   string
		token  string
		status int
		want   string
	}{
		{"user", f.userTok, http.StatusOK, "kind=user tenant=acme user=u-42 agent= model= via=frontend service="},
		{"agent", f.agentTok, http.StatusOK, "kind=agent tenant=acme user=u-42 agent=agent-7 model=claude-x via=frontend service="},
		{"expired never reaches the backend", f.expired, http.StatusUnauthorized, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, frontend.URL+"/v1/things", nil)
			must(t, err)
			req.Header.Set("Authorization", "Bearer "+tc.token)
			resp, err := frontend.Client().Do(req)
			must(t, err)
			defer func() { _ = resp.Body.Close() }()
			body, err := io.ReadAll(resp.Body)
			must(t, err)
			if resp.StatusCode != tc.status {
				t.Fatalf("status = %d, want %d (body %s)", resp.StatusCode, tc.status, body)
			}
			if tc.want != "" && string(body) != tc.want {
				t.Errorf("backend saw %q\nwant        %q", body, tc.want)
			}
		})
	}
}
