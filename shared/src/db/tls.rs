//! TLS for database connections, with libpq's `sslmode` and `sslrootcert`
//! semantics, so that a managed PostgreSQL's connection string works as it is.
//!
//! tokio-postgres knows only `sslmode=disable|prefer|require`, rejects
//! `sslrootcert` and ships no TLS implementation. So the two parameters are taken
//! out of the connection string here (URL or key/value form), the rest goes to
//! `tokio_postgres::Config`, and the handshake is done by rustls (with the ring
//! provider, named explicitly) behind tokio-postgres's `MakeTlsConnect` traits.
//!
//! | sslmode               | TLS                              | certificate checked                   |
//! |-----------------------|----------------------------------|---------------------------------------|
//! | `disable`             | never                            | —                                     |
//! | `prefer` (default)    | if the server offers it          | chain only, if there is a root file   |
//! | `require`             | always                           | chain only, if there is a root file   |
//! | `verify-ca`           | always                           | chain against the root file           |
//! | `verify-full`         | always                           | chain and host name                   |
//!
//! The root file is `sslrootcert` (a PEM file of CA certificates), else
//! `~/.postgresql/root.crt` if it exists, as in libpq. `sslrootcert=system` means
//! the operating system's CA bundle; like libpq it implies `verify-full` and
//! refuses weaker modes (any public CA could vouch for any host). `PGSSLMODE` and
//! `PGSSLROOTCERT` apply when the string does not set the parameter. Unlike libpq,
//! an `sslrootcert` that cannot be read is an error in every mode, `prefer` does
//! not fall back to plain text when a handshake fails, and `allow` is not offered
//! (tokio-postgres cannot try plain text first). Certificates are read once per
//! pool or listener, when it is built.

use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use super::DbError;

/// libpq's `sslmode`, without `allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    const NAMES: [(&'static str, SslMode); 5] = [
        ("disable", SslMode::Disable),
        ("prefer", SslMode::Prefer),
        ("require", SslMode::Require),
        ("verify-ca", SslMode::VerifyCa),
        ("verify-full", SslMode::VerifyFull),
    ];

    fn parse(value: &str, origin: &'static str) -> Result<Self, DbError> {
        Self::NAMES
            .iter()
            .find(|(name, _)| *name == value)
            .map(|(_, mode)| *mode)
            .ok_or(DbError::UnknownSslMode { origin })
    }

    /// What tokio-postgres needs to know: whether TLS is off, optional or mandatory.
    pub fn negotiation(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::NAMES.iter().find(|(_, mode)| mode == self).map_or("?", |(name, _)| name);
        f.write_str(name)
    }
}

/// Where the CA certificates come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// A PEM file of one or more CA certificates.
    File(PathBuf),
    /// The operating system's CA bundle (`sslrootcert=system`).
    System,
}

impl RootCerts {
    fn parse(value: &str) -> Self {
        if value == "system" { RootCerts::System } else { RootCerts::File(PathBuf::from(value)) }
    }
}

/// The TLS parameters of a connection string, defaults and environment applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsParams {
    pub mode: SslMode,
    /// `sslrootcert` (or `PGSSLROOTCERT`); `None` means libpq's default file, if any.
    pub root_certs: Option<RootCerts>,
}

