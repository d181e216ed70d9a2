// Package dnstest is a DNS server for tests. It answers A queries for the
// names a test gives it, over UDP on a loopback port, so that a test can
// have one name resolve to several loopback addresses (127.0.0.2,
// 127.0.0.3, …: on Linux the whole of 127.0.0.0/8 is the loopback
// interface) — the records of a headless Kubernetes Service — without
// touching the machine's /etc/hosts or resolver. gRPC clients are pointed
// at it with the authority of their target:
// dns://127.0.0.1:<port>/<name>:<port> (Server.Target).
package dnstest

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Server is a running DNS server.
type Server struct {
	conn    net.PacketConn
	mu      sync.Mutex
	records map[string][]netip.Addr
	queries atomic.Int64
	done    chan struct{}
}

// Start serves on a free UDP port of 127.0.0.1 until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{conn: conn, records: map[string][]netip.Addr{}, done: make(chan struct{})}
	go s.serve()
	t.Cleanup(func() {
		_ = conn.Close()
		<-s.done
	})
	return s
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.conn.LocalAddr().String() }

// Target is the gRPC target that resolves name through this server, with
// port appended to each address.
func (s *Server) Target(name, port string) string {
	return "dns://" + s.Addr() + "/" + name + ":" + port
}

// Set makes name resolve to the IPv4 addresses addrs (none: the name does
// not exist). It panics on an address that is not IPv4: a test's mistake.
func (s *Server) Set(name string, addrs ...string) {
	var as []netip.Addr
	for _, a := range addrs {
		ip := netip.MustParseAddr(a)
		if !ip.Is4() {
			panic("dnstest: " + a + " is not an IPv4 address")
		}
		as = append(as, ip)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(as) == 0 {
		delete(s.records, canonical(name))
		return
	}
	s.records[canonical(name)] = as
}

// Queries counts the queries answered so far, of every type.
func (s *Server) Queries() int64 { return s.queries.Load() }

func canonical(name string) string { return strings.ToLower(strings.TrimSuffix(name, ".")) }

func (s *Server) serve() {
	defer close(s.done)
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		resp, ok := s.answer(buf[:n])
		if !ok {
			continue // not a query we can parse: a real server would drop it too
		}
		s.queries.Add(1)
		_, _ = s.conn.WriteTo(resp, from)
	}
}

// answer builds the response to one query: the A records of a known name;
// no records but success for its other types (AAAA, TXT: the resolver asks
// for them too); NXDOMAIN for an unknown name. The answers are
// authoritative and recursion is offered, so that Go's resolver does not
// take an empty answer for a lame referral.
func (s *Server) answer(query []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	s.mu.Lock()
	addrs, known := s.records[canonical(q.Name.String())]
	s.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	if q.Type == dnsmessage.TypeA && q.Class == dnsmessage.ClassINET {
		for _, a := range addrs {
			hdr := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 1}
			if b.AResource(hdr, dnsmessage.AResource{A: a.As4()}) != nil {
				return nil, false
			}
		}
	}
	msg, err := b.Finish()
	return msg, err == nil
}
