//! The configuration contract shared by every binary: environment variable names
//! (flags of the same meaning read them) and defaults.

/// PostgreSQL URL or key/value string.
pub const DATABASE_URL: &str = "DATABASE_URL";
/// Optional direct connection for LISTEN when `DATABASE_URL` goes through a
/// transaction-mode pooler.
pub const LISTEN_DATABASE_URL: &str = "LISTEN_DATABASE_URL";
/// `id:base64key,…`: every key that may have encrypted a stored secret.
pub const ENCRYPTION_KEYS: &str = "GITOPS_ENCRYPTION_KEYS";
/// The key id new secrets are encrypted with.
pub const ENCRYPTION_ACTIVE_KEY: &str = "GITOPS_ENCRYPTION_ACTIVE_KEY";
/// The engine instance an agent serves (`gitops-agent run --instance`).
pub const ENGINE_INSTANCE: &str = "GITOPS_ENGINE_INSTANCE";

/// Parses a duration as every binary's flags take it: `250ms`, `30s`, `5m`, `1h`,
/// `2d`, compounds such as `1m30s`, and a bare number of seconds (the form older
/// settings used).
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    use std::time::Duration;
    let text = text.trim();
    let invalid = || format!("{text:?} is not a duration like 30s, 5m, 1m30s or 250ms");
    if text.is_empty() {
        return Err(invalid());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map(Duration::from_secs).map_err(|_| invalid());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(invalid());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number.saturating_mul(60)),
            "h" => Duration::from_secs(number.saturating_mul(3_600)),
            "d" => Duration::from_secs(number.saturating_mul(86_400)),
            unit => return Err(format!("unknown unit {unit:?} in {text:?} (use ms, s, m, h or d)")),
        };
        total = total.checked_add(part).ok_or_else(invalid)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// A PostgreSQL connection string whose `Debug` and `Display` hide the password, so
/// configurations that derive `Debug` can hold one. [`DatabaseUrl::expose`] gives the
/// string to the code that connects.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    pub fn new(url: impl Into<String>) -> DatabaseUrl {
        DatabaseUrl(url.into())
    }

    /// The whole string, password included: only for connecting.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DatabaseUrl({:?})", redact_database_url(&self.0))
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_database_url(&self.0))
    }
}

impl std::str::FromStr for DatabaseUrl {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(DatabaseUrl(text.to_owned()))
    }
}

impl From<String> for DatabaseUrl {
    fn from(url: String) -> Self {
        DatabaseUrl(url)
    }
}

/// Reads a deprecated environment variable: its value, and a warning naming the
/// variable to use instead (logged once the binary's logging is set up).
pub fn deprecated_env(old: &str, new: &str) -> Option<(String, String)> {
    let value = std::env::var(old).ok().filter(|v| !v.is_empty())?;
    Some((value, format!("{old} is deprecated; set {new} instead")))
}

/// Removes the password from a connection URL or key/value string, for logs and
/// error messages.
pub fn redact_database_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let (authority, tail) = rest.split_once('/').map_or((rest, ""), |(a, t)| (a, t));
        let authority = match authority.rsplit_once('@') {
            Some((userinfo, host)) => {
                let user = userinfo.split(':').next().unwrap_or("");
                format!("{user}:***@{host}")
            }
            None => authority.to_owned(),
        };
        let tail = redact_password_param(tail);
        return if rest.contains('/') {
            format!("{scheme}://{authority}/{tail}")
        } else {
            format!("{scheme}://{authority}")
        };
    }
    url.split_whitespace()
        .map(|part| if part.starts_with("password=") { "password=***".to_owned() } else { part.to_owned() })
        .collect::<Vec<_>>()
        .join(" ")
}

fn redact_password_param(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else { return tail.to_owned() };
    let query: Vec<String> = query
        .split('&')
        .map(|kv| if kv.starts_with("password=") { "password=***".to_owned() } else { kv.to_owned() })
        .collect();
    format!("{path}?{}", query.join("&"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{DatabaseUrl, parse_duration, redact_database_url};

    #[test]
    fn durations_read_simple_compound_and_bare_forms() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h2m3s4ms"), Ok(Duration::from_millis(3_723_004)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration(" 600 "), Ok(Duration::from_secs(600)), "a bare number is seconds");
        for bad in ["", "s", "5x", "1.5s", "-3s", "m5", "5 m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn database_urls_hide_their_password_when_shown() {
        let url: DatabaseUrl = "postgres://gitops:s3cret@127.0.0.1/gitops".parse().expect("url");
        assert!(!format!("{url:?}").contains("s3cret"));
        assert!(!url.to_string().contains("s3cret"));
        assert!(url.expose().contains("s3cret"));
    }

    #[test]
    fn passwords_are_removed_from_both_url_forms() {
        assert_eq!(
            redact_database_url("postgres://gitops:s3cret@127.0.0.1:5432/gitops?sslmode=disable&password=x"),
            "postgres://gitops:***@127.0.0.1:5432/gitops?sslmode=disable&password=***"
        );
        assert_eq!(redact_database_url("host=127.0.0.1 password=s3cret user=a"), "host=127.0.0.1 password=*** user=a");
        assert!(!redact_database_url("postgresql://u:pw@h").contains("pw"));
    }
}
