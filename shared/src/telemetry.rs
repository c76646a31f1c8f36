//! What every binary does the same way at its edges: the version line it prints,
//! structured logs to stderr (level from `RUST_LOG`, `info` by default; text with
//! colour only on a terminal, or one JSON object per line for log collectors) and an
//! error printed with its whole chain of causes.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The environment variable every binary reads its log format from (`--log-format`).
pub const LOG_FORMAT: &str = "GITOPS_LOG_FORMAT";

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines, coloured on a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (the
    /// message and the event's structured fields), `span` and `spans`.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("unknown log format {other:?}: use text or json")),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

/// The line `--version` prints: the crate version and the Git revision the binary
/// was built from. Binaries pass `option_env!("GITOPS_REVISION")` from their own
/// `main.rs`, so a new revision relinks the binaries and rebuilds nothing else; the
/// image and release scripts and `ops/test` set it, a plain `cargo build` says
/// that it was not given.
pub fn version_line(version: &str, revision: Option<&str>) -> String {
    match revision.map(str::trim).filter(|r| !r.is_empty()) {
        Some(revision) => format!("{version} (revision {revision})"),
        None => format!("{version} (revision unknown: built without GITOPS_REVISION)"),
    }
}

/// Whether logs are JSON, so that a binary's final error is a JSON line too.
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Installs the process-wide log subscriber, as text. Call once, first thing in `main`.
pub fn init_logging() {
    init_logging_as(LogFormat::Text);
}

/// Installs the process-wide log subscriber in `format`. Call once, first thing in
/// `main`. A log line that cannot be written (stderr a closed pipe, say) is dropped:
/// it must never stop the process — or stop it from shutting down on SIGTERM.
pub fn init_logging_as(format: LogFormat) {
    JSON_LOGS.store(format == LogFormat::Json, std::sync::atomic::Ordering::Relaxed);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder =
        tracing_subscriber::fmt().with_writer(std::io::stderr).log_internal_errors(false).with_env_filter(filter);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).with_current_span(true).with_span_list(true).init(),
    }
}

/// As [`init_logging_as`], into the file at `path` (appended; its directory
/// created) instead of stderr.
pub fn init_logging_into(format: LogFormat, path: &std::path::Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    JSON_LOGS.store(format == LogFormat::Json, std::sync::atomic::Ordering::Relaxed);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::sync::Mutex::new(file))
        .log_internal_errors(false)
        .with_env_filter(filter)
        .with_ansi(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(true).init(),
    }
    Ok(())
}

/// An error and all its sources on one line, `outer: inner: innermost` (for
/// operator-facing messages and log fields).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// How a command-line binary ends: its output written to stdout (0), or its error
/// chain printed to stderr (1, or 2 when `usage` says the command line was at fault).
pub fn finish_command<E: std::error::Error>(
    outcome: Result<String, E>,
    usage: impl Fn(&E) -> bool,
) -> std::process::ExitCode {
    use std::io::Write as _;
    match outcome {
        Ok(output) => {
            let mut stdout = std::io::stdout().lock();
            match stdout.write_all(output.as_bytes()).and_then(|()| stdout.flush()) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(error) => {
                    to_stderr(&format!("error: could not write the output: {error}"));
                    std::process::ExitCode::FAILURE
                }
            }
        }
        Err(error) => {
            print_error_chain(&error);
            if usage(&error) { std::process::ExitCode::from(2) } else { std::process::ExitCode::FAILURE }
        }
    }
}

/// Prints `error: …` and one `caused by: …` line per source to stderr; with JSON
/// logs, one log event (`causes`: the sources, `: `-separated) instead.
pub fn print_error_chain(error: &dyn std::error::Error) {
    if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
        let causes = error.source().map(error_chain).unwrap_or_default();
        tracing::error!(causes = %causes, "{error}");
        return;
    }
    to_stderr(&format!("error: {error}"));
    let mut source = error.source();
    while let Some(cause) = source {
        to_stderr(&format!("  caused by: {cause}"));
        source = cause.source();
    }
}

/// Writes a line to stderr; a stderr that cannot be written to is not a panic.
fn to_stderr(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_formats_parse_and_print_as_written() {
        for format in [LogFormat::Text, LogFormat::Json] {
            assert_eq!(format.to_string().parse::<LogFormat>(), Ok(format));
        }
        assert!("JSON ".parse::<LogFormat>().is_err());
    }

    #[test]
    fn the_version_line_names_the_revision_or_says_it_is_unknown() {
        assert_eq!(version_line("0.1.0", Some("0123abc")), "0.1.0 (revision 0123abc)");
        assert_eq!(version_line("0.1.0", Some("")), "0.1.0 (revision unknown: built without GITOPS_REVISION)");
        assert_eq!(version_line("0.1.0", None), "0.1.0 (revision unknown: built without GITOPS_REVISION)");
    }
}
