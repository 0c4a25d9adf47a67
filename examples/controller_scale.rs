//! The controller at scale: kube-sim in-process with N pods (default: a sweep of 5,000,
//! 10,000, 25,000 and 50,000 pods, 20 % of them holding one GPU each), a Prometheus stub
//! answering for every GPU, and the real `gpu-reaper controller` as a child process,
//! measured from outside: initial sync time, CPU time per evaluation cycle, peak and
//! steady RSS, Prometheus queries per cycle, and API writes per cycle (cycle 1 warns the
//! idle workloads; later cycles find nothing changed).
//!
//! ```sh
//! cargo build --release --bin gpu-reaper
//! cargo run --release --example controller_scale                  # the sweep
//! cargo run --release --example controller_scale -- 50000 10000   # one size
//! ```
//!
//! Environment: `SCALE_IDLE` (share of GPU workloads idle, default 0.2), `SCALE_CYCLES`
//! (default 4), `SCALE_INTERVAL_SECONDS` (the controller's `--interval`, default 30),
//! `SCALE_HISTORY_BACKFILL` (e.g. `168h`: the policy is risk-gated and the controller
//! backfills that much idle-span history from the stub in cycle 1; unset: no backfill),
//! `SCALE_CONTROLLER_BIN` (the controller binary; default: the release build's).
//! Why a stub and not the real Prometheus: see `benches/support/controller_scale.rs`.
//! Results go in docs/performance.md ("Controller at scale").

#[path = "../benches/support/controller_scale.rs"]
mod controller_scale;

use std::time::Duration;

use controller_scale::{Measured, Scenario};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_string();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "{cores} cores, {model}, {memory:.0} GiB; load average at start {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

fn row(m: &Measured) -> String {
    let first = &m.cycles[0];
    let later = &m.cycles[1..];
    let max =
        |f: &dyn Fn(&controller_scale::Cycle) -> f64| later.iter().map(f).fold(0.0f64, f64::max);
    let later_writes: usize = later.iter().map(|c| c.calls.workload_writes).sum();
    let later_events: usize = later.iter().map(|c| c.calls.event_writes).sum();
    let queries: Vec<String> = {
        let mut q: Vec<u64> = m.cycles.iter().map(|c| c.prometheus_queries).collect();
        q.dedup();
        q.iter().map(u64::to_string).collect()
    };
    format!(
        "| {} | {} | {} ({} idle) | {:.1} s | {:.1} s | {:.2} s / {:.2} s | {:.2} s / {:.2} s | {:.0} MiB | {:.0} MiB | {} | {} + {} events | {} + {} events ({} cycles) |",
        thousands(m.pods),
        thousands(m.gpu_pods),
        thousands(m.gpu_workloads),
        thousands(m.idle_workloads),
        m.sync_seconds,
        m.first_cycle_done_seconds,
        first.cpu_seconds,
        first.wall_seconds,
        max(&|c| c.cpu_seconds),
        max(&|c| c.wall_seconds),
        m.peak_rss_mib,
        m.steady_rss_mib,
        queries.join("/"),
        thousands(first.calls.workload_writes),
        thousands(first.calls.event_writes),
        later_writes,
        later_events,
        later.len(),
    )
}

fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.replace([',', '_'], "")
                .parse()
                .expect("usage: [pods] [gpu_pods]")
        })
        .collect();
    let sizes: Vec<(usize, usize)> = match args.as_slice() {
        [] => [5_000, 10_000, 25_000, 50_000]
            .iter()
            .map(|&p| (p, p / 5))
            .collect(),
        [pods] => vec![(*pods, pods / 5)],
        [pods, gpu_pods, ..] => vec![(*pods, *gpu_pods)],
    };
    let bin = std::env::var_os("SCALE_CONTROLLER_BIN")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|e| Some(e.parent()?.parent()?.join("gpu-reaper")))
        })
        .filter(|b| b.exists())
        .expect("build the binary first: cargo build --release --bin gpu-reaper");
    println!("machine: {}", machine());
    println!("controller: {}", bin.display());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rows = Vec::new();
    for (pods, gpu_pods) in sizes {
        let mut scenario = Scenario::new(pods, gpu_pods);
        scenario.idle_fraction = env("SCALE_IDLE", 0.2);
        scenario.cycles = env("SCALE_CYCLES", 4usize).max(2);
        scenario.interval = Duration::from_secs(env("SCALE_INTERVAL_SECONDS", 30u64));
        scenario.history_backfill = std::env::var("SCALE_HISTORY_BACKFILL").ok();
        println!("\n== {pods} pods, {gpu_pods} with a GPU ==");
        let measured = runtime
            .block_on(controller_scale::run(&bin, &scenario, &|line| {
                println!("  {line}")
            }))
            .expect("run");
        for w in &measured.warnings {
            println!("  controller warned: {w}");
        }
        for q in &measured.unknown_queries {
            println!("  stub did not know the query: {q}");
        }
        for (cycle, writes) in controller_scale::workload_writes(&measured).iter().skip(1) {
            for w in writes.iter().take(5) {
                println!("  cycle {cycle} wrote: {w}");
            }
        }
        println!(
            "  sync: {:.1} s ({:.2} s CPU, RSS {:.0} MiB after), {} reads; first cycle done at {:.1} s",
            measured.sync_seconds,
            measured.sync_cpu_seconds,
            measured.rss_after_sync_mib,
            measured.sync_calls.reads,
            measured.first_cycle_done_seconds
        );
        rows.push(row(&measured));
    }
    println!(
        "\n| pods | GPU pods | GPU workloads | sync | 1st cycle done | cycle 1 CPU / wall | later cycles CPU / wall (max) | peak RSS | steady RSS | Prometheus queries per cycle | cycle 1 workload writes | later cycles workload writes |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!("{r}");
    }
}
