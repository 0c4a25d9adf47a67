//! The HA soak (issue #35): the whole loop on a control plane of its own, at 1× speed,
//! while its parts fail. `gpu-reaper replay` serves DCGM series for 150 Deployments of one
//! GPU each (a third idle, a third busy, a third in 3-minute busy / 5-minute idle waves);
//! Prometheus 3 scrapes it every 15 s; two controller replicas share the Lease; a user
//! wakes reclaimed workloads as they go. Meanwhile the soak, on a schedule:
//!
//! - rolls the controller (a new replica, then SIGTERM to the leader) — twice;
//! - kills the leader (SIGKILL) and starts a replacement;
//! - stops the SMTP server for a minute;
//! - restarts kube-apiserver and etcd (each down 5 s);
//! - stops Prometheus for 45 s (its data kept);
//!
//! and a GpuPolicy written under a newer CRD (an `action.type` this binary does not know)
//! sits beside the real one the whole time. Afterwards, on the cluster's own record:
//! no scale-down without a warning Event before it (a leader killed before writing one
//! leaves it to the next), no warning written twice (an Event's series, or two different
//! emails for one deadline: one resent after a kill carries the same Message-ID), every reclaimed Deployment holds its restore
//! record, every wake request was carried out, no busy workload was touched, the GPU quota
//! never moved from what the policy allows, and each SIGTERM handover took less than half
//! the Lease's duration (the Lease is released). The run's figures are printed (and
//! recorded in docs/reliability.md).
//!
//! `GPU_REAPER_SOAK_MINUTES` (default 10) sets how long the faults go on; the schedule
//! repeats every 6 minutes after the first 2.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../common/mod.rs"]
mod common;

use common::cluster::{Cluster, OwnCluster};
use common::scenario::BIN;
use common::{free_port, http_ok};

const NS: &str = "soak";
const PER_GROUP: usize = 50;
/// The controllers' Lease: a SIGTERM handover must take well under this.
const LEASE_SECONDS: u64 = 90;

fn name(group: &str, i: usize) -> String {
    format!("{group}-{i:02}")
}

fn deployments() -> String {
    let mut items = Vec::new();
    // "steady", not "busy": the test SMTP server answers 450 to recipients named busy…@.
    for group in ["idle", "steady", "wave"] {
        for i in 0..PER_GROUP {
            let n = name(group, i);
            items.push(serde_json::json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": n, "namespace": NS, "labels": {"app": n, "group": group},
                             "annotations": {"gpureaper.io/owner": format!("{n}@example.com")}},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": n}},
                         "template": {"metadata": {"labels": {"app": n, "group": group}},
                                      "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.0",
                                               "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
            }));
        }
    }
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

const POLICY: &str = "apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata: {name: soak, labels: {gpureaper.io/test: soak}}
spec:
  mode: Enforce
  match: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: soak}}}
  idle: {window: 1m, startupGrace: 0s, minCoverage: 0.5}
  warn: {after: 1m, channels: [Event, Email]}
  action: {type: ScaleToZero, after: 2m, maxPerHour: 1000}
  admission: {mode: Enforce, largeClaimGpus: 8, unattestedGpus: 200}
";

/// Written while the newer CRD is installed; matches no namespace, so it takes no
/// workload — it only has to be unreadable.
const NEWER_POLICY: &str = "apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata: {name: soak-newer, labels: {gpureaper.io/test: soak}}
spec:
  match: {namespaceSelector: {matchLabels: {team: nobody}}}
  action: {type: Hibernate, after: 60m}
";

/// A process the soak starts, stops and restarts; killed when dropped.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

struct Soak {
    own: OwnCluster,
    dir: tempfile::TempDir,
    prometheus_port: u16,
    smtp_port: u16,
    replay_target: String,
}

impl Soak {
    fn cluster(&self) -> &Cluster {
        &self.own.cluster
    }

