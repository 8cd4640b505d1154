-- Item images: metadata here, bytes in DATA_DIR/images/<id> (type sniffed from the bytes).
CREATE TABLE images (
    id TEXT PRIMARY KEY,
    item_id TEXT NOT NULL REFERENCES items(id) ON DELETE CASCADE,
    content_type TEXT NOT NULL,
    size BIGINT NOT NULL,
    filename TEXT,
    created_at TEXT NOT NULL
);

CREATE INDEX images_item ON images (item_id, created_at);
