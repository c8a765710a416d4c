//! A throwaway certificate authority and server certificates, made per test with rcgen.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// A CA and one server certificate it signed, for `127.0.0.1` and `localhost`.
#[derive(Clone)]
pub struct TestPki {
    pub ca_pem: String,
    pub server_cert_pem: String,
    pub server_key_pem: String,
}

impl TestPki {
    /// Makes a fresh CA and server certificate.
    pub fn new() -> Self {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "outbox test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
            .expect("CA");
        let server_key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, "outbox test server");
        let server = params
            .signed_by(&server_key, &ca)
            .expect("server certificate");
        Self {
            ca_pem: ca.pem(),
            server_cert_pem: server.pem(),
            server_key_pem: server_key.serialize_pem(),
        }
    }

    /// The server's identity for tonic.
    pub fn identity(&self) -> Identity {
        Identity::from_pem(&self.server_cert_pem, &self.server_key_pem)
    }

    /// A client TLS configuration trusting only this CA.
    pub fn client_tls(&self) -> ClientTlsConfig {
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem))
    }

    /// Writes `ca.pem`, `server.pem` and `server.key` into `dir`; returns their paths.
    pub fn write_to(&self, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let paths = (
            dir.join("ca.pem"),
            dir.join("server.pem"),
            dir.join("server.key"),
        );
        std::fs::write(&paths.0, &self.ca_pem).expect("write CA");
        std::fs::write(&paths.1, &self.server_cert_pem).expect("write certificate");
        std::fs::write(&paths.2, &self.server_key_pem).expect("write key");
        paths
    }
}
