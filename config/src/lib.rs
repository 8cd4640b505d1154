//! Configuration model for `switchyard server` (and later the other commands).
//!
//! Loading is: read file → expand `${NAME}` → parse YAML strictly (unknown keys are errors with
//! their path) → fill defaults → [`validate`] returns every problem. No I/O beyond reading the file.
#![forbid(unsafe_code)]

pub mod model;
pub mod units;

pub use model::*;
pub use units::{Duration, Size};