/// Splits `url` into its TLS parameters and the rest of the string, which
/// `tokio_postgres::Config` can parse. `PGSSLMODE`/`PGSSLROOTCERT` fill in what the
/// string leaves out. Errors never repeat the string (it may hold a password).
pub fn split_tls_params(url: &str) -> Result<(String, TlsParams), DbError> {
    split_with_env(url, &|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
}

fn split_with_env(url: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<(String, TlsParams), DbError> {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let (rest, sslmode, sslrootcert) = if is_url { split_url(url) } else { split_key_value(url) };
    let (sslmode, mode_origin) = match sslmode {
        Some(value) => (Some(value), "the database URL"),
        None => (env("PGSSLMODE"), "PGSSLMODE"),
    };
    let root_certs = sslrootcert.or_else(|| env("PGSSLROOTCERT")).map(|v| RootCerts::parse(&v));
    let mode = match sslmode {
        Some(value) => SslMode::parse(&value, mode_origin)?,
        None if root_certs == Some(RootCerts::System) => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if root_certs == Some(RootCerts::System) && mode != SslMode::VerifyFull {
        return Err(DbError::WeakSslModeForSystemRoots { mode });
    }
    Ok((rest, TlsParams { mode, root_certs }))
}

/// `postgres://…?k=v&…`: the query parameters are percent-encoded, `&`-separated.
fn split_url(url: &str) -> (String, Option<String>, Option<String>) {
    let Some((base, query)) = url.split_once('?') else { return (url.to_owned(), None, None) };
    let (mut sslmode, mut sslrootcert) = (None, None);
    let mut kept = Vec::new();
    for param in query.split('&') {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        match percent_decode(key).as_str() {
            "sslmode" => sslmode = Some(percent_decode(value)),
            "sslrootcert" => sslrootcert = Some(percent_decode(value)),
            _ => kept.push(param),
        }
    }
    let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    (rest, sslmode, sslrootcert)
}

/// `host=… sslmode=…`: tokio-postgres's (and libpq's) grammar; every kept value is
/// written back quoted. A string that does not tokenize is passed on unchanged,
/// for tokio-postgres to reject with its own message.
fn split_key_value(s: &str) -> (String, Option<String>, Option<String>) {
    let Some(pairs) = key_value_pairs(s) else { return (s.to_owned(), None, None) };
    let (mut sslmode, mut sslrootcert) = (None, None);
    let mut kept = Vec::new();
    for (key, value) in pairs {
        match key.as_str() {
            "sslmode" => sslmode = Some(value),
            "sslrootcert" => sslrootcert = Some(value),
            _ => kept.push(format!("{key}='{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))),
        }
    }
    (kept.join(" "), sslmode, sslrootcert)
}

fn key_value_pairs(s: &str) -> Option<Vec<(String, String)>> {
    let mut chars = s.chars().peekable();
    let mut pairs = Vec::new();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        if key.is_empty() {
            return chars.peek().is_none().then_some(pairs);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        chars.next_if_eq(&'=')?;
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next()? {
                    '\'' => break,
                    '\\' => value.push(chars.next()?),
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return None;
            }
        }
        pairs.push((key, value));
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What the server's certificate is checked against.
enum Verification {
    /// Encryption only: any certificate (its handshake signature is still checked).
    None,
    /// The chain must lead to one of these roots; the host name is not checked.
    Chain(RootCertStore),
    /// Chain and host name.
    Full(RootCertStore),
}

/// Files in which distributions keep the system CA bundle (as OpenSSL's default
/// paths and rustls-native-certs look for them); `SSL_CERT_FILE` comes first.
const SYSTEM_BUNDLES: [&str; 6] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
    "/etc/ssl/certs/ca-bundle.crt",
];

impl TlsParams {
    fn verification(&self) -> Result<Verification, DbError> {
        let explicit = match &self.root_certs {
            Some(RootCerts::System) => return Ok(Verification::Full(system_roots()?)),
            Some(RootCerts::File(path)) => Some(path.clone()),
            None => None,
        };
        let default_file = || {
            std::env::var_os("HOME").map(|home| Path::new(&home).join(".postgresql/root.crt")).filter(|p| p.is_file())
        };
        let roots = match self.mode {
            SslMode::Disable => return Ok(Verification::None),
            _ => match explicit.or_else(default_file) {
                Some(path) => Some(file_roots(&path)?),
                None => None,
            },
        };
        Ok(match (self.mode, roots) {
            (SslMode::VerifyFull, Some(roots)) => Verification::Full(roots),
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
                return Err(DbError::RootCertsMissing { mode: self.mode });
            }
            (_, Some(roots)) => Verification::Chain(roots),
            (_, None) => Verification::None,
        })
    }
}

fn file_roots(path: &Path) -> Result<RootCertStore, DbError> {
    let load = |source| DbError::LoadRootCerts { path: path.to_owned(), source };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(load)? {
        roots.add(cert.map_err(load)?).map_err(|source| DbError::TlsSetup { source })?;
    }
    if roots.is_empty() {
        return Err(DbError::NoRootCerts { path: path.to_owned() });
    }
    Ok(roots)
}

fn system_roots() -> Result<RootCertStore, DbError> {
    let from_env = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    let path = from_env
        .into_iter()
        .chain(SYSTEM_BUNDLES.iter().map(PathBuf::from))
        .find(|p| p.is_file())
        .ok_or(DbError::SystemRootCertsMissing)?;
    let load = |source| DbError::LoadRootCerts { path: path.clone(), source };
    let mut roots = RootCertStore::empty();
    // A bundle may hold a certificate webpki cannot use; the others still count.
    roots.add_parsable_certificates(CertificateDer::pem_file_iter(&path).map_err(load)?.filter_map(Result::ok));
    if roots.is_empty() {
        return Err(DbError::NoRootCerts { path });
    }
    Ok(roots)
}

/// The TLS connector for one connection string: tokio-postgres's `MakeTlsConnect`
/// over tokio-rustls.
///
/// Channel binding is not offered (`ChannelBinding::none()`): SCRAM authentication
/// uses `SCRAM-SHA-256`, not `SCRAM-SHA-256-PLUS`, so `channel_binding=require`
/// cannot be met.
#[derive(Clone)]
pub struct MakeRustlsConnect {
    config: Arc<ClientConfig>,
    mode: SslMode,
}

impl fmt::Debug for MakeRustlsConnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MakeRustlsConnect").field("mode", &self.mode).finish_non_exhaustive()
    }
}

impl MakeRustlsConnect {
    /// Loads the CA certificates `params` name and builds the rustls configuration.
    pub fn new(params: &TlsParams) -> Result<Self, DbError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|source| DbError::TlsSetup { source })?;
        let webpki = |roots: RootCertStore| {
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| DbError::TlsSetup { source: rustls::Error::General(e.to_string()) })
        };
        let builder = match params.verification()? {
            Verification::Full(roots) => builder.with_webpki_verifier(webpki(roots)?),
            Verification::Chain(roots) => {
                builder.dangerous().with_custom_certificate_verifier(Arc::new(LibpqVerifier {
                    chain: Some(webpki(roots)?),
                    algorithms: provider.signature_verification_algorithms,
                }))
            }
            Verification::None => builder.dangerous().with_custom_certificate_verifier(Arc::new(LibpqVerifier {
                chain: None,
                algorithms: provider.signature_verification_algorithms,
            })),
        };
        let mut config = builder.with_no_client_auth();
        // PostgreSQL 17 requires this ALPN for direct TLS and checks it when sent.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(MakeRustlsConnect { config: Arc::new(config), mode: params.mode })
    }
}

