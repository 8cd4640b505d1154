//! End-to-end tests of the management API resources (work in progress).
