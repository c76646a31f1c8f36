//! Contacting a host a tenant named (an environment's `apiURL`, a repository URL):
//! the operator's policy ([`ConnectionPolicy`]) is applied to the host as written,
//! then the name is resolved once and *every* address it resolves to is checked;
//! the caller connects to the returned address only, so no second lookup can lead
//! elsewhere (a name that answers a public address to the check and a private one to
//! the connection). An address is refused when an IP or CIDR deny entry names it,
//! and a special address ([`special`]) unless an IP or CIDR allow entry names it:
//! `*` or a host name in the allow list never opens loopback, link-local, cloud
//! metadata or private networks.
//!
//! A name with several addresses falls back from one that refuses to the next
//! checked one ([`resolve_with`]); nothing unchecked is ever tried.
//!
//! Addresses are compared in one spelling: an IPv4-mapped, IPv4-compatible or NAT64
//! IPv6 address counts as the IPv4 address it carries ([`canonical`]); hosts written
//! in other IPv4 spellings (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`) are never
//! resolved (the policy refuses them as ambiguous before any lookup).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use super::connection::{ConnectionPolicy, Denial};

/// How long a lookup may take.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a host is not contacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The policy refuses the host as written or one of its addresses.
    Denied(Denial),
    /// The name did not resolve (or not in time); nothing was contacted.
    Unresolved,
}

/// A host that may be contacted, and the one address to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The host as written, lower-cased (an IPv6 literal without brackets); for TLS
    /// server names and SSH host keys.
    pub host: String,
    /// Whether the host is a name (not an IP literal).
    pub named: bool,
    pub address: SocketAddr,
}

/// How long the connection to one checked address may take before the next is tried.
pub const ADDRESS_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Addresses of one name tried at most.
const MAX_ADDRESSES_TRIED: usize = 8;

/// Applies `policy` to `host` (as written in a URL, an IPv6 literal in brackets) and
/// `port`, resolves a name once and checks every address; the one to connect to is
/// returned (see [`resolve_with`]).
pub async fn resolve(policy: &ConnectionPolicy, host: &str, port: u16) -> Result<Checked, Refusal> {
    resolve_with(policy, host, port, |name, port| async move {
        tokio::net::lookup_host((name.as_str(), port)).await.map(Iterator::collect)
    })
    .await
}

/// [`resolve`] with the lookup of a name given (the system's, or a test's).
///
/// When a name resolves to several addresses — all of them checked — they are
/// tried in order, IPv4 ones first (a name that has both is more often served on
/// IPv4), with a TCP connect each, and the first that accepts is returned: an
/// address that refuses or does not answer within [`ADDRESS_CONNECT_TIMEOUT`] does
/// not hide the others. When none accepts, the first is returned and the caller's
/// own connection reports the failure. A name with one address, and an IP literal,
/// are returned without a trial connection.
pub async fn resolve_with<F, Fut>(
    policy: &ConnectionPolicy,
    host: &str,
    port: u16,
    lookup: F,
) -> Result<Checked, Refusal>
where
    F: FnOnce(String, u16) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<Vec<SocketAddr>>>,
{
    policy.decide_host(host, port).map_err(Refusal::Denied)?;
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host).to_ascii_lowercase();
    if let Ok(ip) = bare.parse::<IpAddr>() {
        let ip = canonical(ip);
        policy.permits_address(ip, port).map_err(Refusal::Denied)?;
        return Ok(Checked { host: bare, named: false, address: SocketAddr::new(ip, port) });
    }
    let addresses: Vec<SocketAddr> = match tokio::time::timeout(RESOLVE_TIMEOUT, lookup(bare.clone(), port)).await {
        Ok(Ok(found)) => found,
        Ok(Err(_)) | Err(_) => return Err(Refusal::Unresolved),
    };
    for address in &addresses {
        policy.permits_address(address.ip(), port).map_err(Refusal::Denied)?;
    }
    let mut candidates: Vec<SocketAddr> = Vec::new();
    let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = addresses.iter().map(|a| canonical(a.ip())).partition(IpAddr::is_ipv4);
    for ip in v4.into_iter().chain(v6) {
        let address = SocketAddr::new(ip, port);
        if !candidates.contains(&address) {
            candidates.push(address);
        }
    }
    let first = *candidates.first().ok_or(Refusal::Unresolved)?;
    let chosen = if candidates.len() == 1 { first } else { first_accepting(&candidates).await.unwrap_or(first) };
    Ok(Checked { host: bare, named: true, address: chosen })
}

