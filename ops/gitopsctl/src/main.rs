//! The `gitopsctl` binary: parses the command line, sets up logging to stderr and
//! runs the command from the library. Exit codes: 0 success, 1 failure, 2 usage.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use gitopsctl::cli::Cli;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    // clap prints usage errors and exits with 2 itself.
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    match gitopsctl::run(cli.command).await {
        Ok(output) => {
            let mut stdout = std::io::stdout().lock();
            match stdout.write_all(output.as_bytes()).and_then(|()| stdout.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("error: could not write the output: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            if error.is_usage() { ExitCode::from(2) } else { ExitCode::FAILURE }
        }
    }
}
