-- The policy directory: tenants and, scoped to each, roles, users and agents. Every key starts
-- with tenant_id and every reference carries it, so no row can point into another tenant.

CREATE TABLE tenants (
	id           text PRIMARY KEY CHECK (id <> ''),
	display_name text NOT NULL DEFAULT '',
	features     text[] NOT NULL DEFAULT '{}'
);

CREATE TABLE roles (
	tenant_id   text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
	name        text NOT NULL CHECK (name <> ''),
	permissions text[] NOT NULL DEFAULT '{}',
	PRIMARY KEY (tenant_id, name)
);

CREATE TABLE users (
	tenant_id text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
	id        text NOT NULL CHECK (id <> ''),
	org       text NOT NULL DEFAULT '',
	disabled  boolean NOT NULL DEFAULT false,
	PRIMARY KEY (tenant_id, id)
);

CREATE TABLE user_roles (
	tenant_id text NOT NULL,
	user_id   text NOT NULL,
	role      text NOT NULL,
	PRIMARY KEY (tenant_id, user_id, role),
	FOREIGN KEY (tenant_id, user_id) REFERENCES users (tenant_id, id) ON DELETE CASCADE,
	FOREIGN KEY (tenant_id, role) REFERENCES roles (tenant_id, name) ON DELETE CASCADE
);
CREATE INDEX user_roles_role ON user_roles (tenant_id, role);

CREATE TABLE agents (
	tenant_id text NOT NULL,
	id        text NOT NULL CHECK (id <> ''),
	user_id   text NOT NULL,
	disabled  boolean NOT NULL DEFAULT false,
	PRIMARY KEY (tenant_id, id),
	FOREIGN KEY (tenant_id, user_id) REFERENCES users (tenant_id, id)
);
CREATE INDEX agents_user ON agents (tenant_id, user_id);
