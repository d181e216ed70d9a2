// Package pg holds the Postgres plumbing that every Mandate service shares: opening a pgx pool
// with production defaults ([Open]), closure transactions with bounded retries ([InTx]), and the
// translation of driver errors into a small set of kinds ([Classify]) and sentinel errors
// ([ErrNotFound], [ErrConflict], [ErrUnavailable]). Errors are classified by SQLSTATE and by
// driver error types, never by message text, and the messages produced by [Wrap] never carry
// the driver's text, so they are safe to surface; the driver error stays reachable through
// errors.As for logging.
package pg
