//! Fake Git revisions: the stand-in has no repository to resolve a branch or tag
//! against, yet Argo CD reports full 40-hex commit SHAs. A revision is derived
//! deterministically from the source, so tests can predict it
//! (`fake_revision(repo, path, revision)`), and a change of any of the three gives
//! a different commit, as a push would.

/// The commit Argo CD would resolve `revision` of `repo_url`/`path` to: a
/// revision that already is a 40-hex SHA resolves to itself (lower-cased), as in
/// Git; anything else (branch, tag, `HEAD`, empty) to a stable made-up SHA.
pub fn fake_revision(repo_url: &str, path: &str, revision: &str) -> String {
    if is_commit_sha(revision) {
        return revision.to_ascii_lowercase();
    }
    let input = format!("{repo_url}\u{0}{path}\u{0}{revision}");
    // Three FNV-1a passes with different seeds give 192 bits; Git shows 160.
    let mut hex = String::with_capacity(48);
    for seed in [0xcbf2_9ce4_8422_2325_u64, 0x8422_2325_cbf2_9ce4, 0x1000_0000_01b3_0001] {
        let mut hash = seed;
        for byte in input.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        hex.push_str(&format!("{hash:016x}"));
    }
    hex.truncate(40);
    hex
}

/// Whether `revision` is a full commit SHA (40 hex digits).
pub fn is_commit_sha(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_forty_hex() {
        let a = fake_revision("https://git.example.invalid/a", "web", "main");
        assert!(is_commit_sha(&a), "{a}");
        assert_eq!(a, fake_revision("https://git.example.invalid/a", "web", "main"));
        assert_ne!(a, fake_revision("https://git.example.invalid/a", "web", "v2"));
        assert_ne!(a, fake_revision("https://git.example.invalid/a", "api", "main"));
        assert_ne!(a, fake_revision("https://git.example.invalid/b", "web", "main"));
        // Field boundaries matter: ("ab", "c") is not ("a", "bc").
        assert_ne!(fake_revision("ab", "c", "x"), fake_revision("a", "bc", "x"));
    }

    #[test]
    fn commit_shas_resolve_to_themselves() {
        let sha = "0123456789ABCDEF0123456789abcdef01234567";
        assert_eq!(fake_revision("r", "p", sha), sha.to_ascii_lowercase());
        assert!(!is_commit_sha("0123456789abcdef"));
        assert!(!is_commit_sha("g123456789abcdef0123456789abcdef01234567"));
    }
}
