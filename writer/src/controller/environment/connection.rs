//! The optional connection check of a GitOpsDeploymentManagedEnvironment: whether
//! the writer may contact the environment's `apiURL` (the operator's policy), and if
//! so, a `GET /version` there and a list of ConfigMaps the environment's credentials
//! must permit (in its first namespace, or `default`). The outcome is the
//! `ConnectionInitializationSucceeded` condition; the writer otherwise never contacts
//! a tenant's API server, and by default (checks off) it contacts none.
//!
//! The policy is decided twice. First on the URL's host *as written*: a host name is
//! compared with host-name patterns, an IP literal with IP and CIDR patterns. Then,
//! before anything is contacted, on every address the name resolves to
//! ([`crate::controller::egress`]): an IP or CIDR deny entry refuses it, and a loopback,
//! link-local, cloud-metadata, private or otherwise special address is contacted only
//! when an IP or CIDR allow entry names it (`*` and host names never do). The
//! connection then goes to the checked address, never through a second lookup.
//! Because an empty allow list
//! allows nothing, turning checks on contacts nothing until the operator names where
//! the writer may go; the deny list wins over the allow list. Hosts that a resolver
//! could read as an IP address although they are not written as one (`127.1`,
//! `2130706433`, `0x7f.1`: a last label starting with a digit) are always denied.
//! Pattern syntax (comma-separated in the flags, case-insensitive):
//!
//! - `*` any destination; `host.example.com` exactly that host; `*.example.com` any
//!   host below `example.com` (not `example.com` itself);
//! - `10.1.2.3` or `10.0.0.0/8` for IPv4 literals, `[fd00::1]` or `[fd00::/8]` for
//!   IPv6 literals (an IPv4-mapped IPv6 literal in a URL counts as its IPv4 address);
//! - any of these with `:port` to match only that port (a URL without a port is 443).
//!
//! The check uses only the credentials the kubeconfig validation kept (inline token or
//! client certificate and key, inline CA, insecure flag, TLS server name); it builds
//! the client from them directly and never loads the tenant's kubeconfig, so no exec
//! plugin, file or proxy can come into play. It is bounded by [`CHECK_TIMEOUT`].
//!
//! A failed check does not stop the environment from being stored: the check runs
//! after the environment is written, and a cluster that is unreachable from the
//! writer may well be reachable from the GitOps engine (another network), so refusing
//! it would break working set-ups. The condition tells the tenant what the writer saw.
//! Tenant-facing messages are fixed texts with at most a status code or the allowed
//! fact; they never carry credentials or the server's response body. The check runs at
//! each reconcile of a stored environment (an edit, a change of its Secret, a writer
//! restart), not periodically. No proxy is used (the client is built without one and
//! never reads the environment) and redirects are not followed.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use gitops_shared::db::credential::ManagedEnvironmentIntent;
use gitops_shared::telemetry::error_chain;

use crate::controller::egress::{Checked, Refusal};

/// The check succeeded: the API server answered `GET /version` with these credentials.
pub const REASON_SUCCEEDED: &str = "Succeeded";
/// Connection checks are off (the default); nothing was contacted.
pub const REASON_CONNECTION_CHECK_DISABLED: &str = "ConnectionCheckDisabled";
/// The operator's policy does not allow contacting `apiURL`; nothing was contacted.
pub const REASON_CONNECTION_CHECK_DENIED: &str = "ConnectionCheckDenied";
/// The API server could not be reached or did not answer like one (TLS, timeout…).
pub const REASON_CONNECTION_FAILED: &str = "ConnectionFailed";
/// The API server refused the credentials (HTTP 401 or 403).
pub const REASON_UNAUTHORIZED: &str = "Unauthorized";

/// How long one check may take, connection and request together.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

const DEFAULT_PORT: u16 = 443;

/// Where the writer may connect for connection checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionPolicy {
    pub allow: Vec<Destination>,
    pub deny: Vec<Destination>,
}

