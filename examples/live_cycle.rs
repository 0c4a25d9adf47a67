//! The live telemetry cycle against a real Prometheus, the per-policy queries of before
//! beside the incremental read the controller makes now, in one run.
//!
//! ```sh
//! cargo run --release --example live_cycle -- --gpus 10000 --policies 3 --json
//! ```
//!
//! It writes a synthetic DCGM history (`--gpus` GPUs, 3 hours at 30 s: engine activity,
//! memory used and power, four GPUs per pod, each pod busy 90 minutes in every 270),
//! backfills it with `promtool tsdb create-blocks-from openmetrics` into a TSDB under
//! `--data` (kept: later runs with the same `--gpus` reuse it), starts `prometheus` on
//! it (`--prometheus`, `--promtool`, or `GPU_REAPER_PROMETHEUS` / `GPU_REAPER_PROMTOOL`;
//! default: Debian's 2.x on the PATH), and then evaluates `--policies` policies (distinct
//! thresholds, so distinct trackers) at a first instant and at `--cycles` more, one minute
//! apart:
//!
//! - old: `per_policy::observe` (below: the controller's path before the incremental
//!   reads, kept here only to measure against), 11 queries per policy every cycle;
//! - new: `PrometheusSource::refresh` into one `LiveTelemetry` (the horizon at the first
//!   instant, then the minute since the previous read), observations per policy from
//!   memory.
//!
//! Prometheus' own time is the growth of its
//! `prometheus_http_request_duration_seconds_sum{handler="/api/v1/query"}` over the
//! cycle's queries (evaluation and encoding of the answers); the engine then evaluates
//! every GPU as a one-GPU workload. `--url URL --now UNIX_SECONDS` measures against a
//! Prometheus already running instead. Results go in docs/performance.md ("Live
//! telemetry cycle").

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpu_reaper::api::policy::GpuPolicySpec;
use gpu_reaper::engine::model::{LadderState, PodPhase, PodState, WorkloadMeta};
use gpu_reaper::engine::{Rules, evaluate};
use gpu_reaper::telemetry::live::{LiveTelemetry, Observations, horizon_seconds};
use gpu_reaper::telemetry::prometheus::{PrometheusConfig, PrometheusSource};
use per_policy::LiveSettings;

/// Start of the synthetic history.
const T0: i64 = 1_793_577_600;
const HOURS: i64 = 3;
const SCRAPE: i64 = 30;

struct Args {
    gpus: usize,
    policies: usize,
    cycles: usize,
    json: bool,
    data: PathBuf,
    prometheus: String,
    promtool: String,
    url: Option<String>,
    now: Option<i64>,
    skip_old: bool,
}

fn args() -> Args {
    let mut a = Args {
        gpus: 10_000,
        policies: 3,
        cycles: 3,
        json: false,
        data: std::env::temp_dir().join("gpu-reaper-live-cycle"),
        prometheus: std::env::var("GPU_REAPER_PROMETHEUS").unwrap_or_else(|_| "prometheus".into()),
        promtool: std::env::var("GPU_REAPER_PROMTOOL").unwrap_or_else(|_| "promtool".into()),
        url: None,
        now: None,
        skip_old: false,
    };
    let mut it = std::env::args().skip(1);
    let usage = "usage: live_cycle [--gpus N] [--policies N] [--cycles N] [--json] [--data DIR] [--prometheus BIN] [--promtool BIN] [--url URL --now UNIX_SECONDS] [--skip-old]";
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{usage}"));
        match flag.as_str() {
            "--gpus" => a.gpus = value().replace([',', '_'], "").parse().expect(usage),
            "--policies" => a.policies = value().parse::<usize>().expect(usage).max(1),
            "--cycles" => a.cycles = value().parse::<usize>().expect(usage).max(1),
            "--json" => a.json = true,
            "--data" => a.data = value().into(),
            "--prometheus" => a.prometheus = value(),
            "--promtool" => a.promtool = value(),
            "--url" => a.url = Some(value()),
            "--now" => a.now = Some(value().parse().expect(usage)),
            "--skip-old" => a.skip_old = true,
            _ => panic!("{usage}"),
        }
    }
    a
}

