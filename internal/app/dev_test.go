package app

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/app/clicore"
)

// TestDevEndsWithAFailingPart: when a part of `mandate dev` fails while
// the suite serves, the whole suite stops and the command returns that
// error, rather than serving on without it or hanging.
func TestDevEndsWithAFailingPart(t *testing.T) {
	var out bytes.Buffer
	d := devSettings{httpAddr: "127.0.0.1:0", grpcAddr: "127.0.0.1:0"}
	d.events.Keep, d.events.PurgeInterval = time.Hour, time.Hour
	var cl clicore.Closers
	defer cl.Close()
	env := func(string) (string, bool) { return "", false }
	p, err := startDev(t.Context(), d, slog.New(slog.NewTextHandler(io.Discard, nil)), IO{Stdout: &out, Stderr: io.Discard, Env: env}, &cl)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`health (http://\S+/healthz)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no health URL in the banner:\n%s", out.String())
	}
	healthz := m[1]
	errBoom := errors.New("component failed")
	p.Serve(func(ctx context.Context) error {
		for { // fail once the suite serves
			if healthy(ctx, healthz) {
				return errBoom
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	if err := p.Run(t.Context()); !errors.Is(err, errBoom) {
		t.Fatalf("mandate dev returned %v, want %v", err, errBoom)
	}
	if healthy(t.Context(), healthz) {
		t.Fatal("the public server still serves after the suite returned")
	}
}

func healthy(ctx context.Context, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
