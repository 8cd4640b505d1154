-- Server-side session records: the cookie carries the id (`sid`); sign-out deletes the row, so a
-- copied cookie stops working. `expires_at` is the absolute expiry (rows past it are purged).
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL
);

CREATE INDEX sessions_expires ON sessions (expires_at);
