//! Validation of a server configuration for this host: the config crate's checks (plain,
//! host-independent) plus what this host lacks to serve it — an authentication mode whose
//! library is loaded at run time and missing here (the problem names the package). Every path
//! that accepts a configuration (`config validate`, start-up, the API's validate and save,
//! reloads) validates through here.

use switchyard_config::{Problem, ServerConfig};

/// Every problem of `cfg` on this host; empty when it can be served.
pub fn validate(cfg: &ServerConfig) -> Vec<Problem> {
    let mut problems = switchyard_config::validate(cfg);
    problems.extend(
        switchyard_proxy_auth::host_problems(&cfg.auth)
            .into_iter()
            .map(|(field, message)| Problem {
                section: "auth".into(),
                field: field.into(),
                message,
            }),
    );
    problems
}
