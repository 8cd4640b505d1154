//! Data plane.
