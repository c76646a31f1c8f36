//! Tenant-facing messages: a last line of defence that keeps secrets and internal
//! addresses out of what tenants read. Messages are written for tenants in the
//! first place; this catches what slips through from lower layers.

const MAX_LEN: usize = 1024;

/// Words whose value (after `=` or `:`, or the next word) is a secret.
const SECRET_KEYS: &[&str] =
    &["password", "passwd", "token", "secret", "apikey", "api_key", "authorization", "bearer", "privatekey"];

/// Host suffixes that name cluster-internal or private hosts.
const INTERNAL_SUFFIXES: &[&str] = &[".svc", ".cluster.local", ".internal", ".local", ".localdomain", ".lan"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pem {
    Outside,
    Header,
    Body,
    Footer,
}

/// Redacts secrets, internal hosts and IP addresses, strips control characters
/// and caps the length.
pub fn sanitize_tenant_message(message: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut pem = Pem::Outside;
    let mut redact_next = false;
    for word in message.split_whitespace() {
        let closes = word.len() > 5 && word.ends_with("-----");
        pem = match pem {
            Pem::Outside if word.starts_with("-----BEGIN") => {
                out.push("<redacted key>".to_owned());
                if closes && word.len() > "-----BEGIN-----".len() { Pem::Body } else { Pem::Header }
            }
            Pem::Outside => Pem::Outside,
            Pem::Header => {
                if closes {
                    Pem::Body
                } else {
                    Pem::Header
                }
            }
            Pem::Body if word.starts_with("-----END") => {
                if closes && word.len() > "-----END-----".len() {
                    Pem::Outside
                } else {
                    Pem::Footer
                }
            }
            Pem::Body => Pem::Body,
            Pem::Footer => {
                if closes {
                    Pem::Outside
                } else {
                    Pem::Footer
                }
            }
        };
        if pem != Pem::Outside
            || word.starts_with("-----END")
            || (closes && out.last().is_some_and(|w| w == "<redacted key>"))
        {
            continue;
        }
        let lower = word.to_ascii_lowercase();
        let key = lower.trim_end_matches([':', '=']);
        if redact_next {
            // "Authorization: Bearer <token>": the scheme word is kept, the token goes.
            redact_next = matches!(key, "bearer" | "basic" | "token");
            out.push(if redact_next { word.to_owned() } else { "<redacted>".to_owned() });
            continue;
        }
        if SECRET_KEYS.contains(&key) {
            redact_next = true;
            out.push(word.to_owned());
            continue;
        }
        out.push(sanitize_word(word, &lower));
    }
    let mut text: String = out.join(" ").chars().filter(|c| !c.is_control()).collect();
    if text.len() > MAX_LEN {
        let mut cut = MAX_LEN;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

fn sanitize_word(word: &str, lower: &str) -> String {
    // Punctuation around a word ("(https://host/x)," ) is kept but not parsed.
    let start = word.len() - word.trim_start_matches(['(', '"', '\'', '<']).len();
    let end = word.trim_end_matches([')', '"', '\'', ',', ';', '.', '>', ':']).len().max(start);
    if start > 0 || end < word.len() {
        let inner = &word[start..end];
        return format!("{}{}{}", &word[..start], sanitize_word_core(inner, &inner.to_ascii_lowercase()), &word[end..]);
    }
    sanitize_word_core(word, lower)
}

fn sanitize_word_core(word: &str, lower: &str) -> String {
    for sep in ['=', ':'] {
        if let Some((k, _)) = lower.split_once(sep) {
            let k = k.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
            if SECRET_KEYS.iter().any(|s| k.ends_with(s)) && !lower.contains("://") {
                return format!("{}{sep}<redacted>", &word[..word.find(sep).unwrap_or(0)]);
            }
        }
    }
    if let Some((scheme, rest)) = word.split_once("://") {
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..end];
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let host = host_of(host_port);
        let shown = if is_ip(host) || is_internal(host) { "<internal host>".to_owned() } else { host_port.to_owned() };
        let path = rest[end..].split(['?', '#']).next().unwrap_or("");
        return format!("{scheme}://{shown}{path}");
    }
    let bare = word.trim_matches(|c: char| matches!(c, ',' | ';' | '(' | ')' | '"' | '\'' | '.'));
    if is_ip(host_of(bare)) || (bare.contains('.') && is_internal(host_of(bare))) {
        return word.replace(bare, "<internal host>");
    }
    word.to_owned()
}

fn host_of(host_port: &str) -> &str {
    if let Some(rest) = host_port.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host_port.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !host.contains(':') => host,
        _ => host_port,
    }
}

fn is_ip(host: &str) -> bool {
    host.parse::<std::net::IpAddr>().is_ok()
}

fn is_internal(host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    host == "localhost" || INTERNAL_SUFFIXES.iter().any(|s| host.ends_with(s))
}

#[cfg(test)]
mod tests {
    use super::sanitize_tenant_message as s;

    #[test]
    fn secrets_are_redacted() {
        assert_eq!(s("login failed: password=hunter2"), "login failed: password=<redacted>");
        assert_eq!(s("Authorization: Bearer abc.def"), "Authorization: Bearer <redacted>");
        assert!(!s("header Bearer eyJhbGciOi").contains("eyJ"));
        assert!(
            !s("key -----BEGIN OPENSSH PRIVATE KEY----- AAAA BBBB -----END OPENSSH PRIVATE KEY----- done")
                .contains("AAAA")
        );
        assert!(
            s("key -----BEGIN OPENSSH PRIVATE KEY----- AAAA -----END OPENSSH PRIVATE KEY----- done").ends_with("done")
        );
    }

    #[test]
    fn internal_hosts_and_addresses_are_hidden_but_public_ones_kept() {
        assert_eq!(s("dial tcp 10.0.3.7:6443: connection refused"), "dial tcp <internal host>: connection refused");
        assert_eq!(s("GET https://argocd-server.argocd.svc/api failed"), "GET https://<internal host>/api failed");
        assert_eq!(
            s("clone https://user:pw@git.example.invalid/repo.git?x=1"),
            "clone https://git.example.invalid/repo.git"
        );
        assert_eq!(
            s("repository https://git.example.invalid/a/b not found"),
            "repository https://git.example.invalid/a/b not found"
        );
        assert!(!s("host [::1]:8080 down").contains("::1"));
        assert_eq!(s("(at https://argocd.argocd.svc)."), "(at https://<internal host>).");
    }

    #[test]
    fn control_characters_are_dropped_and_length_capped() {
        assert_eq!(s("a\u{7}b"), "ab");
        assert!(s(&"x".repeat(5000)).chars().count() <= 1025);
    }
}
