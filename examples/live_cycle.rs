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
//! - old: `PrometheusSource::observe`, 11 queries per policy every cycle;
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
use gpu_reaper::telemetry::live::{LiveTelemetry, horizon_seconds};
use gpu_reaper::telemetry::prometheus::{
    LiveSettings, Observations, PrometheusConfig, PrometheusSource,
};

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
                    .block_on(source.observe(r, &live, now))
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
