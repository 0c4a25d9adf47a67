//! The Slack channel against a local HTTPS server that plays the Slack Web API: it checks
//! the bearer token and the documented request shapes of `chat.postMessage` (JSON body,
//! `charset=utf-8`, Block Kit limits) and `users.lookupByEmail` (GET, `email` query
//! parameter), records every call, and on demand answers 429 + `Retry-After`, 500 or
//! `ok: false`. The interactivity handler runs against the real control plane (scripts/testenv; over
//! HTTPS) with requests signed exactly as Slack signs them.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use common::pki;
use gpu_reaper::admission::server::{CertReloader, serve_tls, tls_config};
use gpu_reaper::cluster::inventory::ObjectInfo;
use gpu_reaper::notify::content::{Fields, Kind, Templates};
use gpu_reaper::notify::interact::{self, InteractState, Outcome};
use gpu_reaper::notify::owner::{self, Owner, OwnerSource};
use gpu_reaper::notify::slack::{SlackApi, SlackNotifier, https_connector};
use gpu_reaper::notify::{Failure, Notification, Notifier, Personal, Severity};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tower::ServiceExt;

const TOKEN: &str = "xoxb-17-test-token";
const SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

/// One request the fake Slack received.
#[derive(Debug, Clone)]
struct Call {
    /// `chat.postMessage`, `users.lookupByEmail` or `response_url`.
    method: String,
    authorization: Option<String>,
    /// The JSON body, or the query/form parameters as an object.
    body: Value,
}

