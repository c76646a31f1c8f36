//! Whether an environment's `apiURL` aims Argo CD at an address a tenant has no
//! business reaching through the service: the engine's own host (loopback, the
//! unspecified address), link-local addresses (where cloud metadata services live)
//! and the metadata services' well-known names and addresses. Argo CD dials
//! `apiURL` with the tenant's credentials from inside the service's network, so such
//! a URL would let a tenant probe it; it is refused unless the operator allows it
//! (`--api-url-allow-private`, for single-tenant or test installations).
//!
//! Decided on the URL's host as written: every IP spelling a resolver might accept
//! is read as an address (`127.1`, `2130706433`, `0x7f000001`, an IPv4-mapped IPv6
//! literal), and a host that looks numeric but is not a plain dotted quad is refused
//! outright. A host *name* that resolves to such an address is not caught here
//! (the engine's resolver decides when it dials); the engine's NetworkPolicy is the
//! boundary for those.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::{Invalid, reason};

/// Host names of cloud metadata services (and the loopback name).
const NAMES: &[&str] = &["localhost", "metadata.google.internal", "metadata.goog", "instance-data"];

fn refused(field: &str, what: &str) -> Invalid {
    Invalid::new(
        reason::API_URL_NOT_ALLOWED,
        format!(
            "{field} points at {what}, which the GitOps engine must not be aimed at; use the cluster's routable address"
        ),
    )
}

/// `Err` when `url`'s host is loopback, unspecified, link-local, a metadata service
/// or an ambiguous IP spelling.
pub fn public_api_url(field: &str, url: &str) -> Result<(), Invalid> {
    let Some(host) = host_of(url) else { return Err(refused(field, "a host that cannot be read unambiguously")) };
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        let v6: Ipv6Addr = inner.parse().map_err(|_| refused(field, "an unreadable IPv6 address"))?;
        return match v6.to_ipv4_mapped() {
            Some(v4) => check_v4(field, v4),
            None => check_v6(field, v6),
        };
    }
    let host = host.trim_end_matches('.');
    if NAMES.contains(&host) || host.ends_with(".localhost") {
        return Err(refused(field, "a loopback or cloud metadata host name"));
    }
    if let Ok(v4) = host.parse::<Ipv4Addr>() {
        return check_v4(field, v4);
    }
    // A last label starting with a digit is an IP address to some resolver
    // (`127.1`, `2130706433`, `0x7f.1`); names never end so in practice.
    if host.rsplit('.').next().is_some_and(|label| label.starts_with(|c: char| c.is_ascii_digit())) {
        return Err(refused(field, "an IP address spelled in an unusual way"));
    }
    Ok(())
}

fn check_v4(field: &str, ip: Ipv4Addr) -> Result<(), Invalid> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() || ip.is_unspecified() || a == 0 {
        return Err(refused(field, "a loopback or unspecified address"));
    }
    // 169.254.0.0/16 holds the metadata services of most clouds; 100.100.100.200 is
    // Alibaba Cloud's, 168.63.129.16 Azure's WireServer.
    if ip.is_link_local()
        || (a == 169 && b == 254)
        || ip == Ipv4Addr::new(100, 100, 100, 200)
        || ip == Ipv4Addr::new(168, 63, 129, 16)
    {
        return Err(refused(field, "a link-local or cloud metadata address"));
    }
    Ok(())
}

fn check_v6(field: &str, ip: Ipv6Addr) -> Result<(), Invalid> {
    if ip.is_loopback() || ip.is_unspecified() {
        return Err(refused(field, "a loopback or unspecified address"));
    }
    let link_local = ip.segments()[0] & 0xffc0 == 0xfe80;
    // fd00:ec2::254 is AWS's IPv6 metadata service.
    if link_local || ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        return Err(refused(field, "a link-local or cloud metadata address"));
    }
    if let Some(v4) = ip.to_ipv4() {
        return check_v4(field, v4);
    }
    // NAT64's well-known prefix 64:ff9b::/96 reaches the IPv4 address in its last 32 bits.
    let segments = ip.segments();
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [.., high, low] = segments;
        return check_v4(field, Ipv4Addr::from((u32::from(high) << 16) | u32::from(low)));
    }
    Ok(())
}

/// The lower-cased host of `scheme://[user@]host[:port]/…` (IPv6 in brackets).
fn host_of(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = rest[..end].rsplit('@').next()?;
    let host =
        if authority.starts_with('[') { &authority[..=authority.find(']')?] } else { authority.split(':').next()? };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_destinations_in_every_spelling_are_refused() {
        for url in [
            "https://127.0.0.1:6443",
            "https://127.1",
            "https://2130706433",
            "https://0x7f000001",
            "https://0x7f.1",
            "https://0177.0.0.1",
            "https://0.0.0.0",
            "https://[::1]:6443",
            "https://[::]",
            "https://[::ffff:127.0.0.1]",
            "https://[::ffff:169.254.169.254]",
            "https://169.254.169.254/latest",
            "https://[fe80::1]",
            "https://[fd00:ec2::254]",
            "https://[64:ff9b::a9fe:a9fe]",
            "https://[64:ff9b::7f00:1]:6443",
            "https://168.63.129.16",
            "https://100.100.100.200",
            "https://localhost:6443",
            "https://LOCALHOST.",
            "https://api.localhost",
            "https://metadata.google.internal",
            "https://user@127.0.0.1",
        ] {
            let refused = public_api_url("spec.apiURL", url).expect_err(url);
            assert_eq!(refused.reason, reason::API_URL_NOT_ALLOWED, "{url}");
            assert!(refused.message.starts_with("spec.apiURL "), "{url}: {}", refused.message);
        }
    }

    #[test]
    fn routable_destinations_are_accepted() {
        for url in [
            "https://api.cluster.example.invalid:6443",
            "https://10.0.0.1:6443",
            "https://192.0.2.10",
            "https://[2001:db8::1]:6443",
            "https://[64:ff9b::c000:20a]",
            "https://k8s-1.example.invalid/prefix",
        ] {
            assert_eq!(public_api_url("spec.apiURL", url), Ok(()), "{url}");
        }
    }
}
