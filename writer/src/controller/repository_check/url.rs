//! The repository URLs the writer validates: `https://host[:port]/path` and
//! `ssh://[user@]host[:port]/path` (or the scp-like `user@host:path`), nothing else.
//! Every part is read strictly so that nothing in it can become an option of git or
//! ssh: no part starts with `-`, no control characters or spaces, no credentials in
//! an HTTPS URL (they belong in the Secret), no query or fragment.

use std::fmt;

/// A repository URL that may be handed to git.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepositoryUrl {
    scheme: Scheme,
    user: Option<String>,
    /// As written (an IPv6 literal in brackets).
    host: String,
    port: u16,
    explicit_port: bool,
    /// Starts with `/` for `https://` and `ssh://`; as written for scp-like URLs.
    path: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Https,
    Ssh,
    /// `user@host:path`.
    ScpLike,
}

/// Why a repository URL is refused (the message is shown to the tenant).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the repository URL {0}")]
pub struct UrlError(&'static str);

impl RepositoryUrl {
    pub fn parse(text: &str) -> Result<Self, UrlError> {
        if text.is_empty() || text.len() > 2048 {
            return Err(UrlError("is empty or too long"));
        }
        if text.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(UrlError("contains spaces or control characters"));
        }
        if text.contains(['?', '#']) {
            return Err(UrlError("has a query or fragment"));
        }
        let (scheme, rest) = if let Some(rest) = text.strip_prefix("https://") {
            (Scheme::Https, rest)
        } else if let Some(rest) = text.strip_prefix("ssh://") {
            (Scheme::Ssh, rest)
        } else if !text.contains("://") && text.contains('@') && text.contains(':') {
            (Scheme::ScpLike, text)
        } else {
            return Err(UrlError("is neither https://, ssh:// nor user@host:path"));
        };
        let (authority, path) = match scheme {
            Scheme::ScpLike => {
                let (user, after) = rest.split_once('@').ok_or(UrlError("has no user"))?;
                let (host, path) = split_scp_host(after).ok_or(UrlError("has no host:path"))?;
                (format!("{user}@{host}"), path.to_owned())
            }
            _ => {
                let end = rest.find('/').ok_or(UrlError("has no repository path"))?;
                (rest[..end].to_owned(), rest[end..].to_owned())
            }
        };
        let (user, host_port) = match authority.rsplit_once('@') {
            Some((user, host_port)) => (Some(user.to_owned()), host_port.to_owned()),
            None => (None, authority),
        };
        if scheme == Scheme::Https && user.is_some() {
            return Err(UrlError("carries credentials; they belong in the Secret"));
        }
        if let Some(user) = &user {
            let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
            if user.is_empty() || user.len() > 64 || user.starts_with('-') || !user.bytes().all(plain) {
                return Err(UrlError("has a user name other than letters, digits, '.', '_' and '-'"));
            }
        }
        let (host, port) = split_port(&host_port).ok_or(UrlError("has an unreadable host or port"))?;
        let valid_host = if let Some(inside) = host.strip_prefix('[') {
            inside.strip_suffix(']').is_some_and(|v6| v6.parse::<std::net::Ipv6Addr>().is_ok())
        } else {
            !host.is_empty()
                && !host.starts_with('-')
                && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
        };
        if !valid_host {
            return Err(UrlError("has an invalid host"));
        }
        if scheme == Scheme::ScpLike && port.is_some() {
            return Err(UrlError("has a port, which user@host:path cannot carry; use ssh://"));
        }
        let trimmed = path.trim_start_matches('/');
        if trimmed.is_empty() || trimmed.starts_with('-') || path.split('/').any(|s| s.starts_with('-')) {
            return Err(UrlError("has an empty path or a path part starting with '-'"));
        }
        let default_port = if scheme == Scheme::Https { 443 } else { 22 };
        Ok(RepositoryUrl {
            scheme,
            user,
            host: host.to_ascii_lowercase(),
            port: port.unwrap_or(default_port),
            explicit_port: port.is_some(),
            path,
        })
    }

    pub fn is_ssh(&self) -> bool {
        self.scheme != Scheme::Https
    }

    /// The host as written, lower-cased (an IPv6 literal in brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

/// The URL as git is given it.
impl fmt::Display for RepositoryUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.scheme {
            Scheme::ScpLike => {
                write!(f, "{}@{}:{}", self.user.as_deref().unwrap_or_default(), self.host, self.path)
            }
            Scheme::Https | Scheme::Ssh => {
                let scheme = if self.scheme == Scheme::Https { "https" } else { "ssh" };
                write!(f, "{scheme}://")?;
                if let Some(user) = &self.user {
                    write!(f, "{user}@")?;
                }
                write!(f, "{}", self.host)?;
                if self.explicit_port {
                    write!(f, ":{}", self.port)?;
                }
                write!(f, "{}", self.path)
            }
        }
    }
}

/// `host:path` of an scp-like URL (the host may be a bracketed IPv6 literal).
fn split_scp_host(text: &str) -> Option<(&str, &str)> {
    if text.starts_with('[') {
        let end = text.find(']')?;
        let path = text[end + 1..].strip_prefix(':')?;
        return Some((&text[..=end], path));
    }
    text.split_once(':')
}

/// `host[:port]`, the host possibly a bracketed IPv6 literal.
fn split_port(text: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if text.starts_with('[') {
        let end = text.find(']')?;
        let after = &text[end + 1..];
        (&text[..=end], if after.is_empty() { None } else { Some(after.strip_prefix(':')?) })
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let port = match port {
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            Some(p.parse::<u16>().ok().filter(|p| *p != 0)?)
        }
        Some(_) => return None,
        None => None,
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_urls_are_handed_on_as_written() {
        for (text, host, port, ssh) in [
            ("https://git.example.com/org/repo.git", "git.example.com", 443, false),
            ("https://GIT.example.com:8443/r", "git.example.com", 8443, false),
            ("https://[::1]:8443/r.git", "[::1]", 8443, false),
            ("ssh://git@git.example.com/org/repo.git", "git.example.com", 22, true),
            ("ssh://git@127.0.0.1:2222/srv/r.git", "127.0.0.1", 2222, true),
            ("git@github.com:org/repo.git", "github.com", 22, true),
        ] {
            let url = RepositoryUrl::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((url.host(), url.port(), url.is_ssh()), (host, port, ssh), "{text}");
            assert_eq!(url.to_string().to_ascii_lowercase(), text.to_ascii_lowercase());
        }
    }

    #[test]
    fn anything_that_could_become_an_option_is_refused() {
        for bad in [
            "",
            "http://git.example.com/r",
            "file:///srv/r.git",
            "ext::sh -c touch% /tmp/x",
            "git://git.example.com/r",
            "-uhttps://x/r",
            "https://user:pw@git.example.com/r",
            "https://git.example.com",
            "https://git.example.com/",
            "https://git.example.com/-r",
            "https://-oProxyCommand=x/r",
            "ssh://-oProxyCommand=x/r",
            "ssh://-u@host/r",
            "ssh://git@host:0/r",
            "ssh://git@host:x/r",
            "ssh://git@host/r?x",
            "ssh://git@[zz::1]/r",
            "-oProxyCommand=x@host:r",
            "git@host:-r",
            "https://git.example.com/r x",
            "https://git.example.com/r\n",
            "https://git.exa_mple.com/r",
        ] {
            assert!(RepositoryUrl::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
