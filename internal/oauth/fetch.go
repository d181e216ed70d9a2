package oauth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
)

// Bounds of fetching client ID metadata documents. The authorization
// endpoint needs no credential, so whoever can reach it can make the server
// fetch a URL; these bounds keep that from becoming a scanner of the
// server's network or an amplifier.
const (
	// DefaultFetchTimeout bounds one fetch, from dialing to the last byte.
	DefaultFetchTimeout = 5 * time.Second
	// maxResponseHeaderBytes bounds the headers of a document's response;
	// its body is bounded by maxMetadataBytes.
	maxResponseHeaderBytes = 16 << 10
	// failureTTL is how long a client_id whose document could not be used
	// is answered from memory, without fetching it again: short, so that a
	// client that fixes its document is not locked out for long.
	failureTTL = time.Minute
	// maxFailures bounds the remembered failures.
	maxFailures = 10000
	// A client address may start fetchBurstPerAddr fetches at once, then
	// one per fetchEveryPerAddr; all addresses together fetchBurst, then
	// fetchRate a second. A host fetches its document once per login at
	// most (it is cached for metadataTTL), so these are far above what an
	// honest browser needs.
	fetchBurstPerAddr = 10
	fetchEveryPerAddr = 6 * time.Second
	fetchBurst        = 30
	fetchRate         = 1
	// maxAddrs bounds the per-address limiters kept.
	maxAddrs = 10000
)

// errNonPublicAddress is a connection refused because the address it would
// go to is not a public unicast one.
var errNonPublicAddress = errors.New("the address is not a public unicast address")

// errRateLimited is a fetch refused because too many were asked for.
var errRateLimited = errors.New("too many client ID metadata documents fetched; try again in a minute")

// fetcher fetches client ID metadata documents within the bounds above,
// and remembers failures so that asking again does not fetch again.
type fetcher struct {
	client  *http.Client
	timeout time.Duration
	now     func() time.Time
	group   singleflight.Group

	mu       sync.Mutex
	failures map[string]time.Time // client_id → when its failure is forgotten
	global   *rate.Limiter
	addrs    map[string]*rate.Limiter
}

