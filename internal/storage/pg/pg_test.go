package pg_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

func TestClassify(t *testing.T) {
	closedPort := closedAddr(t)
	_, dialErr := pgx.Connect(context.Background(), "postgres://postgres@"+closedPort+"/postgres?sslmode=disable&connect_timeout=2")
	if dialErr == nil {
		t.Fatal("connecting to a closed port succeeded")
	}
	code := func(c string) error { return &pgconn.PgError{Code: c, Message: "secret detail"} }
	tests := []struct {
		name string
		err  error
		want pg.Kind
	}{
		{"nil", nil, pg.KindNone},
		{"unique", code("23505"), pg.KindUniqueViolation},
		{"unique wrapped", fmt.Errorf("insert: %w", code("23505")), pg.KindUniqueViolation},
		{"foreign key", code("23503"), pg.KindForeignKeyViolation},
		{"check", code("23514"), pg.KindCheckViolation},
		{"serialization", code("40001"), pg.KindSerializationFailure},
		{"deadlock", code("40P01"), pg.KindDeadlockDetected},
		{"connection failure 08006", code("08006"), pg.KindUnavailable},
		{"connection exception 08000", code("08000"), pg.KindUnavailable},
		{"admin shutdown", code("57P01"), pg.KindUnavailable},
		{"cannot connect now", code("57P03"), pg.KindUnavailable},
		{"too many connections", code("53300"), pg.KindUnavailable},
		{"disk full", code("53100"), pg.KindUnavailable},
		{"out of memory", code("53200"), pg.KindUnavailable},
		{"I/O error", code("58030"), pg.KindUnavailable},
		{"read-only transaction", code("25006"), pg.KindUnavailable},
		{"syntax error", code("42601"), pg.KindOther},
		{"message text is ignored", &pgconn.PgError{Code: "42P01", Message: "duplicate key value violates unique constraint"}, pg.KindOther},
		{"no rows", pgx.ErrNoRows, pg.KindNotFound},
		{"canceled", context.Canceled, pg.KindCanceled},
		{"deadline", fmt.Errorf("q: %w", context.DeadlineExceeded), pg.KindCanceled},
		{"dial failure", dialErr, pg.KindUnavailable},
		{"net op error", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("reset")}, pg.KindUnavailable},
		{"unexpected eof", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), pg.KindUnavailable},
		{"conn closed", pgconn.ErrConnClosed, pg.KindUnavailable},
		{"plain error", errors.New("boom"), pg.KindOther},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pg.Classify(tt.err); got != tt.want {
				t.Fatalf("Classify(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestWrap(t *testing.T) {
	driver := &pgconn.PgError{Code: "23505", Message: `duplicate key value violates unique constraint "users_pkey"`, Detail: "Key (id)=(alice) already exists."}
	tests := []struct {
		name     string
		err      error
		sentinel error
		msg      string
	}{
		{"unique → conflict", driver, pg.ErrConflict, "directory: put user: conflict"},
		{"no rows → not found", pgx.ErrNoRows, pg.ErrNotFound, "directory: put user: not found"},
		{"admin shutdown → unavailable", &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, pg.ErrUnavailable, "directory: put user: storage unavailable"},
		{"other → generic", &pgconn.PgError{Code: "42P01", Message: `relation "directory.users" does not exist`}, nil, "directory: put user: database error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := pg.Wrap("directory: put user", tt.err)
			if err.Error() != tt.msg {
				t.Fatalf("message = %q, want %q", err.Error(), tt.msg)
			}
			for _, s := range []error{pg.ErrConflict, pg.ErrNotFound, pg.ErrUnavailable} {
				if got, want := errors.Is(err, s), errors.Is(tt.sentinel, s) && tt.sentinel != nil; got != want {
					t.Errorf("errors.Is(err, %v) = %v, want %v", s, got, want)
				}
			}
			if !errors.Is(err, tt.err) {
				t.Error("the driver error is not reachable through errors.Is/As")
			}
			if again := pg.Wrap("outer", err); again != err { //nolint:errorlint // identity is the point
				t.Errorf("wrapping twice changed the error: %v", again)
			}
		})
	}
	if pg.Wrap("op", nil) != nil {
		t.Error("Wrap(nil) != nil")
	}
}

