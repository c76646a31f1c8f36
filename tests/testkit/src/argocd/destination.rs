//! Whether an Application's destination cluster answers, as Argo CD finds out when
//! it loads the live state: a destination that does not answer makes the comparison
//! fail (sync `Unknown`, condition `ComparisonError`), whatever Git says.
//!
//! The stand-in only ever dials loopback: a destination whose API URL names
//! 127.0.0.0/8, `::1` or `localhost` is probed with a TCP connect, and the answer is
//! cached per server for [`PROBE_TTL`] so thousands of Applications on one cluster
//! cost one probe. Any other host (`https://kubernetes.default.svc`, a tenant's
//! cluster under `.invalid`) is never contacted: it follows the knob annotation
//! `standin.gitops.test/destination` (`reachable`, the default, or `unreachable`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a probe's answer is reused for one server.
pub const PROBE_TTL: Duration = Duration::from_secs(5);
/// How long one probe may take before the server counts as not answering.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The message of the `ComparisonError` for a destination that does not answer,
/// shaped as Argo CD's (`Failed to load live state: …`).
pub fn unreachable_message(server: &str, cause: &str) -> String {
    format!("Failed to load live state: failed to get cluster info for \"{server}\": {cause}")
}

/// The loopback socket address an API URL names, or `None` for any other host.
pub fn loopback_address(server: &str) -> Option<SocketAddr> {
    let uri: http::Uri = server.parse().ok()?;
    let port = uri.port_u16().or_else(|| match uri.scheme_str() {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    })?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr =
        if host.eq_ignore_ascii_case("localhost") { IpAddr::from([127, 0, 0, 1]) } else { host.parse().ok()? };
    ip.is_loopback().then_some(SocketAddr::new(ip, port))
}

/// A probe's answer and when it was found.
type Probed = (Instant, Result<(), String>);

/// Probe results per server URL.
#[derive(Debug, Default)]
pub struct Destinations {
    cache: Mutex<HashMap<String, Probed>>,
}

impl Destinations {
    /// `Ok` when `server` answers (or is not loopback: then the caller's knob
    /// decides), `Err(cause)` when a loopback server refuses or does not answer.
    pub async fn probe(&self, server: &str) -> Result<(), String> {
        let Some(address) = loopback_address(server) else { return Ok(()) };
        if let Some((at, answer)) = self.cache.lock().ok().and_then(|cache| cache.get(server).cloned())
            && at.elapsed() < PROBE_TTL
        {
            return answer;
        }
        let answer = match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(format!("dial tcp {address}: {error}")),
            Err(_) => Err(format!("dial tcp {address}: i/o timeout")),
        };
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(server.to_owned(), (Instant::now(), answer.clone()));
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_are_probed() {
        assert_eq!(loopback_address("https://127.0.0.1:6443"), Some("127.0.0.1:6443".parse().unwrap()));
        assert_eq!(loopback_address("https://[::1]:8443/"), Some("[::1]:8443".parse().unwrap()));
        assert_eq!(loopback_address("https://localhost"), Some("127.0.0.1:443".parse().unwrap()));
        assert_eq!(loopback_address("https://127.3.4.5:1"), Some("127.3.4.5:1".parse().unwrap()));
        // The agent's per-environment server URLs carry a query.
        assert_eq!(
            loopback_address("https://127.0.0.1:6443?managed-environment=1"),
            Some("127.0.0.1:6443".parse().unwrap())
        );
        assert_eq!(loopback_address("https://kubernetes.default.svc"), None);
        assert_eq!(loopback_address("https://cluster.example.invalid:6443"), None);
        assert_eq!(loopback_address("https://10.0.0.1:6443"), None);
        assert_eq!(loopback_address("not a url"), None);
        assert_eq!(loopback_address(""), None);
    }

    #[tokio::test]
    async fn a_closed_loopback_port_does_not_answer_and_an_open_one_does() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let open = format!("https://{}", listener.local_addr().expect("address"));
        // A port that was free a moment ago and is closed now.
        let closed = {
            let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            format!("https://{}", socket.local_addr().expect("address"))
        };
        let destinations = Destinations::default();
        assert_eq!(destinations.probe(&open).await, Ok(()));
        let error = destinations.probe(&closed).await.expect_err("nothing listens there");
        assert!(error.starts_with("dial tcp 127.0.0.1:"), "{error}");
        // Non-loopback hosts are never dialled: the knob decides.
        assert_eq!(destinations.probe("https://cluster.example.invalid").await, Ok(()));
    }
}
