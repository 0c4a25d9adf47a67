//! Warnings end to end: kube-sim for the API server, the real Prometheus with DCGM-shaped
//! history, a real SMTP server (aiosmtpd, tests/smtp/server.py), and the gpu-reaper binary
//! run as the controller at chosen instants. The owner gets exactly one warning per idle
//! period across restarts, an SMTP outage is recorded, counted and retried, and a signed
//! "Keep 4h" click on the controller's /slack/interactivity delays the action.

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Prometheus, free_port, http_ok, prometheus_with};
use jiff::{SignedDuration, Timestamp};
use kube_sim::KubeSim;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-reaper");
const CRDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/gpu-reaper.yaml");
const SMTP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/smtp/server.py");
const SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

fn t0() -> i64 {
    static T0: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *T0.get_or_init(|| Timestamp::now().as_second() / 60 * 60 + 600)
}

fn at(minutes: i64) -> String {
    Timestamp::from_second(t0() + minutes * 60)
        .unwrap()
        .to_string()
}

/// Five and a half hours of an idle GPU for `ml/chat-1-a`, one sample a minute.
fn history() -> Vec<u8> {
    let mut s = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
    for m in 0..=340 {
        let _ = writeln!(
            s,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"0\",UUID=\"GPU-chat\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"n1\",namespace=\"ml\",pod=\"chat-1-a\",container=\"main\"}} 0 {}",
            t0() + m * 60
        );
    }
    s.push_str("# EOF\n");
    s.into_bytes()
}

const POLICY: &str = r#"
apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata: {name: inference}
spec:
  mode: Enforce
  idle: {window: 30m, startupGrace: 20m, minCoverage: 0.8}
  warn: {after: 30m, channels: [Event, Email]}
  action: {type: ScaleToZero, after: 60m}
  exemptions: {maxSnooze: 6h}
  cost: {byModel: {"NVIDIA H100 80GB HBM3": 4.0}}
"#;

struct Setup {
    sim: KubeSim,
    prometheus: Prometheus,
    dir: tempfile::TempDir,
    smtp_port: u16,
}

async fn setup(name: &str) -> Setup {
    let prometheus = prometheus_with(name, &history());
    let sim = KubeSim::start().await.unwrap();
    for ns in ["ml", "gpu-reaper"] {
        sim.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .unwrap();
    }
    let gpu = json!({"limits": {"nvidia.com/gpu": "1"}});
    sim.seed(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "ml", "annotations": {"gpureaper.io/owner": "ana@example.com"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "chat"}},
                 "template": {"metadata": {"labels": {"app": "chat"}}, "spec": {"containers": [{"name": "main", "image": "x", "resources": gpu}]}}}}))
    .unwrap();
    sim.seed(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "chat-1", "namespace": "ml",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat", "uid": "u-d", "controller": true}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "chat"}},
                 "template": {"metadata": {"labels": {"app": "chat"}}, "spec": {"containers": [{"name": "main", "image": "x"}]}}}}))
    .unwrap();
    sim.seed(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "chat-1-a", "namespace": "ml", "labels": {"app": "chat"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "chat-1", "uid": "u-rs", "controller": true}]},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": gpu}]},
        "status": {"phase": "Running"}}))
    .unwrap();
    for input in [std::fs::read_to_string(CRDS).unwrap(), POLICY.to_string()] {
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(sim.kubeconfig_path())
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = out;
        {
            use tokio::io::AsyncWriteExt;
            out.stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .await
                .unwrap();
        }
        let done = out.wait_with_output().await.unwrap();
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("signing-secret"), SIGNING_SECRET).unwrap();
    std::fs::write(dir.path().join("token"), "xoxb-test").unwrap();
    std::fs::create_dir(dir.path().join("mail")).unwrap();
    Setup {
        sim,
        prometheus,
        dir,
        smtp_port: free_port(),
    }
}