func newFetcher(timeout time.Duration, loopback bool, now func() time.Time) *fetcher {
	return &fetcher{
		client: &http.Client{
			Timeout:   timeout,
			Transport: guardedTransport(timeout, loopback),
			// A document is where its client_id says it is: a redirect is
			// refused (its answer is not 200), never followed.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		timeout: timeout, now: now,
		failures: map[string]time.Time{},
		global:   rate.NewLimiter(fetchRate, fetchBurst),
		addrs:    map[string]*rate.Limiter{},
	}
}

// guardedTransport connects to public unicast addresses only (and to
// loopback ones when loopback is set), judged on the address each
// connection actually goes to, after name resolution: a name that resolves
// to a private address, or first to a public and then to a private one
// (DNS rebinding), gets no connection. No proxy is used, since the address
// judged would then be the proxy's; no connection is kept, so none is
// reused for another host.
func guardedTransport(timeout time.Duration, loopback bool) *http.Transport {
	d := &net.Dialer{
		Timeout: timeout,
		Control: func(network, address string, _ syscall.RawConn) error {
			return checkDialAddress(network, address, loopback)
		},
	}
	return &http.Transport{
		Proxy:                  nil,
		DialContext:            d.DialContext,
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
		DisableKeepAlives:      true,
	}
}

// checkDialAddress is the dialer's judgment of one resolved address.
func checkDialAddress(network, address string, loopback bool) error {
	if network != "tcp4" && network != "tcp6" {
		return fmt.Errorf("network %q: %w", network, errNonPublicAddress)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("address %q: %w", address, errNonPublicAddress)
	}
	ip := ap.Addr().Unmap()
	if ip.IsLoopback() && loopback {
		return nil
	}
	if !isPublic(ip) {
		return fmt.Errorf("%s: %w", ip, errNonPublicAddress)
	}
	return nil
}

// nonPublicV4 are the IPv4 ranges of the IANA special-purpose registry
// (RFC 6890 and its updates) that are not globally reachable unicast,
// besides those netip.Addr classifies itself.
var nonPublicV4 = prefixes(
	"0.0.0.0/8",       // "this network" (RFC 791)
	"100.64.0.0/10",   // shared address space, carrier-grade NAT (RFC 6598)
	"192.0.0.0/24",    // IETF protocol assignments (RFC 6890)
	"192.0.2.0/24",    // documentation (RFC 5737)
	"192.88.99.0/24",  // 6to4 relay anycast (RFC 7526)
	"198.18.0.0/15",   // benchmarking (RFC 2544)
	"198.51.100.0/24", // documentation
	"203.0.113.0/24",  // documentation
	"240.0.0.0/4",     // reserved, and the limited broadcast address
)

// publicV6 is global unicast; nonPublicV6 are the parts of it that are not
// globally reachable, or that embed an IPv4 address a relay would reach
// (so a private IPv4 address could hide in them).
var (
	publicV6    = netip.MustParsePrefix("2000::/3")
	nonPublicV6 = prefixes(
		"2001::/23",     // IETF protocol assignments, Teredo included (RFC 2928, 4380)
		"2001:db8::/32", // documentation (RFC 3849)
		"2002::/16",     // 6to4 (RFC 3056)
		"3fff::/20",     // documentation (RFC 9637)
	)
)

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// isPublic reports whether ip is a globally reachable unicast address: not
// loopback, private (RFC 1918, ULA fc00::/7), link-local (169.254.0.0/16,
// where cloud metadata services answer, and fe80::/10), unspecified,
// multicast, carrier-grade NAT, documentation, benchmarking or reserved.
// IPv6 outside 2000::/3 is refused whole, which takes in the NAT64
// prefixes (64:ff9b::/96, 64:ff9b:1::/48) that translate to IPv4
// addresses, private ones included.
func isPublic(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.IsUnspecified() || ip.IsLoopback() || ip.IsPrivate() || ip.IsMulticast() ||
		ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() {
		return false
	}
	if ip.Is4() {
		for _, p := range nonPublicV4 {
			if p.Contains(ip) {
				return false
			}
		}
		return true
	}
	if !publicV6.Contains(ip) {
		return false
	}
	for _, p := range nonPublicV6 {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

// failed reports whether id failed less than failureTTL ago.
func (f *fetcher) failed(id string) bool {
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	until, ok := f.failures[id]
	if ok && now.After(until) {
		delete(f.failures, id)
		return false
	}
	return ok
}

// remember records that id failed. Past maxFailures the expired entries go
// first, then arbitrary ones: forgetting a failure early costs one fetch,
// which the rate limits still bound.
func (f *fetcher) remember(id string) {
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.failures) >= maxFailures {
		for k, until := range f.failures {
			if now.After(until) {
				delete(f.failures, k)
			}
		}
	}
	for k := range f.failures {
		if len(f.failures) < maxFailures {
			break
		}
		delete(f.failures, k)
	}
	f.failures[id] = now.Add(failureTTL)
}

// allow takes one fetch from addr's allowance and then from the global
// one. The address is asked first, so that one address spending its own
// allowance does not spend everyone's.
func (f *fetcher) allow(addr string) bool {
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	lim, ok := f.addrs[addr]
	if !ok {
		if len(f.addrs) >= maxAddrs {
			// A limiter that has refilled is as good as a new one.
			for k, l := range f.addrs {
				if l.TokensAt(now) >= fetchBurstPerAddr {
					delete(f.addrs, k)
				}
			}
		}
		for k := range f.addrs {
			if len(f.addrs) < maxAddrs {
				break
			}
			delete(f.addrs, k)
		}
		lim = rate.NewLimiter(rate.Every(fetchEveryPerAddr), fetchBurstPerAddr)
		f.addrs[addr] = lim
	}
	return lim.AllowN(now, 1) && f.global.AllowN(now, 1)
}

// fetch runs get for id once however many ask at the same time, detached
// from the asking request: one caller giving up must neither cancel the
// others' fetch nor leave a failure remembered against a document that
// works.
func (f *fetcher) fetch(ctx context.Context, id string, get func(context.Context) (*Client, error)) (*Client, error) {
	v, err, _ := f.group.Do(id, func() (any, error) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.timeout)
		defer cancel()
		c, err := get(fctx)
		if err != nil {
			f.remember(id)
			return nil, err
		}
		return c, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Client), nil
}

// clientAddr is the key of a request's fetch allowance: its peer's IP
// address, an IPv6 one by its /64, which one host usually holds whole.
// Forwarding headers are not read: anyone could set them.
func clientAddr(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}
