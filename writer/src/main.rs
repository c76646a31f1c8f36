//! The `gitops-writer` binary: parses the command line, logs to stderr and runs
//! the library. Exit codes: 0 success, 1 failure, 2 usage.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use gitops_shared::telemetry::{init_logging, print_error_chain};
use gitops_writer::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match gitops_writer::execute(cli.command).await {
        Ok(output) => match std::io::stdout().write_all(output.as_bytes()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: could not write the output: {error}");
                ExitCode::FAILURE
            }
        },
        Err(error) => {
            print_error_chain(&error);
            ExitCode::FAILURE
        }
    }
}