/// One allow- or deny-list pattern (see the module documentation for the syntax).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    host: HostPattern,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Any,
    Name(String),
    /// With its leading dot: `.example.com`.
    Suffix(String),
    Net(IpAddr, u8),
}

/// A pattern that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid connection-check destination {pattern:?}: {problem}")]
pub struct DestinationError {
    pattern: String,
    problem: &'static str,
}

/// Why the policy does not allow a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// The host could not be read, or could be read as an IP address it is not written as.
    Ambiguous,
    DenyListed,
    NoAllowList,
    NotAllowed,
    /// The host is, or resolves to, a loopback, link-local, metadata, private or other
    /// special address that no IP or CIDR allow entry names.
    PrivateAddress,
}

impl Denial {
    /// The tenant-facing message.
    pub fn message(self) -> &'static str {
        match self {
            Denial::Ambiguous => {
                "the writer did not contact the API server: the host of apiURL is not a plain host name or IP address"
            }
            Denial::DenyListed => {
                "the writer did not contact the API server: apiURL is on the writer's connection-check deny list"
            }
            Denial::NoAllowList => {
                "the writer did not contact the API server: connection checks are on, but the writer's allow list \
                 is empty, so no API server is contacted"
            }
            Denial::NotAllowed => {
                "the writer did not contact the API server: apiURL is not on the writer's connection-check allow list"
            }
            Denial::PrivateAddress => {
                "the writer did not contact the API server: the host of apiURL is or resolves to a loopback, \
                 link-local, metadata or private address that the writer's allow list does not name"
            }
        }
    }
}

/// The host and port a URL connects to, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    host: TargetHost,
    port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TargetHost {
    Name(String),
    Ip(IpAddr),
}

impl FromStr for Destination {
    type Err = DestinationError;

    fn from_str(pattern: &str) -> Result<Self, Self::Err> {
        let error = |problem| DestinationError { pattern: pattern.to_owned(), problem };
        let text = pattern.trim().to_ascii_lowercase();
        if text.is_empty() {
            return Err(error("it is empty"));
        }
        let (host, port) = if let Some(bracketed) = text.strip_prefix('[') {
            let (inside, after) = bracketed.split_once(']').ok_or_else(|| error("a '[' has no matching ']'"))?;
            let port = if after.is_empty() {
                None
            } else {
                Some(after.strip_prefix(':').ok_or_else(|| error("only ':port' may follow ']'"))?)
            };
            let (address, prefix) =
                address_and_prefix(inside, 128).ok_or_else(|| error("not an IPv6 address or CIDR"))?;
            if !address.is_ipv6() {
                return Err(error("an IPv4 address is written without brackets"));
            }
            (HostPattern::Net(address, prefix), port)
        } else {
            let (host, port) = match text.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text.as_str(), None),
            };
            if host.contains(':') || port.is_some_and(|p| p.contains(':')) {
                return Err(error("IPv6 addresses are written in brackets: [::1] or [fd00::/8]"));
            }
            (host_pattern(host).ok_or_else(|| error("not *, a host name, *.domain, an IPv4 address or CIDR"))?, port)
        };
        let port = match port {
            Some(port) => Some(
                port.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0 && port.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| error("the port is not a number from 1 to 65535"))?,
            ),
            None => None,
        };
        Ok(Destination { host, port })
    }
}

fn host_pattern(host: &str) -> Option<HostPattern> {
    if host == "*" {
        return Some(HostPattern::Any);
    }
    if let Some(suffix) = host.strip_prefix("*.") {
        return plain_name(suffix).then(|| HostPattern::Suffix(format!(".{suffix}")));
    }
    if host.contains('/') {
        let (address, prefix) = address_and_prefix(host, 32)?;
        return address.is_ipv4().then_some(HostPattern::Net(address, prefix));
    }
    if let Ok(v4) = host.parse::<Ipv4Addr>() {
        return Some(HostPattern::Net(IpAddr::V4(v4), 32));
    }
    plain_name(host).then(|| HostPattern::Name(host.to_owned()))
}

