//! End-to-end tests of the management API: WebSocket, origin rules, sessions, metrics (work in progress).
