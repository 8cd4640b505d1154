-- The mesh registry: networks, their peers and the peers' address leases.
-- SQL both SQLite and PostgreSQL accept (see switchyard-sqlstore); times are ISO-8601 UTC text.

CREATE TABLE mesh_networks (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    cidr TEXT NOT NULL,
    created TEXT NOT NULL
);

CREATE TABLE mesh_peers (
    network_id TEXT NOT NULL REFERENCES mesh_networks (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    name TEXT NOT NULL,
    public_key TEXT NOT NULL,
    -- JSON array of endpoints, JSON object.
    endpoints TEXT NOT NULL,
    metadata TEXT NOT NULL,
    -- The leased address; NULL once the lease expired (the peer must register again).
    virtual_ip TEXT,
    -- The address last leased, offered again when the peer comes back and it is still free.
    previous_ip TEXT,
    lease_expires TEXT NOT NULL,
    last_seen TEXT NOT NULL,
    joined_at TEXT NOT NULL,
    -- As the peer reports them in heartbeats.
    connection_type TEXT,
    latency DOUBLE PRECISION,
    bytes_sent BIGINT NOT NULL DEFAULT 0,
    bytes_received BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (network_id, id)
);

-- Never two peers on one address of a network, whatever registers at the same time
-- (NULLs, the expired leases, do not collide).
CREATE UNIQUE INDEX mesh_peers_address ON mesh_peers (network_id, virtual_ip);
CREATE INDEX mesh_peers_lease_expires ON mesh_peers (lease_expires);
