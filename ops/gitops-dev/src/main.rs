//! The `gitops-dev` binary: parses the command line, logs to stderr and runs the
//! command from the library. Exit codes: 0 success, 1 failure, 2 usage.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use gitops_dev::cli::Cli;
use gitops_shared::telemetry::{init_logging, print_error_chain};

#[tokio::main]
async fn main() -> ExitCode {
    // clap prints usage errors and exits with 2 itself.
    let cli = Cli::parse();
    init_logging();
    match gitops_dev::run(cli.command).await {
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
            print_error_chain(&error);
            ExitCode::FAILURE
        }
    }
}
