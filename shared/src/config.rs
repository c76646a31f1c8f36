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
/// Tests only: a PostgreSQL server to use instead of a throwaway one.
pub const TEST_DATABASE_URL: &str = "GITOPS_TEST_DATABASE_URL";
/// Tests only: a Kubernetes cluster to use instead of the emulator.
pub const TEST_KUBECONFIG: &str = "GITOPS_TEST_KUBECONFIG";

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
    use super::redact_database_url;

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
