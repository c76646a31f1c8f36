//! What every binary does the same way at its edges: structured logs to stderr
//! (level from `RUST_LOG`, `info` by default, colour only on a terminal) and an
//! error printed with its whole chain of causes.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the process-wide log subscriber. Call once, first thing in `main`.
/// A log line that cannot be written (stderr a closed pipe, say) is dropped: it
/// must never stop the process — or stop it from shutting down on SIGTERM.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
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

/// Prints `error: …` and one `caused by: …` line per source to stderr.
pub fn print_error_chain(error: &dyn std::error::Error) {
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
