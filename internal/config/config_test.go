package config

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestFlagsWinOverEnvironment(t *testing.T) {
	var url string
	var ttl time.Duration
	s := New("x", env(map[string]string{"MANDATE_DATABASE_URL": "postgres://env", "MANDATE_TTL": "2h"}))
	s.String(&url, "database-url", "", "database")
	s.Duration(&ttl, "ttl", time.Hour, "ttl")
	if err := s.Parse([]string{"--database-url", "postgres://flag"}); err != nil {
		t.Fatal(err)
	}
	if url != "postgres://flag" || ttl != 2*time.Hour {
		t.Fatalf("url=%q ttl=%v", url, ttl)
	}
}

func TestErrorsNameTheSetting(t *testing.T) {
	var url string
	var ttl time.Duration
	s := New("x", env(map[string]string{"MANDATE_TTL": "soon"}))
	s.String(&url, "database-url", "", "database")
	s.Duration(&ttl, "ttl", time.Hour, "ttl")
	s.Require("database-url", func() bool { return url == "" })
	err := s.Parse(nil)
	if err == nil {
		t.Fatal("Parse accepted a missing required setting")
	}
	for _, want := range []string{"MANDATE_TTL: invalid value for --ttl", "--database-url (MANDATE_DATABASE_URL) is required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestSecretNeverPrints(t *testing.T) {
	var sec Secret
	s := New("x", env(map[string]string{"MANDATE_DEV_SECRET": "hunter2-hunter2-hunter2-hunter2-x"}))
	s.SecretVar(&sec, "dev-secret", "secret")
	if err := s.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if sec.Reveal() != "hunter2-hunter2-hunter2-hunter2-x" {
		t.Fatal("secret not read from the environment")
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		if out := fmt.Sprintf(verb, struct{ S Secret }{sec}); strings.Contains(out, "hunter2") {
			t.Fatalf("%s printed the secret: %s", verb, out)
		}
	}
	// A bad secret value in the environment is reported without the value.
	var n int
	s = New("x", env(map[string]string{"MANDATE_PORT": "hunter2"}))
	s.Int(&n, "port", 1, "port")
	if err := s.Parse(nil); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %v leaks the value", err)
	}
}
