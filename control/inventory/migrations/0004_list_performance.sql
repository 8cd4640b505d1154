-- Item lists at 100,000 items per user (measured in bench/, scenario `inventory`).
-- lowStock: a partial index of only the low-stock rows in the default list order, so the count
-- and the first page read those rows alone (SQLite and PostgreSQL both take partial indexes).
CREATE INDEX items_user_low_stock ON items (user_id, created_at, id) WHERE quantity <= min_quantity;
-- search: name, description, manufacturer and barcode, lower-cased (Unicode, by the service)
-- into one column, so a search is one LIKE over one value instead of four LOWER() calls. Filled
-- by the service on every write and, for rows written before this migration, at start
-- (db::backfill_search_text). Its index is per engine (db::open): a covering (user_id,
-- search_text) B-tree on SQLite, a pg_trgm GIN index on PostgreSQL.
ALTER TABLE items ADD COLUMN search_text TEXT;
