-- Portable schema: the same file runs on SQLite and PostgreSQL (TEXT ids and ISO-8601 UTC
-- timestamps that sort lexically, BIGINT counts, DOUBLE PRECISION prices).
CREATE TABLE settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE users (
    id TEXT PRIMARY KEY,
    name TEXT,
    email TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    role TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE categories (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    color TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (user_id, name)
);

CREATE TABLE locations (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    description TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (user_id, name)
);

CREATE TABLE items (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    description TEXT,
    manufacturer TEXT,
    barcode TEXT,
    buy_price DOUBLE PRECISION NOT NULL DEFAULT 0,
    buy_date TEXT NOT NULL,
    quantity BIGINT NOT NULL DEFAULT 1,
    min_quantity BIGINT NOT NULL DEFAULT 0,
    category_id TEXT REFERENCES categories(id) ON DELETE SET NULL,
    location_id TEXT REFERENCES locations(id) ON DELETE SET NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (user_id, barcode)
);

-- The list endpoint filters by owner and sorts by one whitelisted column (id breaks ties).
CREATE INDEX items_user_created ON items (user_id, created_at, id);
CREATE INDEX items_user_updated ON items (user_id, updated_at, id);
CREATE INDEX items_user_name ON items (user_id, name, id);
CREATE INDEX items_user_quantity ON items (user_id, quantity, id);
CREATE INDEX items_user_category ON items (user_id, category_id);
CREATE INDEX items_user_location ON items (user_id, location_id);
CREATE INDEX items_category ON items (category_id);
CREATE INDEX items_location ON items (location_id);
CREATE INDEX categories_user ON categories (user_id, name);
CREATE INDEX locations_user ON locations (user_id, name);
