package tests

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/emptypb"
)

// seriesOf returns the series of a Prometheus text exposition, each as
// its name and labels (the line without its value), and the label sets:
// a series without its le label and _bucket, _sum and _count suffixes, so
// one histogram observation counts once.
func seriesOf(text string) (series, labelSets map[string]bool) {
	series, labelSets = map[string]bool{}, map[string]bool{}
	for line := range strings.SplitSeq(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		s := line[:i]
		series[s] = true
		name, labels, _ := strings.Cut(s, "{")
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			name = strings.TrimSuffix(name, suffix)
		}
		var kept []string
		for l := range strings.SplitSeq(strings.TrimSuffix(labels, "}"), ",") {
			if !strings.HasPrefix(l, "le=") {
				kept = append(kept, l)
			}
		}
		labelSets[name+"{"+strings.Join(kept, ",")+"}"] = true
	}
	return series, labelSets
}

// rawRequest sends one request over a fresh connection, written by hand
// so that the method, the request line's version and the Host header are
// whatever the test makes up, and reads the answer to its end.
func rawRequest(t *testing.T, addr, method, target, proto, host, token string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s\r\nHost: %s\r\nConnection: close\r\n", method, target, proto, host)
	if token != "" {
		fmt.Fprintf(&b, "Authorization: Bearer %s\r\n", token)
	}
	if method == "POST" || method == "PUT" || method == "PATCH" {
		b.WriteString("Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	} else {
		b.WriteString("\r\n")
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, bufio.NewReader(conn)); err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
}

// TestMetricsCardinalityBounded: the unauthenticated /metrics never grows
// by what a caller makes up (issue 31 item 7, where 600 requests with
// made-up Host headers and paths added 31,800 series). Against `mandate
// dev`, whose one HTTP server carries every kind of HTTP surface Mandate
// runs — the bridge (/mcp and its metadata), the REST gateway (commands),
// the audit and confirm REST routes, the approval pages and the dev OAuth
// server — 480 requests with a random Host (name and port), a random
// path under each surface, a random method (standard ones and made-up
// ones) and a random HTTP/1.x version, half of them with a token, add at
// most a small constant of label sets, and no made-up value reaches a
// label; 120 gRPC calls to made-up methods add at most a handful. A
// second round as large adds nothing new but status codes already seen.
func TestMetricsCardinalityBounded(t *testing.T) {
	d := startDev(t)
	rng := rand.New(rand.NewPCG(31, 7))
	// Every made-up value carries this marker, so a label holding one is
	// found in the scrape.
	const marker = "zq31"
	made := func() string { return fmt.Sprintf("%s%x", marker, rng.Uint64()) }
	surfaces := []func() string{
		func() string { return "/mcp" },
		func() string { return "/mcp/" + made() },
		func() string { return "/.well-known/oauth-protected-resource/mcp" },
		func() string { return "/v1/commands/" + made() + ":execute" },
		func() string { return "/v1/commands/ticket.search:execute?" + made() + "=1" },
		func() string { return "/v1/audit/records?page_token=" + made() },
		func() string { return "/v1/audit/invocations/" + made() },
		func() string { return "/v1/challenges/" + made() },
		func() string { return "/v1/challenges/" + made() + ":decide" },
		func() string { return "/approve/" + made() },
		func() string { return "/approve/login?t=" + made() },
		func() string { return "/authorize?client_id=" + made() },
		func() string { return "/token" },
		func() string { return "/register" },
		func() string { return "/.well-known/oauth-authorization-server/" + made() },
		func() string { return "/dev/sign-in?" + made() },
		func() string { return "/" + made() + "/" + made() },
		func() string { return "/healthz/" + made() },
	}
	methods := []string{"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"}
	round := func(n int) {
		for i := range n {
			method := methods[rng.IntN(len(methods))]
			if rng.IntN(4) == 0 {
				method = strings.ToUpper(made())
			}
			host := fmt.Sprintf("%s.test:%d", made(), 1+rng.IntN(65535))
			proto := fmt.Sprintf("HTTP/1.%d", rng.IntN(10))
			token := ""
			if i%2 == 0 {
				token = d.tokens["alice"]
			}
			rawRequest(t, d.httpAddr, method, surfaces[i%len(surfaces)](), proto, host, token)
		}
	}
	grpcRound := func(n int) {
		conn, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		for i := range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if i%2 == 0 {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+d.tokens["alice"])
			}
			method := fmt.Sprintf("/%s.v1.%s/%s", made(), made(), made())
			if err := conn.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{}); err == nil {
				t.Errorf("%s answered", method)
			}
			cancel()
		}
	}
	scrape := func() (map[string]bool, map[string]bool, string) {
		code, text := scrapeMetrics(t, d.base)
		if code != 200 {
			t.Fatalf("GET /metrics: %d", code)
		}
		s, l := seriesOf(text)
		return s, l, text
	}
	// One request per surface first, so that the series every server
	// keeps anyway (a route's first 404, the first refusal) exist before
	// the count starts.
	round(len(surfaces))
	grpcRound(2)
	series0, sets0, _ := scrape()

	round(480)
	grpcRound(120)
	series1, sets1, text := scrape()
	newSets, newSeries := len(sets1)-len(sets0), len(series1)-len(series0)
	t.Logf("after 480 HTTP requests and 120 gRPC calls: %d series (+%d), %d label sets (+%d)", len(series1), newSeries, len(sets1), newSets)
	if i := strings.Index(text, marker); i >= 0 {
		t.Errorf("a made-up value reached a label: ...%s...", text[max(0, i-300):min(len(text), i+100)])
	}
	// Method (8 values) × route (the registered patterns) × status: the
	// made-up hosts alone would be one label set per request and
	// histogram, over 1,400 here.
	const maxNewSets = 200
	if testing.Verbose() {
		for s := range sets1 {
			if !sets0[s] {
				t.Log(s)
			}
		}
	}
	if newSets > maxNewSets {
		t.Errorf("480 requests added %d label sets, want at most %d", newSets, maxNewSets)
		for s := range sets1 {
			if !sets0[s] {
				t.Log(s)
			}
		}
	}

	// The same again: nothing but what the first round already saw.
	round(480)
	grpcRound(120)
	_, sets2, _ := scrape()
	t.Logf("after a second round: %d label sets (+%d)", len(sets2), len(sets2)-len(sets1))
	if grown := len(sets2) - len(sets1); grown > maxNewSets/4 {
		t.Errorf("a second round added %d label sets, want at most %d", grown, maxNewSets/4)
	}
}
