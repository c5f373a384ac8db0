//! The `imstream` binary: parse arguments, load configuration, initialise
//! telemetry, and hand over to [`imstream::run`].

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = imstream::cli::Cli::parse();
    match imstream::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
