//! The `imstream` binary: parse arguments, load configuration, initialise
//! telemetry, and hand over to [`imstream::run`].

use clap::Parser;

/// mimalloc: the gateway and pipelines allocate many short-lived buffers
/// across threads, where glibc malloc showed up as a third of the CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
