//! The `gitops-dev` binary: parses the command line, logs to stderr and runs the
//! command from the library. Exit codes: 0 success, 1 failure, 2 usage.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use gitops_dev::cli::Cli;
use gitops_shared::telemetry::{finish_command, init_logging_as, init_logging_into, version_line};

#[tokio::main]
async fn main() -> ExitCode {
    // clap prints usage errors and exits with 2 itself.
    // `--version`: the version and the Git revision this binary was built from.
    let version = version_line(env!("CARGO_PKG_VERSION"), option_env!("GITOPS_REVISION"));
    let matches = Cli::command().version(&*version.leak()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    // `up` is quiet unless --verbose: the emulator's and stand-in's logs go to a file.
    let log_file = match &cli.command {
        gitops_dev::cli::Command::Up(args) => args.log_file(),
        _ => None,
    };
    match log_file {
        Some(path) => {
            if let Err(error) = init_logging_into(cli.log_format, &path) {
                eprintln!("could not open the log file {}: {error}", path.display());
                return ExitCode::FAILURE;
            }
        }
        None => init_logging_as(cli.log_format),
    }
    finish_command(gitops_dev::run(cli.command).await, |_| false)
}
