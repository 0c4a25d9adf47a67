//! gpu-reaper against a real Thanos (built from its Go module by `scripts/testenv build`,
//! tests/k8s/thanos): Thanos Query over the sidecars of two Prometheus replicas, an HA
//! pair with the same series and external labels `cluster="test"`, `replica="a"|"b"`.
//! Replica b lost 40 minutes (a restart), so only deduplication (Query's
//! `--query.replica-label=replica`) gives back the whole series. Every read — `backtest`
//! and `audit` over the history, the controller's incremental reads (with a selector on
//! the external label, as a Thanos holding several clusters is read) — must see exactly
//! what one Prometheus with the same samples gives; and again with replica b's sidecar
//! gone from Query's endpoints.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-reaper");

use crate::common;
use crate::prometheus::sample_trace_text;
use common::{free_port, http_ok, prometheus_replica, prometheus_with};

/// The Thanos binary: `GPU_REAPER_THANOS`, else the one `scripts/testenv build` put beside
/// the control plane of `GPU_REAPER_TESTENV` (scripts/test sets both up).
fn thanos_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("GPU_REAPER_THANOS") {
        return path.into();
    }
    let path = std::env::var_os("GPU_REAPER_TESTENV")
        .map(|dir| Path::new(&dir).join("bin/thanos"))
        .filter(|p| p.exists());
    path.unwrap_or_else(|| {
        panic!(
            "thanos is needed: `scripts/testenv build` builds it from tests/k8s/thanos \
             (scripts/test does); set GPU_REAPER_THANOS=PATH or GPU_REAPER_TESTENV=DIR"
        )
    })
}

/// A Thanos component; killed when dropped. Its log is kept for failure messages.
struct Thanos {
    child: Child,
    log: PathBuf,
    http_port: u16,
    grpc_port: u16,
}

