//! Wire types of the switchyard management APIs: every JSON body the control plane sends or
//! accepts, with the field names of the product specification, and their OpenAPI schemas
//! (utoipa). No I/O here; the control plane serialises these and the end-to-end tests read them.
#![forbid(unsafe_code)]

pub mod diagnostics;
pub mod server;

pub use server::*;
