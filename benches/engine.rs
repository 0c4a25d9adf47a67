//! Engine and backtest benchmarks. `cargo bench --bench engine`; figures in
//! docs/performance.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gpu_reaper::api::policy::{GpuPolicySpec, PolicyMode};
use gpu_reaper::backtest::{self, BacktestOptions};
use gpu_reaper::engine::model::{GpuObservation, LadderState, PodPhase, PodState, WorkloadMeta};
use gpu_reaper::engine::{Rules, evaluate};
use gpu_reaper::telemetry::trace::{ReadOptions, read_trace};
use jiff::{SignedDuration, Timestamp};

const T0: i64 = 1_793_577_600;

/// 10,000 GPUs: 1,250 workloads of 8, a mix of busy, idle and warned.
fn fleet() -> Vec<(
    WorkloadMeta,
    Vec<PodState>,
    Vec<GpuObservation>,
    LadderState,
)> {
    let at = |m: i64| Timestamp::from_second(T0 + m * 60).unwrap();
    (0..1250)
        .map(|w| {
            let meta = WorkloadMeta {
                kind: "Deployment".into(),
                namespace: format!("ns-{}", w % 40),
                name: format!("w-{w}"),
                created_at: at(-1000),
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
            };
            let pods = vec![PodState {
                phase: PodPhase::Running,
                waiting_reason: None,
                stuck_since: None,
                gpu_devices: 8,
            }];
            let gpus = (0..8)
                .map(|g| GpuObservation {
                    id: format!("GPU-{w}-{g}"),
                    model: "NVIDIA H100 80GB HBM3".into(),
                    share: 1.0,
                    pod: 0,
                    coverage: 1.0,
                    first_sample_at: Some(at(-900)),
                    last_busy_at: Some(at(if w % 3 == 0 { 299 } else { 100 - (w % 50) })),
                    blind_until: Some(at(-880)),
                    fb_used_mib: Some(if w % 2 == 0 { 70_000.0 } else { 0.0 }),
                    ..GpuObservation::default()
                })
                .collect();
            let ladder = LadderState {
                warned_at: (w % 4 == 0).then(|| at(150)),
                ..LadderState::default()
            };
            (meta, pods, gpus, ladder)
        })
        .collect()
}

fn engine(c: &mut Criterion) {
    let rules = Rules::from_spec(&GpuPolicySpec {
        mode: PolicyMode::Enforce,
        ..GpuPolicySpec::default()
    });
    let fleet = fleet();
    let now = Timestamp::from_second(T0 + 300 * 60).unwrap();
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(10_000));
    g.bench_function("classify_and_decide_10000_gpus", |b| {
        b.iter(|| {
            let mut acts = 0;
            for (meta, pods, gpus, ladder) in &fleet {
                let d = evaluate(&rules, meta, pods, gpus, ladder, now);
                acts += usize::from(d.step.changes_workload());
            }
            black_box(acts)
        })
    });
    g.finish();
}

/// A day of 60 s samples for `gpus` GPUs in `gpus / 4` workloads, two DCGM metrics each.
fn synthetic_trace(gpus: usize, minutes: i64) -> String {
    let mut s = String::with_capacity(gpus * minutes as usize * 2 * 190);
    for metric in ["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED"] {
        let _ = writeln!(s, "# TYPE {metric} gauge");
        for g in 0..gpus {
            let pod = format!("job-{}-0", g / 4);
            for m in 0..minutes {
                let v = match metric {
                    "DCGM_FI_DEV_FB_USED" => 30_000.0,
                    _ if (m / 90 + g as i64 / 4) % 3 == 0 => 0.6,
                    _ => 0.0,
                };
                let _ = writeln!(
                    s,
                    "{metric}{{gpu=\"{}\",UUID=\"GPU-{g:08}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-{}\",namespace=\"team\",pod=\"{pod}\",container=\"main\"}} {v} {}",
                    g % 8,
                    g / 8,
                    T0 + m * 60
                );
            }
        }
    }
    s.push_str("# EOF\n");
    s
}

fn backtest_throughput(c: &mut Criterion) {
    let (gpus, minutes) = (200, 1440);
    let text = synthetic_trace(gpus, minutes);
    let samples = (gpus as u64) * (minutes as u64) * 2;
    let options = ReadOptions {
        step_seconds: 60,
        skip_unknown_metrics: false,
        workload_labels: Default::default(),
    };
    let spec = GpuPolicySpec {
        mode: PolicyMode::Enforce,
        ..GpuPolicySpec::default()
    };
    let bt = BacktestOptions {
        regret_horizon: SignedDuration::from_hours(2),
        keep_timelines: false,
        warmup: SignedDuration::ZERO,
        history_backfill: gpu_reaper::backtest::CONTROLLER_BACKFILL,
    };
    let mut g = c.benchmark_group("backtest");
    g.sample_size(10);
    g.throughput(Throughput::Elements(samples));
    g.bench_function("read_trace_200_gpus_1_day", |b| {
        b.iter(|| {
            black_box(
                read_trace(text.as_bytes(), "bench", &options)
                    .unwrap()
                    .samples,
            )
        })
    });
    let trace = read_trace(text.as_bytes(), "bench", &options).unwrap();
    g.bench_function("replay_200_gpus_1_day", |b| {
        b.iter(|| black_box(backtest::run("bench", &spec, &trace, &bt).summary.actions))
    });
    // The controller's start-up backfill of one policy's idle-span history over the same
    // day (the Prometheus read aside): 50 workloads of 4 GPUs.
    let now = jiff::Timestamp::from_second(T0 + minutes * 60).unwrap();
    let pods = (0..gpus / 4)
        .map(|n| {
            let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("job-{n}-0"), "namespace": "team", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
                "status": {"phase": "Running"}});
            gpu_reaper::cluster::inventory::pod_info(&pod, &Default::default(), now).unwrap()
        })
        .collect();
    let workloads = gpu_reaper::cluster::inventory::resolve(pods, &Default::default());
    let rules = gpu_reaper::engine::Rules::from_spec(&spec);
    g.bench_function("backfill_feed_200_gpus_1_day", |b| {
        b.iter(|| {
            let mut history = gpu_reaper::engine::Histories::new(rules.risk);
            black_box(
                gpu_reaper::controller::backfill::feed(
                    &mut history,
                    &trace,
                    &workloads,
                    &rules,
                    now,
                )
                .spans,
            )
        })
    });
    g.finish();
}

criterion_group!(benches, engine, backtest_throughput);
criterion_main!(benches);