func TestOpenUnavailable(t *testing.T) {
	start := time.Now()
	_, err := pg.Open(context.Background(), "postgres://postgres:hunter2@"+closedAddr(t)+"/postgres?sslmode=disable",
		pg.Options{ConnectTimeout: time.Second, PingTimeout: 2 * time.Second})
	if !errors.Is(err, pg.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("message leaks connection details: %q", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Open took %v to give up", d)
	}
}

func TestOpenInvalidDSN(t *testing.T) {
	_, err := pg.Open(context.Background(), "postgres://u:hunter2@host:notaport/db", pg.Options{})
	if !errors.Is(err, pg.ErrInvalidDSN) || err.Error() != "pg: open: invalid database connection string" {
		t.Fatalf("err = %v, want ErrInvalidDSN", err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("message leaks the password: %q", err)
	}
}

func TestOpenDefaults(t *testing.T) {
	_, dsn := pgtest.NewURL(t)
	pool, err := pg.Open(context.Background(), dsn, pg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	cfg := pool.Config()
	if cfg.MaxConns != 10 || cfg.MaxConnLifetime != time.Hour || cfg.MaxConnIdleTime != 5*time.Minute {
		t.Errorf("defaults not applied: max=%d lifetime=%v idle=%v", cfg.MaxConns, cfg.MaxConnLifetime, cfg.MaxConnIdleTime)
	}
	var app string
	if err := pool.QueryRow(context.Background(), "SHOW application_name").Scan(&app); err != nil {
		t.Fatal(err)
	}
	if app != "mandate" {
		t.Errorf("application_name = %q, want mandate", app)
	}
}

// TestClassifyLive provokes real server errors so the SQLSTATE mapping is checked against
// PostgreSQL itself, not only against hand-built errors.
func TestClassifyLive(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	mustExec(t, pool, `CREATE TABLE parent (id int PRIMARY KEY, n int CHECK (n >= 0));
		CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent(id));
		INSERT INTO parent VALUES (1, 1);`)
	tests := []struct {
		name string
		sql  string
		want pg.Kind
	}{
		{"unique", "INSERT INTO parent VALUES (1, 1)", pg.KindUniqueViolation},
		{"foreign key", "INSERT INTO child VALUES (1, 42)", pg.KindForeignKeyViolation},
		{"check", "INSERT INTO parent VALUES (2, -1)", pg.KindCheckViolation},
		{"syntax", "SELEKT 1", pg.KindOther},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := pool.Exec(ctx, tt.sql)
			if got := pg.Classify(err); got != tt.want {
				t.Fatalf("Classify(%v) = %v, want %v", err, got, tt.want)
			}
		})
	}
	t.Run("no rows", func(t *testing.T) {
		var n int
		err := pool.QueryRow(ctx, "SELECT n FROM parent WHERE id = 99").Scan(&n)
		if got := pg.Classify(err); got != pg.KindNotFound {
			t.Fatalf("Classify(%v) = %v", err, got)
		}
	})
	t.Run("terminated backend", func(t *testing.T) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		var pid int
		if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		mustExec(t, pool, fmt.Sprintf("SELECT pg_terminate_backend(%d)", pid))
		_, err = conn.Exec(ctx, "SELECT 1")
		if got := pg.Classify(err); got != pg.KindUnavailable {
			t.Fatalf("Classify(%v) = %v, want unavailable", err, got)
		}
	})
}

