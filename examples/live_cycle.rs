//! One live evaluation cycle against a Prometheus: the batched queries, then the engine
//! on every GPU. Prints GPUs, queries, time and peak memory.
//! `cargo run --release --example live_cycle -- http://127.0.0.1:9090 <unix seconds>`

use std::time::Instant;

use gpu_reaper::api::policy::GpuPolicySpec;
use gpu_reaper::engine::model::{LadderState, PodPhase, PodState, WorkloadMeta};
use gpu_reaper::engine::{Rules, evaluate};
use gpu_reaper::telemetry::prometheus::{LiveSettings, PrometheusConfig, PrometheusSource};

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:9090".into());
    let now: i64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .expect("usage: live_cycle URL UNIX_SECONDS");
    let rules = Rules::from_spec(&GpuPolicySpec::default());
    let source = PrometheusSource::new(PrometheusConfig {
        url,
        ..PrometheusConfig::default()
    })
    .expect("client");
    let live = LiveSettings {
        scrape_interval_seconds: 30,
        horizon_seconds: 2 * 3600,
        step_seconds: 60,
        selector: String::new(),
        workload_labels: Default::default(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let observed = runtime
        .block_on(source.observe(&rules, &live, now))
        .expect("observe");
    let queried = started.elapsed();
    let at = jiff::Timestamp::from_second(now).unwrap();
    let started = Instant::now();
    let mut idle = 0;
    for obs in observed.values() {
        let meta = WorkloadMeta {
            kind: "Pod".into(),
            namespace: "bench".into(),
            name: obs.id.clone(),
            created_at: at - jiff::SignedDuration::from_hours(6),
            labels: Default::default(),
            annotations: Default::default(),
        };
        let pods = [PodState {
            phase: PodPhase::Running,
            waiting_reason: None,
            stuck_since: None,
            gpu_devices: 1,
        }];
        let d = evaluate(
            &rules,
            &meta,
            &pods,
            std::slice::from_ref(obs),
            &LadderState::default(),
            at,
        );
        idle += usize::from(d.verdict.classification.is_idle());
    }
    let evaluated = started.elapsed();
    let peak_kb = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        })
        .unwrap_or_default();
    println!(
        "{} GPUs observed with 11 queries in {:.0} ms; engine on all of them in {:.1} ms ({idle} idle); peak RSS {peak_kb} kB",
        observed.len(),
        queried.as_secs_f64() * 1000.0,
        evaluated.as_secs_f64() * 1000.0
    );
}
