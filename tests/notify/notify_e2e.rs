//! Warnings end to end on the real control plane (scripts/testenv), the real Prometheus
//! with DCGM-shaped history of the pod the cluster runs, a real SMTP server (aiosmtpd,
//! tests/smtp/server.py), and the gpu-reaper binary run as the controller at chosen
//! instants. The owner gets exactly one warning per idle period across restarts, an SMTP
//! outage is recorded, counted and retried, and a signed "Keep 4h" click on the
//! controller's /slack/interactivity delays the action.

use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::scenario::{BIN, H100, Scenario, Workload, deployment as deployment_manifest};
use common::{free_port, http_ok};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const SMTP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/smtp/server.py");
const SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

/// The rest of the policy's spec.
const POLICY: &str = r#"  mode: Enforce
  idle: {window: 30m, startupGrace: 20m, minCoverage: 0.8}
  warn: {after: 30m, channels: [Event, Email]}
  action: {type: ScaleToZero, after: 60m}
  exemptions: {maxSnooze: 6h}
  cost: {byModel: {"NVIDIA H100 80GB HBM3": 4.0}}
"#;

struct Setup {
    scenario: Scenario,
    dir: tempfile::TempDir,
    smtp_port: u16,
}

/// Deployment chat (1 GPU, owner ana@example.com), idle for five and a half hours.
async fn setup(name: &str) -> Setup {
    let scenario = Scenario::start(
        name,
        |ns| {
            vec![Workload {
                name: "chat",
                manifest: deployment_manifest(
                    ns,
                    "chat",
                    1,
                    json!({"gpureaper.io/owner": "ana@example.com"}),
                ),
                pods: ("app=chat".into(), 1),
            }]
        },
        |dcgm, ns, pods| {
            dcgm.gpu(ns, &pods["chat"][0], 0, H100, 0..=340, |_| Some(0.0));
        },
    );
    scenario.apply_policy(POLICY);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("signing-secret"), SIGNING_SECRET).unwrap();
    std::fs::write(dir.path().join("token"), "xoxb-test").unwrap();
    std::fs::create_dir(dir.path().join("mail")).unwrap();
    Setup {
        scenario,
        dir,
        smtp_port: free_port(),
    }
}

fn at(s: &Setup, minutes: i64) -> String {
    s.scenario.at(minutes)
}