// rows counts table's rows.
func rows(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestInBatch(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	mustExec(t, pool, "CREATE TABLE t (id int PRIMARY KEY)")
	count := func() int { return rows(t, pool, "t") }
	const fail40001 = `DO $$ BEGIN RAISE EXCEPTION 'try again' USING ERRCODE = '40001'; END $$`

	t.Run("all statements take effect", func(t *testing.T) {
		if err := pg.InBatch(ctx, pool, func(b *pgx.Batch) {
			b.Queue("INSERT INTO t VALUES (1)")
			b.Queue("INSERT INTO t VALUES (2)")
		}); err != nil {
			t.Fatal(err)
		}
		if n := count(); n != 2 {
			t.Fatalf("rows = %d, want 2", n)
		}
	})
	t.Run("one fails, none takes effect", func(t *testing.T) {
		err := pg.InBatch(ctx, pool, func(b *pgx.Batch) {
			b.Queue("INSERT INTO t VALUES (3)")
			b.Queue("INSERT INTO t VALUES (1)") // duplicate key
			b.Queue("INSERT INTO t VALUES (4)")
		})
		if pg.Classify(err) != pg.KindUniqueViolation {
			t.Fatalf("err = %v, want the unique violation unchanged", err)
		}
		if n := count(); n != 2 {
			t.Fatalf("rows = %d, want 2: the batch is one transaction", n)
		}
	})
	t.Run("a batch that fails after a lock holds none", func(t *testing.T) {
		// The lock the first statement took goes with the implicit transaction.
		_ = pg.InBatch(ctx, pool, func(b *pgx.Batch) {
			b.Queue("SELECT * FROM t WHERE id = 1 FOR UPDATE")
			b.Queue(fail40001)
		})
		var locked bool
		err := pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM t WHERE id = 1 FOR UPDATE NOWAIT)").Scan(&locked)
		if err != nil || locked {
			t.Fatalf("row still locked after the batch failed: %v", err)
		}
	})
	t.Run("retry on serialization failure", func(t *testing.T) {
		var calls int
		err := pg.InBatch(ctx, pool, func(b *pgx.Batch) {
			calls++
			b.Queue("INSERT INTO t VALUES (5)")
			if calls < 3 {
				b.Queue(fail40001)
			}
		}, pg.WithRetry(5))
		if err != nil || calls != 3 {
			t.Fatalf("err = %v after %d attempts, want success on the third", err, calls)
		}
		if n := count(); n != 3 {
			t.Fatalf("rows = %d, want 3 (one insert, the failed attempts rolled back)", n)
		}
	})
	t.Run("no retry by default", func(t *testing.T) {
		calls := 0
		err := pg.InBatch(ctx, pool, func(b *pgx.Batch) { calls++; b.Queue(fail40001) })
		if calls != 1 || pg.Classify(err) != pg.KindSerializationFailure {
			t.Fatalf("calls = %d, err = %v", calls, err)
		}
	})
}

func TestInTx(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	mustExec(t, pool, "CREATE TABLE t (id int PRIMARY KEY)")
	count := func() int { return rows(t, pool, "t") }
	insert := func(id int) func(pgx.Tx) error {
		return func(tx pgx.Tx) error { _, err := tx.Exec(ctx, "INSERT INTO t VALUES ($1)", id); return err }
	}

	t.Run("commit on nil", func(t *testing.T) {
		if err := pg.InTx(ctx, pool, insert(1)); err != nil {
			t.Fatal(err)
		}
		if n := count(); n != 1 {
			t.Fatalf("rows = %d, want 1", n)
		}
	})
	t.Run("rollback on error", func(t *testing.T) {
		domain := errors.New("domain says no")
		err := pg.InTx(ctx, pool, func(tx pgx.Tx) error {
			if err := insert(2)(tx); err != nil {
				return err
			}
			return domain
		})
		if err != domain { //nolint:errorlint // InTx must return the domain error itself, not a wrapper
			t.Fatalf("err = %v, want the domain error unchanged", err)
		}
		if n := count(); n != 1 {
			t.Fatalf("rows = %d, want 1 (rolled back)", n)
		}
	})
	t.Run("rollback on panic", func(t *testing.T) {
		func() {
			defer func() {
				if r := recover(); r != "kaboom" {
					t.Fatalf("recovered %v, want the original panic", r)
				}
			}()
			_ = pg.InTx(ctx, pool, func(tx pgx.Tx) error {
				_ = insert(3)(tx)
				panic("kaboom")
			})
		}()
		if n := count(); n != 1 {
			t.Fatalf("rows = %d, want 1 (rolled back)", n)
		}
		if st := pool.Stat(); st.AcquiredConns() != 0 {
			t.Fatalf("%d connections still acquired after the panic", st.AcquiredConns())
		}
	})
	t.Run("retry on serialization failure", func(t *testing.T) {
		var calls atomic.Int32
		err := pg.InTx(ctx, pool, func(tx pgx.Tx) error {
			if calls.Add(1) < 3 {
				return &pgconn.PgError{Code: "40001"}
			}
			return insert(4)(tx)
		}, pg.WithRetry(5))
		if err != nil || calls.Load() != 3 {
			t.Fatalf("err = %v after %d calls, want success on the third", err, calls.Load())
		}
		if n := count(); n != 2 {
			t.Fatalf("rows = %d, want 2", n)
		}
	})
	t.Run("retries are bounded", func(t *testing.T) {
		var calls atomic.Int32
		err := pg.InTx(ctx, pool, func(pgx.Tx) error {
			calls.Add(1)
			return &pgconn.PgError{Code: "40P01"}
		}, pg.WithRetry(3))
		if calls.Load() != 3 || !errors.Is(err, pg.ErrRetriesExhausted) || pg.Classify(err) != pg.KindDeadlockDetected {
			t.Fatalf("calls = %d, err = %v; want 3 calls, ErrRetriesExhausted wrapping the deadlock", calls.Load(), err)
		}
	})
	t.Run("no retry by default", func(t *testing.T) {
		var calls atomic.Int32
		err := pg.InTx(ctx, pool, func(pgx.Tx) error {
			calls.Add(1)
			return &pgconn.PgError{Code: "40001"}
		})
		if calls.Load() != 1 || pg.Classify(err) != pg.KindSerializationFailure {
			t.Fatalf("calls = %d, err = %v", calls.Load(), err)
		}
	})
	t.Run("non-retryable errors are not retried", func(t *testing.T) {
		var calls atomic.Int32
		err := pg.InTx(ctx, pool, func(tx pgx.Tx) error {
			calls.Add(1)
			return insert(1)(tx) // duplicate key
		}, pg.WithRetry(5))
		if calls.Load() != 1 || pg.Classify(err) != pg.KindUniqueViolation {
			t.Fatalf("calls = %d, err = %v", calls.Load(), err)
		}
	})
	t.Run("real serialization conflict is retried", func(t *testing.T) {
		mustExec(t, pool, "CREATE TABLE counter (n int); INSERT INTO counter VALUES (0)")
		// Two serializable transactions read then write the same row; the first attempt of the
		// second one is forced to overlap the first, so it must fail with 40001 and succeed on
		// retry.
		started := make(chan struct{})
		release := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- pg.InTx(ctx, pool, func(tx pgx.Tx) error {
				var n int
				if err := tx.QueryRow(ctx, "SELECT n FROM counter").Scan(&n); err != nil {
					return err
				}
				close(started)
				<-release
				_, err := tx.Exec(ctx, "UPDATE counter SET n = $1", n+1)
				return err
			}, pg.WithIsolation(pgx.Serializable))
		}()
		<-started
		var attempts atomic.Int32
		err := pg.InTx(ctx, pool, func(tx pgx.Tx) error {
			var n int
			if err := tx.QueryRow(ctx, "SELECT n FROM counter").Scan(&n); err != nil {
				return err
			}
			if attempts.Add(1) == 1 {
				close(release)
				if err := <-done; err != nil {
					return fmt.Errorf("first transaction: %w", err)
				}
			}
			_, err := tx.Exec(ctx, "UPDATE counter SET n = $1", n+1)
			return err
		}, pg.WithIsolation(pgx.Serializable), pg.WithRetry(3))
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := pool.QueryRow(ctx, "SELECT n FROM counter").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if attempts.Load() != 2 || n != 2 {
			t.Fatalf("attempts = %d, counter = %d; want 2 and 2 (no lost update)", attempts.Load(), n)
		}
	})
}

