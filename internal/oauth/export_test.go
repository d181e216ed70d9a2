package oauth

import "net/netip"

// Bounds the tests measure against.
const (
	FetchBurstPerAddr = fetchBurstPerAddr
	FetchEveryPerAddr = fetchEveryPerAddr
	FetchBurst        = fetchBurst
	FetchRate         = fetchRate
	FailureTTL        = failureTTL
	MaxFailures       = maxFailures
	MaxAddrs          = maxAddrs
)

// IsPublic is isPublic.
func IsPublic(ip netip.Addr) bool { return isPublic(ip) }

// CheckDialAddress is the guarded dialer's judgment of one address.
func CheckDialAddress(network, address string, loopback bool) error {
	return checkDialAddress(network, address, loopback)
}

// RememberFailure records a failure of id, as a failed fetch does.
func RememberFailure(s *Server, id string) { s.fetch.remember(id) }

// FetchMemory is how many failures and per-address limiters s keeps.
func FetchMemory(s *Server) (failures, addrs int) {
	s.fetch.mu.Lock()
	defer s.fetch.mu.Unlock()
	return len(s.fetch.failures), len(s.fetch.addrs)
}
