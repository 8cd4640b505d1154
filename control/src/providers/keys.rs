//! WireGuard key pairs for providers that register the client's key (Mullvad, PIA), and the
//! Mullvad key file: the key pair and the address the account assigned to it, kept in a 0600
//! file under the data directory so a restart reuses the registered device instead of adding
//! another one.

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::Digest;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A fresh X25519 key pair as base64 (private, public).
pub fn generate() -> Result<(String, String), String> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| format!("no randomness for a key: {e}"))?;
    let private = x25519_dalek::StaticSecret::from(secret);
    let public = x25519_dalek::PublicKey::from(&private);
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok((
        b64.encode(private.to_bytes()),
        b64.encode(public.as_bytes()),
    ))
}

/// What the Mullvad key file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredDevice {
    /// SHA-256 of the account number: another account means another device.
    pub account_sha256: String,
    pub private_key: String,
    pub public_key: String,
    pub ipv4_address: String,
    #[serde(default)]
    pub ipv6_address: Option<String>,
    #[serde(default)]
    pub device_id: String,
}

pub fn account_hash(account: &str) -> String {
    sha2::Sha256::digest(account.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `<data_dir>/providers/<backend>.mullvad.json`
pub fn device_file(data_dir: &Path, backend: &str) -> PathBuf {
    let safe: String = backend
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    data_dir
        .join("providers")
        .join(format!("{safe}.mullvad.json"))
}

/// The stored device for `account`, if the file exists and belongs to it.
pub fn load(path: &Path, account: &str) -> Option<StoredDevice> {
    let text = std::fs::read(path).ok()?;
    let stored: StoredDevice = serde_json::from_slice(&text).ok()?;
    (stored.account_sha256 == account_hash(account)).then_some(stored)
}

/// Writes the file with mode 0600 (its directory 0700), replacing it atomically.
pub fn store(path: &Path, device: &StoredDevice) -> Result<(), String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = path.parent().ok_or("the key file has no directory")?;
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_vec_pretty(device).map_err(|e| e.to_string())?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    f.write_all(&text)
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("renaming to {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn generated_keys_are_a_pair() {
        let (private, public) = generate().expect("key");
        let b64 = base64::engine::general_purpose::STANDARD;
        let secret: [u8; 32] = b64.decode(private).expect("b64").try_into().expect("32");
        let derived = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(secret));
        assert_eq!(b64.encode(derived.as_bytes()), public);
        assert_ne!(
            generate().expect("key").0,
            b64.encode(secret),
            "fresh each time"
        );
    }

    #[test]
    fn the_device_file_is_private_and_bound_to_the_account() {
        let dir = tempfile::tempdir().expect("dir");
        let path = device_file(dir.path(), "m/1");
        assert!(path.ends_with("providers/m_1.mullvad.json"));
        let device = StoredDevice {
            account_sha256: account_hash("1234567890123456"),
            private_key: "a".into(),
            public_key: "b".into(),
            ipv4_address: "10.64.0.2/32".into(),
            ipv6_address: None,
            device_id: "d".into(),
        };
        store(&path, &device).expect("stored");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load(&path, "1234567890123456"), Some(device));
        assert_eq!(load(&path, "6543210987654321"), None);
    }
}
