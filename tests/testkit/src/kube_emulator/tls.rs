//! Optional TLS (`--tls`): a throwaway CA and a server certificate for 127.0.0.1,
//! ::1 and localhost, generated at start with rcgen, so https-only rules can be
//! exercised; the CA goes into the kubeconfig as `certificate-authority-data`.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A server identity and the CA that signed it.
pub struct TlsMaterial {
    /// PEM of the CA certificate, for the kubeconfig.
    pub ca_pem: String,
    pub server_config: Arc<rustls::ServerConfig>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generate a certificate")]
    Generate(#[from] rcgen::Error),
    #[error("build the TLS server configuration")]
    Config(#[from] rustls::Error),
}

/// A fresh CA and a server certificate signed by it.
pub fn generate() -> Result<TlsMaterial, TlsError> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "kube-emulator-ca");
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca_params.self_signed(&ca_key)?;

    let server_key = KeyPair::generate()?;
    let mut server_params =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()])?;
    server_params.distinguished_name.push(DnType::CommonName, "kube-emulator");
    let issuer = Issuer::from_params(&ca_params, &ca_key);
    let server_cert = server_params.signed_by(&server_key, &issuer)?;

    let chain = vec![CertificateDer::from(server_cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsMaterial { ca_pem: ca_cert.pem(), server_config: Arc::new(config) })
}
