package cli

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"net"
	"net/url"
	"time"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// runMCPBridge runs the MCP bridge on its own: Streamable HTTP at the path
// of --resource-url, the RFC 9728 metadata and /healthz on --http-addr,
// and gRPC health on --grpc-addr. It keeps no data: tool lists and
// manifest reads come from the catalog, calls go to the executor and
// elicited confirmations to the confirm service, each relayed for the
// caller with the bridge's service token (service "mcpbridge"). Replicas
// share --state-secret (or the service secret it derives from) and each
// advertises its own address (--advertise-url): a request for a session
// another replica holds is forwarded there.
func runMCPBridge(ctx context.Context, args []string, io IO) error {
	var (
		f                                  serviceFlags
		mf                                 manifestFlags
		catalogAddr, executorAddr, confirm string
		resourceURL, advertiseURL          string
		authServers                        []string
		sessionTimeout, idleTimeout        time.Duration
		stateSecret                        config.Secret
	)
	s := config.New("mcpbridge", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.String(&f.grpcAddr, "grpc-addr", "127.0.0.1:9095", "gRPC listen address (health only)")
	s.String(&f.httpAddr, "http-addr", "127.0.0.1:8085", "HTTP listen address: MCP, protected-resource metadata, /healthz")
	f.declareIdentity(s)
	mf.declare(s)
	s.String(&catalogAddr, "catalog-addr", "127.0.0.1:9091", "gRPC address of the catalog service")
	s.String(&executorAddr, "executor-addr", "127.0.0.1:9092", "gRPC address of the executor")
	s.String(&confirm, "confirm-addr", "127.0.0.1:9093", "gRPC address of the confirm service (elicited confirmations); empty: approval URLs only")
	s.String(&resourceURL, "resource-url", "", "public URL of the MCP endpoint, the RFC 9728 resource (default http://<http-addr>/mcp)")
	s.String(&advertiseURL, "advertise-url", "", "URL at which the other bridge replicas reach this one (http://host:port of --http-addr, e.g. the pod's "+
		"address): session ids name it, sealed with the state secret, and a replica forwards requests for another's sessions to it "+
		"(default http://<http-addr>)")
	s.Strings(&authServers, "authorization-server", nil, "issuer URLs of the authorization servers MCP clients get tokens from, named in the "+
		"protected-resource metadata (default: --oidc-issuer, else the --issuer values that are URLs)")
	s.Duration(&sessionTimeout, "session-timeout", time.Hour, "close MCP sessions that made no request for this long; clients keep theirs with pings (0: never)")
	s.Duration(&idleTimeout, "idle-timeout", mcpbridge.DefaultIdleTimeout, "drop a principal's server and catalog watch this long after its last request once no session is open")
	s.SecretVar(&stateSecret, "state-secret", "HMAC key sealing the requestState of MCP 2026-07-28 confirmations and the owner named in session ids, the same on every replica "+
		"(at least 32 bytes; default: derived from --service-secret)")
	s.Check(func() error {
		if stateSecret.Set() && len(stateSecret.Reveal()) < mcpbridge.MinStateKeyBytes {
			return s.Errorf("state-secret", "must be at least %d bytes", mcpbridge.MinStateKeyBytes)
		}
		return nil
	})
	s.Check(func() error {
		if resourceURL == "" {
			return nil
		}
		if u, err := url.Parse(resourceURL); err != nil || u.Scheme == "" || u.Host == "" {
			return s.Errorf("resource-url", "must be an absolute URL")
		}
		return nil
	})
	s.Check(func() error {
		for _, as := range authServers {
			if !mcpbridge.IsIssuerURL(as) {
				return s.Errorf("authorization-server", "%q is not an issuer URL (absolute http(s), no query or fragment)", as)
			}
		}
		return nil
	})
	s.Check(func() error {
		if advertiseURL == "" {
			return nil
		}
		if !mcpbridge.IsAdvertiseURL(advertiseURL) {
			return s.Errorf("advertise-url", "must be an absolute http(s) URL without query, fragment or user info")
		}
		return nil
	})
	s.Require("catalog-addr", func() bool { return catalogAddr == "" })
	s.Require("executor-addr", func() bool { return executorAddr == "" })
	if err := s.Parse(args); err != nil {
		return err
	}
	if resourceURL == "" {
		resourceURL = "http://" + f.httpAddr + "/mcp"
	}
	if advertiseURL == "" {
		advertiseURL = "http://" + f.httpAddr
	}
	if len(authServers) == 0 {
		authServers = defaultAuthorizationServers(f.oidcURL, f.issuers)
	}
	log := f.logger(io.Stderr, "mcpbridge")
	var cl closers
	defer cl.close()
	metrics, err := f.tracing(ctx, io, "mcpbridge", log, &cl)
	if err != nil {
		return err
	}
	set, err := mf.load()
	if err != nil {
		return err
	}
	auth, users, err := f.verifiers(ctx)
	if err != nil {
		return err
	}
	dial, err := f.serviceDialer(identity.MCPBridgeService, &cl)
	if err != nil {
		return err
	}
	catalogConn, err := dial(catalogAddr)
	if err != nil {
		return err
	}
	executorConn, err := dial(executorAddr)
	if err != nil {
		return err
	}
	deps := bridgeDeps{
		Catalog: catalogConn, Executor: executorConn,
		Manifest: set, Verifier: users,
		ResourceURL: resourceURL, AuthorizationServers: authServers, AdvertiseURL: advertiseURL,
		IdleTimeout: idleTimeout, SessionTimeout: sessionTimeout, StateKey: []byte(stateSecret.Reveal()), Logger: log,
	}
	if !stateSecret.Set() {
		deps.StateKey = deriveStateKey([]byte(f.serviceSecret.Reveal()))
	}
	if confirm != "" {
		if deps.Confirm, err = dial(confirm); err != nil {
			return err
		}
	}
	svc, err := buildBridge(deps, &cl)
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{Name: "mcpbridge", GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr, Auth: auth, Logger: log, Metrics: metrics})
	if err != nil {
		return err
	}
	svc.register(srv)
	if au, err := url.Parse(advertiseURL); err == nil && (au.Hostname() == "" || net.ParseIP(au.Hostname()).IsUnspecified()) {
		log.Warn("the advertise URL names no address the other replicas can reach: set --advertise-url when running more than one replica", "advertise", advertiseURL)
	}
	log.Info("MCP endpoint", "resource", resourceURL, "advertise", advertiseURL, "catalog", catalogAddr, "executor", executorAddr, "confirm", confirm)
	var p processGroup
	svc.start(&p)
	p.serve(srv.Run)
	return p.run(ctx)
}

// defaultAuthorizationServers is what the bridge's protected-resource
// metadata names when --authorization-server is not given: the OIDC issuer
// that signs users' tokens, else the accepted issuers that are URLs (an
// issuer such as "mandate-dev" names no server a client could find).
func defaultAuthorizationServers(oidcIssuer string, issuers []string) []string {
	if oidcIssuer != "" {
		return []string{oidcIssuer}
	}
	var out []string
	for _, iss := range issuers {
		if mcpbridge.IsIssuerURL(iss) {
			out = append(out, iss)
		}
	}
	return out
}

// deriveStateKey is the default requestState key of the MCP bridge: an
// HMAC-SHA256 of a label under the service secret, so that every replica
// sharing the service secret agrees on it and the key is never the service
// secret itself.
func deriveStateKey(serviceSecret []byte) []byte {
	h := hmac.New(sha256.New, serviceSecret)
	h.Write([]byte("mandate.dev/mcpbridge/request-state-key/v1"))
	return h.Sum(nil)
}