/// `--policies` policies that differ in their threshold (5 %, 10 %, …).
fn policies(n: usize) -> Vec<Rules> {
    (0..n)
        .map(|i| {
            let mut spec = GpuPolicySpec::default();
            spec.idle.threshold = 0.05 * (i + 1) as f64;
            Rules::from_spec(&spec)
        })
        .collect()
}

/// The synthetic history's TSDB for `gpus` GPUs, written once.
fn tsdb(args: &Args) -> PathBuf {
    let dir = args.data.join(format!("g{}-h{HOURS}-s{SCRAPE}", args.gpus));
    let db = dir.join("db");
    if dir.join("complete").exists() {
        return db;
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("data directory");
    let om = dir.join("trace.om");
    let started = Instant::now();
    {
        let mut out =
            std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&om).unwrap());
        for family in [
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_POWER_USAGE",
        ] {
            writeln!(out, "# TYPE {family} gauge").unwrap();
            for g in 0..args.gpus {
                let pod = g / 4;
                for k in 0..HOURS * 3600 / SCRAPE {
                    let minute = k * SCRAPE / 60;
                    let busy = (minute / 90 + pod as i64) % 3 == 0;
                    let value = match (family, busy) {
                        ("DCGM_FI_DEV_FB_USED", _) => 30_000.0,
                        ("DCGM_FI_DEV_POWER_USAGE", true) => 610.5,
                        ("DCGM_FI_DEV_POWER_USAGE", false) => 71.25,
                        (_, true) => 0.6,
                        _ => 0.0,
                    };
                    writeln!(
                        out,
                        "{family}{{gpu=\"{}\",UUID=\"GPU-{g:08}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-{}\",namespace=\"team\",pod=\"job-{pod}-0\",container=\"main\"}} {value} {}",
                        g % 8,
                        g / 8,
                        T0 + k * SCRAPE
                    )
                    .unwrap();
                }
            }
        }
        writeln!(out, "# EOF").unwrap();
        out.flush().unwrap();
    }
    eprintln!(
        "wrote {} in {:.0} s; backfilling",
        om.display(),
        started.elapsed().as_secs_f64()
    );
    let status = Command::new(&args.promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&om)
        .arg(&db)
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "{} is needed ({e}): apt-get install -y prometheus",
                args.promtool
            )
        });
    assert!(status.success(), "promtool failed");
    let _ = std::fs::remove_file(&om);
    std::fs::write(dir.join("complete"), b"").unwrap();
    eprintln!("TSDB ready in {:.0} s", started.elapsed().as_secs_f64());
    db
}

struct Server {
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(args: &Args, db: &Path) -> (Server, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = db.parent().unwrap().join("prometheus.yml");
    std::fs::write(&config, "global:\n  scrape_interval: 30s\n").unwrap();
    let log = std::fs::File::create(db.parent().unwrap().join("prometheus.log")).unwrap();
    let child = Command::new(&args.prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", db.display()))
        .arg("--storage.tsdb.retention.time=100y")
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{} is needed ({e}): apt-get install -y prometheus",
                args.prometheus
            )
        });
    let server = Server { child };
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        || !std::fs::read_to_string(db.parent().unwrap().join("prometheus.log"))
            .is_ok_and(|l| l.contains("Server is ready to receive web requests"))
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "Prometheus not ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (server, url)
}

