//! A managed environment's kubeconfig, parsed as data — never handed to a client
//! config loader, which would run exec plugins, read files or contact proxies on
//! the writer's host. Only an inline bearer token or an inline client certificate
//! and key, plus an inline CA, the insecure flag and the TLS server name, are
//! accepted; every other way to authenticate or connect is refused with its own
//! reason, in every user and cluster of the file (not only the current one).
//!
//! The credentials used are those of the context whose cluster's `server` is the
//! environment's `apiURL` (compared after normalising scheme and host case, the
//! default port and a trailing slash) — never simply the current context, which may
//! name another cluster. No such context, or several, is refused
//! (`UnableToLocateContext`). A kubeconfig without contexts is read as one context
//! of its only user and its only cluster (whose server must match too).
//!
//! The YAML parser's own error text is never shown: it can quote the input.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use gitops_shared::db::credential::ClusterCredentials;
use serde::Deserialize;
use serde::de::IgnoredAny;

use super::{Invalid, limits, reason, text::text};

/// The Secret key that holds the kubeconfig.
pub const KUBECONFIG_KEY: &str = "kubeconfig";

/// The allow-listed credentials, ready to seal, and the kubeconfig's insecure flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidKubeconfig {
    pub credentials: ClusterCredentials,
    pub insecure_skip_tls_verify: bool,
}

#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(default)]
    clusters: Option<Vec<Named<Cluster>>>,
    #[serde(default)]
    users: Option<Vec<Named<User>>>,
    #[serde(default)]
    contexts: Option<Vec<Named<Context>>>,
}

