//! Plain-text output for terminals: aligned tables and short ages ("42s", "3h"),
//! so every listing command prints the same way.

use std::time::{Duration, SystemTime};

/// Renders `rows` under `headers`, columns left-aligned and two spaces apart.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// A short age: seconds under two minutes, then minutes, hours, days.
pub fn age(elapsed: Duration) -> String {
    let secs = elapsed.as_secs();
    match secs {
        0..120 => format!("{secs}s"),
        120..7_200 => format!("{}m", secs / 60),
        7_200..172_800 => format!("{}h", secs / 3_600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// The age of a database timestamp by the local clock; a time in the future
/// (clock skew) counts as now.
pub fn age_since(at: SystemTime) -> String {
    age(SystemTime::now().duration_since(at).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_lines_have_no_trailing_blanks() {
        let rows = vec![vec!["prod-eu-1".to_owned(), "5".to_owned()], vec!["a".to_owned(), "".to_owned()]];
        assert_eq!(render(&["NAME", "TENANTS"], &rows), "NAME       TENANTS\nprod-eu-1  5\na\n");
    }

    #[test]
    fn ages_use_the_largest_sensible_unit() {
        assert_eq!(age(Duration::from_secs(0)), "0s");
        assert_eq!(age(Duration::from_secs(119)), "119s");
        assert_eq!(age(Duration::from_secs(120)), "2m");
        assert_eq!(age(Duration::from_secs(7_199)), "119m");
        assert_eq!(age(Duration::from_secs(7_200)), "2h");
        assert_eq!(age(Duration::from_secs(3 * 86_400)), "3d");
        assert_eq!(age_since(SystemTime::now() + Duration::from_secs(60)), "0s");
    }
}
