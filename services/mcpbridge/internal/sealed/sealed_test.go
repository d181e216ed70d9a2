package sealed_test

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/services/mcpbridge/internal/sealed"
)

const owner = "http://replica-a.test:8085"

var key = bytes.Repeat([]byte{7}, 32)

func TestRoundTrip(t *testing.T) {
	s := sealed.New(key, owner)
	if s.Owner() != owner {
		t.Fatalf("Owner() = %q, want %q", s.Owner(), owner)
	}
	for _, label := range []string{sealed.SessionLabel, sealed.TaskLabel} {
		id := s.Seal(label)
		if got, ok := s.Open(label, id); !ok || got != owner {
			t.Errorf("Open(%q, %q) = %q, %v; want %q, true", label, id, got, ok, owner)
		}
		// Any replica with the same key opens it, whatever it names itself.
		if got, ok := sealed.New(key, "http://replica-b.test").Open(label, id); !ok || got != owner {
			t.Errorf("another replica's Open = %q, %v; want %q, true", got, ok, owner)
		}
	}
}

func TestIDsAreDistinct(t *testing.T) {
	s := sealed.New(key, owner)
	if a, b := s.Seal(sealed.SessionLabel), s.Seal(sealed.SessionLabel); a == b {
		t.Errorf("two ids are equal: %q", a)
	}
}

func TestTamperedIDRefused(t *testing.T) {
	s := sealed.New(key, owner)
	id := s.Seal(sealed.SessionLabel)
	nonce, rest, _ := strings.Cut(id, ".")
	_, mac, _ := strings.Cut(rest, ".")
	enc := base64.RawURLEncoding
	flip := func(s string) string {
		b := []byte(s)
		if b[0] == 'A' {
			b[0] = 'B'
		} else {
			b[0] = 'A'
		}
		return string(b)
	}
	for name, bad := range map[string]string{
		"another owner": nonce + "." + enc.EncodeToString([]byte("http://evil.test")) + "." + mac,
		"another nonce": flip(nonce) + "." + rest,
		"another mac":   nonce + "." + enc.EncodeToString([]byte(owner)) + "." + flip(mac),
		"no mac":        nonce + "." + enc.EncodeToString([]byte(owner)),
		"empty mac":     nonce + "." + enc.EncodeToString([]byte(owner)) + ".",
		"no nonce":      "." + rest,
		"mac not b64":   nonce + "." + enc.EncodeToString([]byte(owner)) + ".!!",
		"owner not b64": nonce + ".!!." + mac,
		"truncated":     id[:len(id)-1],
		"extra part":    id + ".x",
		"empty":         "",
		"random":        "1234567890",
	} {
		if got, ok := s.Open(sealed.SessionLabel, bad); ok {
			t.Errorf("%s: Open(%q) = %q, true; want refused", name, bad, got)
		}
	}
}

func TestAnotherLabelRefused(t *testing.T) {
	s := sealed.New(key, owner)
	if got, ok := s.Open(sealed.TaskLabel, s.Seal(sealed.SessionLabel)); ok {
		t.Errorf("a session id opened as a task id: %q", got)
	}
	if got, ok := s.Open(sealed.SessionLabel, s.Seal(sealed.TaskLabel)); ok {
		t.Errorf("a task id opened as a session id: %q", got)
	}
}

func TestAnotherKeyRefused(t *testing.T) {
	id := sealed.New(key, owner).Seal(sealed.SessionLabel)
	other := sealed.New(bytes.Repeat([]byte{8}, 32), owner)
	if got, ok := other.Open(sealed.SessionLabel, id); ok {
		t.Errorf("an id sealed under another key opened: %q", got)
	}
}
