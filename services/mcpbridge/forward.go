package mcpbridge

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/mandate-dev/mandate/services/mcpbridge/internal/replica"
	"github.com/mandate-dev/mandate/services/mcpbridge/internal/sealed"
)

// With Config.AdvertiseURL set, the bridge runs as one of several
// replicas: it names itself in every session and task id it issues
// (package sealed), and forwards a request for another replica's session
// or task there (package replica).

// ForwardedHeader marks a request one replica forwarded to the owner of its
// session. Its value is an HMAC of the session id under the state key, so
// only replicas can set it; a replica never forwards a request that carries
// a valid one (no loops), and ignores and drops any other.
const ForwardedHeader = replica.ForwardedHeader

// ForwardDialTimeout bounds connecting to a session's owner. An owner that
// cannot be reached in time is taken as lost: the session is answered 404
// (session not found), on which clients initialise a new one.
const ForwardDialTimeout = replica.DialTimeout

// IsAdvertiseURL reports whether s can be Config.AdvertiseURL: an
// absolute http(s) URL without query, fragment or user info.
func IsAdvertiseURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" &&
		u.RawQuery == "" && !u.ForceQuery && u.Fragment == "" && u.User == nil && !strings.Contains(s, "#")
}

// advertiseURL validates Config.AdvertiseURL and returns it normalised
// (no trailing slash).
func advertiseURL(s string) (string, error) {
	if !IsAdvertiseURL(s) {
		return "", fmt.Errorf("mcpbridge: AdvertiseURL %q is not an absolute http(s) URL without query, fragment or user info", s)
	}
	u, _ := url.Parse(s) // checked above
	return strings.TrimSuffix(u.String(), "/"), nil
}

// newSessionID is the servers' ServerOptions.GetSessionID when forwarding
// is on: an id sealed to this replica (package sealed).
func (b *Bridge) newSessionID() string { return b.sealer.Seal(sealed.SessionLabel) }

// sessionIDs is the servers' session id generator: sealed ids naming this
// replica when forwarding is on, the SDK's random ones otherwise.
func (b *Bridge) sessionIDs() func() string {
	if b.fwd == nil {
		return nil
	}
	return b.newSessionID
}
