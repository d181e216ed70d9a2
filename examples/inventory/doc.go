// Package inventory is a backend Mandate has never seen, built only on
// Mandate's exported packages (pkg/backend, pkg/receipt) and the protos
// `mandate proto export` writes: stock per SKU, reservations that
// stock.release undoes, and write-offs that a second person approves. Its
// declaration also caps what an agent reserves (a budget of 50 units of a
// SKU an hour) and denies an agent's write-off with a reason under 10
// characters (a CEL condition); the executor enforces both.
// Every effect runs at most once per invocation (pkg/receipt), and every
// handler knows who it serves (backend.CallerFrom). State is in memory;
// each tenant has its own stock.
package inventory