/// `{name, cluster|user|context}`: the entry's body under any of those keys.
#[derive(Deserialize)]
struct Named<T> {
    #[serde(default)]
    name: Option<String>,
    #[serde(alias = "cluster", alias = "user", alias = "context", default)]
    body: Option<T>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct Cluster {
    server: Option<String>,
    certificate_authority_data: Option<String>,
    certificate_authority: Option<String>,
    insecure_skip_tls_verify: Option<bool>,
    tls_server_name: Option<String>,
    proxy_url: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct User {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    client_certificate_data: Option<String>,
    client_key_data: Option<String>,
    client_certificate: Option<String>,
    client_key: Option<String>,
    username: Option<String>,
    password: Option<String>,
    exec: Option<IgnoredAny>,
    auth_provider: Option<IgnoredAny>,
    #[serde(rename = "as")]
    as_user: Option<String>,
    as_uid: Option<String>,
    as_groups: Option<IgnoredAny>,
    as_user_extra: Option<IgnoredAny>,
}

#[derive(Deserialize, Default)]
struct Context {
    cluster: Option<String>,
    user: Option<String>,
}

fn set(value: &Option<String>) -> bool {
    value.as_deref().is_some_and(|v| !v.is_empty())
}

fn malformed(what: &str) -> Invalid {
    Invalid::new(reason::KUBECONFIG_MALFORMED, format!("the kubeconfig {what}"))
}

/// Parses and checks a kubeconfig (YAML or JSON) for the cluster at `api_url`.
pub fn kubeconfig(input: &str, api_url: &str) -> Result<ValidKubeconfig, Invalid> {
    if input.len() > limits::KUBECONFIG {
        return Err(Invalid::new(
            reason::FIELD_TOO_LONG,
            format!("the kubeconfig is {} bytes long; at most {} are allowed", input.len(), limits::KUBECONFIG),
        ));
    }
    if input.contains('\0') {
        return Err(Invalid::new(reason::INVALID_CHARACTERS, "the kubeconfig contains a NUL character"));
    }
    let config: Kubeconfig =
        serde_saphyr::from_str(input).map_err(|_| malformed("is not a valid kubeconfig document (YAML or JSON)"))?;
    let clusters = config.clusters.unwrap_or_default();
    let users = config.users.unwrap_or_default();
    let contexts = config.contexts.unwrap_or_default();
    refuse_features(&clusters, &users)?;

    let (cluster, user_name) = select(&contexts, &clusters, &users, api_url)?;
    let user = find(&users, user_name.as_deref(), "user")?;
    let user = user
        .ok_or_else(|| Invalid::new(reason::KUBECONFIG_NO_CREDENTIALS, "the kubeconfig's user has no credentials"))?;
    credentials(user, cluster.unwrap_or(&Cluster::default()))
}

fn refuse_features(clusters: &[Named<Cluster>], users: &[Named<User>]) -> Result<(), Invalid> {
    let all_users = || users.iter().filter_map(|u| u.body.as_ref());
    let all_clusters = || clusters.iter().filter_map(|c| c.body.as_ref());
    if all_users().any(|u| u.exec.is_some()) {
        return Err(Invalid::new(
            reason::KUBECONFIG_EXEC_PLUGIN_NOT_ALLOWED,
            "the kubeconfig uses an exec credential plugin; use an inline token or client certificate",
        ));
    }
    if all_users().any(|u| u.auth_provider.is_some()) {
        return Err(Invalid::new(
            reason::KUBECONFIG_AUTH_PROVIDER_NOT_ALLOWED,
            "the kubeconfig uses an auth-provider; use an inline token or client certificate",
        ));
    }
    let file_field = all_users()
        .find_map(|u| {
            [("tokenFile", &u.token_file), ("client-certificate", &u.client_certificate), ("client-key", &u.client_key)]
                .into_iter()
                .find(|(_, v)| set(v))
        })
        .map(|(name, _)| name)
        .or_else(|| all_clusters().find(|c| set(&c.certificate_authority)).map(|_| "certificate-authority"));
    if let Some(field) = file_field {
        return Err(Invalid::new(
            reason::KUBECONFIG_FILE_PATH_NOT_ALLOWED,
            format!("the kubeconfig refers to a file ({field}); inline the data instead (token, *-data fields)"),
        ));
    }
    if all_users().any(|u| set(&u.username) || set(&u.password)) {
        return Err(Invalid::new(
            reason::KUBECONFIG_BASIC_AUTH_NOT_ALLOWED,
            "the kubeconfig uses a username and password; use an inline token or client certificate",
        ));
    }
    if all_clusters().any(|c| set(&c.proxy_url)) {
        return Err(Invalid::new(
            reason::KUBECONFIG_PROXY_NOT_ALLOWED,
            "the kubeconfig sets a proxy-url, which is not allowed",
        ));
    }
    if all_users().any(|u| set(&u.as_user) || set(&u.as_uid) || u.as_groups.is_some() || u.as_user_extra.is_some()) {
        return Err(Invalid::new(
            reason::KUBECONFIG_IMPERSONATION_NOT_ALLOWED,
            "the kubeconfig impersonates another user (as, as-groups, as-uid, as-user-extra), which is not allowed",
        ));
    }
    Ok(())
}

/// `scheme://host[:port][/path]` compared as a client would dial it: scheme and
/// host without case, the scheme's default port made explicit, no trailing `/`.
/// `None` when it is not such a URL.
pub fn normalised_server(url: &str) -> Option<(String, String, u16, String)> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let (host, port) = match authority.rsplit_once(':').filter(|(host, port)| {
        !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && (!host.starts_with('[') || host.ends_with(']'))
    }) {
        Some((host, port)) => (host, Some(port.parse::<u16>().ok()?)),
        None => (authority, None),
    };
    if host.is_empty() {
        return None;
    }
    let default_port = match scheme.as_str() {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    Some((scheme, host.to_ascii_lowercase(), port.unwrap_or(default_port), path.trim_end_matches('/').to_owned()))
}

fn unable_to_locate(message: String) -> Invalid {
    Invalid::new(reason::UNABLE_TO_LOCATE_CONTEXT, message)
}

/// The cluster and the user's name of the one context whose cluster's server is
/// `api_url`; without contexts, the only cluster (its server matching) and user.
fn select<'a>(
    contexts: &'a [Named<Context>],
    clusters: &'a [Named<Cluster>],
    users: &[Named<User>],
    api_url: &str,
) -> Result<(Option<&'a Cluster>, Option<String>), Invalid> {
    let wanted = normalised_server(api_url);
    let matches =
        |cluster: &Cluster| wanted.is_some() && cluster.server.as_deref().and_then(normalised_server) == wanted;
    if contexts.is_empty() {
        if users.len() > 1 || clusters.len() > 1 {
            return Err(malformed("has several users or clusters and no context choosing among them"));
        }
        let cluster = clusters.first().and_then(|c| c.body.as_ref());
        if let Some(cluster) = cluster
            && !matches(cluster)
        {
            return Err(unable_to_locate("the kubeconfig's cluster has a server other than spec.apiURL".to_owned()));
        }
        return Ok((cluster, None));
    }
    let mut found = Vec::new();
    for context in contexts {
        let body = context.body.as_ref().ok_or_else(|| malformed("has a context without a body"))?;
        let Some(cluster_name) = body.cluster.as_deref().filter(|c| !c.is_empty()) else { continue };
        let cluster = find(clusters, Some(cluster_name), "cluster")?;
        if let Some(cluster) = cluster.filter(|c| matches(c)) {
            found.push((context.name.as_deref().unwrap_or_default(), cluster, body.user.clone().unwrap_or_default()));
        }
    }
    match found.as_slice() {
        [(_, cluster, user)] => Ok((Some(*cluster), Some(user.clone()))),
        [] => Err(unable_to_locate("the kubeconfig has no context whose cluster's server is spec.apiURL".to_owned())),
        several => {
            let names: Vec<String> = several.iter().take(5).map(|(name, _, _)| format!("{name:?}")).collect();
            Err(unable_to_locate(format!(
                "the kubeconfig has several contexts whose cluster's server is spec.apiURL ({}); keep one",
                names.join(", ")
            )))
        }
    }
}

/// The entry named `name`; `None` name: the only entry.
fn find<'a, T>(entries: &'a [Named<T>], name: Option<&str>, kind: &str) -> Result<Option<&'a T>, Invalid> {
    let entry = match name {
        Some(name) => entries.iter().find(|e| e.name.as_deref() == Some(name)),
        None => entries.first(),
    };
    match entry {
        Some(entry) => Ok(entry.body.as_ref()),
        None if kind == "user" => {
            Err(Invalid::new(reason::KUBECONFIG_NO_CREDENTIALS, "the kubeconfig's context names no user it defines"))
        }
        None => Err(malformed(&format!("names a {kind} that it does not define"))),
    }
}