/// A scripted answer given before the normal one.
#[derive(Debug, Clone)]
enum Fault {
    RateLimited(u64),
    ServerError,
    SlackError(&'static str),
}

#[derive(Default)]
struct FakeState {
    token: String,
    /// email → member ID.
    users: BTreeMap<String, String>,
    /// Channels and member IDs a message can be posted to.
    channels: Vec<String>,
    faults: VecDeque<Fault>,
    calls: Vec<Call>,
    /// Contract violations: a test fails when any is recorded.
    violations: Vec<String>,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<FakeState>>);

impl Fake {
    fn calls(&self, method: &str) -> Vec<Call> {
        let s = self.0.lock().unwrap();
        s.calls
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    fn violations(&self) -> Vec<String> {
        self.0.lock().unwrap().violations.clone()
    }

    fn fault(&self, fault: Fault) {
        self.0.lock().unwrap().faults.push_back(fault);
    }

    /// Waits (bounded) for `n` calls of `method`.
    async fn wait_calls(&self, method: &str, n: usize) -> Vec<Call> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let calls = self.calls(method);
            if calls.len() >= n || Instant::now() > deadline {
                return calls;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn slack_answer(body: Value) -> Response {
    (
        [("content-type", "application/json; charset=utf-8")],
        body.to_string(),
    )
        .into_response()
}

fn check_text(v: &Value, max: usize, what: &str, violations: &mut Vec<String>) {
    match v["text"].as_str() {
        Some(t) if !t.is_empty() && t.chars().count() <= max => {}
        _ => violations.push(format!("{what}: text missing, empty or over {max}: {v}")),
    }
    if !matches!(v["type"].as_str(), Some("plain_text" | "mrkdwn")) {
        violations.push(format!("{what}: not a text object: {v}"));
    }
}

/// The Block Kit rules gpu-reaper's messages rely on (block types, text object limits,
/// button limits, 10 fields per section, 50 blocks per message).
fn check_blocks(blocks: &Value, violations: &mut Vec<String>) {
    let Some(blocks) = blocks.as_array() else {
        violations.push(format!("blocks is not an array: {blocks}"));
        return;
    };
    if blocks.len() > 50 {
        violations.push("more than 50 blocks".into());
    }
    for b in blocks {
        match b["type"].as_str() {
            Some("header") => {
                check_text(&b["text"], 150, "header", violations);
                if b["text"]["type"] != "plain_text" {
                    violations.push("header text must be plain_text".into());
                }
            }
            Some("section") => {
                if b.get("text").is_some() {
                    check_text(&b["text"], 3000, "section", violations);
                }
                if let Some(fields) = b.get("fields") {
                    let fields = fields.as_array().cloned().unwrap_or_default();
                    if fields.is_empty() || fields.len() > 10 {
                        violations.push(format!("section with {} fields", fields.len()));
                    }
                    for f in &fields {
                        check_text(f, 2000, "section field", violations);
                    }
                }
                if b.get("text").is_none() && b.get("fields").is_none() {
                    violations.push("section without text or fields".into());
                }
            }
            Some("context") => {
                let elements = b["elements"].as_array().cloned().unwrap_or_default();
                if elements.is_empty() || elements.len() > 10 {
                    violations.push(format!("context with {} elements", elements.len()));
                }
                for e in &elements {
                    check_text(e, 2000, "context element", violations);
                }
            }
            Some("actions") => {
                let elements = b["elements"].as_array().cloned().unwrap_or_default();
                if elements.is_empty() || elements.len() > 25 {
                    violations.push(format!("actions with {} elements", elements.len()));
                }
                for e in &elements {
                    if e["type"] != "button" {
                        violations.push(format!("unexpected element {e}"));
                    }
                    check_text(&e["text"], 75, "button", violations);
                    if e["text"]["type"] != "plain_text" {
                        violations.push("button text must be plain_text".into());
                    }
                    if e["action_id"].as_str().is_none_or(|a| a.len() > 255) {
                        violations.push(format!("button action_id missing or too long: {e}"));
                    }
                    if e.get("value")
                        .is_some_and(|v| v.as_str().is_none_or(|v| v.len() > 2000))
                    {
                        violations.push(format!("button value not a string ≤ 2000: {e}"));
                    }
                    if e.get("url")
                        .is_some_and(|v| v.as_str().is_none_or(|v| v.len() > 3000))
                    {
                        violations.push(format!("button url not a string ≤ 3000: {e}"));
                    }
                }
            }
            other => violations.push(format!("unexpected block type {other:?}")),
        }
    }
}

/// The Web API methods; `token` checks happen before any scripted fault.
async fn web_api(
    State(fake): State<Fake>,
    Path(method): Path<String>,
    http_method: Method,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    let mut s = fake.0.lock().unwrap();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let authorization = header("authorization");
    let content_type = header("content-type").unwrap_or_default();
    let parsed = match method.as_str() {
        "chat.postMessage" => {
            if http_method != Method::POST {
                s.violations
                    .push(format!("chat.postMessage with {http_method}"));
            }
            if content_type != "application/json; charset=utf-8" {
                s.violations.push(format!(
                    "chat.postMessage Content-Type {content_type:?}, want application/json; charset=utf-8"
                ));
            }
            serde_json::from_slice::<Value>(&body).unwrap_or_else(|e| {
                s.violations
                    .push(format!("chat.postMessage body is not JSON: {e}"));
                Value::Null
            })
        }
        "users.lookupByEmail" => {
            if http_method != Method::GET {
                s.violations
                    .push(format!("users.lookupByEmail with {http_method}"));
            }
            let pairs: serde_json::Map<String, Value> =
                url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                    .map(|(k, v)| (k.into_owned(), Value::from(v.into_owned())))
                    .collect();
            Value::Object(pairs)
        }
        other => {
            s.violations.push(format!("unknown method {other}"));
            return slack_answer(json!({"ok": false, "error": "unknown_method"}));
        }
    };
    s.calls.push(Call {
        method: method.clone(),
        authorization: authorization.clone(),
        body: parsed.clone(),
    });
    if authorization.as_deref() != Some(&format!("Bearer {}", s.token)) {
        return slack_answer(json!({"ok": false, "error": "invalid_auth"}));
    }
    if let Some(fault) = s.faults.pop_front() {
        return match fault {
            Fault::RateLimited(after) => (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", after.to_string())],
                "",
            )
                .into_response(),
            Fault::ServerError => {
                (StatusCode::INTERNAL_SERVER_ERROR, "upstream trouble").into_response()
            }
            Fault::SlackError(code) => slack_answer(json!({"ok": false, "error": code})),
        };
    }
    match method.as_str() {
        "chat.postMessage" => {
            let Some(channel) = parsed["channel"].as_str().map(String::from) else {
                s.violations.push("chat.postMessage without channel".into());
                return slack_answer(json!({"ok": false, "error": "channel_not_found"}));
            };
            if parsed["text"].as_str().is_none_or(str::is_empty) {
                s.violations
                    .push("chat.postMessage without a text fallback".into());
            }
            if let Some(blocks) = parsed.get("blocks") {
                let mut v = Vec::new();
                check_blocks(blocks, &mut v);
                s.violations.extend(v);
            }
            if !s.channels.contains(&channel) {
                return slack_answer(json!({"ok": false, "error": "channel_not_found"}));
            }
            slack_answer(json!({"ok": true, "channel": channel, "ts": "1764417600.000100"}))
        }
        _ => {
            let Some(email) = parsed["email"].as_str() else {
                s.violations
                    .push("users.lookupByEmail without email".into());
                return slack_answer(json!({"ok": false, "error": "invalid_arguments"}));
            };
            match s.users.get(email) {
                Some(id) => slack_answer(
                    json!({"ok": true, "user": {"id": id, "profile": {"email": email}}}),
                ),
                None => slack_answer(json!({"ok": false, "error": "users_not_found"})),
            }
        }
    }
}

/// Where interaction `response_url`s point.
async fn response_url(State(fake): State<Fake>, headers: HeaderMap, body: Bytes) -> Response {
    let mut s = fake.0.lock().unwrap();
    if headers.get("authorization").is_some() {
        s.violations
            .push("the bot token was sent to a response_url".into());
    }
    let body = serde_json::from_slice::<Value>(&body).unwrap_or_else(|e| {
        s.violations
            .push(format!("response_url body is not JSON: {e}"));
        Value::Null
    });
    if let Some(blocks) = body.get("blocks") {
        let mut v = Vec::new();
        check_blocks(blocks, &mut v);
        s.violations.extend(v);
    }
    s.calls.push(Call {
        method: "response_url".into(),
        authorization: None,
        body,
    });
    slack_answer(json!({"ok": true}))
}

/// The fake Slack on HTTPS with a throw-away CA, and files for the token and the CA.
struct Slack {
    fake: Fake,
    url: String,
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Slack {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Slack {
    async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let ca = pki::Ca::new("fake Slack test CA");
        let leaf = ca.leaf(&["127.0.0.1"], "slack.test");
        std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
        std::fs::write(dir.path().join("tls.crt"), &leaf.cert_pem).unwrap();
        std::fs::write(dir.path().join("tls.key"), &leaf.key_pem).unwrap();
        std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).unwrap();

        let fake = Fake::default();
        {
            let mut s = fake.0.lock().unwrap();
            s.token = TOKEN.into();
            s.users = BTreeMap::from([
                ("ana@example.com".to_string(), "U0ANA0001".to_string()),
                ("bo@example.com".to_string(), "U0BO00002".to_string()),
            ]);
            s.channels = ["U0ANA0001", "U0BO00002", "C0GPUS"]
                .map(String::from)
                .to_vec();
        }
        let app = Router::new()
            .route("/api/{method}", any(web_api))
            .route("/actions/{*rest}", post(response_url))
            .with_state(fake.clone());
        let certs = Arc::new(
            CertReloader::load(&dir.path().join("tls.crt"), &dir.path().join("tls.key")).unwrap(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_tls(
            listener,
            tls_config(certs).unwrap(),
            app,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            fake,
            url: format!("https://127.0.0.1:{port}"),
            dir,
            stop: Some(stop),
        }
    }

    fn token_file(&self) -> PathBuf {
        self.dir.path().join("token")
    }

    fn api(&self) -> SlackApi {
        let https =
            https_connector(Some(&self.dir.path().join("ca.pem")), "--slack-ca-file").unwrap();
        SlackApi::new(&format!("{}/api", self.url), self.token_file(), https)
    }

    /// The notifier exactly as the controller builds it from its flags.
    fn notifier(&self) -> SlackNotifier {
        let args = gpu_reaper::notify::NotifyConfig {
            slack_token_file: Some(self.token_file()),
            slack_api_url: format!("{}/api", self.url),
            slack_ca_file: Some(self.dir.path().join("ca.pem")),
            ..Default::default()
        };
        SlackNotifier::from_config(&args).unwrap().unwrap()
    }
}

fn workload() -> ObjectInfo {
    ObjectInfo::from_value(&deployment("ml")).unwrap()
}

fn warning(owner: Owner, slack_channel: Option<&str>) -> Notification {
    let fields = Fields::from([
        ("namespace", "ml".to_string()),
        ("kind", "Deployment".to_string()),
        ("name", "chat".to_string()),
        ("workload", "ml/Deployment/chat".to_string()),
        ("policy", "research".to_string()),
        ("gpus", "2".to_string()),
        ("model", "NVIDIA H100 80GB HBM3".to_string()),
        ("idle_since", "2026-11-29T10:00:00Z".to_string()),
        ("idle_for", "2h".to_string()),
        ("shape", "MemoryHeld".to_string()),
        ("hourly_usd", "8.00".to_string()),
        ("wasted_usd", "16.00".to_string()),
        ("action", "ScaleToZero".to_string()),
        ("action_verb", "scale it to zero".to_string()),
        ("action_at", "2026-11-29T13:00:00Z".to_string()),
        ("owner", owner.describe()),
        (
            "url",
            "https://grafana.example.com/d/gpu?var-ns=ml".to_string(),
        ),
    ]);
    let rendered = Templates::default().render(Kind::Warning, &fields);
    Notification {
        workload: workload(),
        reason: "IdleGpus",
        severity: Severity::Warning,
        message: rendered.text.clone(),
        personal: Some(Personal {
            kind: Kind::Warning,
            fields,
            rendered,
            owner,
            policy: "research".into(),
            slack_channel: slack_channel.map(String::from),
        }),
    }
}

fn owner_of(value: &str) -> Owner {
    owner::parse(value, OwnerSource::Workload)
}

fn assert_contract(slack: &Slack) {
    assert_eq!(
        slack.fake.violations(),
        Vec::<String>::new(),
        "requests broke the Slack API contract"
    );
    for call in slack.fake.calls("chat.postMessage") {
        assert_eq!(
            call.authorization.as_deref(),
            Some(format!("Bearer {TOKEN}").as_str())
        );
    }
}

#[tokio::test]
async fn a_slack_member_id_gets_a_dm_with_the_warning_and_its_buttons() {
    let slack = Slack::start().await;
    let n = warning(owner_of("U0ANA0001"), Some("C0GPUS"));
    let sent = slack.notifier().notify(&n).await.unwrap();
    assert_eq!(sent, "Slack DM to U0ANA0001");
    let posts = slack.fake.calls("chat.postMessage");
    assert_eq!(posts.len(), 1);
    let body = &posts[0].body;
    assert_eq!(body["channel"], "U0ANA0001");
    assert_eq!(
        body["text"],
        "Idle GPUs: ml/Deployment/chat will be reclaimed at 2026-11-29T13:00:00Z"
    );
    let blocks = body["blocks"].as_array().unwrap();
    let buttons: Vec<&str> = blocks
        .iter()
        .filter(|b| b["type"] == "actions")
        .flat_map(|b| b["elements"].as_array().unwrap())
        .filter_map(|e| e["action_id"].as_str())
        .collect();
    assert_eq!(
        buttons,
        ["open_workload", "keep_4h", "keep_24h", "not_mine"]
    );
    assert!(slack.fake.calls("users.lookupByEmail").is_empty());
    assert_contract(&slack);
}

#[tokio::test]
async fn an_email_owner_is_looked_up_and_messaged_directly() {
    let slack = Slack::start().await;
    let n = warning(owner_of("ana@example.com"), Some("C0GPUS"));
    let sent = slack.notifier().notify(&n).await.unwrap();
    assert_eq!(sent, "Slack DM to U0ANA0001");
    let lookups = slack.fake.calls("users.lookupByEmail");
    assert_eq!(lookups.len(), 1);
    assert_eq!(lookups[0].body["email"], "ana@example.com");
    assert_eq!(
        lookups[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    let posts = slack.fake.calls("chat.postMessage");
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].body["channel"], "U0ANA0001");
    assert_contract(&slack);
}

#[tokio::test]
async fn an_owner_not_on_slack_is_warned_in_the_policy_channel() {
    let slack = Slack::start().await;
    let n = warning(owner_of("ghost@example.com"), Some("C0GPUS"));
    let sent = slack.notifier().notify(&n).await.unwrap();
    assert!(sent.starts_with("Slack channel C0GPUS"), "{sent}");
    assert!(sent.contains("ghost@example.com is not on Slack"), "{sent}");
    let posts = slack.fake.calls("chat.postMessage");
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].body["channel"], "C0GPUS");
    assert_contract(&slack);
}

#[tokio::test]
async fn nobody_and_no_channel_is_unrouted_without_calling_slack() {
    let slack = Slack::start().await;
    let n = warning(Owner::default(), None);
    let err = slack.notifier().notify(&n).await.unwrap_err();
    assert!(
        matches!(&err, Failure::Unrouted(m) if m.contains("no warn.slackChannel")),
        "{err:?}"
    );
    assert!(slack.fake.calls("chat.postMessage").is_empty());
    // An Event-only notification is not Slack's business.
    let mut event_only = warning(owner_of("U0ANA0001"), None);
    event_only.personal = None;
    assert_eq!(
        slack.notifier().notify(&event_only).await.unwrap(),
        "not a personal notification"
    );
    assert!(slack.fake.calls("chat.postMessage").is_empty());
}

#[tokio::test]
async fn a_rate_limit_is_waited_out_and_the_message_sent_once() {
    let slack = Slack::start().await;
    slack.fake.fault(Fault::RateLimited(1));
    let n = warning(owner_of("U0ANA0001"), None);
    let sent = slack.notifier().notify(&n).await.unwrap();
    assert_eq!(sent, "Slack DM to U0ANA0001");
    assert_eq!(slack.fake.calls("chat.postMessage").len(), 2);
    assert_contract(&slack);
}

#[tokio::test]
async fn endless_rate_limits_and_server_errors_are_retried_later() {
    let slack = Slack::start().await;
    slack.fake.fault(Fault::ServerError);
    let n = warning(owner_of("U0ANA0001"), Some("C0GPUS"));
    let err = slack.notifier().notify(&n).await.unwrap_err();
    assert!(
        matches!(&err, Failure::Retry(m) if m.contains("chat.postMessage") && m.contains("500")),
        "{err:?}"
    );
    // A transient failure of the DM never falls back to the channel.
    assert_eq!(slack.fake.calls("chat.postMessage").len(), 1);

    let mut api = slack.api();
    api.rate_limit_retries = 0;
    slack.fake.fault(Fault::RateLimited(1));
    let err = SlackNotifier::new(api).notify(&n).await.unwrap_err();
    assert!(
        matches!(&err, Failure::Retry(m) if m.contains("429")),
        "{err:?}"
    );

    slack.fake.fault(Fault::SlackError("internal_error"));
    let err = slack.notifier().notify(&n).await.unwrap_err();
    assert_eq!(
        err,
        Failure::Retry("Slack chat.postMessage: internal_error".into())
    );

    // A lookup that fails transiently is retried, not routed to the channel.
    slack.fake.fault(Fault::ServerError);
    let by_email = warning(owner_of("ana@example.com"), Some("C0GPUS"));
    let err = slack.notifier().notify(&by_email).await.unwrap_err();
    assert!(
        matches!(&err, Failure::Retry(m) if m.contains("users.lookupByEmail")),
        "{err:?}"
    );
    assert_eq!(slack.fake.calls("chat.postMessage").len(), 3);
    assert_contract(&slack);
}

#[tokio::test]
async fn an_unknown_channel_is_unrouted() {
    let slack = Slack::start().await;
    let n = warning(Owner::default(), Some("C0NOPE"));
    let err = slack.notifier().notify(&n).await.unwrap_err();
    assert_eq!(
        err,
        Failure::Unrouted("Slack chat.postMessage: channel_not_found".into())
    );
    assert_contract(&slack);
}

#[tokio::test]
async fn the_token_is_read_again_on_every_send() {
    let slack = Slack::start().await;
    let notifier = slack.notifier();
    let n = warning(owner_of("U0ANA0001"), None);
    notifier.notify(&n).await.unwrap();
    slack.fake.0.lock().unwrap().token = "xoxb-rotated".into();
    std::fs::write(slack.token_file(), "xoxb-rotated\n").unwrap();
    notifier.notify(&n).await.unwrap();
    let posts = slack.fake.calls("chat.postMessage");
    assert_eq!(
        posts[1].authorization.as_deref(),
        Some("Bearer xoxb-rotated")
    );
}

/// An HTTP CONNECT proxy on loopback that records the targets it tunnelled to.
async fn connect_proxy() -> (String, Arc<Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let targets = Arc::new(Mutex::new(Vec::new()));
    let seen = targets.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                    if client.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let Some(target) = head
                    .strip_prefix("CONNECT ")
                    .and_then(|rest| rest.split_whitespace().next())
                else {
                    let _ = client
                        .write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
                        .await;
                    return;
                };
                seen.lock().unwrap().push(target.to_string());
                let Ok(mut upstream) = tokio::net::TcpStream::connect(target).await else {
                    let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                    return;
                };
                let _ = client
                    .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                    .await;
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    (url, targets)
}

#[tokio::test]
async fn an_https_proxy_is_tunnelled_through_unless_no_proxy_exempts_the_host() {
    use hyper_util::client::proxy::matcher::Matcher;
    let slack = Slack::start().await;
    let (proxy, targets) = connect_proxy().await;
    let ca = slack.dir.path().join("ca.pem");
    let api = |proxies: Matcher| {
        let https = gpu_reaper::notify::slack::https_connector_with_proxies(
            Some(&ca),
            "--slack-ca-file",
            proxies,
        )
        .unwrap();
        SlackNotifier::new(SlackApi::new(
            &format!("{}/api", slack.url),
            slack.token_file(),
            https,
        ))
    };
    let n = warning(owner_of("U0ANA0001"), None);
    let via_proxy = api(Matcher::builder().https(proxy.clone()).build());
    assert_eq!(via_proxy.notify(&n).await.unwrap(), "Slack DM to U0ANA0001");
    let host = slack.url.trim_start_matches("https://").to_string();
    assert_eq!(*targets.lock().unwrap(), [host]);
    let exempt = api(Matcher::builder().https(proxy).no("127.0.0.1").build());
    assert_eq!(exempt.notify(&n).await.unwrap(), "Slack DM to U0ANA0001");
    assert_eq!(targets.lock().unwrap().len(), 1, "NO_PROXY goes direct");
    assert_eq!(slack.fake.calls("chat.postMessage").len(), 2);
    assert_contract(&slack);
}

// ---- interactivity -------------------------------------------------------------------

fn deployment(ns: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": ns, "annotations": {
            "gpureaper.io/notified-owner": "ana@example.com (from the namespace)"
        }},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "chat"}},
                 "template": {"metadata": {"labels": {"app": "chat"}},
                              "spec": {"containers": [{"name": "c", "image": "vllm/vllm-openai:v0.6.0",
                                                       "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}},
    })
}

/// The real control plane (tests/common/cluster.rs): a namespace and a policy of this
/// test's own.
struct Cluster {
    cluster: &'static common::cluster::Cluster,
    ns: String,
    policy: String,
    slack: Slack,
    app: Router,
    state: InteractState,
}

async fn cluster() -> Cluster {
    let slack = Slack::start().await;
    let cluster = common::cluster::cluster();
    cluster.install_crds();
    let ns = cluster.namespace("ml-slack", &[]);
    cluster.apply(&deployment(&ns).to_string());
    let policy = format!("research-{ns}");
    cluster.apply(
        &json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy",
            "metadata": {"name": policy},
            "spec": {"match": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
                     "exemptions": {"maxSnooze": "6h"}, "warn": {"after": "30m", "channels": ["Event", "Slack"], "slackChannel": "C0GPUS"}},
        })
        .to_string(),
    );
    let secret = slack.dir.path().join("signing-secret");
    std::fs::write(&secret, format!("{SIGNING_SECRET}\n")).unwrap();
    let state = InteractState::new(secret, cluster.client().await, slack.api());
    Cluster {
        app: interact::router(state.clone()),
        cluster,
        ns,
        policy,
        slack,
        state,
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .cluster
            .try_kubectl(&["delete", "namespace", &self.ns, "--wait=false"], None);
        let _ = self
            .cluster
            .try_kubectl(&["delete", "gpupolicy", &self.policy, "--wait=false"], None);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Slack's signature: `v0=` + hex HMAC-SHA256(secret, `v0:{timestamp}:{body}`).
fn slack_signature(secret: &str, timestamp: i64, body: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, format!("v0:{timestamp}:{body}").as_bytes());
    format!("v0={}", hex(tag.as_ref()))
}

/// The form body of a block_actions payload for a click on `action_id`.
fn click_body(c: &Cluster, action_id: &str, policy: &str) -> String {
    let value =
        json!({"w": format!("{}/Deployment/chat", c.ns), "v": "apps/v1", "p": policy}).to_string();
    let n = warning(owner_of("U0ANA0001"), Some("C0GPUS"));
    let blocks = gpu_reaper::notify::slack::message_blocks(&n, n.personal.as_ref().unwrap());
    let payload = json!({
        "type": "block_actions",
        "user": {"id": "U0ANA0001", "username": "ana", "team_id": "T0TEAM"},
        "api_app_id": "A0APP",
        "token": "deprecated-verification-token",
        "container": {"type": "message", "message_ts": "1764417600.000100", "channel_id": "D0DM", "is_ephemeral": false},
        "trigger_id": "1.2.3",
        "team": {"id": "T0TEAM", "domain": "example"},
        "channel": {"id": "D0DM", "name": "directmessage"},
        "message": {"type": "message", "text": "Idle GPUs", "ts": "1764417600.000100", "blocks": blocks},
        "response_url": format!("{}/actions/T0TEAM/123/abcdef", c.slack.url),
        "actions": [{"type": "button", "action_id": action_id, "block_id": "gpu_reaper_decision",
                     "text": {"type": "plain_text", "text": "Keep"}, "value": value,
                     "action_ts": "1764417700.000200"}],
    });
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish()
}

async fn send(c: &Cluster, body: &str, timestamp: i64, signature: &str) -> (StatusCode, String) {
    let request = Request::post("/slack/interactivity")
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", timestamp.to_string())
        .header("x-slack-signature", signature)
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = c.app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

async fn signed(c: &Cluster, body: &str) -> (StatusCode, String) {
    let now = Timestamp::now().as_second();
    send(c, body, now, &slack_signature(SIGNING_SECRET, now, body)).await
}

fn snooze_until(c: &Cluster) -> Option<Timestamp> {
    c.cluster.get("deployment", Some(&c.ns), "chat").unwrap()["metadata"]["annotations"]
        ["gpureaper.io/snooze-until"]
        .as_str()
        .map(|s| s.parse().unwrap())
}

fn assert_about(at: Timestamp, expected: Timestamp) {
    let off = at.duration_since(expected).abs();
    assert!(
        off < SignedDuration::from_secs(60),
        "{at} is not about {expected}"
    );
}

#[tokio::test]
async fn keep_4h_snoozes_the_workload_and_replaces_the_message() {
    let c = cluster().await;
    let (status, body) = signed(&c, &click_body(&c, "keep_4h", &c.policy)).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    let until = snooze_until(&c).expect("snooze-until written");
    assert_about(until, Timestamp::now() + SignedDuration::from_hours(4));
    let answers = c.slack.fake.wait_calls("response_url", 1).await;
    assert_eq!(answers.len(), 1);
    let answer = &answers[0].body;
    assert_eq!(answer["replace_original"], true);
    let text = answer["text"].as_str().unwrap();
    assert!(
        text.contains(&format!("{}/Deployment/chat kept until", c.ns))
            && text.contains("by <@U0ANA0001>"),
        "{text}"
    );
    assert!(!text.contains("capped"), "{text}");
    let blocks = answer["blocks"].as_array().unwrap();
    assert!(
        blocks
            .iter()
            .all(|b| b["block_id"] != "gpu_reaper_decision"),
        "the buttons are gone: {blocks:?}"
    );
    assert_eq!(blocks[0]["type"], "header", "the rest of the message stays");
    assert_eq!(blocks.last().unwrap()["type"], "context");
    assert_eq!(c.state.metrics().count(Outcome::Kept4h), 1);
    assert_contract(&c.slack);
}

#[tokio::test]
async fn keep_24h_is_capped_at_the_policys_max_snooze() {
    let c = cluster().await;
    let (status, _) = signed(&c, &click_body(&c, "keep_24h", &c.policy)).await;
    assert_eq!(status, StatusCode::OK);
    let until = snooze_until(&c).expect("snooze-until written");
    assert_about(until, Timestamp::now() + SignedDuration::from_hours(6));
    assert!(until <= Timestamp::now() + SignedDuration::from_hours(6));
    let answers = c.slack.fake.wait_calls("response_url", 1).await;
    let text = answers[0].body["text"].as_str().unwrap().to_string();
    assert!(
        text.contains(&format!("capped at policy {}'s maxSnooze of 6h", c.policy)),
        "{text}"
    );
    assert_eq!(c.state.metrics().capped(), 1);
    assert_eq!(c.state.metrics().count(Outcome::Kept24h), 1);
}

#[tokio::test]
async fn a_bad_signature_is_refused_and_changes_nothing() {
    let c = cluster().await;
    let body = click_body(&c, "keep_4h", &c.policy);
    let now = Timestamp::now().as_second();
    let forged = slack_signature("not-the-secret", now, &body);
    let (status, reason) = send(&c, &body, now, &forged).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{reason}");
    // Signed, then tampered with: the body is what counts.
    let good = slack_signature(SIGNING_SECRET, now, &body);
    let tampered = body.replace("keep_4h", "keep_24h");
    let (status, _) = send(&c, &tampered, now, &good).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = send(&c, &body, now, "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(snooze_until(&c), None);
    assert!(c.slack.fake.calls("response_url").is_empty());
    assert_eq!(c.state.metrics().count(Outcome::BadSignature), 3);
}

#[tokio::test]
async fn a_stale_timestamp_is_refused_even_when_signed() {
    let c = cluster().await;
    let body = click_body(&c, "keep_4h", &c.policy);
    let then = Timestamp::now().as_second() - 6 * 60;
    let (status, reason) = send(
        &c,
        &body,
        then,
        &slack_signature(SIGNING_SECRET, then, &body),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(reason.contains("5 minutes"), "{reason}");
    assert_eq!(snooze_until(&c), None);
    assert_eq!(c.state.metrics().count(Outcome::Stale), 1);
}

#[tokio::test]
async fn a_replayed_request_is_refused() {
    let c = cluster().await;
    let body = click_body(&c, "keep_4h", &c.policy);
    let now = Timestamp::now().as_second();
    let signature = slack_signature(SIGNING_SECRET, now, &body);
    let (first, _) = send(&c, &body, now, &signature).await;
    assert_eq!(first, StatusCode::OK);
    let (again, reason) = send(&c, &body, now, &signature).await;
    assert_eq!(again, StatusCode::UNAUTHORIZED);
    assert!(reason.contains("replay"), "{reason}");
    assert_eq!(c.state.metrics().count(Outcome::Kept4h), 1);
    assert_eq!(c.state.metrics().count(Outcome::Replayed), 1);
}

#[tokio::test]
async fn not_mine_tells_the_policy_channel_who_the_owner_was_resolved_from() {
    let c = cluster().await;
    let (status, _) = signed(&c, &click_body(&c, "not_mine", &c.policy)).await;
    assert_eq!(status, StatusCode::OK);
    let posts = c.slack.fake.wait_calls("chat.postMessage", 1).await;
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].body["channel"], "C0GPUS");
    let text = posts[0].body["text"].as_str().unwrap();
    assert!(
        text.starts_with(&format!("<@U0ANA0001> says {}/Deployment/chat is not theirs; owner was resolved from ana@example.com (from the namespace)", c.ns)),
        "{text}"
    );
    let answers = c.slack.fake.wait_calls("response_url", 1).await;
    assert_eq!(answers[0].body["replace_original"], true);
    assert_eq!(snooze_until(&c), None, "not mine keeps nothing");
    assert_eq!(c.state.metrics().count(Outcome::NotMine), 1);
    assert_contract(&c.slack);
}

#[tokio::test]
async fn a_click_for_a_deleted_policy_is_explained_to_the_clicker_only() {
    let c = cluster().await;
    let (status, _) = signed(&c, &click_body(&c, "keep_4h", "deleted-policy")).await;
    assert_eq!(status, StatusCode::OK);
    let answers = c.slack.fake.wait_calls("response_url", 1).await;
    let answer = &answers[0].body;
    assert_eq!(answer["replace_original"], false);
    assert_eq!(answer["response_type"], "ephemeral");
    assert!(
        answer["text"]
            .as_str()
            .unwrap()
            .contains("GpuPolicy deleted-policy no longer exists"),
        "{answer}"
    );
    assert_eq!(snooze_until(&c), None);
    assert_eq!(c.state.metrics().count(Outcome::UnknownWorkload), 1);
}

#[tokio::test]
async fn a_malformed_signed_payload_gets_400_with_a_reason() {
    let c = cluster().await;
    for (body, why) in [
        ("payload=%7B%22type%22", "not an interaction payload"),
        ("nothing=1", "no `payload`"),
    ] {
        let (status, reason) = signed(&c, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(reason.contains(why), "{reason}");
    }
    let bad_value = click_body(&c, "keep_4h", &c.policy)
        .replace(&format!("{}%2FDeployment%2Fchat", c.ns), "chat");
    let (status, reason) = signed(&c, &bad_value).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(reason.contains("namespace/Kind/name"), "{reason}");
    // Link clicks are reported by Slack too, and need only a 200.
    let (status, _) = signed(&c, &click_body(&c, "open_workload", &c.policy)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(c.state.metrics().count(Outcome::Malformed), 3);
    assert_eq!(c.state.metrics().count(Outcome::Ignored), 1);
}

#[tokio::test]
async fn interactivity_is_off_without_a_signing_secret_and_names_the_flag_on_errors() {
    let c = cluster().await;
    let client = c.cluster.client().await;
    let notifier = c.slack.notifier();
    let mut args = gpu_reaper::notify::NotifyConfig::default();
    assert!(
        InteractState::from_config(&args, client.clone(), Some(&notifier))
            .unwrap()
            .is_none()
    );
    args.slack_signing_secret_file = Some(c.slack.dir.path().join("absent"));
    let err = InteractState::from_config(&args, client.clone(), Some(&notifier))
        .err()
        .unwrap()
        .to_string();
    assert!(err.starts_with("--slack-signing-secret-file "), "{err}");
    args.slack_signing_secret_file = Some(c.slack.dir.path().join("signing-secret"));
    let err = InteractState::from_config(&args, client.clone(), None)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("needs --slack-token-file"), "{err}");
    assert!(
        InteractState::from_config(&args, client, Some(&notifier))
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn a_signed_click_is_counted_in_the_metrics_text() {
    let c = cluster().await;
    // As the controller serves them: registered in its `gpu_reaper` registry.
    let mut registry = prometheus_client::registry::Registry::with_prefix("gpu_reaper");
    let metrics = interact::InteractionMetrics::default();
    metrics.register(&mut registry);
    let app = interact::router(c.state.clone().with_metrics(metrics));
    let body = click_body(&c, "keep_4h", &c.policy);
    let now = Timestamp::now().as_second();
    let mut statuses = Vec::new();
    for signature in [slack_signature(SIGNING_SECRET, now, &body), "v0=00".into()] {
        let request = Request::post("/slack/interactivity")
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-slack-request-timestamp", now.to_string())
            .header("x-slack-signature", signature)
            .body(Body::from(body.clone()))
            .unwrap();
        statuses.push(app.clone().oneshot(request).await.unwrap().status());
    }
    assert_eq!(statuses, [StatusCode::OK, StatusCode::UNAUTHORIZED]);
    assert!(snooze_until(&c).is_some());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        r#"gpu_reaper_slack_interactions_total{outcome="kept_4h"} 1"#,
        r#"gpu_reaper_slack_interactions_total{outcome="bad_signature"} 1"#,
        r#"gpu_reaper_slack_interactions_total{outcome="kept_24h"} 0"#,
        "gpu_reaper_slack_snoozes_capped_total 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
}