impl<S> MakeTlsConnect<S> for MakeRustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    /// Called for every connection, even unencrypted ones and Unix sockets (with an
    /// empty name), so the name is only checked when a handshake starts.
    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, io::Error> {
        Ok(RustlsConnect { config: self.config.clone(), mode: self.mode, host: domain.to_owned() })
    }
}

/// One handshake, to `host`.
pub struct RustlsConnect {
    config: Arc<ClientConfig>,
    mode: SslMode,
    host: String,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let name = ServerName::try_from(self.host.clone()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("`{}` is not a host name TLS can use", self.host))
            })?;
            let connector = tokio_rustls::TlsConnector::from(self.config);
            let stream = connector.connect(name, stream).await.map_err(|e| explain(e, self.mode))?;
            Ok(RustlsStream(stream))
        })
    }
}

/// A rejected certificate, said in words an operator can act on.
#[derive(Debug, thiserror::Error)]
#[error("the server's certificate could not be verified (sslmode={mode}); check sslrootcert and the host name")]
pub struct CertificateRejected {
    mode: SslMode,
    source: rustls::Error,
}

fn explain(error: io::Error, mode: SslMode) -> io::Error {
    match error.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(source @ rustls::Error::InvalidCertificate(_)) => {
            io::Error::new(error.kind(), CertificateRejected { mode, source: source.clone() })
        }
        _ => error,
    }
}