/// The first of `candidates` (at most [`MAX_ADDRESSES_TRIED`]) that accepts a TCP
/// connection; the trial connection is closed at once.
async fn first_accepting(candidates: &[SocketAddr]) -> Option<SocketAddr> {
    for address in candidates.iter().take(MAX_ADDRESSES_TRIED) {
        let connect = tokio::net::TcpStream::connect(address);
        if let Ok(Ok(_)) = tokio::time::timeout(ADDRESS_CONNECT_TIMEOUT, connect).await {
            return Some(*address);
        }
    }
    None
}

/// The one spelling of an address: an IPv6 address that carries an IPv4 address
/// (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`) is that
/// IPv4 address; `::` and `::1` stay IPv6.
pub fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let segments = v6.segments();
    let embedded = Ipv4Addr::from((u32::from(segments[6]) << 16) | u32::from(segments[7]));
    let compatible = segments[..6].iter().all(|s| *s == 0) && u32::from(embedded) > 1;
    let nat64 = segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    if compatible || nat64 { IpAddr::V4(embedded) } else { IpAddr::V6(v6) }
}

/// What kind of special address `ip` is (after [`canonical`]); `None` for an
/// ordinary public unicast address.
pub fn special(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (169, 254, 169) if ip.octets()[3] == 254 => "cloud metadata",
        (100, 100, 100) if ip.octets()[3] == 200 => "cloud metadata",
        (127, _, _) => "loopback",
        (169, 254, _) => "link-local",
        (0, _, _) => "unspecified",
        (10, _, _) | (192, 168, _) => "private",
        (172, 16..=31, _) => "private",
        (100, 64..=127, _) => "shared (carrier-grade NAT)",
        (192, 0, 0) | (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "reserved",
        (198, 18..=19, _) => "benchmarking",
        (224..=239, _, _) => "multicast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    })
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    Some(match first {
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        0xfd00 if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) => "cloud metadata",
        _ if first & 0xffc0 == 0xfe80 => "link-local",
        _ if first & 0xffc0 == 0xfec0 => "site-local",
        _ if first & 0xfe00 == 0xfc00 => "private (unique local)",
        _ if first & 0xff00 == 0xff00 => "multicast",
        0x2001 if ip.segments()[1] == 0xdb8 => "documentation",
        0x2002 => "6to4",
        0x2001 if ip.segments()[1] == 0 => "Teredo",
        0x0100 if ip.segments()[1..4] == [0, 0, 0] => "discard",
        _ if first == 0 => "reserved",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> ConnectionPolicy {
        let list = |l: &[&str]| l.iter().map(|p| p.parse().unwrap_or_else(|e| panic!("{e}"))).collect();
        ConnectionPolicy::new(list(allow), list(deny))
    }

    #[test]
    fn every_spelling_of_an_ipv4_address_is_that_address() {
        let loopback = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
        for spelling in ["::ffff:127.0.0.1", "::ffff:7f00:1", "::127.0.0.1", "64:ff9b::7f00:1", "0:0:0:0:0:ffff:7f00:1"]
        {
            let ip: IpAddr = spelling.parse().expect("an IPv6 address");
            assert_eq!(canonical(ip), loopback, "{spelling}");
            assert_eq!(special(ip), Some("loopback"), "{spelling}");
        }
        assert_eq!(canonical("::1".parse().expect("ip")), "::1".parse::<IpAddr>().expect("ip"));
        assert_eq!(canonical("::".parse().expect("ip")), "::".parse::<IpAddr>().expect("ip"));
        let metadata: IpAddr = "::ffff:169.254.169.254".parse().expect("ip");
        assert_eq!(special(metadata), Some("cloud metadata"));
    }

    #[test]
    fn special_addresses() {
        for (address, kind) in [
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("169.254.169.254", "cloud metadata"),
            ("169.254.0.1", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "shared (carrier-grade NAT)"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fe80::1", "link-local"),
            ("fd00::1", "private (unique local)"),
            ("fd00:ec2::254", "cloud metadata"),
            ("fc00::1", "private (unique local)"),
            ("ff02::1", "multicast"),
            ("2002:7f00:1::", "6to4"),
        ] {
            assert_eq!(special(address.parse().expect("ip")), Some(kind), "{address}");
        }
        for public in ["8.8.8.8", "172.32.0.1", "100.128.0.1", "2606:4700::1111", "::ffff:1.1.1.1"] {
            assert_eq!(special(public.parse().expect("ip")), None, "{public}");
        }
    }

    #[tokio::test]
    async fn special_addresses_need_an_address_entry() {
        let open = policy(&["*"], &[]);
        for host in
            ["127.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[64:ff9b::a9fe:a9fe]", "169.254.169.254"]
        {
            assert_eq!(resolve(&open, host, 443).await, Err(Refusal::Denied(Denial::PrivateAddress)), "{host}");
        }
        // Other IPv4 spellings are never resolved: ambiguous as written.
        for host in ["2130706433", "0x7f000001", "0x7f.1", "0177.0.0.1", "127.1", "127.0.0.1.", "[fe80::1%25lo]"] {
            assert_eq!(resolve(&open, host, 443).await, Err(Refusal::Denied(Denial::Ambiguous)), "{host}");
        }
        let named = policy(&["*", "127.0.0.0/8", "[::1]"], &[]);
        let checked = resolve(&named, "[::ffff:127.0.0.1]", 8443).await.expect("allowed by address");
        assert_eq!(checked.address, "127.0.0.1:8443".parse().expect("address"));
        assert!(!checked.named);
        assert_eq!(resolve(&named, "[::1]", 22).await.map(|c| c.address), Ok("[::1]:22".parse().expect("address")));
    }

    #[tokio::test]
    async fn a_name_is_checked_by_every_address_it_resolves_to() {
        // `localhost` resolves to loopback only (127.0.0.1 and/or ::1).
        let by_name = policy(&["localhost"], &[]);
        assert_eq!(resolve(&by_name, "localhost", 443).await, Err(Refusal::Denied(Denial::PrivateAddress)));
        let with_addresses = policy(&["localhost", "127.0.0.0/8", "[::1]"], &[]);
        let checked = resolve(&with_addresses, "LOCALHOST", 443).await.expect("allowed");
        assert!(checked.named && checked.address.ip().is_loopback(), "{checked:?}");
        assert_eq!(checked.host, "localhost");
        let denied = policy(&["localhost", "127.0.0.0/8", "[::1]"], &["127.0.0.1", "[::1]"]);
        assert_eq!(resolve(&denied, "localhost", 443).await, Err(Refusal::Denied(Denial::DenyListed)));
    }

    /// A name resolving to `addresses` (through a lookup of the test's own).
    async fn resolve_to(policy: &ConnectionPolicy, addresses: &[SocketAddr]) -> Result<Checked, Refusal> {
        let addresses = addresses.to_vec();
        let port = addresses[0].port();
        resolve_with(policy, "multi.test", port, move |name, _| async move {
            assert_eq!(name, "multi.test");
            Ok(addresses)
        })
        .await
    }

    #[tokio::test]
    async fn a_refusing_address_falls_back_to_the_next_checked_one() {
        // One port, open on ::1 and on 127.0.0.2, closed on 127.0.0.1.
        let v6 = std::net::TcpListener::bind("[::1]:0").expect("bind ::1");
        let port = v6.local_addr().expect("address").port();
        let other = std::net::TcpListener::bind(("127.0.0.2", port)).expect("bind 127.0.0.2");
        let (one, two, six): (SocketAddr, SocketAddr, SocketAddr) = (
            format!("127.0.0.1:{port}").parse().expect("address"),
            format!("127.0.0.2:{port}").parse().expect("address"),
            format!("[::1]:{port}").parse().expect("address"),
        );
        assert!(std::net::TcpStream::connect(one).is_err(), "nothing listens on 127.0.0.1:{port}");
        let allowed = policy(&["multi.test", "127.0.0.0/8", "[::1]"], &[]);
        // IPv4 first; the refusing 127.0.0.1 does not hide ::1.
        let checked = resolve_to(&allowed, &[six, one]).await.expect("allowed");
        assert_eq!((checked.address, checked.named, checked.host.as_str()), (six, true, "multi.test"));
        // Nor another IPv4 address after it.
        assert_eq!(resolve_to(&allowed, &[one, two, six]).await.map(|c| c.address), Ok(two));
        // One that accepts first is taken as it is.
        assert_eq!(resolve_to(&allowed, &[two, one]).await.map(|c| c.address), Ok(two));
        drop((v6, other));
        // None accepts: the first checked one, whose connection then reports the failure.
        assert_eq!(resolve_to(&allowed, &[six, one]).await.map(|c| c.address), Ok(one));
        // Every address is still checked before any is tried: one refused refuses the name.
        let only_v4 = policy(&["multi.test", "127.0.0.0/8"], &[]);
        assert_eq!(resolve_to(&only_v4, &[one, six]).await, Err(Refusal::Denied(Denial::PrivateAddress)));
    }
}
