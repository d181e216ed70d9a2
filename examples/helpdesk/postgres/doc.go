// Package postgres is the PostgreSQL helpdesk Store. Its tables live in the helpdesk schema and
// are created by the embedded [Migrations]: tickets, refunds, expense_reports (lines and labels
// as jsonb), erasures (receipts of customer erasures), sequences (per-tenant id counters) and
// idempotency_keys; every primary key starts with the tenant.
//
// InTx runs one READ COMMITTED transaction and never retries it, because the callback may have
// called the payment gateway. ...ForUpdate reads take row locks (SELECT … FOR UPDATE), so
// concurrent refunds of one ticket and concurrent transitions of one report run one after the
// other. NextID is an upsert on the counter row, which serialises id allocation per tenant and
// rolls back with the transaction. ClaimKey is INSERT … ON CONFLICT DO NOTHING: a concurrent
// claim of the same key waits on the first one's transaction and then sees its committed row.
// Driver errors are classified by SQLSTATE (never by message text) into the helpdesk sentinels and
// never reach clients.
package postgres
