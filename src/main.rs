use std::process::ExitCode;

use clap::Parser;
use gpu_reaper::cli::Cli;

// mimalloc: an AdmissionReview is parsed into many small allocations and dropped at once;
// with glibc's allocator that was most of the time of a big review (docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // One TLS crypto provider for the whole process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    gpu_reaper::logging::init_logging(gpu_reaper::commands::log_format(cli.log_format));
    let result = gpu_reaper::commands::run(cli.command);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
