//! The Prometheus text exposition's common lines: a metric's `# HELP` and `# TYPE`
//! header, and an unlabelled counter or gauge with its one sample. The writer's, the
//! agent's and the process metrics all render through these.

use std::fmt::{Display, Write as _};

/// `# HELP` and `# TYPE` of metric `name`, of `kind` (`counter`, `gauge`, `histogram`).
pub fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// An unlabelled counter and its value.
pub fn counter(out: &mut String, name: &str, help: &str, value: impl Display) {
    header(out, name, help, "counter");
    let _ = writeln!(out, "{name} {value}");
}

/// An unlabelled gauge and its value.
pub fn gauge(out: &mut String, name: &str, help: &str, value: impl Display) {
    header(out, name, help, "gauge");
    let _ = writeln!(out, "{name} {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_and_a_gauge_are_a_header_and_one_sample() {
        let mut out = String::new();
        counter(&mut out, "a_total", "As seen.", 3_u64);
        gauge(&mut out, "b", "Bs now.", -1_i64);
        assert_eq!(
            out,
            "# HELP a_total As seen.\n# TYPE a_total counter\na_total 3\n# HELP b Bs now.\n# TYPE b gauge\nb -1\n"
        );
    }
}