    fn log_of(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Prometheus 3 scraping the replay every 15 s, on the same port and data each time.
    fn prometheus(&self) -> Proc {
        let dir = self.dir.path().join("prometheus");
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 15s\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n      - targets: ['{}']\n",
                self.replay_target
            ),
        )
        .unwrap();
        let log = self.dir.path().join("prometheus.log");
        let child = Command::new(self.cluster().bin("prometheus3"))
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!(
                "--web.listen-address=127.0.0.1:{}",
                self.prometheus_port
            ))
            .stdout(Stdio::null())
            .stderr(append(&log))
            .spawn()
            .unwrap();
        let p = Proc { child, log };
        wait_for("Prometheus 3 ready", Duration::from_secs(120), || {
            http_ok(self.prometheus_port, "/-/ready")
        });
        p
    }

    /// The SMTP server (aiosmtpd), writing each message to DIR/mail.
    fn smtp(&self) -> Proc {
        let log = self.dir.path().join("smtp.log");
        let mut child = Command::new("python3")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/smtp/server.py"))
            .args(["--port", &self.smtp_port.to_string(), "--mode", "plain"])
            .arg("--out")
            .arg(self.dir.path().join("mail"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(append(&log))
            .spawn()
            .expect("python3 with aiosmtpd (scripts/test installs it)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("ready"), "{line}");
        Proc { child, log }
    }

    /// A controller replica: 20 s cycles, the soak's Lease.
    fn controller(&self, identity: &str) -> (Proc, u16) {
        let port = free_port();
        let log = self.dir.path().join(format!("controller-{identity}.log"));
        let child = Command::new(BIN)
            .arg("controller")
            .args([
                "--prometheus-url",
                &format!("http://127.0.0.1:{}", self.prometheus_port),
            ])
            .args(["--scrape-interval", "15s", "--interval", "20s"])
            .args(["--policy-selector", "gpureaper.io/test=soak"])
            .args(["--lease-namespace", NS, "--identity", identity])
            .args(["--lease-duration", &format!("{LEASE_SECONDS}s")])
            .args([
                "--smtp-host",
                "127.0.0.1",
                "--smtp-port",
                &self.smtp_port.to_string(),
            ])
            .args([
                "--smtp-security",
                "none",
                "--smtp-from",
                "gpu-reaper <gpu-reaper@example.com>",
            ])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("KUBECONFIG", &self.cluster().kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(append(&log))
            .spawn()
            .unwrap();
        (Proc { child, log }, port)
    }

    fn holder(&self) -> Option<String> {
        let run = self.cluster().try_kubectl(
            &[
                "get",
                "lease",
                "gpu-reaper-controller",
                "-n",
                NS,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
            None,
        );
        (run.ok && !run.stdout.trim().is_empty()).then(|| run.stdout.trim().to_string())
    }

    fn deployments(&self) -> Vec<Value> {
        let run = self
            .cluster()
            .try_kubectl(&["get", "deployments", "-n", NS, "-o", "json"], None);
        if !run.ok {
            return Vec::new();
        }
        serde_json::from_str::<Value>(&run.stdout)
            .ok()
            .and_then(|v| v["items"].as_array().cloned())
            .unwrap_or_default()
    }

    fn quota(&self) -> Option<Value> {
        let run = self.cluster().try_kubectl(
            &[
                "get",
                "resourcequota",
                "gpu-reaper-gpus",
                "-n",
                NS,
                "-o",
                "jsonpath={.spec.hard}",
            ],
            None,
        );
        (run.ok && !run.stdout.trim().is_empty())
            .then(|| serde_json::from_str(run.stdout.trim()).ok())
            .flatten()
    }
}

fn append(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

fn annotation<'a>(d: &'a Value, key: &str) -> Option<&'a str> {
    d["metadata"]["annotations"][key].as_str()
}

/// Replicas and controllers by identity; the one in the Lease is the leader.
struct Replicas {
    running: BTreeMap<String, (Proc, u16)>,
    next: usize,
}

impl Replicas {
    fn start(&mut self, soak: &Soak) -> String {
        self.next += 1;
        let identity = format!("c{}", self.next);
        let replica = soak.controller(&identity);
        self.running.insert(identity.clone(), replica);
        identity
    }

    fn wait_ready(&self, identity: &str) {
        let port = self.running[identity].1;
        wait_for(
            &format!("controller {identity} ready"),
            Duration::from_secs(180),
            || http_ok(port, "/readyz"),
        );
    }
}

#[derive(Default, Debug)]
struct Figures {
    faults: BTreeMap<&'static str, u32>,
    /// Seconds from SIGTERM to the next holder's acquisition, per rolling update.
    handovers: Vec<f64>,
    wakes_requested: BTreeSet<String>,
    wake_requests: u32,
    quota_samples: u32,
}

#[test]
fn soak_two_controllers_through_rollouts_restarts_and_outages_lose_and_double_nothing() {
    let minutes: u64 = std::env::var("GPU_REAPER_SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(10)
        .max(10);
    let started = Instant::now();
    // 150 one-GPU Deployments, and room for them after wakes: 20 nodes of 8.
    let own = OwnCluster::up("soak", 20);
    // Kept when the soak fails (its logs, mails and the cluster's logs are the evidence);
    // removed when it passes.
    let dir = tempfile::Builder::new()
        .prefix("gpu-reaper-soak-run-")
        .tempdir()
        .unwrap();
    std::fs::create_dir(dir.path().join("mail")).unwrap();
    let cluster = &own.cluster;
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/gpu-reaper.yaml");
    cluster.kubectl(&["apply", "--server-side", "-f", crds], None);
    cluster.wait_established(&[
        "gpupolicies.gpureaper.io",
        "readinessattestations.gpureaper.io",
    ]);

    // The policy this binary cannot read: written under a newer CRD, which is then put back.
    cluster.kubectl(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&common::scenario::newer_policy_crd()),
    );
    wait_for(
        "the newer CRD to admit Hibernate",
        Duration::from_secs(120),
        || {
            cluster
                .try_kubectl(&["apply", "-f", "-"], Some(NEWER_POLICY))
                .ok
        },
    );
    cluster.kubectl(
        &["apply", "--server-side", "--force-conflicts", "-f", crds],
        None,
    );
    wait_for(
        "the committed CRD served again",
        Duration::from_secs(120),
        || cluster.try_kubectl(&["get", "gpupolicies"], None).ok,
    );

    cluster.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"
    ));
    wait_for(
        "the default service account",
        Duration::from_secs(120),
        || {
            cluster
                .try_kubectl(&["get", "serviceaccount", "default", "-n", NS], None)
                .ok
        },
    );
    cluster.kubectl(&["apply", "-f", "-"], Some(&deployments()));
    wait_for("150 running pods", Duration::from_secs(600), || {
        cluster
            .list("pods", NS, None)
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count()
            == 3 * PER_GROUP
    });

    let replay = common::live::replay(
        cluster,
        &[
            "--pattern",
            &format!("{NS}/idle-*=idle"),
            "--pattern",
            &format!("{NS}/steady-*=busy"),
            "--pattern",
            &format!("{NS}/wave-*=busy:3m,idle:5m"),
        ],
        &dir.path().join("replay.log"),
    );
    let soak = Soak {
        own,
        dir,
        prometheus_port: free_port(),
        smtp_port: free_port(),
        replay_target: replay.target(),
    };
    // Declared after `soak`, so dropped (and copying) before it is.
    let kept = KeepOnPanic(soak.dir.path().to_path_buf(), soak.own.cluster.dir.clone());
    let cluster = soak.cluster();
    let mut prometheus = Some(soak.prometheus());
    let mut smtp = Some(soak.smtp());
    cluster.apply(POLICY);
    let mut replicas = Replicas {
        running: BTreeMap::new(),
        next: 0,
    };
    let first = replicas.start(&soak);
    let second = replicas.start(&soak);
    replicas.wait_ready(&first);
    replicas.wait_ready(&second);
    wait_for("a leader", Duration::from_secs(120), || {
        soak.holder().is_some()
    });

    let mut figures = Figures::default();
    let mut quotas: BTreeSet<String> = BTreeSet::new();
    let soak_start = Instant::now();
    let end = Duration::from_secs(minutes * 60);
    // (seconds into the 6-minute round, fault); the first round starts after 2 minutes.
    let schedule: [(u64, &str); 7] = [
        (0, "rolling update"),
        (50, "SMTP down 60 s"),
        (110, "kube-apiserver restart"),
        (160, "leader SIGKILL"),
        (220, "Prometheus down 45 s"),
        (290, "etcd restart"),
        (330, "rolling update"),
    ];
    let mut done_in_round: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut last_wake_round = Instant::now();
    while soak_start.elapsed() < end {
        let t = soak_start.elapsed().as_secs();
        if t >= 120 {
            let round = (t - 120) / 360;
            let into = (t - 120) % 360;
            for (at, fault) in schedule {
                if into >= at && done_in_round.insert((round, at)) && t + 60 < end.as_secs() {
                    *figures.faults.entry(fault).or_default() += 1;
                    match fault {
                        "rolling update" => {
                            let new = replicas.start(&soak);
                            replicas.wait_ready(&new);
                            let Some(leader) = soak.holder() else {
                                continue;
                            };
                            let Some((mut proc, _)) = replicas.running.remove(&leader) else {
                                continue;
                            };
                            let termed = Instant::now();
                            Command::new("kill")
                                .args(["-TERM", &proc.child.id().to_string()])
                                .status()
                                .unwrap();
                            wait_for(
                                "the leader to exit after SIGTERM",
                                Duration::from_secs(60),
                                || proc.child.try_wait().unwrap().is_some(),
                            );
                            let log = std::fs::read_to_string(&proc.log).unwrap_or_default();
                            assert!(
                                log.contains("Lease released"),
                                "the leader {leader} did not release the Lease:\n{log}"
                            );
                            wait_for(
                                "another replica to lead",
                                Duration::from_secs(3 * LEASE_SECONDS),
                                || soak.holder().is_some_and(|h| h != leader),
                            );
                            figures.handovers.push(termed.elapsed().as_secs_f64());
                        }
                        "SMTP down 60 s" => {
                            drop(smtp.take());
                            std::thread::sleep(Duration::from_secs(60));
                            smtp = Some(soak.smtp());
                        }
                        "kube-apiserver restart" => soak.own.restart("apiserver", 5),
                        "etcd restart" => soak.own.restart("etcd", 5),
                        "leader SIGKILL" => {
                            if let Some(leader) = soak.holder()
                                && let Some((mut proc, _)) = replicas.running.remove(&leader)
                            {
                                let _ = proc.child.kill();
                                let _ = proc.child.wait();
                                let new = replicas.start(&soak);
                                replicas.wait_ready(&new);
                            }
                        }
                        "Prometheus down 45 s" => {
                            drop(prometheus.take());
                            std::thread::sleep(Duration::from_secs(45));
                            prometheus = Some(soak.prometheus());
                        }
                        _ => unreachable!(),
                    }
                }
            }
        }
        // A user wakes what was reclaimed, once a minute (the wave ones relapse: warned and
        // reclaimed again).
        if last_wake_round.elapsed() >= Duration::from_secs(60) {
            last_wake_round = Instant::now();
            for d in soak.deployments() {
                let n = d["metadata"]["name"].as_str().unwrap_or("").to_string();
                let reclaimed =
                    d["spec"]["replicas"] == 0 && annotation(&d, "gpureaper.io/wake").is_none();
                if reclaimed && (n.starts_with("idle-") || n.starts_with("wave-")) {
                    let run = cluster.try_kubectl(
                        &[
                            "annotate",
                            "deployment",
                            &n,
                            "-n",
                            NS,
                            "gpureaper.io/wake=true",
                            "--overwrite",
                        ],
                        None,
                    );
                    if run.ok {
                        figures.wake_requests += 1;
                        figures.wakes_requested.insert(n);
                    }
                }
            }
        }
        if let Some(q) = soak.quota() {
            figures.quota_samples += 1;
            quotas.insert(q.to_string());
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    drop(prometheus.take());
    let _prometheus = soak.prometheus();
    let _smtp = smtp.take().unwrap_or_else(|| soak.smtp());
    // The faults are over: every wake request is carried out (a leader is there to do it).
    wait_for(
        "every wake request carried out",
        Duration::from_secs(300),
        || {
            let all = soak.deployments();
            !all.is_empty()
                && all
                    .iter()
                    .all(|d| annotation(d, "gpureaper.io/wake").is_none())
        },
    );
    // Every warning Event the controllers owe is written: a warning whose Event failed
    // (an API server restart between its record and its Event) is written again after
    // its backoff (a minute), and the record says so until then.
    wait_for(
        "every warning's Event written",
        Duration::from_secs(300),
        || {
            soak.deployments().iter().all(|d| {
                annotation(d, "gpureaper.io/notified")
                    .and_then(|r| serde_json::from_str::<Value>(r).ok())
                    .is_none_or(|r| r["event"].is_null() || r["event"]["state"] == "sent")
            })
        },
    );
    let record = Record::read(&soak);
    let report = format!(
        "soak: {minutes} min of faults, {:.0} s in all; faults {:?}; SIGTERM handovers {:?} s (Lease {LEASE_SECONDS} s); \
         {} wake requests on {} Deployments; quota sampled {} times: {:?}; \
         {} warnings, {} scale-downs, {} emails, {} wakes done",
        started.elapsed().as_secs_f64(),
        figures.faults,
        figures.handovers,
        figures.wake_requests,
        figures.wakes_requested.len(),
        figures.quota_samples,
        quotas,
        record.warnings.values().map(BTreeSet::len).sum::<usize>(),
        record.scale_downs.values().sum::<u64>(),
        record.mails.len(),
        record.woken,
    );
    println!("{report}");
    let logs = || {
        replicas
            .running
            .keys()
            .map(|id| format!("--- {id}:\n{}", soak.log_of(&format!("controller-{id}"))))
            .collect::<String>()
    };

    // The soak did its work: the idle ones were reclaimed, wakes done, faults injected.
    assert!(
        record
            .scale_downs
            .keys()
            .filter(|n| n.starts_with("idle-"))
            .count()
            >= PER_GROUP * 9 / 10,
        "{report}\n{}",
        logs()
    );
    assert!(figures.faults.values().sum::<u32>() >= 7, "{report}");
    assert!(record.woken >= 1 && figures.wake_requests >= 1, "{report}");
    // Each SIGTERM handover within half the Lease: the leader released it.
    assert!(
        !figures.handovers.is_empty()
            && figures
                .handovers
                .iter()
                .all(|s| *s < LEASE_SECONDS as f64 / 2.0),
        "{report}"
    );
    // No action without its warning Event (`kubectl describe` shows every warning, even
    // one whose leader was killed before writing it: the next leader writes it); no
    // warning twice.
    for (n, downs) in &record.scale_downs {
        let warned = record.warnings.get(n).map_or(0, BTreeSet::len) as u64;
        assert!(
            *downs <= warned,
            "{n}: scaled down {downs} times after {warned} warning Events\n{report}\n{}",
            logs()
        );
    }
    assert!(
        record.repeated.is_empty(),
        "warnings written more than once: {:?}",
        record.repeated
    );
    // One warning is one message. A leader SIGKILLed between sending an email and
    // recording it leaves the record `sending`, and the next leader sends it again: the
    // same Message-ID, which mail clients fold into one (at least once, never two
    // different messages for one deadline).
    let mut mailed: BTreeMap<(&String, &String), &String> = BTreeMap::new();
    for (to, deadline, id) in &record.mails {
        let first = *mailed.entry((to, deadline)).or_insert(id);
        assert!(
            !id.is_empty() && first == id,
            "two different emails to {to} for the deadline {deadline}: {first} and {id}"
        );
    }
    let resent = record.mails.len() - mailed.len();
    // Every email's warning has its Event, SIGKILLs or not: a leader killed between
    // recording a warning and writing its Event leaves the Event `sending` in the
    // record, and the next leader writes it (docs/reliability.md).
    let events_lost: Vec<String> = record
        .mails
        .iter()
        .filter(|(to, deadline, _)| {
            let n = to.trim_end_matches("@example.com");
            !record.warnings.get(n).is_some_and(|w| w.contains(deadline))
        })
        .map(|(to, deadline, _)| format!("{to} {deadline}"))
        .collect();
    println!(
        "warning Events lost: {} {events_lost:?}; emails sent again with their Message-ID after a kill: {resent}",
        events_lost.len()
    );
    assert!(
        events_lost.is_empty(),
        "emails whose warning Event is missing: {events_lost:?}\n{report}\n{}",
        logs()
    );
    // Busy workloads untouched.
    let warned_busy: Vec<&String> = record
        .warnings
        .keys()
        .filter(|n| n.starts_with("steady-"))
        .collect();
    assert!(
        warned_busy.is_empty(),
        "busy workloads warned: {warned_busy:?}"
    );
    // Every reclaimed Deployment can be restored; every busy one runs.
    for d in soak.deployments() {
        let n = d["metadata"]["name"].as_str().unwrap();
        if d["spec"]["replicas"] == 0 {
            let restore: Value = annotation(&d, "gpureaper.io/restore")
                .and_then(|r| serde_json::from_str(r).ok())
                .unwrap_or(Value::Null);
            assert!(
                restore["replicas"] == 1 && restore["state"] == "done",
                "{n} at 0 replicas without a whole restore record: {}",
                d["metadata"]["annotations"]
            );
        }
        if n.starts_with("steady-") {
            assert_eq!(d["spec"]["replicas"], 1, "{n}");
        }
    }
    // The quota never moved from the policy's unattested allowance.
    assert_eq!(quotas.len(), 1, "the quota changed: {quotas:?}");
    assert!(quotas.iter().all(|q| q.contains("200")), "{quotas:?}");
    // The unreadable policy was set aside with an Event naming the field.
    assert!(
        record
            .unreadable
            .iter()
            .any(|note| note.contains("action.type")),
        "no Unreadable Event on soak-newer: {:?}",
        record.unreadable
    );
    drop(replay);
    drop(kept);
}

/// Says where the evidence is when the soak fails, and keeps it: the run's directory
/// (controller, Prometheus, SMTP logs; mails) is not removed, and the cluster's logs are
/// copied beside it.
struct KeepOnPanic(PathBuf, PathBuf);

impl Drop for KeepOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let kept =
                std::env::temp_dir().join(format!("gpu-reaper-soak-failed-{}", std::process::id()));
            let _ = Command::new("cp")
                .arg("-a")
                .arg(&self.0)
                .arg(&kept)
                .status();
            let _ = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "cp {}/*.log {}/ 2>/dev/null",
                    self.1.display(),
                    kept.display()
                ))
                .status();
            eprintln!("the soak's logs and mails are kept in {}", kept.display());
        }
    }
}