fn controller_args(s: &Setup) -> Vec<String> {
    let file = |name: &str| s.dir.path().join(name).to_string_lossy().into_owned();
    let mut args = vec!["controller".to_string()];
    args.extend(s.scenario.controller_args("a", "15s"));
    args.extend(
        [
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
        .map(|s| s.to_string()),
    );
    args
}

async fn once(s: &Setup, minutes: i64) {
    let out = tokio::process::Command::new(BIN)
        .args(controller_args(s))
        .args(["--once", "--now", &at(s, minutes)])
        .env("KUBECONFIG", &s.scenario.cluster.kubeconfig)
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
        .args(["--interval", "1h", "--now", &at(s, minutes)])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", &s.scenario.cluster.kubeconfig)
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
    // Long headers are folded (RFC 5322): unfold them so a subject reads as one line.
    files
        .iter()
        .map(|p| {
            std::fs::read_to_string(p)
                .unwrap()
                .replace("\r\n ", " ")
                .replace("\n ", " ")
        })
        .collect()
}

fn deployment(s: &Setup) -> Value {
    s.scenario.deployment("chat")
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

fn signed_click(s: &Setup, action: &str) -> (String, String, String) {
    let ns = &s.scenario.ns;
    let value = json!({"w": format!("{ns}/Deployment/chat"), "v": "apps/v1", "p": ns}).to_string();
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
            .scenario
            .cluster
            .get("gpupolicy", None, &s.scenario.ns)
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
            .contains(&format!("email to {}/Deployment/chat", s.scenario.ns)),
        "{condition}"
    );
    let m = metrics(port);
    assert!(
        m.contains("gpu_reaper_notifications_total{channel=\"email\",result=\"failed\"} 1"),
        "{m}"
    );
    drop(controller);
    let events = s.scenario.events_for("chat");
    assert!(
        events.iter().any(|(reason, _)| reason == "IdleGpus"),
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
        mail.contains(&format!(
            "Subject: Idle GPUs: {}/Deployment/chat will be reclaimed at",
            s.scenario.ns
        )),
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
    let (body, timestamp, signature) = signed_click(&s, "keep_4h");
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
    // Both requests are counted on the controller's own /metrics.
    let m = metrics(port);
    for line in [
        "gpu_reaper_slack_interactions_total{outcome=\"kept_4h\"} 1",
        "gpu_reaper_slack_interactions_total{outcome=\"bad_signature\"} 1",
    ] {
        assert!(m.lines().any(|l| l == line), "{line} in\n{m}");
    }
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
        received.iter().any(|m| m.contains(&format!(
            "Subject: Reclaimed idle GPUs: {}/Deployment/chat",
            s.scenario.ns
        ))),
        "{received:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_delivery_holds_the_action_until_a_warning_reached_the_owner() {
    let s = setup("notify-require").await;
    s.scenario.cluster.kubectl(
        &[
            "patch",
            "gpupolicy",
            &s.scenario.ns,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"warn":{"requireDelivery":true}}}"#,
        ],
        None,
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

/// The warning's Events of `chat` (events.k8s.io: note and series), by the core list.
fn warning_events(s: &Setup) -> Vec<Value> {
    s.scenario
        .cluster
        .list("events", &s.scenario.ns, None)
        .into_iter()
        .filter(|e| {
            e["involvedObject"]["name"] == "chat"
                && e["reportingComponent"] == "gpu-reaper"
                && e["reason"] == "IdleGpus"
        })
        .collect()
}

/// Sets the warning's record as a leader killed right after recording it leaves it (the
/// Event and the email `sending`, the Event's note kept), from the record `record`.
fn record_as_left_by_a_killed_leader(s: &Setup, record: &Value) {
    let mut record = record.clone();
    let note = record["event"]["note"].clone();
    assert!(
        note.is_string(),
        "the record keeps the Event's note: {record}"
    );
    record["event"] = json!({"state": "sending", "note": note});
    if !record["email"].is_null() {
        record["email"] = json!({"state": "sending"});
    }
    set_record(s, &record);
}

/// Writes `record` as the Deployment's `gpureaper.io/notified`.
fn set_record(s: &Setup, record: &Value) {
    let patch = json!({"metadata": {"annotations": {"gpureaper.io/notified": record.to_string()}}});
    s.scenario.cluster.kubectl(
        &[
            "patch",
            "deployment",
            "chat",
            "-n",
            &s.scenario.ns,
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ],
        None,
    );
}

/// Invariant 14 across a leader's death (the HA soak found it): a leader killed between
/// recording a warning and writing its Event left the owner with no Event, and the next
/// leader sent the email at the action. The record now holds the Event as a channel with
/// its note: the next leader writes that very Event (once: a second retry finds it and
/// leaves it as it is), and the action waits a whole notice after the first delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warning_event_lost_with_its_leader_is_written_by_the_next_and_the_action_waits_a_notice()
{
    let s = setup("notify-lost-event").await;
    // The warning at +60 (SMTP down: the email fails; the Event is written).
    once(&s, 60).await;
    let record = delivery(&s);
    assert_eq!(record["event"]["state"], "sent", "{record}");
    let events = warning_events(&s);
    assert_eq!(events.len(), 1, "{events:?}");
    let note = events[0]["message"].as_str().unwrap().to_string();
    assert_eq!(
        record["event"]["note"],
        note.as_str(),
        "the record keeps what the Event says"
    );
    // The leader "died" right after the record: no Event, nothing sent.
    s.scenario.cluster.kubectl(
        &[
            "delete",
            "events",
            "-n",
            &s.scenario.ns,
            events[0]["metadata"]["name"].as_str().unwrap(),
        ],
        None,
    );
    record_as_left_by_a_killed_leader(&s, &record);
    assert!(warning_events(&s).is_empty());

    // The next leader, when the action is due (+95: the warning said +90): it writes the
    // Event the warning stated and sends the email, and does not act in the same breath.
    let _smtp = smtp_server(&s).await;
    once(&s, 95).await;
    let events = warning_events(&s);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0]["message"],
        note.as_str(),
        "the very note of the warning"
    );
    assert!(
        events[0]["series"].is_null() && events[0]["count"].as_i64().unwrap_or(1) <= 1,
        "{events:?}"
    );
    let received = mails(&s);
    assert_eq!(
        received.len(),
        1,
        "the email reached the owner once: {received:?}"
    );
    let after = delivery(&s);
    assert_eq!(after["event"]["state"], "sent", "{after}");
    assert_eq!(after["email"]["state"], "sent", "{after}");
    assert_eq!(deployment(&s)["spec"]["replicas"], 1, "held: told only now");

    // A retry whose record did not land writes the Event again: it is there, so it stays
    // one Event, not a second occurrence.
    let mut again = after.clone();
    again["event"] = json!({"state": "sending", "note": note});
    set_record(&s, &again);
    once(&s, 100).await;
    let events = warning_events(&s);
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0]["series"].is_null() && events[0]["count"].as_i64().unwrap_or(1) <= 1,
        "{events:?}"
    );
    assert_eq!(mails(&s).len(), 1, "the email is not sent again");

    // A notice (30 minutes) after the first delivery at +95, and not before, it acts.
    once(&s, 120).await;
    assert_eq!(
        deployment(&s)["spec"]["replicas"],
        1,
        "the notice runs to +125"
    );
    once(&s, 126).await;
    assert_eq!(
        deployment(&s)["spec"]["replicas"],
        0,
        "acted a notice after the warning reached the owner"
    );
    assert_eq!(warning_events(&s).len(), 1);
}