/// The stream of an established TLS session.
pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// The verifier for the modes that do not check the host name: `chain: None`
/// accepts any certificate (`prefer`/`require` without roots), `Some` checks the
/// chain and forgives only a name mismatch (`verify-ca`, or a root file given with
/// a weaker mode). Handshake signatures are always checked.
#[derive(Debug)]
struct LibpqVerifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for LibpqVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        // webpki checks the name last, after the chain: a name error means the chain is good.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn split(url: &str) -> Result<(String, TlsParams), DbError> {
        split_with_env(url, &no_env)
    }

    fn params(mode: SslMode, root_certs: Option<RootCerts>) -> TlsParams {
        TlsParams { mode, root_certs }
    }

    use crate::telemetry::error_chain as chain;

    #[test]
    fn url_form_tls_params_are_taken_out_and_the_rest_kept() {
        let (rest, tls) = split(
            "postgres://u:pw@db.example:5432/gitops?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=5",
        )
        .expect("parses");
        assert_eq!(rest, "postgres://u:pw@db.example:5432/gitops?application_name=x&connect_timeout=5");
        assert_eq!(tls, params(SslMode::VerifyFull, Some(RootCerts::File("/etc/ca.pem".into()))));
        let config = rest.parse::<tokio_postgres::Config>().expect("tokio-postgres takes the rest");
        assert_eq!(config.get_dbname(), Some("gitops"));
        assert_eq!(config.get_password(), Some(&b"pw"[..]));

        let (rest, tls) = split("postgresql://h/db?sslmode=require").expect("parses");
        assert_eq!(rest, "postgresql://h/db");
        assert_eq!(tls, params(SslMode::Require, None));
        let (rest, tls) = split("postgres://h/db").expect("parses");
        assert_eq!((rest.as_str(), tls), ("postgres://h/db", params(SslMode::Prefer, None)));
    }

    #[test]
    fn key_value_form_tls_params_are_taken_out_and_the_rest_kept() {
        let (rest, tls) = split(
            "host=db.example  sslmode = verify-ca password='it\\'s a \\\\secret' user=a sslrootcert='/etc/my ca.pem' dbname=g\\ x",
        )
        .expect("parses");
        assert_eq!(tls, params(SslMode::VerifyCa, Some(RootCerts::File("/etc/my ca.pem".into()))));
        let config = rest.parse::<tokio_postgres::Config>().expect("tokio-postgres takes the rest");
        assert_eq!(config.get_password(), Some(&b"it's a \\secret"[..]));
        assert_eq!(config.get_dbname(), Some("g x"));
        assert_eq!(config.get_user(), Some("a"));
        assert!(!rest.contains("ssl"), "{rest}");

        let (rest, tls) = split("host=/run/postgresql dbname=gitops").expect("parses");
        assert_eq!(tls, params(SslMode::Prefer, None));
        assert_eq!(rest.parse::<tokio_postgres::Config>().expect("parses").get_dbname(), Some("gitops"));
        assert_eq!(split("").expect("empty is fine").1, params(SslMode::Prefer, None));
        // The last setting wins, as in libpq.
        assert_eq!(split("sslmode=require sslmode=disable").expect("parses").1.mode, SslMode::Disable);
    }

    #[test]
    fn every_libpq_sslmode_but_allow_is_accepted() {
        for (name, mode) in SslMode::NAMES {
            let root = matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull).then_some("&sslrootcert=/ca.pem");
            let url = format!("postgres://h/db?sslmode={name}{}", root.unwrap_or(""));
            assert_eq!(split(&url).expect("parses").1.mode, mode);
            assert_eq!(mode.to_string(), name);
        }
    }

    #[test]
    fn an_unknown_sslmode_names_the_allowed_values_without_echoing_the_url() {
        for url in ["postgres://gitops:hunter2@h/db?sslmode=allow", "host=h password=hunter2 sslmode=VERIFY_FULL"] {
            let error = split(url).expect_err("rejected");
            assert!(matches!(error, DbError::UnknownSslMode { .. }), "{error:?}");
            let text = chain(&error);
            assert!(text.contains("disable, prefer, require, verify-ca, verify-full"), "{text}");
            assert!(text.contains("the database URL"), "{text}");
            assert!(!text.contains("hunter2") && !text.contains("postgres://"), "{text}");
        }
    }

    #[test]
    fn tls_env_vars_apply_only_when_the_string_is_silent() {
        let env = |name: &str| match name {
            "PGSSLMODE" => Some("require".to_owned()),
            "PGSSLROOTCERT" => Some("/env/ca.pem".to_owned()),
            _ => None,
        };
        let (_, tls) = split_with_env("postgres://h/db", &env).expect("parses");
        assert_eq!(tls, params(SslMode::Require, Some(RootCerts::File("/env/ca.pem".into()))));
        let (_, tls) = split_with_env("host=h sslmode=disable sslrootcert=/url/ca.pem", &env).expect("parses");
        assert_eq!(tls, params(SslMode::Disable, Some(RootCerts::File("/url/ca.pem".into()))));
        let bad = |name: &str| (name == "PGSSLMODE").then(|| "sometimes".to_owned());
        let error = split_with_env("host=h", &bad).expect_err("rejected");
        assert!(error.to_string().contains("PGSSLMODE"), "{error}");
    }

    #[test]
    fn system_roots_mean_verify_full_and_refuse_weaker_modes() {
        assert_eq!(
            split("host=h sslrootcert=system").expect("parses").1,
            params(SslMode::VerifyFull, Some(RootCerts::System))
        );
        let error = split("postgres://u:pw@h/db?sslrootcert=system&sslmode=verify-ca").expect_err("weak");
        assert!(matches!(error, DbError::WeakSslModeForSystemRoots { mode: SslMode::VerifyCa }), "{error:?}");
        assert!(error.to_string().contains("verify-full"), "{error}");
    }

    #[test]
    fn tls_verification_follows_libpq() {
        assert!(matches!(params(SslMode::Require, None).verification(), Ok(Verification::None)));
        assert!(matches!(
            params(SslMode::Disable, Some(RootCerts::File("/nonexistent".into()))).verification(),
            Ok(Verification::None)
        ));
        let error = params(SslMode::VerifyCa, None).verification().err();
        // Unless this machine has ~/.postgresql/root.crt, verify-ca has nothing to check against.
        if let Some(error) = error {
            assert!(matches!(error, DbError::RootCertsMissing { mode: SslMode::VerifyCa }), "{error:?}");
            assert!(error.to_string().contains("sslrootcert"), "{error}");
        }
        let error = params(SslMode::Require, Some(RootCerts::File("/nonexistent/ca.pem".into())))
            .verification()
            .err()
            .expect("an unreadable sslrootcert is an error");
        assert!(chain(&error).contains("/nonexistent/ca.pem"), "{}", chain(&error));
    }

    #[test]
    fn tls_root_files_without_a_certificate_are_refused() {
        let dir = std::env::temp_dir().join(format!("gitops-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let error = MakeRustlsConnect::new(&params(SslMode::VerifyFull, Some(RootCerts::File(empty.clone()))))
            .expect_err("refused");
        assert!(matches!(error, DbError::NoRootCerts { .. }), "{error:?}");
        std::fs::remove_dir_all(&dir).expect("clean up");
        assert!(MakeRustlsConnect::new(&params(SslMode::Require, None)).is_ok());
    }

    #[test]
    fn tls_params_survive_redaction_and_the_password_does_not() {
        let redacted = crate::config::redact_database_url(
            "postgres://gitops:hunter2@db:5432/gitops?sslmode=verify-full&sslrootcert=/etc/ca.pem&password=hunter2",
        );
        assert_eq!(
            redacted,
            "postgres://gitops:***@db:5432/gitops?sslmode=verify-full&sslrootcert=/etc/ca.pem&password=***"
        );
        let redacted =
            crate::config::redact_database_url("host=db password=hunter2 sslmode=require sslrootcert=system");
        assert_eq!(redacted, "host=db password=*** sslmode=require sslrootcert=system");
    }

    #[test]
    fn tls_percent_decoding_is_lenient() {
        assert_eq!(percent_decode("%2Fa%20b%zz%+1%"), "/a b%zz%+1%");
    }
}
