//! Who is calling: the emulator's authenticators, as kube-apiserver configures them for
//! tests — a static token file (`--token-auth-file`), ServiceAccount tokens minted by
//! TokenRequest, and anonymous requests — so RBAC can be exercised with real identities.
//!
//! As kube-apiserver: every authenticated user also gets `system:authenticated`; no token
//! (or an `Authorization` header that is not a bearer token) is `system:anonymous` in
//! `system:unauthenticated`; an unknown token is rejected (401), never anonymous. A
//! ServiceAccount token is `system:serviceaccount:NS:NAME` in `system:serviceaccounts`,
//! `system:serviceaccounts:NS` and `system:authenticated`, and stops working when it
//! expires or when its ServiceAccount (by uid) is gone. Unlike the real server's signed
//! JWTs, minted tokens are opaque random strings known only to this process.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

/// The group kube-apiserver lets do anything.
pub const MASTERS: &str = "system:masters";
pub const AUTHENTICATED: &str = "system:authenticated";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
pub const ANONYMOUS: &str = "system:anonymous";
/// The shortest TokenRequest lifetime the real server accepts.
pub const MIN_TOKEN_SECONDS: i64 = 600;
/// The longest (2^32 seconds).
pub const MAX_TOKEN_SECONDS: i64 = 1 << 32;

/// An authenticated (or anonymous) caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl Identity {
    /// `system:anonymous`, group `system:unauthenticated`.
    pub fn anonymous() -> Identity {
        Identity { user: ANONYMOUS.to_owned(), uid: String::new(), groups: vec![UNAUTHENTICATED.to_owned()] }
    }

    /// Whether the caller is in `system:masters`.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|group| group == MASTERS)
    }

    fn authenticated(user: String, uid: String, mut groups: Vec<String>) -> Identity {
        if !groups.iter().any(|group| group == AUTHENTICATED) {
            groups.push(AUTHENTICATED.to_owned());
        }
        Identity { user, uid, groups }
    }
}

/// The outcome of authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authn {
    /// No credentials: the request goes on as `system:anonymous`.
    Anonymous,
    User(Identity),
    /// Credentials that match nobody: 401.
    Invalid,
}

/// A token file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("token file line {line}: must have at least 3 columns (token, user name, user uid), found {found}")]
    TooFewColumns { line: usize, found: usize },
    #[error("token file line {line}: {problem}")]
    Syntax { line: usize, problem: &'static str },
}

#[derive(Debug, Clone)]
struct MintedToken {
    namespace: String,
    name: String,
    sa_uid: String,
    expires_unix: i64,
}

/// Static tokens and the ServiceAccount tokens minted so far.
#[derive(Default)]
pub struct TokenBook {
    static_tokens: HashMap<String, Identity>,
    minted: Mutex<HashMap<String, MintedToken>>,
}

/// Counts only: tokens are secrets and never printed.
impl std::fmt::Debug for TokenBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let minted = self.minted.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("TokenBook").field("static_tokens", &self.static_tokens.len()).field("minted", &minted).finish()
    }
}

impl TokenBook {
    /// Reads kube-apiserver's `--token-auth-file` format: `token,user,uid[,"group1,group2"]`
    /// per line, CSV quoting, blank lines skipped, a line with an empty token ignored, a
    /// repeated token taking the later line.
    pub fn from_csv(text: &str) -> Result<TokenBook, AuthError> {
        let mut book = TokenBook::default();
        for (line, record) in parse_csv(text)? {
            if record.len() < 3 {
                return Err(AuthError::TooFewColumns { line, found: record.len() });
            }
            if record[0].is_empty() {
                continue;
            }
            let groups = match record.get(3) {
                Some(groups) => groups.split(',').filter(|group| !group.is_empty()).map(str::to_owned).collect(),
                None => Vec::new(),
            };
            let identity = Identity::authenticated(record[1].clone(), record[2].clone(), groups);
            book.static_tokens.insert(record[0].clone(), identity);
        }
        Ok(book)
    }

    /// A book holding only the admin user.
    pub fn with_admin(admin_token: String) -> TokenBook {
        let mut book = TokenBook::default();
        book.add_admin(admin_token);
        book
    }

    /// Adds the admin user: `admin` (uid `admin-uid`) in `system:masters`.
    pub fn add_admin(&mut self, admin_token: String) {
        let admin = Identity::authenticated("admin".to_owned(), "admin-uid".to_owned(), vec![MASTERS.to_owned()]);
        self.static_tokens.insert(admin_token, admin);
    }