/// Prometheus' own seconds answering `/api/v1/query` so far, and its version.
async fn prometheus_seconds(http: &reqwest::Client, url: &str) -> (f64, String) {
    let text = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .expect("Prometheus /metrics")
        .text()
        .await
        .unwrap_or_default();
    let value = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    // Absent until the first query is answered.
    let seconds = value("prometheus_http_request_duration_seconds_sum{handler=\"/api/v1/query\"}")
        .unwrap_or(0.0);
    let version = text
        .lines()
        .find(|l| l.starts_with("prometheus_build_info"))
        .and_then(|l| l.split(",version=\"").nth(1)?.split('"').next())
        .unwrap_or("unknown")
        .to_string();
    (seconds, version)
}

/// Engine over every GPU as a one-GPU workload: how many are idle.
fn evaluate_all(rules: &Rules, observed: &Observations, now: i64) -> usize {
    let at = jiff::Timestamp::from_second(now).unwrap();
    let pods = [PodState {
        phase: PodPhase::Running,
        waiting_reason: None,
        stuck_since: None,
        gpu_devices: 1,
    }];
    observed
        .values()
        .filter(|obs| {
            let meta = WorkloadMeta {
                kind: "Pod".into(),
                namespace: "bench".into(),
                name: obs.id.clone(),
                created_at: at - jiff::SignedDuration::from_hours(6),
                labels: Default::default(),
                annotations: Default::default(),
            };
            evaluate(
                rules,
                &meta,
                &pods,
                std::slice::from_ref(obs),
                &LadderState::default(),
                at,
            )
            .verdict
            .classification
            .is_idle()
        })
        .count()
}

#[derive(Default, Debug)]
struct Cycle {
    queries: usize,
    prometheus_seconds: f64,
    wall_seconds: f64,
    gpus: usize,
    idle: Vec<usize>,
}

fn json_cycles(c: &[Cycle]) -> String {
    let items: Vec<String> = c
        .iter()
        .map(|c| {
            format!(
                "{{\"queries\":{},\"prometheus_seconds\":{:.3},\"wall_seconds\":{:.3},\"gpus\":{},\"idle_per_policy\":{:?}}}",
                c.queries, c.prometheus_seconds, c.wall_seconds, c.gpus, c.idle
            )
        })
        .collect();
    format!("[{}]", items.join(","))
}

fn max_steady(c: &[Cycle]) -> f64 {
    c.iter()
        .skip(1)
        .map(|c| c.prometheus_seconds)
        .fold(0.0, f64::max)
}

