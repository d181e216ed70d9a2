package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/mandate-dev/mandate/internal/app"
)

const (
	// childMode runs `mandate <args>` in this process, next to a stats
	// endpoint.
	childMode = "__child"
	// referenceMode runs the ungoverned reference server.
	referenceMode = "__reference"
)

// stats is what a child reports about itself: cumulative counters, so the
// parent takes differences around a measured run.
type stats struct {
	// Mallocs is runtime.MemStats.Mallocs: heap objects allocated so far.
	Mallocs uint64 `json:"mallocs"`
	// CPU is user plus system time of the whole process (getrusage).
	CPU time.Duration `json:"cpu_ns"`
	// HeapInuse is runtime.MemStats.HeapInuse, in bytes.
	HeapInuse uint64 `json:"heap_inuse"`
	// RSSKiB is the resident set from /proc/self/statm (0 where absent).
	RSSKiB int64 `json:"rss_kib"`
}

func readStats() stats {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return stats{
		Mallocs:   ms.Mallocs,
		CPU:       time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		HeapInuse: ms.HeapInuse,
		RSSKiB:    rssKiB(),
	}
}

func rssKiB() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, resident int64
	if _, err := fmt.Sscan(string(b), &size, &resident); err != nil {
		return 0
	}
	return resident * int64(os.Getpagesize()) / 1024
}

// profileMemRate is the heap profile's sampling rate under -profile: a
// sample every 4 KiB allocated rather than 512 KiB, so that a few thousand
// calls give allocation profiles fine enough to read per call.
const profileMemRate = 4096

// serveStats answers GET /stats on addr until ctx ends.
func serveStats(ctx context.Context, addr string) (func(), error) {
	if os.Getenv(profileDirEnv) != "" {
		runtime.MemProfileRate = profileMemRate
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(readStats())
	})
	mux.HandleFunc("POST /profile/start", startProfile)
	mux.HandleFunc("POST /profile/stop", stopProfile)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}

// profiling is the CPU profile being written, if any (-profile).
var profiling struct {
	mu   sync.Mutex
	file *os.File
	// allocs is the file the heap profile goes to when the CPU profile
	// stops; the one taken when it started is allocs+".base".
	allocs string
}

// profileDirEnv names the directory (-profile) children write profiles to.
const profileDirEnv = "MANDATE_BENCH_PROFILE_DIR"

// startProfile starts a CPU profile into the file ?name= (a base name) of
// the directory the parent named in profileDirEnv, and writes a heap
// profile next to it (name.allocs.base) that the one written when it stops
// (name.allocs) is read against:
//
//	go tool pprof -sample_index=alloc_objects -base name.allocs.base name.allocs
func startProfile(w http.ResponseWriter, r *http.Request) {
	profiling.mu.Lock()
	defer profiling.mu.Unlock()
	dir := os.Getenv(profileDirEnv)
	name := r.URL.Query().Get("name")
	if dir == "" || name == "" || name != filepath.Base(name) {
		http.Error(w, "no profile directory, or not a file name", http.StatusBadRequest)
		return
	}
	if profiling.file != nil {
		http.Error(w, "already profiling", http.StatusConflict)
		return
	}
	f, err := os.Create(filepath.Join(dir, filepath.Base(name))) //nolint:gosec // G703: a base name inside the directory the parent chose.
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	profiling.file = f
	profiling.allocs = filepath.Join(dir, filepath.Base(name)) + ".allocs"
	if err := writeHeapProfile(profiling.allocs + ".base"); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// writeHeapProfile writes the process's heap profile, allocations since
// it started included, to file.
func writeHeapProfile(file string) error {
	f, err := os.Create(file) //nolint:gosec // G304: a file of the directory the parent chose.
	if err != nil {
		return err
	}
	return errors.Join(pprof.Lookup("allocs").WriteTo(f, 0), f.Close())
}

func stopProfile(w http.ResponseWriter, _ *http.Request) {
	profiling.mu.Lock()
	defer profiling.mu.Unlock()
	if profiling.file == nil {
		http.Error(w, "not profiling", http.StatusConflict)
		return
	}
	pprof.StopCPUProfile()
	if err := errors.Join(profiling.file.Close(), writeHeapProfile(profiling.allocs)); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
	profiling.file = nil
}

// runChild runs one `mandate` subcommand in this process, as the mandate
// binary would, and reports its stats on statsAddr.
func runChild(ctx context.Context, statsAddr string, args []string) error {
	stop, err := serveStats(ctx, statsAddr)
	if err != nil {
		return err
	}
	defer stop()
	if code := app.Run(ctx, args, app.IO{Stdout: os.Stdout, Stderr: os.Stderr, Env: os.LookupEnv}); code != 0 {
		return fmt.Errorf("mandate %v exited with %d", args, code)
	}
	return nil
}
