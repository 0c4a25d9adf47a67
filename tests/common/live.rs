//! The live loop's parts: `gpu-reaper replay` serving DCGM series for pods of the real
//! control plane, and the real Prometheus 3 (built by scripts/testenv) scraping it — no
//! backfill, no `--now`: samples arrive as the clock runs, as in production.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster::Cluster;
use super::scenario::BIN;
use super::{Prometheus, free_port, http_ok};

/// `gpu-reaper replay` on a free loopback port; killed when dropped.
pub struct Replay {
    child: Child,
    pub port: u16,
}

impl Drop for Replay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replay {
    /// `host:port` for a scrape configuration.
    pub fn target(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// Starts `gpu-reaper replay ARGS` against `cluster` and waits until it serves.
pub fn replay(cluster: &Cluster, args: &[&str], log: &Path) -> Replay {
    let port = free_port();
    let child = Command::new(BIN)
        .arg("replay")
        .args(args)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", &cluster.kubeconfig)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let replay = Replay { child, port };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http_ok(port, "/healthz") {
        assert!(
            Instant::now() < deadline,
            "replay never served: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    replay
}

/// The Prometheus 3 of the control plane's tools scraping `targets` every `interval`.
pub fn prometheus_scraping(
    cluster: &Cluster,
    name: &str,
    targets: &[String],
    interval: &str,
) -> Prometheus {
    let dir = std::env::temp_dir().join(format!("gpu-reaper-live-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: {interval}\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    let server = cluster.bin("prometheus3");
    assert!(
        server.exists(),
        "{} is missing: `scripts/testenv build` builds it",
        server.display()
    );
    let port = free_port();
    let child = Command::new(&server)
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .unwrap();
    let p = Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
        dir,
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while !http_ok(port, "/-/ready") {
        assert!(
            Instant::now() < deadline,
            "Prometheus 3 not ready: {}",
            std::fs::read_to_string(p.dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    p
}
