package executor

import (
	"bufio"
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// heldRefusal makes a refused call whose outcome row neither the trail
// nor the store takes: it ends up held in memory.
func heldRefusal(t *testing.T, h *stageHarness) string {
	t.Helper()
	_, err := h.e.Execute(callAs(t, testPrincipal("acme", "alice", "")), Call{Code: "ticket.delete", Input: []byte(`{}`), Channel: "grpc"})
	if err == nil || !strings.Contains(err.Error(), "command.not_found") {
		t.Fatalf("the refused call: %v", err)
	}
	h.e.heldMu.Lock()
	defer h.e.heldMu.Unlock()
	if len(h.e.held) == 0 {
		t.Fatal("the refusal's row is not held")
	}
	return h.e.held[len(h.e.held)-1].GetInvocationId()
}

// TestHeldRowsSurviveARestart (issue 31, item 4): rows held in memory
// while both the trail and the executor's store are down are written to
// the held file at shutdown and appended by the next executor once the
// trail is back — none lost, none silently; the file goes once they are
// in.
func TestHeldRowsSurviveARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "held")
	first := newStageHarness(t, func(c *Config) { c.HeldFile = path; c.OutcomeAttemptTimeout = 50 * time.Millisecond })
	first.audit.takeAway(status.Error(codes.Unavailable, "the trail is down"))
	first.store.down = errors.New("the database is down")
	ids := []string{heldRefusal(t, first), heldRefusal(t, first)}
	first.e.Close()

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the held file after shutdown: %v", err)
	}
	if lines := bytes.Count(b, []byte("\n")); lines != len(ids) {
		t.Fatalf("the held file has %d rows, want %d", lines, len(ids))
	}

	second := newStageHarness(t, func(c *Config) { c.HeldFile = path })
	mark := second.audit.mark()
	if n, err := second.e.FlushSpool(t.Context()); err != nil || n != len(ids) {
		t.Fatalf("the next executor's flush: %d rows, %v; want %d", n, err, len(ids))
	}
	got := map[string]bool{}
	for _, r := range second.audit.since(mark) {
		got[r.GetInvocationId()] = r.GetCode() == "command.not_found"
	}
	for _, id := range ids {
		if !got[id] {
			t.Errorf("the refusal %s did not reach the trail after the restart", id)
		}
	}
	second.e.Close()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the held file after every row reached the trail: %v", err)
	}
}

// TestHeldRowsWithoutAFileAreCounted: without a held file, a shutdown that
// cannot keep its held rows says how many it lost.
func TestHeldRowsWithoutAFileAreCounted(t *testing.T) {
	var log bytes.Buffer
	h := newStageHarness(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&log, nil))
		c.OutcomeAttemptTimeout = 50 * time.Millisecond
	})
	h.audit.takeAway(status.Error(codes.Unavailable, "the trail is down"))
	h.store.down = errors.New("the database is down")
	heldRefusal(t, h)
	h.e.Close()
	sc := bufio.NewScanner(&log)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "lost at shutdown") && strings.Contains(sc.Text(), "rows=1") && strings.Contains(sc.Text(), "level=ERROR") {
			return
		}
	}
	t.Fatalf("no error line counting the lost rows:\n%s", log.String())
}

// TestAHeldRowTheTrailRefusesIsSpooledNotDropped (issue 31 item 3): a row
// held in memory (trail and store both down) that the trail, once back,
// refuses outright goes to the store's spool, where the flusher's tries
// and the dead letter take over; while the store will not take it either,
// it stays held. It is never dropped.
func TestAHeldRowTheTrailRefusesIsSpooledNotDropped(t *testing.T) {
	h := newStageHarness(t, func(c *Config) { c.OutcomeAttemptTimeout = 50 * time.Millisecond })
	h.audit.takeAway(status.Error(codes.Unavailable, "the trail is down"))
	h.store.down = errors.New("the database is down")
	inv := heldRefusal(t, h)

	// The trail is back but refuses the row; the store is still down.
	h.audit.takeAway(status.Error(codes.InvalidArgument, "the trail refuses this row"))
	if _, err := h.e.FlushSpool(t.Context()); err != nil {
		t.Fatalf("flush: %v", err)
	}
	h.e.heldMu.Lock()
	held := len(h.e.held)
	h.e.heldMu.Unlock()
	if held != 1 {
		t.Fatalf("with the store down the refused row must stay held: %d held", held)
	}

	h.store.mu.Lock()
	h.store.down = nil
	h.store.mu.Unlock()
	if _, err := h.e.FlushSpool(t.Context()); err != nil {
		t.Fatalf("flush: %v", err)
	}
	h.e.heldMu.Lock()
	held = len(h.e.held)
	h.e.heldMu.Unlock()
	h.store.mu.Lock()
	spooled := append([]SpooledRow(nil), h.store.spooled...)
	h.store.mu.Unlock()
	if held != 0 || len(spooled) != 1 || spooled[0].InvocationID != inv {
		t.Fatalf("the refused row: %d held, spooled %+v; want it in the store's spool", held, spooled)
	}
	h.e.Close()
}

// TestShutdownDoesNotWaitForAHungTrail (issue 31 item 4; the chaos test
// TestChaosHeldRowsSurviveShutdownWhileTheDatabaseHangs saw it in CI):
// with the trail hung, a flush in flight when Close begins is abandoned,
// its rows kept, and no further flush starts — Close does not wait out an
// attempt's deadline (a minute here), let alone several: it keeps the
// held rows in the held file and returns.
func TestShutdownDoesNotWaitForAHungTrail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "held")
	h := newStageHarness(t, func(c *Config) {
		c.HeldFile = path
		c.OutcomeAttemptTimeout = time.Minute
		c.SpoolInterval = 10 * time.Millisecond
	})
	h.audit.takeAway(status.Error(codes.Unavailable, "the trail is down"))
	h.store.down = errors.New("the database is down")
	heldRefusal(t, h)
	// Now the trail hangs, and each attempt may wait a minute.
	h.audit.takeAway(nil)
	h.audit.hang(true)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		h.audit.mu.Lock()
		asked := h.audit.unanswered
		h.audit.mu.Unlock()
		if asked > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no flush reached the hung trail")
		}
	}
	closed := make(chan struct{})
	go func() { h.e.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close waited for a flush stuck on the hung trail")
	}
	b, err := os.ReadFile(path)
	if err != nil || bytes.Count(b, []byte("\n")) != 1 {
		t.Fatalf("the held file after shutdown: %q, %v; want the one held row", b, err)
	}
}
