// Package inventory is a backend Mandate has never seen, built only on
// Mandate's exported packages (pkg/backend, pkg/receipt) and the protos
// `mandate proto export` writes: stock per SKU, reservations that
// stock.release undoes, and write-offs that a second person approves.
// Every effect runs at most once per invocation (pkg/receipt), and every
// handler knows who it serves (backend.CallerFrom). State is in memory;
// each tenant has its own stock.
package inventory
