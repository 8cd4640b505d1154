//! Wire types of the switchyard management APIs: every JSON body the control plane sends or
//! accepts, with the field names of the product specification, and their OpenAPI schemas
//! (utoipa); [`client`] holds the client API's own bodies. No I/O here; the control plane
//! serialises these and the end-to-end tests read them. With the `axum` feature, [`http_error`]
//! is the error answer every API shares.
#![forbid(unsafe_code)]

pub mod client;
pub mod diagnostics;
#[cfg(feature = "axum")]
pub mod http_error;
pub mod mesh;
pub mod server;

pub use mesh::*;
pub use server::*;
