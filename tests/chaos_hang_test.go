package tests

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

// TestChaosPostgresHungUnderLoad (issue 31, item 5): the one Postgres
// every service uses is frozen for 8 s (SIGSTOP: connections open, nothing
// answers) while clients create keyed expense reports and search. Every
// statement waits for a reply at most --database-reply-timeout (2 s here),
// so every call is answered — refused, retriable — within seconds instead
// of hanging until the client gives up: no client ever times out. After
// the database continues, what every run under faults must leave holds
// (finishAnswers: one report per key, no key held, every refusal in the
// trail, the chain intact), and a new keyed call runs within 10 s.
func TestChaosPostgresHungUnderLoad(t *testing.T) {
	pg := startOwnPostgres(t)
	tp := newTopology(t, topologyOptions{
		databaseURL: pg.url(),
		env:         []string{"MANDATE_DATABASE_REPLY_TIMEOUT=2s"},
		executorArgs: []string{"--default-deadline", "2s", "--lease", "1500ms",
			"--reconcile-after", "4s", "--reconcile-interval", "300ms"},
	})
	alice := tp.token("acme", "alice", "")
	l := startChaosLoad(tp, 4, 4)

	// Searches while the database hangs: each must be answered (a 10 s
	// client timeout means it hung), and the slowest answer is reported.
	var (
		mu       sync.Mutex
		searches int
		hung     int
		slowest  time.Duration
	)
	stopSearch := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stopSearch:
				return
			default:
			}
			start := time.Now()
			_, err := tp.tryRest("executor", http.MethodPost, "/v1/commands/ticket.search:execute", alice, `{"input":{"query":"charged twice"}}`)
			took := time.Since(start)
			mu.Lock()
			searches++
			if err != nil {
				hung++
			}
			slowest = max(slowest, took)
			mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
	}()

	time.Sleep(500 * time.Millisecond)
	thaw := pg.freeze(t)
	time.Sleep(8 * time.Second)
	thaw()
	continued := time.Now()
	close(stopSearch)
	wg.Wait()

	_, _, answers := l.finishAnswers(t)
	// A key refused while the database hung is retried by its client;
	// its definitive answer must come within 10 s of the database
	// continuing.
	retriedAfter := l.retriedAnswered.Sub(continued)
	if retriedAfter > 10*time.Second {
		t.Errorf("the last retried key got its answer %v after the database continued, want within 10 s", retriedAfter)
	}
	if n := answers["connection error"]; n != 0 {
		t.Errorf("%d keyed calls got no answer within the client's 10 s while the database hung", n)
	}
	if hung != 0 {
		t.Errorf("%d of %d searches got no answer within the client's 10 s while the database hung", hung, searches)
	}
	t.Logf("database frozen 8 s: %d searches, slowest answer %v, none hung; the last retried key answered %v after it continued; keyed refusals seen %v",
		searches, slowest.Round(time.Millisecond), retriedAfter.Round(time.Millisecond), answers)
}