/// `address` or `address/prefix` (IPv4 or IPv6, `max` is the longest prefix allowed).
fn address_and_prefix(text: &str, max: u8) -> Option<(IpAddr, u8)> {
    let (address, prefix) = match text.split_once('/') {
        Some((address, prefix)) => (address, Some(prefix)),
        None => (text, None),
    };
    let address: IpAddr = address.parse().ok()?;
    let full = if address.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p.parse::<u8>().ok()?,
        Some(_) => return None,
        None => full,
    };
    (prefix <= full.min(max)).then_some((address, prefix))
}

/// A DNS name that no resolver reads as an IP address: letters, digits and
/// hyphens in non-empty labels, the last label not starting with a digit.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && name.rsplit('.').next().is_some_and(|last| !last.starts_with(|c: char| c.is_ascii_digit()))
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Any => write!(f, "*")?,
            HostPattern::Name(name) => write!(f, "{name}")?,
            HostPattern::Suffix(suffix) => write!(f, "*{suffix}")?,
            HostPattern::Net(IpAddr::V4(address), 32) => write!(f, "{address}")?,
            HostPattern::Net(IpAddr::V4(address), prefix) => write!(f, "{address}/{prefix}")?,
            HostPattern::Net(IpAddr::V6(address), 128) => write!(f, "[{address}]")?,
            HostPattern::Net(IpAddr::V6(address), prefix) => write!(f, "[{address}/{prefix}]")?,
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

impl Destination {
    fn matches(&self, target: &Target) -> bool {
        if self.port.is_some_and(|port| port != target.port) {
            return false;
        }
        match (&self.host, &target.host) {
            (HostPattern::Any, _) => true,
            (HostPattern::Name(name), TargetHost::Name(host)) => name == host,
            (HostPattern::Suffix(suffix), TargetHost::Name(host)) => host.ends_with(suffix.as_str()),
            (HostPattern::Net(net, prefix), TargetHost::Ip(ip)) => in_net(*ip, *net, *prefix),
            _ => false,
        }
    }
}

fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

/// The host and port of an `https://` URL as written; `None` when it cannot be read
/// unambiguously.
fn target(url: &str) -> Option<Target> {
    let after = url.strip_prefix("https://")?;
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let authority = &after[..end];
    if authority.contains('@') {
        return None;
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (inside, after) = bracketed.split_once(']')?;
        let port = if after.is_empty() { None } else { Some(after.strip_prefix(':')?) };
        (format!("[{inside}]"), port)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (authority.to_owned(), None),
        }
    };
    let port = match port {
        Some(port) if port.bytes().all(|b| b.is_ascii_digit()) => port.parse::<u16>().ok().filter(|p| *p != 0)?,
        Some(_) => return None,
        None => DEFAULT_PORT,
    };
    Some(Target { host: target_host(&host)?, port })
}

/// A host as written in a URL (an IPv6 literal in brackets): a plain name or an IP
/// address in its one standard spelling; `None` for anything a resolver could read
/// otherwise. An IPv4-mapped IPv6 literal counts as its IPv4 address.
fn target_host(host: &str) -> Option<TargetHost> {
    if let Some(inside) = host.strip_prefix('[') {
        let v6: Ipv6Addr = inside.strip_suffix(']')?.parse().ok()?;
        return Some(TargetHost::Ip(crate::controller::egress::canonical(IpAddr::V6(v6))));
    }
    let host = host.to_ascii_lowercase();
    match host.parse::<Ipv4Addr>() {
        Ok(v4) => Some(TargetHost::Ip(IpAddr::V4(v4))),
        Err(_) if plain_name(&host) => Some(TargetHost::Name(host)),
        Err(_) => None,
    }
}

impl ConnectionPolicy {
    pub fn new(allow: Vec<Destination>, deny: Vec<Destination>) -> Self {
        ConnectionPolicy { allow, deny }
    }

