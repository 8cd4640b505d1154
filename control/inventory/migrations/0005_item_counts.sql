-- Exact item count per owner, so an unfiltered list reports `pagination.total` from one row
-- instead of counting 100,000 index entries per request (on PostgreSQL a COUNT(*) also has to
-- visit the heap until VACUUM has set the visibility map). The service changes `n` in the same
-- transaction as every item insert and delete (db::add_item_count); items never change owner
-- and users are never deleted, so those are the only writes that move it. Filtered lists still
-- count the matching rows.
CREATE TABLE item_counts (
    user_id TEXT PRIMARY KEY REFERENCES users(id) ON DELETE CASCADE,
    n BIGINT NOT NULL
);

INSERT INTO item_counts (user_id, n) SELECT user_id, COUNT(*) FROM items GROUP BY user_id;
