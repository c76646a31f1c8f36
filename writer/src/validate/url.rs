//! URL forms: Git repository URLs (`https://`, `ssh://`, `git://` and the scp-like
//! `user@host:path`), repository-credential URLs (`https://` or `ssh://`) and
//! cluster API URLs (`https://` with a host). A small parser of our own, because
//! the rules are narrower than a general URL parser's: no whitespace, a real host
//! (never starting with `-`, which `git`/`ssh` would read as an option), no
//! password in the URL (credentials belong in a GitOpsDeploymentRepositoryCredential).

use super::{Invalid, limits, reason, text::required};

/// The parts of `scheme://[user[:password]@]host[:port][/rest]`.
#[derive(Debug, PartialEq, Eq)]
struct Parts<'a> {
    scheme: &'a str,
    user: Option<&'a str>,
    has_password: bool,
    host: &'a str,
    /// Everything from the first `/`, `?` or `#` after the authority.
    rest: &'a str,
}

fn parse(value: &str) -> Option<Parts<'_>> {
    let (scheme, after) = value.split_once("://")?;
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (authority, rest) = after.split_at(end);
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((userinfo, host_port)) => (Some(userinfo), host_port),
        None => (None, authority),
    };
    let (user, has_password) = match userinfo {
        Some(info) => match info.split_once(':') {
            Some((user, _)) => (Some(user), true),
            None => (Some(info), false),
        },
        None => (None, false),
    };
    let host = host_and_port(host_port)?;
    Some(Parts { scheme, user, has_password, host, rest })
}

/// The host of `host[:port]` or `[v6][:port]`, if both parts are well formed.
fn host_and_port(host_port: &str) -> Option<&str> {
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        let (v6, after) = bracketed.split_once(']')?;
        if v6.is_empty() || !v6.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.') {
            return None;
        }
        let port = if after.is_empty() { None } else { Some(after.strip_prefix(':')?) };
        (v6, port)
    } else {
        match host_port.split_once(':') {
            Some((host, port)) => (valid_hostname(host)?, Some(port)),
            None => (valid_hostname(host_port)?, None),
        }
    };
    if let Some(port) = port {
        let number: u32 = port.parse().ok().filter(|_| port.bytes().all(|b| b.is_ascii_digit()))?;
        if !(1..=65535).contains(&number) {
            return None;
        }
    }
    Some(host)
}

fn valid_hostname(host: &str) -> Option<&str> {
    let ok = !host.is_empty()
        && host.len() <= limits::DNS_SUBDOMAIN
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    ok.then_some(host)
}

fn valid_user(user: &str) -> bool {
    !user.is_empty()
        && !user.starts_with('-')
        && user.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'~' | b'%' | b'+'))
}

fn no_whitespace(field: &str, value: &str, reason: &'static str) -> Result<(), Invalid> {
    if value.chars().any(char::is_whitespace) {
        return Err(Invalid::new(reason, format!("{field} must not contain spaces")));
    }
    Ok(())
}

/// A Git repository URL: `https://host/path`, `ssh://[user@]host[:port]/path`,
/// `git://host/path` or scp-like `[user@]host:path`.
pub fn repository_url(field: &str, value: &str) -> Result<String, Invalid> {
    let value = required(field, value, limits::URL)?;
    let refused = || {
        Invalid::new(
            reason::INVALID_REPOSITORY_URL,
            format!(
                "{field} must be a Git repository URL: https://host/path, ssh://[user@]host[:port]/path, \
                 git://host/path or user@host:path"
            ),
        )
    };
    no_whitespace(field, value, reason::INVALID_REPOSITORY_URL)?;
    if value.contains("://") {
        let parts = parse(value).ok_or_else(refused)?;
        check_repository_parts(field, &parts, &["https", "ssh", "git"]).map_err(|e| e.unwrap_or_else(refused))?;
        return Ok(value.to_owned());
    }
    // scp-like: no "://", and no '/' before the first ':'.
    let (left, path) = value.split_once(':').ok_or_else(refused)?;
    // A leading ':' would make it git's `transport::address` form (`ext::` runs commands).
    if left.contains('/') || path.is_empty() || path.starts_with(['-', ':']) {
        return Err(refused());
    }
    let host = match left.rsplit_once('@') {
        Some((user, host)) if valid_user(user) => host,
        Some(_) => return Err(refused()),
        None => left,
    };
    valid_hostname(host).ok_or_else(refused)?;
    Ok(value.to_owned())
}

/// A repository-credential URL: `https://` or `ssh://` only.
pub fn credential_repository_url(field: &str, value: &str) -> Result<String, Invalid> {
    let value = required(field, value, limits::URL)?;
    let refused = || {
        Invalid::new(
            reason::INVALID_REPOSITORY_URL,
            format!("{field} must be an https:// or ssh:// URL of a Git repository or repository prefix"),
        )
    };
    no_whitespace(field, value, reason::INVALID_REPOSITORY_URL)?;
    let parts = parse(value).ok_or_else(refused)?;
    check_repository_parts(field, &parts, &["https", "ssh"]).map_err(|e| e.unwrap_or_else(refused))?;
    Ok(value.to_owned())
}

