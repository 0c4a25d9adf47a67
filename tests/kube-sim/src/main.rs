//! `kube-sim` binary: runs the simulated API server until Ctrl-C, for manual use and
//! benchmarks. `cargo run -p kube-sim -- --port 6443 --kubeconfig-out /tmp/kubeconfig`.

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "In-memory Kubernetes API server for tests")]
struct Cli {
    /// Port to listen on (0: pick a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Where to write a kubeconfig for kubectl (CA embedded).
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Serve plain HTTP instead of HTTPS.
    #[arg(long)]
    http: bool,
    /// Watch history kept, in events, before resuming watches get 410 Gone.
    #[arg(long, default_value_t = 10_000)]
    history_limit: usize,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let cli = Cli::parse();
    let sim = kube_sim::KubeSim::start_with(kube_sim::Options {
        port: cli.port,
        tls: !cli.http,
        history_limit: cli.history_limit,
        ..kube_sim::Options::default()
    })
    .await?;
    if let Some(path) = &cli.kubeconfig_out {
        sim.write_kubeconfig(path)?;
        println!("kubeconfig written to {}", path.display());
    }
    println!("kube-sim serving on {}", sim.url());
    tokio::signal::ctrl_c().await?;
    sim.stop().await;
    Ok(())
}