    /// Whether the writer may contact `url`; decided without any lookup (the
    /// addresses are checked by [`crate::controller::egress::resolve`]).
    pub fn decide(&self, url: &str) -> Result<(), Denial> {
        self.decide_target(&target(url).ok_or(Denial::Ambiguous)?)
    }

    /// Whether the writer may contact `host` (as written in a URL, an IPv6 literal in
    /// brackets) on `port`; decided without any lookup.
    pub fn decide_host(&self, host: &str, port: u16) -> Result<(), Denial> {
        let host = target_host(host).ok_or(Denial::Ambiguous)?;
        if port == 0 {
            return Err(Denial::Ambiguous);
        }
        let target = Target { host, port };
        self.decide_target(&target)?;
        if let TargetHost::Ip(ip) = target.host {
            self.permits_address(ip, port)?;
        }
        Ok(())
    }

    /// Whether a resolved (or literal) address may be contacted on `port`: no IP or
    /// CIDR deny entry names it, and a special address (see
    /// [`crate::controller::egress::special`]) only when an IP or CIDR allow entry does.
    pub fn permits_address(&self, ip: IpAddr, port: u16) -> Result<(), Denial> {
        let ip = crate::controller::egress::canonical(ip);
        let target = Target { host: TargetHost::Ip(ip), port };
        let by_address = |d: &&Destination| matches!(d.host, HostPattern::Net(..));
        if self.deny.iter().filter(by_address).any(|d| d.matches(&target)) {
            return Err(Denial::DenyListed);
        }
        if crate::controller::egress::special(ip).is_some()
            && !self.allow.iter().filter(by_address).any(|d| d.matches(&target))
        {
            return Err(Denial::PrivateAddress);
        }
        Ok(())
    }

    fn decide_target(&self, target: &Target) -> Result<(), Denial> {
        if self.deny.iter().any(|d| d.matches(target)) {
            return Err(Denial::DenyListed);
        }
        if self.allow.is_empty() {
            return Err(Denial::NoAllowList);
        }
        if self.allow.iter().any(|d| d.matches(target)) { Ok(()) } else { Err(Denial::NotAllowed) }
    }
}

/// What the check found: the `ConnectionInitializationSucceeded` condition's parts,
/// and for the operator's log, the error chain (never shown to the tenant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
    pub detail: Option<String>,
}

impl Outcome {
    fn new(status: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Outcome { status, reason, message: message.into(), detail: None }
    }

    fn failed(message: impl Into<String>, detail: Option<String>) -> Self {
        Outcome { detail, ..Outcome::new("False", REASON_CONNECTION_FAILED, message) }
    }
}

/// Checks the connection to a stored environment's API server, if `policy` (the
/// operator's; `None`: checks off) allows contacting it.
pub async fn connection_check(policy: Option<&ConnectionPolicy>, intent: &ManagedEnvironmentIntent) -> Outcome {
    let Some(policy) = policy else {
        return Outcome::new(
            "Unknown",
            REASON_CONNECTION_CHECK_DISABLED,
            "the writer does not contact the API server; connection checks are disabled",
        );
    };
    let client = match checked_client(policy, intent).await {
        Ok(client) => client,
        Err(outcome) => return outcome,
    };
    match tokio::time::timeout(CHECK_TIMEOUT, client.apiserver_version()).await {
        Err(_) => {
            Outcome::failed(format!("the API server did not answer within {} seconds", CHECK_TIMEOUT.as_secs()), None)
        }
        Ok(Ok(_)) => namespaced_list(&client, intent).await,
        Ok(Err(kube::Error::Api(status))) if matches!(status.code, 401 | 403) => Outcome::new(
            "False",
            REASON_UNAUTHORIZED,
            format!("the API server refused the credentials (HTTP {})", status.code),
        ),
        Ok(Err(kube::Error::Api(status))) => Outcome::failed(
            format!("the API server answered GET /version with HTTP {}", status.code),
            Some(format!("HTTP {}", status.code)),
        ),
        Ok(Err(kube::Error::SerdeError(_))) => {
            Outcome::failed("the server at apiURL did not answer GET /version like a Kubernetes API server", None)
        }
        Ok(Err(error)) => transport_failure(&error),
    }
}