/// `Err(None)`: refused with the caller's generic message; `Err(Some)`: a specific one.
fn check_repository_parts(field: &str, parts: &Parts<'_>, schemes: &[&str]) -> Result<(), Option<Invalid>> {
    if !schemes.contains(&parts.scheme) {
        return Err(None);
    }
    if parts.has_password {
        return Err(Some(Invalid::new(
            reason::INVALID_REPOSITORY_URL,
            format!("{field} must not contain a password; put credentials in a GitOpsDeploymentRepositoryCredential"),
        )));
    }
    if parts.user.is_some_and(|user| !valid_user(user)) {
        return Err(None);
    }
    if parts.rest.trim_start_matches('/').is_empty() || !parts.rest.starts_with('/') {
        return Err(Some(Invalid::new(reason::INVALID_REPOSITORY_URL, format!("{field} names no repository path"))));
    }
    Ok(())
}

/// A cluster API URL: `https://host[:port][/path]`, without user, query or fragment.
pub fn api_url(field: &str, value: &str) -> Result<String, Invalid> {
    let value = required(field, value, limits::URL)?;
    let refused = || {
        Invalid::new(
            reason::INVALID_API_URL,
            format!("{field} must be an https:// URL with a host, like https://api.cluster.example.com:6443"),
        )
    };
    no_whitespace(field, value, reason::INVALID_API_URL)?;
    let parts = parse(value).ok_or_else(refused)?;
    if parts.scheme != "https" || parts.user.is_some() || parts.rest.contains(['?', '#']) {
        return Err(refused());
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::reason::*;

    #[test]
    fn repository_urls_in_every_accepted_form() {
        for good in [
            "https://git.example.invalid/team/repo.git",
            "https://git.example.invalid:8443/team/repo",
            "ssh://git@git.example.invalid/team/repo.git",
            "ssh://git@git.example.invalid:2222/team/repo.git",
            "git://git.example.invalid/team/repo.git",
            "git@git.example.invalid:team/repo.git",
            "git.example.invalid:team/repo.git",
            "https://[2001:db8::1]/team/repo",
            "https://git.example.invalid/team/it's;$(x)`y`&z|w.git",
        ] {
            assert_eq!(repository_url("spec.source.repoURL", good), Ok(good.to_owned()), "{good}");
        }
    }

    #[test]
    fn bad_repository_urls_are_refused() {
        for bad in [
            "http://git.example.invalid/team/repo.git",
            "file:///etc/passwd",
            "ftp://git.example.invalid/repo",
            "https://",
            "https:///repo",
            "https://git.example.invalid",
            "https://git.example.invalid/",
            "https://-oProxyCommand=x/repo",
            "ssh://-oProxyCommand=x@host/repo",
            "ssh://git@host:99999/repo",
            "ssh://git@host:port/repo",
            "https://git.example.invalid/team repo",
            "git@host:-oProxyCommand=x",
            "git@:repo",
            "/local/path",
            "./relative",
            "repo",
            "team/repo:thing",
            "https://[zz]/repo",
            "https://[::1/repo",
            "ext::sh -c touch% /tmp/pwned",
            "ext::sh%20-c%20id",
            "fd::17/repo",
        ] {
            assert_eq!(repository_url("spec.source.repoURL", bad).unwrap_err().reason, INVALID_REPOSITORY_URL, "{bad}");
        }
        let password = repository_url("f", "https://user:s3cret@git.example.invalid/repo").unwrap_err();
        assert_eq!(password.reason, INVALID_REPOSITORY_URL);
        assert!(!password.message.contains("s3cret"));
        assert_eq!(repository_url("f", "").unwrap_err().reason, FIELD_REQUIRED);
        assert_eq!(repository_url("f", "https://h/\0").unwrap_err().reason, INVALID_CHARACTERS);
        let long = format!("https://git.example.invalid/{}", "a".repeat(limits::URL));
        assert_eq!(repository_url("f", &long).unwrap_err().reason, FIELD_TOO_LONG);
    }

    #[test]
    fn credential_urls_are_https_or_ssh_only() {
        assert!(credential_repository_url("f", "https://git.example.invalid/team").is_ok());
        assert!(credential_repository_url("f", "ssh://git@git.example.invalid/team").is_ok());
        for bad in ["git://git.example.invalid/team", "git@git.example.invalid:team", "http://h/x", "https://h"] {
            assert_eq!(credential_repository_url("f", bad).unwrap_err().reason, INVALID_REPOSITORY_URL, "{bad}");
        }
    }

    #[test]
    fn api_urls_are_https_with_a_host() {
        for good in [
            "https://cluster.example.invalid:6443",
            "https://cluster.example.invalid",
            "https://cluster.example.invalid/k8s/clusters/c-1",
            "https://10.0.0.1:6443",
            "https://[2001:db8::1]:6443",
        ] {
            assert_eq!(api_url("spec.apiURL", good), Ok(good.to_owned()), "{good}");
        }
        for bad in [
            "http://cluster.example.invalid:6443",
            "https://",
            "https://:6443",
            "cluster.example.invalid:6443",
            "https://user@cluster.example.invalid",
            "https://cluster.example.invalid/?x=1",
            "https://cluster.example.invalid:0",
            "https://clu ster.example.invalid",
            "unix:///var/run/k8s.sock",
        ] {
            assert_eq!(api_url("spec.apiURL", bad).unwrap_err().reason, INVALID_API_URL, "{bad}");
        }
    }
}
