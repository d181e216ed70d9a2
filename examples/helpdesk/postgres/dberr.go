package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/examples/helpdesk"
)

// SQLSTATE codes the store tells apart (PostgreSQL appendix A); never the message text.
const (
	sqlUniqueViolation      = "23505"
	sqlForeignKeyViolation  = "23503"
	sqlCheckViolation       = "23514"
	sqlSerializationFailure = "40001"
	sqlDeadlockDetected     = "40P01"
	sqlAdminShutdown        = "57P01"
	sqlCrashShutdown        = "57P02"
	sqlCannotConnectNow     = "57P03"
	sqlTooManyConnections   = "53300"
	// Class 53, insufficient resources (disk full 53100, out of memory 53200, too many
	// connections 53300); an I/O error (58030); a read-only transaction (25006, a standby
	// that has not been promoted yet): the database cannot take the write now, and the
	// transaction rolled back — nothing was changed, a retry may succeed.
	sqlClassInsufficientResources = "53"
	sqlIOError                    = "58030"
	sqlReadOnlyTransaction        = "25006"
)

// classOf returns the helpdesk sentinel of a driver error: ErrNotFound for no rows, ErrConflict
// for a violated constraint or a transaction that collided with another, ErrUnavailable for a
// database that cannot be reached or went away; nil for anything else.
func classOf(err error) error {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		switch c := pgErr.Code; {
		case c == sqlUniqueViolation, c == sqlForeignKeyViolation, c == sqlCheckViolation,
			c == sqlSerializationFailure, c == sqlDeadlockDetected:
			return helpdesk.ErrConflict
		case c == sqlAdminShutdown, c == sqlCrashShutdown, c == sqlCannotConnectNow, c == sqlTooManyConnections,
			strings.HasPrefix(c, sqlClassInsufficientResources), c == sqlIOError, c == sqlReadOnlyTransaction,
			strings.HasPrefix(c, "08"): // class 08: connection exception
			return helpdesk.ErrUnavailable
		}
		return nil
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return helpdesk.ErrNotFound
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil
	case isConnectionError(err):
		return helpdesk.ErrUnavailable
	}
	return nil
}

func isConnectionError(err error) bool {
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return true
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// isForeignKeyViolation reports SQLSTATE 23503 anywhere in err's chain.
func isForeignKeyViolation(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == sqlForeignKeyViolation
}

// dbError is a driver error of operation op: its message names the operation and its class
// only, so it is safe to log anywhere and never carries the driver's text (which may quote
// data); Unwrap yields the helpdesk sentinel, for errors.Is, and the driver's error, for logs.
type dbError struct {
	op    string
	class error // a helpdesk sentinel, or nil
	err   error
}

func (e *dbError) Error() string {
	switch {
	case e.class != nil:
		return "helpdesk: " + e.op + ": " + strings.TrimPrefix(e.class.Error(), "helpdesk: ")
	case errors.Is(e.err, context.Canceled), errors.Is(e.err, context.DeadlineExceeded):
		return "helpdesk: " + e.op + ": canceled"
	}
	return "helpdesk: " + e.op + ": database error"
}

func (e *dbError) Unwrap() []error {
	if e.class != nil {
		return []error{e.class, e.err}
	}
	return []error{e.err}
}

// wrap classifies a driver error and tags it with op; nil stays nil, and an error that already
// matches a helpdesk sentinel (or is one of the domain's) is returned unchanged.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*dbError](err); ok {
		return err
	}
	return &dbError{op: op, class: classOf(err), err: err}
}

// tag adds the helpdesk sentinel of a driver error in err's chain (one of pkg/receipt's store,
// say), and returns every other error — the receipt package's own among them — unchanged.
func tag(op string, err error) error {
	switch {
	case err == nil, errors.Is(err, helpdesk.ErrNotFound), errors.Is(err, helpdesk.ErrConflict), errors.Is(err, helpdesk.ErrUnavailable):
		return err
	case classOf(err) != nil:
		return wrap(op, err)
	}
	return err
}

// inTx runs fn in one READ COMMITTED transaction: committed when fn returns nil, rolled back
// when it returns an error or panics. fn's errors come back unchanged, so the domain's refusals
// survive; a failure to begin or commit is classified. It never retries: fn may have called the
// payment gateway.
func inTx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) (err error) {
	t, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return wrap("begin", err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		// Roll back even when ctx has ended; a failed rollback closes the connection, which
		// the server takes as a rollback too.
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = t.Rollback(rbCtx)
	}()
	if err := fn(t); err != nil {
		return err
	}
	if err := t.Commit(ctx); err != nil {
		return wrap("commit", err)
	}
	committed = true
	return nil
}
