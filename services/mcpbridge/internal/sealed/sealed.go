// Package sealed makes and opens the ids the MCP bridge issues when it
// runs as several replicas: random ids that name the replica that owns
// them (the one holding the session or the task), sealed with an
// HMAC-SHA256 under the bridge's state key so that a client can read the
// owner but cannot change it.
//
// An id is "nonce.base64url(owner).base64url(mac)", the mac an HMAC of a
// label, the nonce and the owner. The label keeps the ids of one kind (a
// session, a task) from passing for another's; every label is distinct
// from the labels of the bridge's other MACs under the same key.
package sealed

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// Labels of the ids the bridge seals.
const (
	// SessionLabel seals session ids (Mcp-Session-Id).
	SessionLabel = "mandate.dev/mcp-session/v1\x00"
	// TaskLabel seals task ids.
	TaskLabel = "mandate.dev/mcp-task/v1\x00"
)

// Sealer seals ids to one replica under one key. It is safe for
// concurrent use.
type Sealer struct {
	key   []byte
	owner string
}

// New returns a Sealer that names owner (the replica's advertised URL) in
// the ids it seals, under key. It keeps key as given: the caller must not
// change it afterwards.
func New(key []byte, owner string) *Sealer {
	return &Sealer{key: key, owner: owner}
}

// Owner is the replica the Sealer names in the ids it seals.
func (s *Sealer) Owner() string { return s.owner }

// Seal returns a new random id under label naming the Sealer's owner.
func (s *Sealer) Seal(label string) string {
	nonce := rand.Text()
	enc := base64.RawURLEncoding
	return nonce + "." + enc.EncodeToString([]byte(s.owner)) + "." + enc.EncodeToString(s.mac(label, nonce, s.owner))
}

// Open opens an id sealed under label with the Sealer's key (by any
// replica) and returns the owner it names; ok is false for any other
// string.
func (s *Sealer) Open(label, id string) (owner string, ok bool) {
	nonce, rest, ok1 := strings.Cut(id, ".")
	owner64, mac64, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || nonce == "" {
		return "", false
	}
	enc := base64.RawURLEncoding
	o, err1 := enc.DecodeString(owner64)
	mac, err2 := enc.DecodeString(mac64)
	if err1 != nil || err2 != nil || !hmac.Equal(mac, s.mac(label, nonce, string(o))) {
		return "", false
	}
	return string(o), true
}

func (s *Sealer) mac(label, nonce, owner string) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(label))
	h.Write([]byte(nonce))
	h.Write([]byte{0})
	h.Write([]byte(owner))
	return h.Sum(nil)
}