fn main() {
    let args = args();
    let (_server, url) = match &args.url {
        Some(url) => (None, url.clone()),
        None => {
            let db = tsdb(&args);
            let (server, url) = start(&args, &db);
            (Some(server), url)
        }
    };
    let rules = policies(args.policies);
    let horizon = rules.iter().map(horizon_seconds).max().unwrap_or(0);
    // Late enough for the horizon of every policy to lie inside the history.
    let first = args.now.unwrap_or(T0 + horizon + 5 * 60 + 17);
    let instants: Vec<i64> = (0..=args.cycles as i64).map(|k| first + 60 * k).collect();
    let source = PrometheusSource::new(PrometheusConfig {
        url: url.clone(),
        timeout: Duration::from_secs(300),
        ..PrometheusConfig::default()
    })
    .expect("client");
    let http = reqwest::Client::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let version = runtime.block_on(prometheus_seconds(&http, &url)).1;

    // Old: every policy's 11 queries, every cycle (the first and one more: the cost of
    // each is the same).
    let mut old: Vec<Cycle> = Vec::new();
    if !args.skip_old {
        for &now in instants.iter().take(2) {
            let mut c = Cycle::default();
            let (before, _) = runtime.block_on(prometheus_seconds(&http, &url));
            let started = Instant::now();
            for r in &rules {
                // The horizon the controller gave these queries.
                let horizon = (r.action_after.max(r.warn_after) + r.window).as_secs() + 600;
                let live = LiveSettings {
                    scrape_interval_seconds: SCRAPE,
                    horizon_seconds: horizon,
                    step_seconds: 60,
                    selector: String::new(),
                    workload_labels: Default::default(),
                };
                let observed = runtime
                    .block_on(per_policy::observe(&source, r, &live, now))
                    .expect("observe");
                c.queries += 11;
                c.gpus = c.gpus.max(observed.len());
                c.idle.push(evaluate_all(r, &observed, now));
            }
            c.wall_seconds = started.elapsed().as_secs_f64();
            c.prometheus_seconds = runtime.block_on(prometheus_seconds(&http, &url)).0 - before;
            eprintln!("old {now}: {c:?}");
            old.push(c);
        }
    }

    // New: one state, one read per cycle.
    let mut live = LiveTelemetry::new(60);
    let mut new: Vec<Cycle> = Vec::new();
    let mut engine_seconds = 0.0f64;
    for &now in &instants {
        let mut c = Cycle::default();
        let (before, _) = runtime.block_on(prometheus_seconds(&http, &url));
        let started = Instant::now();
        let read = runtime
            .block_on(source.refresh(&mut live, &rules, &Default::default(), now))
            .expect("refresh");
        c.prometheus_seconds = runtime.block_on(prometheus_seconds(&http, &url)).0 - before;
        c.queries = read.queries;
        let engine = Instant::now();
        for r in &rules {
            let observed = live.observe(r);
            c.gpus = c.gpus.max(observed.len());
            c.idle.push(evaluate_all(r, &observed, now));
        }
        engine_seconds = engine_seconds.max(engine.elapsed().as_secs_f64());
        c.wall_seconds = started.elapsed().as_secs_f64();
        eprintln!("new {now}: {c:?} {read:?}");
        new.push(c);
    }
    let peak_kb: u64 = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    let steady_new = max_steady(&new);
    let steady_old = max_steady(&old);
    let ratio = (steady_new > 0.0 && !old.is_empty()).then(|| steady_old / steady_new);
    let json_number = |v: Option<f64>| {
        v.filter(|v| v.is_finite())
            .map_or("null".into(), |v| format!("{v:.3}"))
    };
    let queries_steady = new.last().map_or(0, |c| c.queries);
    if args.json {
        println!(
            "{{\"gpus\":{},\"policies\":{},\"prometheus_version\":\"{version}\",\"queries_per_cycle\":{queries_steady},\"queries_first_cycle\":{},\"prometheus_seconds_first_cycle\":{:.3},\"prometheus_seconds_steady_cycle\":{steady_new:.3},\"old\":{{\"queries_per_cycle\":{},\"prometheus_seconds_first_cycle\":{},\"prometheus_seconds_steady_cycle\":{},\"cycles\":{}}},\"steady_old_over_new\":{},\"engine_and_split_seconds_per_cycle\":{engine_seconds:.3},\"peak_rss_kb\":{peak_kb},\"cycles\":{}}}",
            args.gpus,
            args.policies,
            new[0].queries,
            new[0].prometheus_seconds,
            old.first().map_or(0, |c| c.queries),
            json_number(old.first().map(|c| c.prometheus_seconds)),
            json_number((!old.is_empty()).then_some(steady_old)),
            json_cycles(&old),
            json_number(ratio),
            json_cycles(&new),
        );
    } else {
        println!(
            "{} GPUs, {} policies, Prometheus {version}\n  old: {} queries per cycle, {:.2} s in Prometheus (first), {steady_old:.2} s (steady)\n  new: {} queries at the first cycle, {:.2} s in Prometheus; steady {queries_steady} queries, {steady_new:.3} s ({}× less)\n  engine and split over the policies ≤ {:.0} ms per cycle; peak RSS {peak_kb} kB",
            args.gpus,
            args.policies,
            old.first().map_or(0, |c| c.queries),
            old.first().map_or(f64::NAN, |c| c.prometheus_seconds),
            new[0].queries,
            new[0].prometheus_seconds,
            json_number(ratio),
            engine_seconds * 1000.0,
        );
    }
}