/// The whole loop as it runs in production, at 1× speed: `gpu-reaper replay` serves the
/// DCGM series of the Deployment's pods (whatever their names), the real Prometheus 3
/// scrapes it every 15 s, the controller reads it incrementally every 30 s, warns (an
/// Event that `kubectl describe` shows, an email) with the deadline it really acts at,
/// acts then, is woken, and warns again after the relapse with its own text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_loop_warns_with_the_true_deadline_acts_at_it_and_rewarns_after_a_wake() {
    let cluster = common::cluster::cluster();
    cluster.install_crds();
    let ns = cluster.namespace("ml-live", &[]);
    cluster.apply(&deployment_manifest(
        &ns,
        "chat",
        1,
        json!({"gpureaper.io/owner": "ana@example.com"}),
    ));
    cluster.running_pods(&ns, "app=chat", 1);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("mail")).unwrap();
    let replay = common::live::replay(
        cluster,
        &["--pattern", &format!("{ns}/chat-*=idle")],
        &dir.path().join("replay.log"),
    );
    let prometheus = common::live::prometheus_scraping(cluster, &ns, &[replay.target()], "15s");
    let s = Setup {
        scenario: Scenario {
            cluster,
            ns: ns.clone(),
            prometheus,
            t0: 0,
            pods: Default::default(),
        },
        dir,
        smtp_port: free_port(),
    };
    s.scenario.apply_policy(
        r#"  mode: Enforce
  idle: {window: 1m, startupGrace: 0s, minCoverage: 0.5}
  warn: {after: 1m, channels: [Event, Email]}
  action: {type: ScaleToZero, after: 2m}
"#,
    );
    let _smtp = smtp_server(&s).await;
    let port = free_port();
    let log = s.dir.path().join("controller.log");
    let _controller = tokio::process::Command::new(BIN)
        .arg("controller")
        .args(["--prometheus-url", &s.scenario.prometheus.url])
        .args(["--scrape-interval", "15s", "--interval", "30s"])
        .args(["--policy-selector", &format!("gpureaper.io/test={ns}")])
        .args(["--lease-namespace", &ns, "--identity", "live"])
        .args([
            "--smtp-host",
            "127.0.0.1",
            "--smtp-port",
            &s.smtp_port.to_string(),
        ])
        .args([
            "--smtp-security",
            "none",
            "--smtp-from",
            "gpu-reaper <gpu-reaper@example.com>",
        ])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let controller_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let describe = || cluster.kubectl(&["describe", "deployment", "chat", "-n", &ns], None);
    // The stated deadline of every IdleGpus Event `kubectl describe` shows.
    let deadlines = |text: &str| -> Vec<jiff::Timestamp> {
        text.lines()
            .filter(|l| l.contains("IdleGpus"))
            .filter_map(|l| {
                let after = l.split(" from ").nth(1)?;
                after.split_whitespace().next()?.parse().ok()
            })
            .collect()
    };
    let wait = |what: &str, minutes: u64, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(minutes * 60);
        while !done() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}\n--- describe:\n{}\n--- controller:\n{}",
                describe(),
                controller_log()
            );
            std::thread::sleep(Duration::from_secs(2));
        }
    };

    // 1. The warning, in `kubectl describe` (the Event names the Deployment's uid).
    wait("the warning in kubectl describe", 6, &|| {
        deadlines(&describe()).len() == 1
    });
    let first_deadline = deadlines(&describe())[0];
    wait("the warning's email", 2, &|| !mails(&s).is_empty());
    assert!(
        mails(&s)[0].contains(&first_deadline.to_string()),
        "the email names the same deadline {first_deadline}: {}",
        mails(&s)[0]
    );

    // 2. The action, at that deadline (within one 30 s cycle and the read of the API).
    wait("the scale to zero", 5, &|| {
        s.scenario.deployment("chat")["spec"]["replicas"] == 0
    });
    let reaped_at: jiff::Timestamp =
        s.scenario.deployment("chat")["metadata"]["annotations"]["gpureaper.io/reaped-at"]
            .as_str()
            .expect("reaped-at recorded")
            .parse()
            .unwrap();
    let late = reaped_at.duration_since(first_deadline);
    assert!(
        late >= SignedDuration::from_secs(-1) && late <= SignedDuration::from_secs(40),
        "acted at {reaped_at}, the warning said {first_deadline} ({late:?} late)\n{}",
        controller_log()
    );
    wait("the Reclaimed Event in kubectl describe", 2, &|| {
        describe().contains("Reclaimed")
    });

    // 3. Woken, then idle again: a second warning with its own deadline, after the first
    // action (a merged Event would still read the first one's).
    common::wake(&cluster.kubeconfig, &format!("{ns}/Deployment/chat")).await;
    cluster.running_pods(&ns, "app=chat", 1);
    wait("the second warning in kubectl describe", 6, &|| {
        deadlines(&describe()).len() == 2
    });
    let all = deadlines(&describe());
    let second = *all.iter().max().unwrap();
    assert!(
        second > reaped_at,
        "the re-warning names a new deadline ({all:?}), after the first action at {reaped_at}"
    );
    wait("the second email", 2, &|| mails(&s).len() >= 2);
    assert!(
        mails(&s).iter().any(|m| m.contains(&second.to_string())),
        "the second email names the new deadline {second}"
    );
}