/// What the cluster and the SMTP server recorded.
struct Record {
    /// Deployment → the deadlines its IdleGpus Events name.
    warnings: BTreeMap<String, BTreeSet<String>>,
    /// gpu-reaper Events whose series shows they were written more than once.
    repeated: Vec<String>,
    /// Deployment → how many times its ReplicaSets were scaled down to 0.
    scale_downs: BTreeMap<String, u64>,
    /// (recipient, deadline named, Message-ID) per email.
    mails: Vec<(String, String, String)>,
    /// Woken Events.
    woken: usize,
    /// Notes of Unreadable Events.
    unreadable: Vec<String>,
}

impl Record {
    fn read(soak: &Soak) -> Record {
        let cluster = soak.cluster();
        let events = |ns: Option<&str>| -> Vec<Value> {
            let mut args = vec!["get", "events.events.k8s.io", "-o", "json"];
            match ns {
                Some(ns) => args.extend(["-n", ns]),
                None => args.push("-A"),
            }
            serde_json::from_str::<Value>(&cluster.kubectl(&args, None)).unwrap()["items"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        };
        let deadline_in = |note: &str| -> Option<String> {
            Some(
                note.split(" from ")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .to_string(),
            )
        };
        let mut r = Record {
            warnings: BTreeMap::new(),
            repeated: Vec::new(),
            scale_downs: BTreeMap::new(),
            mails: Vec::new(),
            woken: 0,
            unreadable: Vec::new(),
        };
        // The mail first, then the Events: the controllers are still running, and a
        // warning's Event is written before its email, so every email read here has its
        // Event in the list read after it (read the other way round, warnings given
        // between the two reads looked like lost Events).
        let mut files: Vec<PathBuf> = std::fs::read_dir(soak.dir.path().join("mail"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f)
                .unwrap()
                .replace("\r\n ", " ")
                .replace("\n ", " ");
            let to = text
                .lines()
                .find_map(|l| l.strip_prefix("X-Test-Envelope-To: "))
                .unwrap_or("")
                .to_string();
            // A warning's subject names its deadline ("Idle GPUs: … will be reclaimed at
            // <time>"), the same field as the Event's "from <time>"; action notices none.
            let deadline = text.lines().find_map(|l| {
                let subject = l.strip_prefix("Subject: Idle GPUs:")?;
                Some(subject.split(" reclaimed at ").nth(1)?.trim().to_string())
            });
            let id = text
                .lines()
                .find_map(|l| l.strip_prefix("Message-ID: "))
                .unwrap_or("")
                .to_string();
            if let Some(d) = deadline {
                r.mails.push((to, d, id));
            }
        }
        for e in events(None) {
            let reason = e["reason"].as_str().unwrap_or("");
            let note = e["note"].as_str().unwrap_or("").to_string();
            let regarding = e["regarding"]["name"].as_str().unwrap_or("").to_string();
            let ours = e["reportingController"]
                .as_str()
                .unwrap_or("")
                .contains("gpu-reaper");
            let count = e["series"]["count"]
                .as_u64()
                .unwrap_or(1)
                .max(e["deprecatedCount"].as_u64().unwrap_or(1));
            if ours && reason == "IdleGpus" {
                if count > 1 {
                    r.repeated.push(format!("{regarding} ×{count}: {note}"));
                }
                if let Some(d) = deadline_in(&note) {
                    r.warnings.entry(regarding.clone()).or_default().insert(d);
                }
            }
            if ours && reason == "Woken" {
                r.woken += 1;
            }
            if ours && reason == "Unreadable" && regarding == "soak-newer" {
                r.unreadable.push(note.clone());
            }
            // The Deployment controller's own record of each scale-down to zero.
            if reason == "ScalingReplicaSet"
                && note.starts_with("Scaled down")
                && note.ends_with("to 0")
            {
                let count = e["deprecatedCount"]
                    .as_u64()
                    .unwrap_or(1)
                    .max(e["series"]["count"].as_u64().unwrap_or(1));
                *r.scale_downs.entry(regarding).or_default() += count;
            }
        }
        r
    }
}
