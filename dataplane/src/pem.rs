//! Reading a PEM certificate chain and private key, for every TLS listener (the management
//! API's and the QUIC transport's), so both refuse the same files with the same reasons.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;

/// Which file of the pair could not be used, and why (callers add the config key and path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PemPairError {
    Cert(String),
    Key(String),
}

/// The certificate chain (leaf first, at least one) and the private key.
pub fn load_pem_pair(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), PemPairError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| PemPairError::Cert(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PemPairError::Cert(e.to_string()))?;
    if chain.is_empty() {
        return Err(PemPairError::Cert(
            "no CERTIFICATE block in the file".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        PemPairError::Key(format!(
            "{e} (expected a PKCS#8, PKCS#1 or SEC1 PEM private key)"
        ))
    })?;
    Ok((chain, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_a_certificate_or_key_names_the_file_that_failed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no pem here\n").expect("write");
        assert_eq!(
            load_pem_pair(&empty, &empty).err(),
            Some(PemPairError::Cert(
                "no CERTIFICATE block in the file".into()
            ))
        );
        let missing = dir.path().join("missing.pem");
        assert!(matches!(
            load_pem_pair(&missing, &missing),
            Err(PemPairError::Cert(_))
        ));
    }
}
