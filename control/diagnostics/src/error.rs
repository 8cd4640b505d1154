//! Errors of the diagnostics endpoints: the APIs' shared error answer.

pub use switchyard_api::http_error::ApiError;