/// `/version` answers anyone; the credentials themselves are checked by a list
/// they must permit: ConfigMaps (one) in the environment's first namespace, or in
/// `default` when it lists none.
async fn namespaced_list(client: &kube::Client, intent: &ManagedEnvironmentIntent) -> Outcome {
    let namespace = intent.namespaces.first().map_or("default", String::as_str);
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client.clone(), namespace);
    let params = kube::api::ListParams::default().limit(1);
    match tokio::time::timeout(CHECK_TIMEOUT, api.list_metadata(&params)).await {
        Err(_) => {
            Outcome::failed(format!("the API server did not answer within {} seconds", CHECK_TIMEOUT.as_secs()), None)
        }
        Ok(Ok(_)) => Outcome::new(
            "True",
            REASON_SUCCEEDED,
            format!("the writer reached the API server and the credentials may list ConfigMaps in {namespace:?}"),
        ),
        Ok(Err(kube::Error::Api(status))) if matches!(status.code, 401 | 403) => Outcome::new(
            "False",
            REASON_UNAUTHORIZED,
            format!(
                "the API server refused the credentials a list of ConfigMaps in {namespace:?} (HTTP {})",
                status.code
            ),
        ),
        Ok(Err(kube::Error::Api(status))) => Outcome::failed(
            format!("the API server answered a list of ConfigMaps in {namespace:?} with HTTP {}", status.code),
            Some(format!("HTTP {}", status.code)),
        ),
        Ok(Err(error)) => transport_failure(&error),
    }
}

/// A client for `intent`'s API server once `policy` allows it: the host of apiURL
/// is resolved once and every address checked ([`crate::controller::egress`]), and
/// the client connects to the checked address. `Err` with the tenant's outcome when
/// the policy refuses or the name does not resolve.
pub(crate) async fn checked_client(
    policy: &ConnectionPolicy,
    intent: &ManagedEnvironmentIntent,
) -> Result<kube::Client, Outcome> {
    let Some(target) = target(&intent.api_url) else {
        return Err(Outcome::new("False", REASON_CONNECTION_CHECK_DENIED, Denial::Ambiguous.message()));
    };
    let host = match &target.host {
        TargetHost::Name(name) => name.clone(),
        TargetHost::Ip(IpAddr::V4(v4)) => v4.to_string(),
        TargetHost::Ip(IpAddr::V6(v6)) => format!("[{v6}]"),
    };
    let checked = match crate::controller::egress::resolve(policy, &host, target.port).await {
        Ok(checked) => checked,
        Err(Refusal::Denied(denial)) => {
            return Err(Outcome::new("False", REASON_CONNECTION_CHECK_DENIED, denial.message()));
        }
        Err(Refusal::Unresolved) => {
            return Err(Outcome::failed("the host name in apiURL could not be resolved", None));
        }
    };
    client(intent, &checked)
}

