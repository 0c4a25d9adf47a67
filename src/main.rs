use std::process::ExitCode;

use clap::Parser;
use gpu_reaper::cli::{Cli, Command};

// mimalloc: an AdmissionReview is parsed into many small allocations and dropped at once;
// with glibc's allocator that was most of the time of a big review (docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // One TLS crypto provider for the whole process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    gpu_reaper::logging::init_logging(cli.log_format);
    let result = match cli.command {
        Command::Crd => gpu_reaper::api::crds_yaml()
            .map(|y| print!("{y}"))
            .map_err(gpu_reaper::Error::from),
        Command::Backtest(args) => gpu_reaper::commands::backtest::run(&args),
        Command::Export(args) => gpu_reaper::commands::export::run(&args),
        Command::Audit(args) => gpu_reaper::commands::audit::run(&args),
        Command::Webhook(args) => gpu_reaper::admission::webhook::run(&args),
        Command::Attest(args) => gpu_reaper::admission::approve::run(&args),
        Command::Check(args) => gpu_reaper::admission::check::run(&args),
        Command::Wake(args) => gpu_reaper::cluster::wake::run(&args),
        Command::Controller(args) => gpu_reaper::controller::run::run(&args),
        Command::Replay(args) => gpu_reaper::commands::replay::run(&args),
        Command::Explain(args) => gpu_reaper::commands::explain::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
