#![allow(dead_code)]
//! The one harness of the integration tests: the real Prometheus on loopback with series
//! backfilled by promtool (Debian's 2.x by default; `GPU_REAPER_PROMETHEUS` and
//! `GPU_REAPER_PROMTOOL` name other binaries, e.g. the Prometheus 3 that scripts/testenv
//! builds — scripts/test runs the telemetry suite against both), DCGM series, and the
//! real control plane (`cluster`, `scenario`).

pub mod pki;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Prometheus {
    child: Child,
    pub url: String,
    pub dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts Prometheus on loopback with `openmetrics` backfilled into its TSDB.
pub fn prometheus_with(name: &str, openmetrics: &[u8]) -> Prometheus {
    prometheus_serving(name, openmetrics, &[])
}

/// Like [`prometheus_with`], with a web configuration (`--web.config.file`: TLS, client
/// certificates, basic auth): `web` holds `web.yml` and the files it names, relative to
/// it. With TLS the URL is `https://127.0.0.1:PORT`.
pub fn prometheus_serving(name: &str, openmetrics: &[u8], web: &[(&str, &str)]) -> Prometheus {
    prometheus_configured(name, openmetrics, web, "")
}

/// Like [`prometheus_with`], as one replica of an HA pair behind Thanos: its external
/// labels are `cluster="test"` and `replica="{replica}"` (a Thanos sidecar refuses a
/// Prometheus without external labels).
pub fn prometheus_replica(name: &str, openmetrics: &[u8], replica: &str) -> Prometheus {
    prometheus_configured(
        name,
        openmetrics,
        &[],
        &format!("  external_labels:\n    cluster: test\n    replica: {replica}\n"),
    )
}

/// The real Prometheus over `openmetrics`; `global` is more of the configuration's
/// `global:` section (indented two spaces).
fn prometheus_configured(
    name: &str,
    openmetrics: &[u8],
    web: &[(&str, &str)],
    global: &str,
) -> Prometheus {
    let dir = std::env::temp_dir().join(format!("gpu-reaper-prom-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("trace.om"), openmetrics).unwrap();
    let promtool = std::env::var("GPU_REAPER_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let backfill = Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(dir.join("trace.om"))
        .arg(dir.join("data"))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{promtool} is needed ({e}): apt-get install -y prometheus (scripts/test does it)"
            )
        });
    assert!(
        backfill.status.success(),
        "backfill: {}",
        String::from_utf8_lossy(&backfill.stderr)
    );
    std::fs::write(
        dir.join("prometheus.yml"),
        format!("global:\n  scrape_interval: 1m\n{global}"),
    )
    .unwrap();
    for (file, text) in web {
        std::fs::write(dir.join(file), text).unwrap();
    }
    let tls = web
        .iter()
        .any(|(f, t)| *f == "web.yml" && t.contains("tls_server_config"));
    let port = free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let server = std::env::var("GPU_REAPER_PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
    let mut command = Command::new(&server);
    if !web.is_empty() {
        command.arg(format!(
            "--web.config.file={}",
            dir.join("web.yml").display()
        ));
    }
    let child = command
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg("--storage.tsdb.retention.time=100y")
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{server} is needed ({e}): apt-get install -y prometheus (scripts/test does it)")
        });
    let p = Prometheus {
        child,
        url: format!("{}://127.0.0.1:{port}", if tls { "https" } else { "http" }),
        dir,
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let ready = |p: &Prometheus| {
        if web.is_empty() {
            http_ok(port, "/-/ready")
        } else {
            std::fs::read_to_string(p.dir.join("prometheus.log"))
                .is_ok_and(|log| log.contains("Server is ready to receive web requests"))
        }
    };
    while !ready(&p) {
        assert!(
            Instant::now() < deadline,
            "Prometheus not ready: {}",
            std::fs::read_to_string(p.dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    p
}

pub fn http_ok(port: u16, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).is_ok() && buf.ends_with(b"200")
}

pub mod cluster;
pub mod scenario;

/// `gpu-reaper wake TARGET` against the API server of `kubeconfig`; panics with its stderr
/// unless it succeeds, and returns what it printed.
pub async fn wake(kubeconfig: &std::path::Path, target: &str) -> String {
    let out = tokio::process::Command::new(scenario::BIN)
        .args(["wake", target])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "wake {target}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// RFC 3339 of `minutes` after `t0` (epoch seconds).
pub fn at(t0: i64, minutes: i64) -> String {
    jiff::Timestamp::from_second(t0 + minutes * 60)
        .unwrap()
        .to_string()
}

/// A whole minute a little after the wall clock: the start of a history laid out after
/// the objects it describes were created (the API server stamps them with the wall
/// clock), backfilled into Prometheus ahead of time, and evaluated with `--now`.
pub fn history_start() -> i64 {
    jiff::Timestamp::now().as_second() / 60 * 60 + 600
}

/// DCGM exporter series in OpenMetrics, one sample a minute, for promtool's backfill.
pub struct Dcgm {
    text: String,
    t0: i64,
}

impl Dcgm {
    pub fn new(t0: i64) -> Self {
        Dcgm {
            text: String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n"),
            t0,
        }
    }

    /// GPU `gpu` of `namespace/pod` over `minutes`, at `value(minute)` (None: no sample).
    pub fn gpu(
        &mut self,
        namespace: &str,
        pod: &str,
        gpu: u32,
        model: &str,
        minutes: std::ops::RangeInclusive<i64>,
        value: impl Fn(i64) -> Option<f64>,
    ) -> &mut Self {
        use std::fmt::Write as _;
        for m in minutes {
            if let Some(v) = value(m) {
                let _ = writeln!(
                    self.text,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"{gpu}\",UUID=\"GPU-{pod}-{gpu}\",modelName=\"{model}\",Hostname=\"n1\",namespace=\"{namespace}\",pod=\"{pod}\",container=\"main\"}} {v} {}",
                    self.t0 + m * 60
                );
            }
        }
        self
    }

    pub fn finish(&mut self) -> Vec<u8> {
        let mut text = std::mem::take(&mut self.text);
        text.push_str("# EOF\n");
        text.into_bytes()
    }
}
pub mod chart;
pub mod kueue;
pub mod live;