func mustExec(t *testing.T, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sql string) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// closedAddr returns a loopback address on which nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestOpenWaitsForAServerThatIsNotUpYet: with WaitFor, Open keeps pinging
// a server that refuses connections, and succeeds once it listens; on
// giving up, the message says why (connection refused) without the
// address or the password.
func TestOpenWaitsForAServerThatIsNotUpYet(t *testing.T) {
	addr := closedAddr(t)
	start := time.Now()
	_, err := pg.Open(context.Background(), "postgres://postgres:hunter2@"+addr+"/postgres?sslmode=disable",
		pg.Options{ConnectTimeout: time.Second, PingTimeout: time.Second, WaitFor: 700 * time.Millisecond})
	if !errors.Is(err, pg.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), " attempts in 700ms") {
		t.Fatalf("err = %v, want ErrUnavailable saying connection refused after the attempts", err)
	}
	if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("message leaks connection details: %q", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Open gave up after %v, want within about WaitFor", d)
	}

	// A proxy that starts forwarding to the real server only after a while
	// stands for a server that is still starting.
	_, dsn := pgtest.NewURL(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyAddr, target := lis.Addr().String(), u.Host
	_ = lis.Close() // refused until the proxy comes up
	go func() {
		time.Sleep(400 * time.Millisecond)
		l, err := net.Listen("tcp", proxyAddr)
		if err != nil {
			return
		}
		t.Cleanup(func() { _ = l.Close() })
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
			go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		}
	}()
	u.Host = proxyAddr
	pool, err := pg.Open(context.Background(), u.String(), pg.Options{ConnectTimeout: time.Second, PingTimeout: time.Second, WaitFor: 10 * time.Second})
	if err != nil {
		t.Fatalf("Open through a server that came up late: %v", err)
	}
	pool.Close()
}
