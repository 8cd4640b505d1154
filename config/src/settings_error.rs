//! The error of a backend's settings object (`wireguard:`, `openvpn:`, a provider's `config:`):
//! which key, relative to that object, and what is wrong with it — so validation can name the
//! full path (`backends[2].openvpn.remote`).

/// A settings problem: the key (relative to the settings object) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct SettingsError {
    pub key: String,
    pub message: String,
}

pub(crate) fn err(key: &str, message: impl Into<String>) -> SettingsError {
    SettingsError {
        key: key.to_owned(),
        message: message.into(),
    }
}
