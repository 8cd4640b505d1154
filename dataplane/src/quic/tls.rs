//! TLS 1.3 for the QUIC transport (rustls with the ring provider, the tree's only one).
//!
//! The server presents a configured certificate (`server.quic.tls`, PEM, read like the API's)
//! or a self-signed one generated on first start and kept in the data directory, so its
//! fingerprint stays the same across restarts. Clients do not consult a CA store: they pin the
//! SHA-256 fingerprint of the server's leaf certificate (a self-signed certificate has no other
//! anchor; a CA-issued one pins just as well), and still check the handshake signature with
//! that certificate's key. The mesh peer's registry client (`mesh.discovery.fingerprint`)
//! pins its https registry with the same [`PinnedCert`].

use crate::pem::PemPairError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use switchyard_proto::quic_wire::ALPN;

/// File names of a generated certificate in the data directory.
pub const GENERATED_CERT: &str = "quic-cert.pem";
pub const GENERATED_KEY: &str = "quic-key.pem";

#[derive(Debug, thiserror::Error)]
pub enum QuicTlsError {
    #[error("server.quic.tls.cert {path}: {reason}")]
    Cert { path: PathBuf, reason: String },
    #[error("server.quic.tls.key {path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("QUIC certificate in {dir}: {reason}")]
    Generate { dir: PathBuf, reason: String },
    #[error("QUIC TLS configuration: {0}")]
    Config(String),
}

/// The server's certificate chain, key and the leaf's fingerprint.
pub struct ServerIdentity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// SHA-256 of the leaf certificate (DER).
    pub fingerprint: [u8; 32],
    /// Whether the certificate was generated here (first start) rather than configured.
    pub self_signed: bool,
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `AB:CD:…`, the form the server prints and clients configure.
pub fn format_fingerprint(fp: &[u8; 32]) -> String {
    fp.iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// SHA-256 of a certificate (DER): what a pin is compared with.
pub fn fingerprint_of(cert: &CertificateDer<'_>) -> [u8; 32] {
    Sha256::digest(cert.as_ref()).into()
}

fn read_pem(cert: &Path, key: &Path) -> Result<ServerIdentity, QuicTlsError> {
    let (chain, key) = crate::pem::load_pem_pair(cert, key).map_err(|e| match e {
        PemPairError::Cert(reason) => QuicTlsError::Cert {
            path: cert.to_owned(),
            reason,
        },
        PemPairError::Key(reason) => QuicTlsError::Key {
            path: key.to_owned(),
            reason,
        },
    })?;
    let fingerprint = chain.first().map(fingerprint_of).unwrap_or_default();
    Ok(ServerIdentity {
        chain,
        key,
        fingerprint,
        self_signed: false,
    })
}

/// The configured certificate, or the one generated in `data_dir` (created on first use).
pub fn server_identity(
    configured: Option<(&Path, &Path)>,
    data_dir: &Path,
) -> Result<ServerIdentity, QuicTlsError> {
    if let Some((cert, key)) = configured {
        return read_pem(cert, key);
    }
    let (cert, key) = (data_dir.join(GENERATED_CERT), data_dir.join(GENERATED_KEY));
    if !cert.exists() || !key.exists() {
        let fail = |reason: String| QuicTlsError::Generate {
            dir: data_dir.to_owned(),
            reason,
        };
        let generated = rcgen::generate_simple_self_signed(vec!["switchyard".to_owned()])
            .map_err(|e| fail(e.to_string()))?;
        std::fs::create_dir_all(data_dir).map_err(|e| fail(e.to_string()))?;
        write_private(&key, generated.signing_key.serialize_pem().as_bytes())
            .map_err(|e| fail(e.to_string()))?;
        std::fs::write(&cert, generated.cert.pem()).map_err(|e| fail(e.to_string()))?;
    }
    let mut identity = read_pem(&cert, &key)?;
    identity.self_signed = true;
    Ok(identity)
}

/// Writes a private key readable by the owner only.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// The QUIC server's TLS: TLS 1.3 only, ALPN [`ALPN`], 0-RTT accepted (see the module docs of
/// [`super`] for why the stream header may ride in early data).
pub fn server_config(
    identity: &ServerIdentity,
) -> Result<Arc<quinn_proto::crypto::rustls::QuicServerConfig>, QuicTlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| QuicTlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())
        .map_err(|e| QuicTlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.max_early_data_size = u32::MAX;
    let quic = quinn_proto::crypto::rustls::QuicServerConfig::try_from(config)
        .map_err(|e| QuicTlsError::Config(e.to_string()))?;
    Ok(Arc::new(quic))
}

/// Accepts exactly the certificate whose SHA-256 is `pin` (no CA, name or validity check: the
/// pin is the trust anchor), and checks the handshake signature with that certificate's key.
#[derive(Debug)]
pub struct PinnedCert {
    pin: [u8; 32],
    provider: Arc<CryptoProvider>,
}

impl PinnedCert {
    pub fn new(pin: [u8; 32]) -> Self {
        PinnedCert {
            pin,
            provider: provider(),
        }
    }
}

impl ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let seen = fingerprint_of(end_entity);
        if seen == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "server certificate fingerprint {} does not match the pinned {}",
                format_fingerprint(&seen),
                format_fingerprint(&self.pin)
            )))
        }
    }

    /// Only reached over TLS over TCP (the registry client): QUIC offers TLS 1.3 alone.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The client's TLS for one server: pinned certificate, ALPN, early data on (rustls keeps the
/// session tickets in its in-memory cache, so a reconnect resumes with 0-RTT).
pub fn client_config(
    pin: [u8; 32],
) -> Result<Arc<quinn_proto::crypto::rustls::QuicClientConfig>, QuicTlsError> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| QuicTlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedCert::new(pin)))
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.enable_early_data = true;
    let quic = quinn_proto::crypto::rustls::QuicClientConfig::try_from(config)
        .map_err(|e| QuicTlsError::Config(e.to_string()))?;
    Ok(Arc::new(quic))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_certificate_is_kept_and_its_fingerprint_is_stable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = server_identity(None, dir.path()).expect("generate");
        assert!(first.self_signed);
        let again = server_identity(None, dir.path()).expect("reload");
        assert_eq!(first.fingerprint, again.fingerprint);
        let mode = std::fs::metadata(dir.path().join(GENERATED_KEY))
            .expect("key")
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o077,
            0,
            "private"
        );
        assert_eq!(format_fingerprint(&first.fingerprint).len(), 95);
        server_config(&first).expect("server config");
    }

    #[test]
    fn the_pin_decides() {
        let dir = tempfile::tempdir().expect("tempdir");
        let id = server_identity(None, dir.path()).expect("generate");
        let verifier = PinnedCert::new(id.fingerprint);
        let name = ServerName::try_from("switchyard").expect("name");
        assert!(verifier
            .verify_server_cert(&id.chain[0], &[], &name, &[], UnixTime::now())
            .is_ok());
        let wrong = PinnedCert::new([0; 32]);
        let err = wrong
            .verify_server_cert(&id.chain[0], &[], &name, &[], UnixTime::now())
            .expect_err("wrong pin");
        assert!(err.to_string().contains("does not match"), "{err}");
    }
}