fn credentials(user: &User, cluster: &Cluster) -> Result<ValidKubeconfig, Invalid> {
    let token = user.token.as_deref().map(str::trim).filter(|t| !t.is_empty());
    if let Some(token) = token {
        text("the kubeconfig's token", token, limits::CREDENTIAL_DATA)?;
        if token.chars().any(char::is_whitespace) {
            return Err(malformed("has a token with spaces in it"));
        }
    }
    let cert = data("client-certificate-data", &user.client_certificate_data)?;
    let key = data("client-key-data", &user.client_key_data)?;
    let ca = data("certificate-authority-data", &cluster.certificate_authority_data)?;
    match (&cert, &key) {
        (Some(_), None) | (None, Some(_)) => {
            return Err(Invalid::new(
                reason::KUBECONFIG_NO_CREDENTIALS,
                "the kubeconfig has only one of client-certificate-data and client-key-data; both are needed",
            ));
        }
        (None, None) if token.is_none() => {
            return Err(Invalid::new(
                reason::KUBECONFIG_NO_CREDENTIALS,
                "the kubeconfig's user has no inline token and no client-certificate-data with client-key-data",
            ));
        }
        _ => {}
    }
    let tls_server_name = match user_field(&cluster.tls_server_name) {
        Some(name) => Some(text("the kubeconfig's tls-server-name", name, limits::DNS_SUBDOMAIN)?.to_owned()),
        None => None,
    };
    Ok(ValidKubeconfig {
        credentials: ClusterCredentials {
            bearer_token: token.map(str::to_owned),
            client_certificate_data: cert,
            client_key_data: key,
            certificate_authority_data: ca,
            tls_server_name,
        },
        insecure_skip_tls_verify: cluster.insecure_skip_tls_verify.unwrap_or(false),
    })
}

fn user_field(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.is_empty())
}

/// An inline `*-data` field: base64, within the size limit.
fn data(field: &str, value: &Option<String>) -> Result<Option<String>, Invalid> {
    let Some(value) = user_field(value).map(str::trim) else { return Ok(None) };
    text(&format!("the kubeconfig's {field}"), value, limits::CREDENTIAL_DATA)?;
    if STANDARD.decode(value).is_err() {
        return Err(malformed(&format!("has a {field} that is not base64")));
    }
    Ok(Some(value.to_owned()))
}

#[cfg(test)]
#[path = "kubeconfig_tests.rs"]
mod tests;