/// The per-policy queries of before the incremental reads: every policy's activity
/// queries evaluated at each cycle's instant (11 per policy; the number of queries grows
/// with policies, never with pods or GPUs — every answer carries every GPU). Only range
/// functions over raw samples count coverage (`count_over_time`), and subqueries only
/// re-report real samples' own timestamps, so Prometheus' lookback never turns a gap into
/// data.
mod per_policy {
    use std::collections::BTreeSet;

    use gpu_reaper::api::policy::Signal;
    use gpu_reaper::engine::{GpuObservation, Rules};
    use gpu_reaper::telemetry::live::Observations;
    use gpu_reaper::telemetry::prometheus::{PrometheusError, PrometheusSource};
    use gpu_reaper::telemetry::trace::WorkloadLabels;

    /// What the old cycle needed besides the policy: how often the exporter is scraped
    /// (to turn sample counts into coverage), how far back to look for the last activity,
    /// and an optional extra selector.
    #[derive(Debug, Clone)]
    pub struct LiveSettings {
        pub scrape_interval_seconds: i64,
        pub horizon_seconds: i64,
        pub step_seconds: i64,
        pub selector: String,
        pub workload_labels: WorkloadLabels,
    }

    /// The activity metric families, in fallback order, with the factor that brings them to 0–1.
    pub const ACTIVITY_SIGNALS: [(&str, f64); 2] = [
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0),
        ("DCGM_FI_DEV_GPU_UTIL", 0.01),
    ];

    /// What one cycle asks per activity family.
    #[derive(Debug, Clone, PartialEq)]
    pub struct ActivityQueries {
        /// Samples per GPU in the idle window (coverage = count × scrape interval ÷ window).
        pub samples_in_window: String,
        /// Timestamp of the last sample at or above the threshold within the horizon.
        pub last_busy: String,
        /// Last evaluation step within the horizon whose window had too few samples, or a
        /// sample that is not an activity value (NaN from a broken exporter field, or
        /// negative): such a window is blind, never evidence of idleness.
        pub last_blind: String,
        /// Timestamp of the first sample within the horizon.
        pub first_sample: String,
    }

    /// Seconds as a PromQL duration.
    fn secs(s: i64) -> String {
        format!("{}s", s.max(1))
    }

    /// The shape of one cycle's queries under a policy.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct QueryShape {
        /// Busy at or above this, on the 0–1 scale.
        pub threshold: f64,
        /// The idle window, seconds.
        pub window: i64,
        /// How far back the last activity is looked for, seconds.
        pub horizon: i64,
        /// Evaluation resolution, seconds.
        pub step: i64,
        /// Fewest samples a window may have to count as observed.
        pub min_samples: u32,
    }

    /// The queries for one activity family (`scale` brings it to 0–1).
    pub fn activity_queries(
        family: &str,
        scale: f64,
        selector: &str,
        shape: &QueryShape,
    ) -> ActivityQueries {
        let QueryShape {
            threshold,
            window,
            horizon,
            step,
            min_samples,
        } = *shape;
        let series = format!("{family}{selector}");
        let raw_threshold = threshold / scale;
        ActivityQueries {
            samples_in_window: format!("count_over_time({series}[{}])", secs(window)),
            last_busy: format!(
                "max_over_time(timestamp({series} >= {raw_threshold})[{}:{}])",
                secs(horizon),
                secs(step)
            ),
            // `min_over_time` < 0: a negative sample; a NaN sample makes the window's sum NaN,
            // and NaN is the only value unequal to itself.
            last_blind: format!(
                "max_over_time(timestamp(count_over_time({series}[{w}]) < {min_samples} or min_over_time({series}[{w}]) < 0 or sum_over_time({series}[{w}]) != sum_over_time({series}[{w}]))[{}:{}])",
                secs(horizon),
                secs(step),
                w = secs(window),
            ),
            first_sample: format!(
                "min_over_time(timestamp({series})[{}:{}])",
                secs(horizon),
                secs(step)
            ),
        }
    }

    /// Latest value of a gauge family (memory held, PCIe receive, power), within the window.
    pub fn latest(family: &str, selector: &str, window: i64) -> String {
        format!("last_over_time({family}{selector}[{}])", secs(window))
    }

    /// Observes every GPU at `now` with a fixed number of queries.
    pub async fn observe(
        source: &PrometheusSource,
        rules: &Rules,
        live: &LiveSettings,
        now: i64,
    ) -> Result<Observations, PrometheusError> {
        let window = rules.window.as_secs();
        let min_samples = ((rules.min_coverage * window as f64)
            / live.scrape_interval_seconds.max(1) as f64)
            .ceil() as u32;
        let mut out = Observations::new();
        let signals: Vec<(&str, f64)> = match rules.signal {
            Signal::Auto | Signal::Unknown => ACTIVITY_SIGNALS.to_vec(),
            Signal::EngineActive => vec![ACTIVITY_SIGNALS[0]],
            Signal::GpuUtil => vec![ACTIVITY_SIGNALS[1]],
        };
        let labels = &live.workload_labels;
        // GPUs already described by an earlier (preferred) family keep it.
        let mut described: BTreeSet<(String, String, String)> = BTreeSet::new();
        for (family, scale) in signals {
            let shape = QueryShape {
                threshold: rules.threshold,
                window,
                horizon: live.horizon_seconds,
                step: live.step_seconds,
                min_samples,
            };
            let q = activity_queries(family, scale, &live.selector, &shape);
            let counts = source
                .instant_vector(&q.samples_in_window, now, labels)
                .await?;
            let busy = source.instant_vector(&q.last_busy, now, labels).await?;
            let blind = source.instant_vector(&q.last_blind, now, labels).await?;
            let first = source.instant_vector(&q.first_sample, now, labels).await?;
            let mut this_family = BTreeSet::new();
            for (key, (identity, _)) in counts.iter().chain(first.iter()) {
                if described.contains(key) {
                    continue;
                }
                this_family.insert(key.clone());
                let obs = out.entry(key.clone()).or_insert_with(|| GpuObservation {
                    id: identity.id.clone(),
                    model: identity.model.clone(),
                    share: identity.share,
                    ..Default::default()
                });
                let count = counts.get(key).map_or(0.0, |(_, v)| *v);
                obs.coverage =
                    (count * live.scrape_interval_seconds as f64 / window.max(1) as f64).min(1.0);
                obs.last_busy_at = busy.get(key).and_then(|(_, v)| ts(*v));
                obs.first_sample_at = first.get(key).and_then(|(_, v)| ts(*v));
                // The current window counts too: with too few samples now, it is blind now.
                let blind_now = (count as u32) < min_samples.max(1);
                obs.blind_until = if blind_now {
                    ts(now as f64)
                } else {
                    blind.get(key).and_then(|(_, v)| ts(*v))
                };
            }
            described.extend(this_family);
        }
        for (family, field) in [
            ("DCGM_FI_DEV_FB_USED", 0),
            ("DCGM_FI_PROF_PCIE_RX_BYTES", 1),
            ("DCGM_FI_DEV_POWER_USAGE", 2),
        ] {
            let query = latest(family, &live.selector, window);
            for (key, (_, value)) in source.instant_vector(&query, now, labels).await? {
                if let Some(obs) = out.get_mut(&key) {
                    match field {
                        0 => obs.fb_used_mib = Some(value),
                        1 => obs.pcie_rx_bytes_per_second = Some(value),
                        _ => obs.power_watts = Some(value),
                    }
                }
            }
        }
        Ok(out)
    }

    fn ts(seconds: f64) -> Option<jiff::Timestamp> {
        seconds
            .is_finite()
            .then(|| jiff::Timestamp::from_second(seconds.floor() as i64).ok())
            .flatten()
    }
}