/// A client for exactly the validated credentials; nothing else is read. It connects
/// to the checked address (apiURL with its host replaced by the address; a host name
/// stays the TLS server name), so nothing is resolved again.
fn client(intent: &ManagedEnvironmentIntent, checked: &Checked) -> Result<kube::Client, Outcome> {
    let credentials = &intent.credentials;
    let unusable = || Outcome::failed("apiURL cannot be used as a request URL", None);
    let uri: http::Uri = intent.api_url.parse().map_err(|_| unusable())?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let pinned = format!("https://{}{path}", checked.address);
    let mut config = kube::Config::new(pinned.parse().map_err(|_| unusable())?);
    config.proxy_url = None;
    config.connect_timeout = Some(CHECK_TIMEOUT);
    config.read_timeout = Some(CHECK_TIMEOUT);
    config.write_timeout = Some(CHECK_TIMEOUT);
    config.default_retry = false;
    config.accept_invalid_certs = intent.allow_insecure_skip_tls_verify;
    config.tls_server_name =
        credentials.tls_server_name.clone().or_else(|| checked.named.then(|| checked.host.clone()));
    if let Some(ca) = &credentials.certificate_authority_data {
        let certificates = pem_certificates(ca).ok_or_else(|| {
            Outcome::failed("the kubeconfig's certificate-authority-data holds no usable PEM certificate", None)
        })?;
        config.root_cert = Some(certificates);
    }
    config.auth_info.token = credentials.bearer_token.clone().map(Into::into);
    config.auth_info.client_certificate_data.clone_from(&credentials.client_certificate_data);
    config.auth_info.client_key_data = credentials.client_key_data.clone().map(Into::into);
    kube::Client::try_from(config).map_err(|error| {
        Outcome::failed(
            "the kubeconfig's certificates or client key could not be used for TLS",
            Some(error_chain(&error)),
        )
    })
}

/// The DER certificates of base64-encoded PEM; `None` when there are none or one is damaged.
fn pem_certificates(data: &str) -> Option<Vec<Vec<u8>>> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let decoded = STANDARD.decode(data.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let mut certificates = Vec::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find(BEGIN) {
        let body = &rest[start + BEGIN.len()..];
        let end = body.find(END)?;
        let base64: String = body[..end].chars().filter(|c| !c.is_whitespace()).collect();
        certificates.push(STANDARD.decode(base64).ok()?);
        rest = &body[end + END.len()..];
    }
    (!certificates.is_empty()).then_some(certificates)
}

