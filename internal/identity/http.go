package identity

import (
	"encoding/json"
	"net/http"

	"github.com/mandate-dev/mandate/internal/failure"
)

// healthPath and livePath (readiness and liveness, internal/server) are
// the only HTTP paths served without a token.
const (
	healthPath = "/healthz"
	livePath   = "/livez"
)

// problem is an RFC 9457 problem+json body carrying the stable code.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

// HTTPMiddleware authenticates every request except /healthz with the same
// rules as the gRPC interceptors, reading the Authorization and
// X-Mandate-On-Behalf-Of headers. Refusals are 401 problem+json bodies with
// the stable code, and a WWW-Authenticate challenge as RFC 6750 §3 asks.
func (a *Authenticator) HTTPMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == healthPath || r.URL.Path == livePath {
			next.ServeHTTP(w, r)
			return
		}
		ctx, err := a.Authenticate(r.Context(), r.Header.Values("Authorization"), r.Header.Values(OnBehalfOfHeader))
		if err != nil {
			writeUnauthorized(w, asError(err))
			return
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

func writeUnauthorized(w http.ResponseWriter, e *Error) {
	// RFC 6750 §3.1: a request without credentials gets a bare challenge;
	// error="invalid_token" is for credentials that were sent and refused.
	challenge := `Bearer error="invalid_token"`
	if e.Code == failure.CodeAuthenticationMissingCredentials {
		challenge = "Bearer"
	}
	w.Header().Set("WWW-Authenticate", challenge)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusUnauthorized)
	_ = json.NewEncoder(w).Encode(problem{
		Type:   "about:blank",
		Title:  http.StatusText(http.StatusUnauthorized),
		Status: http.StatusUnauthorized,
		Code:   e.Code,
		Detail: e.Reason,
	})
}

// Transport is an http.RoundTripper for service-to-service HTTP calls: like
// UnaryClientInterceptor it sends the service token and forwards the end
// user's token found in the request context.
type Transport struct {
	// Source supplies the service token. Required.
	Source TokenSource
	// Base performs the request; nil means http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip sets the credentials on a clone of req, as the RoundTripper
// contract forbids modifying the caller's request.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	tok, err := t.Source.Token(req.Context())
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	out := req.Clone(req.Context())
	out.Header.Set("Authorization", "Bearer "+tok)
	out.Header.Del(OnBehalfOfHeader)
	if raw, ok := RawTokenFromContext(req.Context()); ok {
		out.Header.Set(OnBehalfOfHeader, "Bearer "+raw)
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(out)
}