fn controller_args(s: &Setup) -> Vec<String> {
    let file = |name: &str| s.dir.path().join(name).to_string_lossy().into_owned();
    [
        "controller",
        "--prometheus-url",
        &s.prometheus.url,
        "--scrape-interval",
        "1m",
        "--smtp-host",
        "127.0.0.1",
        "--smtp-port",
        &s.smtp_port.to_string(),
        "--smtp-security",
        "none",
        "--smtp-from",
        "gpu-reaper <gpu-reaper@example.com>",
        "--slack-token-file",
        &file("token"),
        "--slack-api-url",
        "http://127.0.0.1:9/api",
        "--slack-signing-secret-file",
        &file("signing-secret"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

async fn once(s: &Setup, minutes: i64) {
    let out = tokio::process::Command::new(BIN)
        .args(controller_args(s))
        .args(["--once", "--now", &at(minutes), "--identity", "a"])
        .env("KUBECONFIG", s.sim.kubeconfig_path())
        .output()
        .await
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "controller at +{minutes}m: {log}");
    eprintln!("controller at +{minutes}m:\n{log}");
}

/// The controller running (metrics and /slack/interactivity served), first cycle at
/// `minutes`; killed when dropped.
async fn running(s: &Setup, minutes: i64) -> (tokio::process::Child, u16) {
    let port = free_port();
    let child = tokio::process::Command::new(BIN)
        .args(controller_args(s))
        .args(["--interval", "1h", "--now", &at(minutes), "--identity", "a"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", s.sim.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http_ok(port, "/readyz") {
        assert!(Instant::now() < deadline, "controller never ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (child, port)
}

async fn smtp_server(s: &Setup) -> tokio::process::Child {
    let mut child = tokio::process::Command::new("python3")
        .arg(SMTP)
        .args(["--port", &s.smtp_port.to_string(), "--mode", "plain"])
        .arg("--out")
        .arg(s.dir.path().join("mail"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 with aiosmtpd (.ci/run installs it)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .await
        .unwrap();
    assert!(line.starts_with("ready"), "{line}");
    child
}

fn mails(s: &Setup) -> Vec<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(s.dir.path().join("mail"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}

fn deployment(s: &Setup) -> Value {
    s.sim.get("apps", "deployments", "ml", "chat").unwrap()
}

fn delivery(s: &Setup) -> Value {
    deployment(s)["metadata"]["annotations"]["gpureaper.io/notified"]
        .as_str()
        .map(|t| serde_json::from_str(t).unwrap())
        .unwrap_or(Value::Null)
}

fn metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}

fn signed_click(path: &Path, action: &str) -> (String, String, String) {
    let _ = path;
    let value = json!({"w": "ml/Deployment/chat", "v": "apps/v1", "p": "inference"}).to_string();
    let payload = json!({
        "type": "block_actions",
        "user": {"id": "U0ANA0001", "username": "ana"},
        "team": {"id": "T0TEAM"},
        "container": {"type": "message", "message_ts": "1.2", "channel_id": "D0DM"},
        "message": {"type": "message", "text": "Idle GPUs", "ts": "1.2", "blocks": []},
        "response_url": "https://127.0.0.1:9/actions/T0TEAM/1/x",
        "actions": [{"type": "button", "action_id": action, "block_id": "gpu_reaper_decision", "value": value, "action_ts": "1.3"}],
    });
    let body = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish();
    let timestamp = Timestamp::now().as_second().to_string();
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SIGNING_SECRET.as_bytes());
    let tag = ring::hmac::sign(&key, format!("v0:{timestamp}:{body}").as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    (body, timestamp, format!("v0={hex}"))
}

fn post_click(port: u16, body: &str, timestamp: &str, signature: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let request = format!(
        "POST /slack/interactivity HTTP/1.0\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nX-Slack-Request-Timestamp: {timestamp}\r\nX-Slack-Signature: {signature}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_warning_per_idle_period_an_outage_retried_and_keep_4h_delays_the_action() {
    let s = setup("notify-once").await;

    // 1. SMTP is down when the warning is due: the Event is recorded, the failure is
    //    counted, kept on the workload and in the policy's status.
    let (controller, port) = running(&s, 60).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while delivery(&s)["email"]["state"] != "failed" {
        assert!(
            Instant::now() < deadline,
            "no failed delivery recorded: {}",
            delivery(&s)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The status is written at the end of the evaluation.
    let condition = loop {
        let policy = s
            .sim
            .get("gpureaper.io", "gpupolicies", "", "inference")
            .unwrap();
        let found = policy["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "NotificationsDelivered")
            .cloned();
        if let Some(c) = found {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "no NotificationsDelivered condition: {policy}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(condition["status"], "False", "{condition}");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("email to ml/Deployment/chat"),
        "{condition}"
    );
    let m = metrics(port);
    assert!(
        m.contains("gpu_reaper_notifications_total{channel=\"email\",result=\"failed\"} 1"),
        "{m}"
    );
    drop(controller);
    let events: Vec<Value> = s
        .sim
        .list("events.k8s.io", "events", Some("ml"))
        .into_iter()
        .chain(s.sim.list("", "events", Some("ml")))
        .collect();
    assert!(
        events.iter().any(|e| e.to_string().contains("IdleGpus")),
        "the Event is recorded whatever SMTP does: {events:?}"
    );
    assert!(mails(&s).is_empty());

    // 2. SMTP is back: the next evaluation (a new process) retries after the backoff.
    let _smtp = smtp_server(&s).await;
    once(&s, 63).await;
    let received = mails(&s);
    assert_eq!(received.len(), 1, "one warning");
    let mail = &received[0];
    assert!(mail.contains("ana@example.com"), "{mail}");
    assert!(
        mail.contains("Subject: Idle GPUs: ml/Deployment/chat will be reclaimed at"),
        "{mail}"
    );
    assert!(
        mail.contains("gpureaper.io/snooze-until="),
        "the kubectl snooze command: {mail}"
    );
    assert_eq!(delivery(&s)["email"]["state"], "sent");

    // 3. Restarts do not repeat it.
    once(&s, 70).await;
    once(&s, 75).await;
    assert_eq!(mails(&s).len(), 1, "exactly one warning per idle period");

    // 4. "Keep 4h", signed as Slack signs it, on the running controller's listener.
    let (controller, port) = running(&s, 76).await;
    let (body, timestamp, signature) = signed_click(s.dir.path(), "keep_4h");
    let forged = post_click(port, &body, &timestamp, "v0=00");
    assert!(
        forged.starts_with("HTTP/1.1 401") || forged.starts_with("HTTP/1.0 401"),
        "{forged}"
    );
    assert!(deployment(&s)["metadata"]["annotations"]["gpureaper.io/snooze-until"].is_null());
    let answer = post_click(port, &body, &timestamp, &signature);
    assert!(
        answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"),
        "{answer}"
    );
    drop(controller);
    let until: Timestamp = deployment(&s)["metadata"]["annotations"]["gpureaper.io/snooze-until"]
        .as_str()
        .expect("snoozed")
        .parse()
        .unwrap();
    let expected = Timestamp::now() + SignedDuration::from_hours(4);
    assert!(
        until.duration_since(expected).abs() < SignedDuration::from_mins(2),
        "{until}"
    );

    // 5. The action was due at about +83m (idle since +23m); snoozed, nothing happens...
    once(&s, 120).await;
    assert_eq!(deployment(&s)["spec"]["replicas"], 1, "kept for 4h");
    // ... until the snooze ends (4 h from the click, about +230m): the ladder starts
    // again — a new warning for the new idle period, then the action.
    once(&s, 260).await;
    assert_eq!(deployment(&s)["spec"]["replicas"], 1, "warned again first");
    assert_eq!(mails(&s).len(), 2, "a second warning after the snooze");
    once(&s, 300).await;
    assert_eq!(
        deployment(&s)["spec"]["replicas"],
        0,
        "reclaimed after the snooze"
    );
    let received = mails(&s);
    assert!(
        received
            .iter()
            .any(|m| m.contains("Subject: Reclaimed idle GPUs: ml/Deployment/chat")),
        "{received:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_delivery_holds_the_action_until_a_warning_reached_the_owner() {
    let s = setup("notify-require").await;
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(s.sim.kubeconfig_path())
        .args([
            "patch",
            "gpupolicy",
            "inference",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"warn":{"requireDelivery":true}}}"#,
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SMTP down at the warning and when the action is due: nothing is reclaimed.
    once(&s, 60).await;
    assert_eq!(delivery(&s)["email"]["state"], "failed");
    once(&s, 120).await;
    assert_eq!(
        deployment(&s)["spec"]["replicas"],
        1,
        "held: no warning was delivered"
    );
    // SMTP back: the retry delivers the warning, and the next evaluation acts.
    let _smtp = smtp_server(&s).await;
    once(&s, 125).await;
    assert_eq!(delivery(&s)["email"]["state"], "sent");
    assert_eq!(mails(&s).len(), 1);
    once(&s, 127).await;
    assert_eq!(
        deployment(&s)["spec"]["replicas"],
        0,
        "acted once delivered"
    );
}