    /// Who holds `bearer` (the token of an `Authorization: Bearer` header; see
    /// [`bearer_token`]). `sa_exists(namespace, name, uid)` tells whether a ServiceAccount
    /// still exists with that uid.
    pub fn authenticate(
        &self,
        bearer: Option<&str>,
        sa_exists: &dyn Fn(&str /*ns*/, &str /*name*/, &str /*uid*/) -> bool,
    ) -> Authn {
        let Some(token) = bearer.filter(|token| !token.is_empty()) else {
            return Authn::Anonymous;
        };
        if let Some(identity) = self.static_tokens.get(token) {
            return Authn::User(identity.clone());
        }
        let now = unix_now();
        let found = {
            let mut minted = self.minted.lock().unwrap_or_else(PoisonError::into_inner);
            minted.retain(|_, minted| minted.expires_unix > now);
            minted.get(token).cloned()
        };
        match found {
            Some(sa) if sa_exists(&sa.namespace, &sa.name, &sa.sa_uid) => Authn::User(Identity::authenticated(
                format!("system:serviceaccount:{}:{}", sa.namespace, sa.name),
                sa.sa_uid.clone(),
                vec!["system:serviceaccounts".to_owned(), format!("system:serviceaccounts:{}", sa.namespace)],
            )),
            _ => Authn::Invalid,
        }
    }

    /// A new token for ServiceAccount `namespace/name` (uid `sa_uid`), valid for
    /// `expiration_seconds` from `now_unix` (raised to 600 when shorter; the real server
    /// rejects such requests, see [`validate_expiration_seconds`]). Returns the token and
    /// when it expires.
    pub fn mint_service_account_token(
        &self,
        namespace: &str,
        name: &str,
        sa_uid: &str,
        expiration_seconds: i64,
        now_unix: i64,
    ) -> (String /*token*/, i64 /*expires_unix*/) {
        let expires_unix = now_unix.saturating_add(expiration_seconds.max(MIN_TOKEN_SECONDS));
        let token = random_token();
        let minted = MintedToken {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            sa_uid: sa_uid.to_owned(),
            expires_unix,
        };
        self.minted.lock().unwrap_or_else(PoisonError::into_inner).insert(token.clone(), minted);
        (token, expires_unix)
    }
}

/// The token of an `Authorization` header, as kube-apiserver's bearer authenticator
/// reads it: `Bearer <token>` (scheme in any case); anything else is no token at all.
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    let header = header?.trim();
    let mut parts = header.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// TokenRequest's `spec.expirationSeconds` check: `Err` holds the message of the 422
/// kube-apiserver returns for field `spec.expirationSeconds`.
pub fn validate_expiration_seconds(expiration_seconds: i64) -> Result<(), String> {
    if expiration_seconds < MIN_TOKEN_SECONDS {
        return Err(format!("Invalid value: {expiration_seconds}: may not specify a duration less than 10 minutes"));
    }
    if expiration_seconds > MAX_TOKEN_SECONDS {
        return Err(format!(
            "Invalid value: {expiration_seconds}: may not specify a duration larger than 2^32 seconds"
        ));
    }
    Ok(())
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
}