/// A connection that failed before an HTTP answer: a fixed message by what the
/// chain shows (the kind of an I/O error, else words that TLS errors use — only to
/// pick the hint; the reason is the same); the chain itself goes to the operator's log.
fn transport_failure(error: &kube::Error) -> Outcome {
    let chain = error_chain(error);
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    let mut kind = None;
    while let Some(next) = source {
        if let Some(io) = next.downcast_ref::<std::io::Error>() {
            kind = Some(io.kind());
        }
        source = next.source();
    }
    let lower = chain.to_ascii_lowercase();
    let tls = ["certificate", "tls", "handshake", "alert"].iter().any(|word| lower.contains(word));
    let message = match kind {
        Some(std::io::ErrorKind::ConnectionRefused) => "the API server refused the connection",
        Some(std::io::ErrorKind::TimedOut) => "the connection to the API server timed out",
        _ if lower.contains("dns error") => "the host name in apiURL could not be resolved",
        _ if lower.contains("tcp connect error") => "the API server could not be reached",
        _ if tls => {
            "the TLS handshake with the API server failed (check certificate-authority-data, tls-server-name and \
             the client certificate)"
        }
        _ => "the API server could not be reached",
    };
    Outcome::failed(message, Some(chain))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn destinations(list: &[&str]) -> Vec<Destination> {
        list.iter().map(|p| p.parse().unwrap_or_else(|e| panic!("{e}"))).collect()
    }

    fn policy(allow: &[&str], deny: &[&str]) -> ConnectionPolicy {
        ConnectionPolicy::new(destinations(allow), destinations(deny))
    }

    #[test]
    fn patterns_parse_and_print() {
        for (pattern, printed) in [
            ("*", "*"),
            ("API.Example.com", "api.example.com"),
            ("api.example.com:6443", "api.example.com:6443"),
            ("*.example.com", "*.example.com"),
            ("*:6443", "*:6443"),
            (" 10.1.2.3 ", "10.1.2.3"),
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.0.0.0/8:6443", "10.0.0.0/8:6443"),
            ("[::1]", "[::1]"),
            ("[::1]:6443", "[::1]:6443"),
            ("[fd00::/8]", "[fd00::/8]"),
            ("localhost", "localhost"),
        ] {
            let parsed: Destination = pattern.parse().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(parsed.to_string(), printed, "{pattern}");
        }
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in [
            "",
            " ",
            "::1",
            "fd00::/8",
            "[10.0.0.1]",
            "[::1",
            "[::1]x",
            "host:",
            "host:0",
            "host:65536",
            "host:+1",
            "10.0.0.0/33",
            "[::/129]",
            "10.0.0.0/",
            "*.",
            "a..b",
            "-a.example",
            "127.1",
            "2130706433",
            "host/8",
            "ho st",
            "h_st",
            "https://host",
            "*.*.example",
        ] {
            assert!(bad.parse::<Destination>().is_err(), "{bad:?} should be refused");
        }
        let error = "::1".parse::<Destination>().expect_err("refused");
        assert!(error.to_string().contains("brackets"), "{error}");
    }

    #[test]
    fn targets_are_read_as_written() {
        let name = |h: &str| TargetHost::Name(h.to_owned());
        let ip = |a: &str| TargetHost::Ip(a.parse().expect("ip"));
        for (url, host, port) in [
            ("https://API.example.com", name("api.example.com"), 443),
            ("https://api.example.com:6443/prefix?x", name("api.example.com"), 6443),
            ("https://127.0.0.1:6443", ip("127.0.0.1"), 6443),
            ("https://[::1]:6443/", ip("::1"), 6443),
            ("https://[::ffff:127.0.0.1]", ip("127.0.0.1"), 443),
        ] {
            assert_eq!(target(url), Some(Target { host, port }), "{url}");
        }
        for ambiguous in [
            "https://127.1:6443",
            "https://2130706433",
            "https://0x7f.1",
            "https://0177.0.0.1",
            "https://u@host",
            "https://host:x",
            "https://host:0",
            "http://host",
            "https://[zz::1]",
        ] {
            assert_eq!(target(ambiguous), None, "{ambiguous}");
        }
    }

    #[test]
    fn an_empty_allow_list_allows_nothing() {
        let empty = policy(&[], &[]);
        assert_eq!(empty.decide("https://api.example.com"), Err(Denial::NoAllowList));
        assert!(Denial::NoAllowList.message().contains("allow list is empty"));
    }

    #[test]
    fn allow_list_matching() {
        let p = policy(&["api.example.com:6443", "*.corp.example", "10.0.0.0/8", "[fd00::/8]:443", "[::1]"], &[]);
        for allowed in [
            "https://api.example.com:6443",
            "https://API.EXAMPLE.COM:6443/",
            "https://a.corp.example",
            "https://a.b.corp.example:6443",
            "https://10.20.30.40:6443",
            "https://[::ffff:10.1.1.1]",
            "https://[fd00::1]",
            "https://[::1]:6443",
        ] {
            assert_eq!(p.decide(allowed), Ok(()), "{allowed}");
        }
        for refused in [
            "https://api.example.com",
            "https://api.example.com:443",
            "https://corp.example",
            "https://evilcorp.example",
            "https://corp.example.attacker.invalid",
            "https://11.0.0.1",
            "https://[fd00::1]:6443",
            "https://localhost",
        ] {
            assert_eq!(p.decide(refused), Err(Denial::NotAllowed), "{refused}");
        }
        assert_eq!(p.decide("https://10.1"), Err(Denial::Ambiguous));
    }

    #[test]
    fn names_and_addresses_never_match_each_other() {
        let by_address = policy(&["127.0.0.0/8"], &[]);
        assert_eq!(by_address.decide("https://localhost"), Err(Denial::NotAllowed));
        let by_name = policy(&["*"], &["127.0.0.0/8", "[::1]"]);
        // A name is not resolved: an IP deny entry does not catch it (documented).
        assert_eq!(by_name.decide("https://localhost"), Ok(()));
        assert_eq!(by_name.decide("https://127.0.0.1"), Err(Denial::DenyListed));
        assert_eq!(by_name.decide("https://[::ffff:127.0.0.1]:6443"), Err(Denial::DenyListed));
        assert_eq!(by_name.decide("https://[::1]"), Err(Denial::DenyListed));
    }

    #[test]
    fn deny_wins_over_allow() {
        let p = policy(&["*", "api.example.com"], &["api.example.com", "*.internal.example:6443"]);
        assert_eq!(p.decide("https://api.example.com:6443"), Err(Denial::DenyListed));
        assert_eq!(p.decide("https://x.internal.example:6443"), Err(Denial::DenyListed));
        assert_eq!(p.decide("https://x.internal.example:443"), Ok(()));
        assert_eq!(p.decide("https://other.example.com"), Ok(()));
    }

    #[test]
    fn pem_bundles() {
        let one = "-----BEGIN CERTIFICATE-----\nAAEC\nAw==\n-----END CERTIFICATE-----\n";
        let two = format!("{one}junk\n{}", one.replace("AAEC\nAw==", "BAU="));
        assert_eq!(pem_certificates(&STANDARD.encode(one)), Some(vec![vec![0, 1, 2, 3]]));
        assert_eq!(pem_certificates(&STANDARD.encode(two)), Some(vec![vec![0, 1, 2, 3], vec![4, 5]]));
        assert_eq!(pem_certificates(&STANDARD.encode("no certificate")), None);
        assert_eq!(
            pem_certificates(&STANDARD.encode("-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----")),
            None
        );
        assert_eq!(pem_certificates("not base64"), None);
    }

    #[test]
    fn run_flags() {
        use clap::Parser;
        let parse = |extra: &[&str]| {
            let mut argv = vec!["gitops-writer", "run", "--database-url", "postgres://localhost/x"];
            argv.extend_from_slice(extra);
            match crate::Cli::try_parse_from(argv).map(|cli| cli.command) {
                Ok(crate::Command::Run(args)) => Ok(*args),
                Ok(_) => panic!("not run"),
                Err(error) => Err(error.to_string()),
            }
        };
        let off = parse(&[]).expect("parses");
        assert!(!off.connection_check && off.connection_check_allow.is_empty() && off.connection_check_deny.is_empty());
        let on = parse(&[
            "--connection-check",
            "--connection-check-allow",
            "*.example.com, 10.0.0.0/8:6443",
            "--connection-check-deny",
            "[::1]",
        ])
        .expect("parses");
        assert!(on.connection_check);
        assert_eq!(on.connection_check_allow, destinations(&["*.example.com", "10.0.0.0/8:6443"]));
        assert_eq!(on.connection_check_deny, destinations(&["[::1]"]));
        let bad = parse(&["--connection-check-deny", "::1"]).expect_err("refused");
        assert!(bad.contains("brackets"), "{bad}");
    }

    #[tokio::test]
    async fn disabled_and_denied_checks_contact_nothing() {
        let intent = ManagedEnvironmentIntent {
            resource_uid: uuid::Uuid::nil(),
            resource_name: "prod".into(),
            generation: 1,
            api_url: "https://cluster.example.invalid:6443".into(),
            allow_insecure_skip_tls_verify: false,
            namespaces: vec![],
            cluster_resources: false,
            secret_name: "kc".into(),
            secret_resource_version: None,
            credentials: gitops_shared::db::credential::ClusterCredentials {
                bearer_token: Some("s3cret".into()),
                ..Default::default()
            },
        };
        let off = connection_check(None, &intent).await;
        assert_eq!((off.status, off.reason), ("Unknown", REASON_CONNECTION_CHECK_DISABLED));
        let denied = connection_check(Some(&policy(&["*"], &["*.invalid"])), &intent).await;
        assert_eq!((denied.status, denied.reason), ("False", REASON_CONNECTION_CHECK_DENIED));
        assert_eq!(denied.message, Denial::DenyListed.message());
        let unlisted = connection_check(Some(&policy(&[], &[])), &intent).await;
        assert_eq!(unlisted.message, Denial::NoAllowList.message());
        for outcome in [off, denied, unlisted] {
            assert!(!outcome.message.contains("s3cret"));
        }
    }
}
