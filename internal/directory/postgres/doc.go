// Package postgres is the PostgreSQL directory Store. Its tables live in the directory schema
// and are created by the embedded [Migrations]. Every key and every foreign key starts with the
// tenant id, so the database itself refuses a reference from one tenant into another. Each
// Update takes a transaction-scoped advisory lock (directory writes are rare and serialising
// them keeps Apply's diff exact), and issues NOTIFY mandate_directory with the tenant id for
// every tenant it wrote, inside the same transaction: listeners hear about a change only if it
// committed. Watch listens on a dedicated connection, reconnects with backoff when it breaks,
// and then announces a change to all tenants because notifications may have been missed.
// Changes made through this very Store are announced in-process before Update returns, and
// the listener drops their NOTIFY echo (matched by sending backend and tenant) so that local
// caches are not flushed twice.
package postgres
