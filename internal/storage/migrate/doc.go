// Package migrate declares the embedded, numbered SQL migrations of Mandate's services. Each
// service owns one Postgres schema named after it and ships its migrations as a [Set]: files
// named NNNN_description.sql at the root of an fs.FS, applied in version order, each in its own
// transaction with search_path set to the service schema.
//
// Applying them is the job of internal/storage/migrate/migrator (with goose), a package of its
// own: the services never migrate at start-up (`mandate migrate` does, and the tests), so a
// service's own binary links the migrations' files and this declaration, not goose and
// database/sql's migration machinery (issue #13: each idle service maps less of its binary).
package migrate
