-- Mesh trust (issue 28): per-network enrollment keys and per-peer credentials.
-- Secrets are stored only as the hex SHA-256 of their 256 random bits (a lookup by hash says
-- nothing about a valid secret through its timing, and the database never holds a usable one).

-- The SHA-256 of the peer's credential (`peer_token` of its registration); NULL for peers
-- registered before credentials existed (they can re-register with the admin token only).
ALTER TABLE mesh_peers ADD COLUMN token_hash TEXT;
CREATE UNIQUE INDEX mesh_peers_token ON mesh_peers (token_hash);

CREATE TABLE mesh_enrollment_keys (
    id TEXT PRIMARY KEY,
    network_id TEXT NOT NULL REFERENCES mesh_networks (id) ON DELETE CASCADE,
    key_hash TEXT NOT NULL UNIQUE,
    -- 1: any number of registrations until it expires; 0: consumed (deleted) by the first.
    reusable BIGINT NOT NULL,
    expires_at TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE INDEX mesh_enrollment_keys_network ON mesh_enrollment_keys (network_id);
