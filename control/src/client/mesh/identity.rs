//! The mesh peer's identity on disk: its X25519 static key (generated on the first start,
//! `mesh.key` in the data directory, mode 0600, reused afterwards) and the UDP port it picked
//! when `mesh.connection.listen_port` is 0 (`mesh.port`), so its endpoints stay the same
//! across restarts; and the peer's registry credential (`mesh.peer-token`, 0600), which the
//! registry hands out at the first registration (issue 28).

use base64::Engine as _;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use x25519_dalek::{PublicKey, StaticSecret};

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("mesh key file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "mesh key file {path} does not hold a base64 32-byte key; remove it to make a new one"
    )]
    Invalid { path: String },
}

pub struct Identity {
    pub private: [u8; 32],
    pub public: [u8; 32],
}

impl Identity {
    pub fn public_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.public)
    }
}

fn key_path(data_dir: &Path) -> PathBuf {
    data_dir.join("mesh.key")
}

fn port_path(data_dir: &Path) -> PathBuf {
    data_dir.join("mesh.port")
}

/// The key of `data_dir/mesh.key`, generated and saved (0600) when the file is missing.
pub fn load_or_create(data_dir: &Path) -> Result<Identity, IdentityError> {
    let path = key_path(data_dir);
    let shown = path.display().to_string();
    let private = match std::fs::read_to_string(&path) {
        Ok(text) => base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
            .ok_or(IdentityError::Invalid { path: shown })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let io = |source| IdentityError::Io {
                path: shown.clone(),
                source,
            };
            let mut bytes = [0u8; 32];
            getrandom::fill(&mut bytes).map_err(|e| {
                io(std::io::Error::other(format!(
                    "no randomness for a key: {e}"
                )))
            })?;
            std::fs::create_dir_all(data_dir).map_err(io)?;
            // create_new: two starts at once never overwrite each other's key
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(io)?;
            f.write_all(
                base64::engine::general_purpose::STANDARD
                    .encode(bytes)
                    .as_bytes(),
            )
            .map_err(io)?;
            tracing::info!(path = %shown, "mesh key generated");
            bytes
        }
        Err(source) => {
            return Err(IdentityError::Io {
                path: shown,
                source,
            })
        }
    };
    let public = PublicKey::from(&StaticSecret::from(private)).to_bytes();
    Ok(Identity { private, public })
}

pub fn peer_token_path(data_dir: &Path) -> PathBuf {
    data_dir.join("mesh.peer-token")
}

/// The registry credential saved at an earlier registration, if any.
pub fn saved_peer_token(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let token = text.trim();
    (!token.is_empty()).then(|| token.to_owned())
}

/// Saves the registry credential (mode 0600, written beside and renamed into place, so a
/// crash leaves the old credential or the new one, never a torn file).
pub fn save_peer_token(path: &Path, token: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let partial = path.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)?;
    f.write_all(token.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&partial, path)
}

/// The port picked on an earlier start (0 when none).
pub fn saved_port(data_dir: &Path) -> u16 {
    std::fs::read_to_string(port_path(data_dir))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

pub fn save_port(data_dir: &Path, port: u16) {
    if let Err(e) = std::fs::write(port_path(data_dir), port.to_string()) {
        tracing::warn!(error = %e, "cannot save the mesh port: the next start may pick another");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn the_key_is_made_once_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        let mode = std::fs::metadata(key_path(dir.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = load_or_create(dir.path()).unwrap();
        assert_eq!(first.private, again.private);
        assert_eq!(first.public_base64(), again.public_base64());
        std::fs::write(key_path(dir.path()), "not a key").unwrap();
        assert!(matches!(
            load_or_create(dir.path()),
            Err(IdentityError::Invalid { .. })
        ));
        assert_eq!(saved_port(dir.path()), 0);
        save_port(dir.path(), 41000);
        assert_eq!(saved_port(dir.path()), 41000);
    }

    #[test]
    fn the_peer_token_is_kept_private_and_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = peer_token_path(&dir.path().join("sub"));
        assert_eq!(saved_peer_token(&path), None);
        save_peer_token(&path, "sypt_1").unwrap();
        save_peer_token(&path, "sypt_2").unwrap();
        assert_eq!(saved_peer_token(&path).as_deref(), Some("sypt_2"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