impl Thanos {
    fn start(dir: &Path, name: &str, args: &[String]) -> Thanos {
        let (http_port, grpc_port) = (free_port(), free_port());
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(thanos_binary())
            .args(args)
            .arg(format!("--http-address=127.0.0.1:{http_port}"))
            .arg(format!("--grpc-address=127.0.0.1:{grpc_port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", thanos_binary().display()));
        let t = Thanos {
            child,
            log,
            http_port,
            grpc_port,
        };
        t.wait_for(&format!("{name} ready"), || http_ok(http_port, "/-/ready"));
        t
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    fn wait_for(&self, what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !done() {
            assert!(
                Instant::now() < deadline,
                "waiting for {what}: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Thanos {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body of `GET path` on loopback `port` (HTTP/1.0, read to the end), if it answered.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
}

/// How many sidecars Thanos Query has in its endpoint set now and reached at its last
/// check (a statically configured endpoint that stops answering stays listed, with
/// `lastError` set, and is left out of queries).
fn sidecars(query: &Thanos) -> usize {
    get(query.http_port, "/api/v1/stores")
        .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
        .and_then(|v| {
            v["data"]["sidecar"]
                .as_array()
                .map(|s| s.iter().filter(|e| e["lastError"].is_null()).count())
        })
        .unwrap_or(0)
}

/// `text` without the samples in [from, to) (epoch seconds): what a replica that was down
/// then holds.
fn without(text: &[u8], from: f64, to: f64) -> Vec<u8> {
    let text = String::from_utf8_lossy(text);
    let mut out = String::new();
    for line in text.lines() {
        let timestamp = (!line.starts_with('#'))
            .then(|| line.rsplit(' ').next())
            .flatten()
            .and_then(|t| t.parse::<f64>().ok());
        if timestamp.is_some_and(|t| t >= from && t < to) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.into_bytes()
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("binary runs")
}

/// What a history command printed as JSON, with the source's URL (the one field that
/// names where it read) left out.
fn report(args: &[&str]) -> serde_json::Value {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    scrub_urls(&mut v);
    v
}

fn scrub_urls(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) if s.contains("http://127.0.0.1:") => {
            *s = "<url>".into();
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(scrub_urls),
        serde_json::Value::Object(map) => map.values_mut().for_each(scrub_urls),
        _ => {}
    }
}

fn backtest(url: &str) -> serde_json::Value {
    report(&[
        "backtest",
        "--prometheus-url",
        url,
        "--from",
        "2026-11-02T00:00:00Z",
        "--to",
        "2026-11-02T08:00:00Z",
        "--format",
        "json",
    ])
}

fn audit(url: &str) -> serde_json::Value {
    // The trace is in the past: audit looks back from now.
    let start: jiff::Timestamp = "2026-11-02T00:00:00Z".parse().unwrap();
    let hours = jiff::Timestamp::now().duration_since(start).as_hours() + 1;
    report(&[
        "audit",
        "--prometheus-url",
        url,
        "--since",
        &format!("{hours}h"),
        "--format",
        "json",
    ])
}

/// Each GPU's observation after the controller's incremental reads at these minutes of
/// the trace (a start-up read, one-minute reads, a long gap), through `selector`: how many
/// GPUs, and all of them as text (a map in key order, so equal text is equal maps).
fn incremental(url: &str, selector: &str) -> Vec<(usize, String)> {
    use gpu_reaper::api::policy::GpuPolicySpec;
    use gpu_reaper::engine::Rules;
    use gpu_reaper::telemetry::live::{LiveTelemetry, ReadSettings};
    use gpu_reaper::telemetry::prometheus::{PrometheusConfig, PrometheusSource};

    let rules = Rules::from_spec(&GpuPolicySpec::default());
    let source = PrometheusSource::new(PrometheusConfig {
        url: url.into(),
        ..PrometheusConfig::default()
    })
    .unwrap();
    let settings = ReadSettings {
        selector: selector.into(),
        ..ReadSettings::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t0 = 1_793_577_600i64; // 2026-11-02T00:00:00Z
    let mut live = LiveTelemetry::new(60);
    [140, 141, 142, 220, 310, 479]
        .into_iter()
        .map(|minute| {
            runtime
                .block_on(source.refresh(
                    &mut live,
                    std::slice::from_ref(&rules),
                    &settings,
                    t0 + minute * 60 + 17,
                ))
                .unwrap_or_else(|e| panic!("read at minute {minute} from {url}: {e}"));
            let seen = live.observe(&rules);
            (seen.len(), format!("{seen:?}"))
        })
        .collect()
}

#[test]
fn thanos_query_over_two_replicas_reads_exactly_as_one_prometheus() {
    let text = sample_trace_text();
    // Replica b was down from 02:00 to 02:40 (idle and busy spans of the trace inside).
    let (gap_from, gap_to) = (1_793_577_600.0 + 7_200.0, 1_793_577_600.0 + 9_600.0);
    let gapped = without(&text, gap_from, gap_to);
    assert!(
        gapped.len() < text.len() * 95 / 100,
        "the gap removes samples"
    );
    let one = prometheus_with("thanos-one", &text);
    let a = prometheus_replica("thanos-a", &text, "a");
    let b = prometheus_replica("thanos-b", &gapped, "b");

    let dir = tempfile::tempdir().unwrap();
    let sidecar = |name: &str, p: &common::Prometheus| {
        Thanos::start(
            dir.path(),
            name,
            &[
                "sidecar".into(),
                format!("--prometheus.url={}", p.url),
                format!("--tsdb.path={}", p.dir.join("data").display()),
            ],
        )
    };
    let sidecar_a = sidecar("sidecar-a", &a);
    let sidecar_b = sidecar("sidecar-b", &b);
    let query = Thanos::start(
        dir.path(),
        "query",
        &[
            "query".into(),
            format!("--endpoint=127.0.0.1:{}", sidecar_a.grpc_port),
            format!("--endpoint=127.0.0.1:{}", sidecar_b.grpc_port),
            "--query.replica-label=replica".into(),
        ],
    );
    query.wait_for("both sidecars in Query's endpoint set", || {
        sidecars(&query) == 2
    });

    // The history commands: the very same report.
    let expected = backtest(&one.url);
    assert!(
        expected["summary"]["workloads"].as_u64().unwrap_or(0) >= 20
            && expected["summary"]["actions"].as_u64().unwrap_or(0) >= 5,
        "{}",
        expected["summary"]
    );
    assert_eq!(backtest(&query.url()), expected, "backtest over Thanos");
    assert_eq!(audit(&query.url()), audit(&one.url), "audit over Thanos");
    // Without deduplication the gap shows: the test can tell.
    assert_ne!(
        backtest(&b.url),
        expected,
        "replica b alone lacks 40 minutes"
    );

    // The controller's reads, selecting this cluster by its external label over Thanos.
    let from_one = incremental(&one.url, "");
    assert!(from_one.iter().all(|(n, _)| *n >= 50), "GPUs observed");
    assert_eq!(
        incremental(&query.url(), r#"{cluster="test"}"#),
        from_one,
        "incremental reads over Thanos"
    );
    assert!(
        incremental(&query.url(), r#"{cluster="other"}"#)
            .iter()
            .all(|(n, _)| *n == 0),
        "another cluster's selector reads nothing"
    );

    // Replica b's sidecar goes away: Query marks it down and answers from replica a alone.
    drop(sidecar_b);
    query.wait_for("Query to mark sidecar b down", || sidecars(&query) == 1);
    assert_eq!(backtest(&query.url()), expected, "with one replica left");
    assert_eq!(incremental(&query.url(), r#"{cluster="test"}"#), from_one);
}
