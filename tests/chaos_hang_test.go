package tests

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freeze stops every process of the cluster with SIGSTOP — the postmaster
// and each backend it forked — as a hung database host would be: the
// connections stay open and nothing answers. thaw continues them.
func (pg *ownPostgres) freeze(t *testing.T) (thaw func()) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(pg.dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(raw), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	pids := []int{postmaster}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, so read after ")".
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 {
			if f := strings.Fields(string(stat)[i+1:]); len(f) > 1 && f[1] == strconv.Itoa(postmaster) {
				pids = append(pids, pid)
			}
		}
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	thawed := false
	thaw = func() {
		if thawed {
			return
		}
		thawed = true
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)
	return thaw
}

// TestHungDatabaseMakesServicesNotReady (issue 31, item 5): the one
// Postgres every service uses is frozen (SIGSTOP of the postmaster and its
// backends: connections open, nothing answers). Within a couple of seconds
// every service on it says not-ready on /healthz — answered at once, not
// hanging with the database — while /livez says the processes run, so an
// orchestrator takes them out of rotation instead of restarting them. Once
// the database is continued they are ready again, and a call runs.
func TestHungDatabaseMakesServicesNotReady(t *testing.T) {
	pg := startOwnPostgres(t)
	tp := newTopology(t, topologyOptions{databaseURL: pg.url()})
	services := []string{"audit", "catalog", "confirm", "executor"}
	probe := func(name, path string) int {
		c := &http.Client{Timeout: time.Second}
		resp, err := c.Get("http://" + tp.addr[name].http + path)
		if err != nil {
			return 0 // no answer within a second: a hung health check
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	waitAll := func(what string, want int, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for _, name := range services {
			for probe(name, "/healthz") != want {
				if time.Since(start) > within {
					t.Fatalf("%s: %s's /healthz did not answer %d within %v", what, name, want, within)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		return time.Since(start)
	}
	waitAll("before", http.StatusOK, 10*time.Second)

	thaw := pg.freeze(t)
	frozen := time.Now()
	took := waitAll("database frozen", http.StatusServiceUnavailable, 4*time.Second)
	t.Logf("every service not-ready %v after the database froze", took.Round(10*time.Millisecond))
	for _, name := range services {
		if code := probe(name, "/livez"); code != http.StatusOK {
			t.Errorf("%s's /livez with the database frozen: %d, want 200", name, code)
		}
	}
	time.Sleep(time.Until(frozen.Add(3 * time.Second)))
	thaw()
	took = waitAll("database continued", http.StatusOK, 10*time.Second)
	t.Logf("every service ready again %v after the database continued", took.Round(10*time.Millisecond))
	alice := tp.token("acme", "alice", "")
	if resp, err := tp.tryRest("executor", http.MethodPost, "/v1/commands/ticket.search:execute", alice, `{"input":{"query":"charged twice"}}`); err != nil || resp.status != http.StatusOK {
		t.Fatalf("a call after the database came back: %v %+v", err, resp)
	}
}
