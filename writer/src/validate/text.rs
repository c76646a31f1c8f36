//! The checks every string field gets: a length limit and no NUL or other control
//! characters (PostgreSQL `text` refuses NUL; control characters have no place in
//! names, URLs or paths and make messages and logs misleading).

use super::{Invalid, reason};

/// `value` if it is at most `max` bytes and free of control characters. `field`
/// names the field in the message (`spec.source.path`); the value is not echoed.
pub fn text<'a>(field: &str, value: &'a str, max: usize) -> Result<&'a str, Invalid> {
    if value.len() > max {
        return Err(Invalid::new(
            reason::FIELD_TOO_LONG,
            format!("{field} is {} bytes long; at most {max} are allowed", value.len()),
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        let what = if c == '\0' {
            "a NUL character".to_owned()
        } else {
            format!("the control character U+{:04X}", u32::from(c))
        };
        return Err(Invalid::new(reason::INVALID_CHARACTERS, format!("{field} contains {what}, which is not allowed")));
    }
    Ok(value)
}

/// [`text`], and not empty.
pub(super) fn required<'a>(field: &str, value: &'a str, max: usize) -> Result<&'a str, Invalid> {
    let value = text(field, value, max)?;
    if value.trim().is_empty() {
        return Err(Invalid::new(reason::FIELD_REQUIRED, format!("{field} is required")));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_characters() {
        assert_eq!(text("f", "ok; DROP TABLE x; -- $(rm -rf /) `id` 'q' \"d\" \\", 100).map(str::len), Ok(47));
        assert_eq!(text("f", &"a".repeat(11), 10).unwrap_err().reason, reason::FIELD_TOO_LONG);
        assert_eq!(text("f", &"a".repeat(10), 10), Ok("aaaaaaaaaa"));
        let nul = text("spec.x", "a\0b", 10).unwrap_err();
        assert_eq!(nul.reason, reason::INVALID_CHARACTERS);
        assert!(nul.message.contains("NUL") && nul.message.contains("spec.x"));
        for c in ['\n', '\r', '\t', '\u{1b}', '\u{7f}', '\u{85}'] {
            assert_eq!(text("f", &format!("a{c}b"), 10).unwrap_err().reason, reason::INVALID_CHARACTERS, "{c:?}");
        }
        assert_eq!(required("f", "  ", 10).unwrap_err().reason, reason::FIELD_REQUIRED);
        assert_eq!(required("f", "", 10).unwrap_err().reason, reason::FIELD_REQUIRED);
        // Multi-byte characters count in bytes and are fine.
        assert_eq!(text("f", "ünïcødé", 20), Ok("ünïcødé"));
    }
}
