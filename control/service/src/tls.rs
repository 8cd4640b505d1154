//! The process's TLS crypto provider. ring is the one crypto library in the binary (boringtun
//! needs it; aws-lc beside it cost ~2 MB, issue 14), so reqwest, object_store and ldap3 are
//! built without a bundled provider and take rustls' process default — which must be in place
//! before any of them builds a client, or reqwest panics. Every place that builds one calls
//! [`use_ring_provider`] first: the binary's `main` does, but libraries and their tests must not
//! depend on that.

/// Installs ring as rustls' process-wide default provider unless one is installed already.
pub fn use_ring_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // an Err means another thread installed one first: a provider is in place either way
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_provider_is_in_place_afterwards_and_a_second_call_is_harmless() {
        super::use_ring_provider();
        super::use_ring_provider();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }
}