/// 32 random bytes, hex: opaque and unguessable.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    // Without the OS random source no token can be safe; a test server stops there.
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Records of a CSV text (RFC 4180 as Go's encoding/csv reads it), with their line numbers.
fn parse_csv(text: &str) -> Result<Vec<(usize, Vec<String>)>, AuthError> {
    let mut records = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    while chars.peek().is_some() {
        let start = line;
        let mut record = Vec::new();
        let mut field = String::new();
        let mut quoted_field = false;
        loop {
            match chars.next() {
                None => break,
                Some('"') if field.is_empty() && !quoted_field => {
                    quoted_field = true;
                    loop {
                        match chars.next() {
                            None => {
                                return Err(AuthError::Syntax { line: start, problem: "unterminated quoted field" });
                            }
                            Some('"') if chars.peek() == Some(&'"') => {
                                chars.next();
                                field.push('"');
                            }
                            Some('"') => break,
                            Some(c) => {
                                if c == '\n' {
                                    line += 1;
                                }
                                field.push(c);
                            }
                        }
                    }
                    if !matches!(chars.peek(), None | Some(',' | '\n' | '\r')) {
                        return Err(AuthError::Syntax { line, problem: "extraneous text after a quoted field" });
                    }
                }
                Some(',') => {
                    record.push(std::mem::take(&mut field));
                    quoted_field = false;
                }
                Some('\r') if chars.peek() == Some(&'\n') => {}
                Some('\n') => {
                    line += 1;
                    break;
                }
                Some('"') => return Err(AuthError::Syntax { line, problem: "bare \" in a non-quoted field" }),
                Some(c) => field.push(c),
            }
        }
        let blank = record.is_empty() && field.is_empty() && !quoted_field;
        if !blank {
            record.push(field);
            records.push((start, record));
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_sa(_: &str, _: &str, _: &str) -> bool {
        false
    }

    fn user(authn: Authn) -> Identity {
        match authn {
            Authn::User(identity) => identity,
            other => panic!("expected a user, got {other:?}"),
        }
    }

    #[test]
    fn token_file_lines_become_users_with_groups() {
        let book = TokenBook::from_csv(
            "t1,alice,uid-a,\"dev,ops\"\r\n\nt2,bob,uid-b\n,ghost,uid-g\n\"t,3\",\"carol \"\"c\"\"\",uid-c,solo\n",
        )
        .unwrap();
        let alice = user(book.authenticate(Some("t1"), &no_sa));
        assert_eq!(
            alice,
            Identity {
                user: "alice".into(),
                uid: "uid-a".into(),
                groups: vec!["dev".into(), "ops".into(), AUTHENTICATED.into()]
            }
        );
        assert_eq!(user(book.authenticate(Some("t2"), &no_sa)).groups, [AUTHENTICATED]);
        let carol = user(book.authenticate(Some("t,3"), &no_sa));
        assert_eq!(
            (carol.user.as_str(), carol.groups.as_slice()),
            ("carol \"c\"", &["solo".to_owned(), AUTHENTICATED.to_owned()][..])
        );
        // An empty token on a line is never a credential.
        assert_eq!(book.authenticate(Some(""), &no_sa), Authn::Anonymous);
    }

    #[test]
    fn bad_token_files_are_refused_with_the_line() {
        let short = TokenBook::from_csv("t1,alice,uid\nt2,bob\n").unwrap_err();
        assert!(matches!(short, AuthError::TooFewColumns { line: 2, found: 2 }), "{short}");
        let open = TokenBook::from_csv("t1,\"alice,uid\n").unwrap_err();
        assert!(matches!(open, AuthError::Syntax { line: 1, .. }), "{open}");
        assert!(TokenBook::from_csv("t1,al\"ice,uid\n").is_err());
    }

    #[test]
    fn no_token_is_anonymous_and_an_unknown_one_is_invalid() {
        let book = TokenBook::with_admin("root-token".into());
        assert_eq!(book.authenticate(None, &no_sa), Authn::Anonymous);
        assert_eq!(book.authenticate(Some("nope"), &no_sa), Authn::Invalid);
        let admin = user(book.authenticate(Some("root-token"), &no_sa));
        assert_eq!(admin.user, "admin");
        assert!(admin.is_master() && admin.groups.contains(&AUTHENTICATED.to_owned()));
        let anonymous = Identity::anonymous();
        assert_eq!(
            (anonymous.user.as_str(), anonymous.groups.as_slice()),
            (ANONYMOUS, &[UNAUTHENTICATED.to_owned()][..])
        );
        let mut from_file = TokenBook::from_csv("t1,alice,uid-a\n").unwrap();
        from_file.add_admin("root".into());
        assert!(user(from_file.authenticate(Some("root"), &no_sa)).is_master());
        assert!(!user(from_file.authenticate(Some("t1"), &no_sa)).is_master());
    }

    #[test]
    fn bearer_headers_are_read_like_kube_apiserver() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer abc extra")), Some("abc"));
        assert_eq!(bearer_token(Some("  BEARER abc  ")), Some("abc"));
        assert_eq!(bearer_token(Some("Bearer")), None);
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(None), None);
    }

    #[test]
    fn service_account_tokens_work_until_expiry_or_deletion() {
        let book = TokenBook::default();
        let now = unix_now();
        let (token, expires) = book.mint_service_account_token("team", "deployer", "sa-uid", 3600, now);
        assert_eq!(expires, now + 3600);
        assert_eq!(token.len(), 64);
        let exists = |ns: &str, name: &str, uid: &str| (ns, name, uid) == ("team", "deployer", "sa-uid");
        let sa = user(book.authenticate(Some(&token), &exists));
        assert_eq!(sa.user, "system:serviceaccount:team:deployer");
        assert_eq!(sa.uid, "sa-uid");
        assert_eq!(sa.groups, ["system:serviceaccounts", "system:serviceaccounts:team", AUTHENTICATED]);
        // The ServiceAccount deleted (or recreated with another uid): the token is dead.
        let recreated = |_: &str, _: &str, uid: &str| uid == "new-uid";
        assert_eq!(book.authenticate(Some(&token), &recreated), Authn::Invalid);
        // Short lifetimes are raised to ten minutes; expired tokens stop working.
        let (_, short) = book.mint_service_account_token("team", "deployer", "sa-uid", 60, now);
        assert_eq!(short, now + MIN_TOKEN_SECONDS);
        let (old, _) = book.mint_service_account_token("team", "deployer", "sa-uid", 600, now - 601);
        assert_eq!(book.authenticate(Some(&old), &exists), Authn::Invalid);
        let (other, _) = book.mint_service_account_token("team", "deployer", "sa-uid", 600, now);
        assert_ne!(other, token);
        // Debug output never shows a token.
        let shown = format!("{book:?}");
        assert!(!shown.contains(&token) && shown.contains("minted"), "{shown}");
    }

    #[test]
    fn expiration_is_validated_like_token_request() {
        assert!(validate_expiration_seconds(600).is_ok());
        assert_eq!(
            validate_expiration_seconds(300).unwrap_err(),
            "Invalid value: 300: may not specify a duration less than 10 minutes"
        );
        assert!(validate_expiration_seconds(MAX_TOKEN_SECONDS + 1).is_err());
    }
}
