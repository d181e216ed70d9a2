// Package migrate applies the embedded, numbered SQL migrations of Mandate's services. Each
// service owns one Postgres schema named after it and ships its migrations as a [Set]: files
// named NNNN_description.sql at the root of an fs.FS, applied in version order, each in its own
// transaction with search_path set to the service schema. The public.mandate_migrations table
// records every applied version with a SHA-256 checksum; [Run] skips what is recorded, refuses to
// continue when an applied file has changed, and holds a session advisory lock for the whole run
// so that several processes starting at once apply every migration exactly once.
package migrate
