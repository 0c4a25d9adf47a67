//! Slack interactivity: what happens when someone clicks "Keep 4h", "Keep 24h" or
//! "Not mine" on a warning (docs/notifications.md#slack-buttons).
//!
//! `POST /slack/interactivity` takes Slack's form body (`payload=<json>`) only once it is
//! authentic: the `X-Slack-Signature` HMAC-SHA256 of `v0:<timestamp>:<body>` under the
//! app's signing secret (re-read on every request, compared in constant time), a
//! `X-Slack-Request-Timestamp` within 5 minutes of now, and a signature not seen before
//! (a bounded in-memory set). A Keep writes `gpureaper.io/snooze-until` on the workload
//! (now + the asked time, capped by the policy's `exemptions.maxSnooze`); "Not mine"
//! tells the policy's `warn.slackChannel`. Either way the message is replaced through the
//! interaction's `response_url`, without its buttons, saying who did what.
//!
//! Touches: GpuPolicies (get), the workload named in the button (get, merge patch of one
//! annotation), the Slack Web API. Answers Slack 200 with an empty body once applied (or
//! after 2.5 s, Slack's patience being 3 s; the work then finishes in the background).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use jiff::{SignedDuration, Timestamp};
use kube::Api;
use serde::Deserialize;
use serde_json::{Value, json};

use super::content::human_duration;
use super::slack::{
    ButtonValue, DECISION_BLOCK, KEEP_4H, KEEP_24H, NOT_MINE, SlackApi, SlackNotifier,
    mrkdwn_escape, read_secret_file,
};
use crate::api::keys;
use crate::api::policy::GpuPolicy;
use crate::cli::NotifyArgs;
use crate::cluster::actions::{api_for, merge_patch};
use crate::cluster::inventory::ObjectInfo;

/// The path Slack's Interactivity Request URL points at.
pub const PATH: &str = "/slack/interactivity";
/// How far a request's timestamp may be from now (Slack's recommendation).
pub const MAX_SKEW_SECONDS: i64 = 5 * 60;
/// Signatures remembered against replays.
const REPLAY_CAPACITY: usize = 10_000;
/// How long the handler waits for the work before answering Slack anyway.
const ANSWER_WITHIN: Duration = Duration::from_millis(2500);

/// A clock, injectable for tests.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// What became of the requests, by outcome; register them as metrics as you like
/// ([`InteractCounts::snapshot`] gives `outcome → count`).
#[derive(Debug, Default)]
pub struct InteractCounts {
    /// A Keep was applied (snooze written).
    pub kept: AtomicU64,
    /// A Keep was applied with less time than asked (the policy's maxSnooze).
    pub capped: AtomicU64,
    /// A "Not mine" was passed to the policy's channel.
    pub not_mine: AtomicU64,
    /// Authentic, but nothing for gpu-reaper to do (other payload types, link clicks).
    pub ignored: AtomicU64,
    /// Authentic and understood, but it could not be applied (policy or workload gone,
    /// API server or Slack errors); the clicker is told why.
    pub failed: AtomicU64,
    /// Missing or wrong signature (401).
    pub bad_signature: AtomicU64,
    /// Timestamp missing or more than 5 minutes from now (401).
    pub stale: AtomicU64,
    /// A signature already seen (401).
    pub replayed: AtomicU64,
    /// Authentic but unreadable body (400).
    pub malformed: AtomicU64,
    /// The signing secret could not be read (500).
    pub no_secret: AtomicU64,
}

impl InteractCounts {
    /// `outcome → count`, for a metric family with an `outcome` label.
    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BTreeMap::from([
            ("kept", get(&self.kept)),
            ("capped", get(&self.capped)),
            ("not_mine", get(&self.not_mine)),
            ("ignored", get(&self.ignored)),
            ("failed", get(&self.failed)),
            ("bad_signature", get(&self.bad_signature)),
            ("stale", get(&self.stale)),
            ("replayed", get(&self.replayed)),
            ("malformed", get(&self.malformed)),
            ("no_secret", get(&self.no_secret)),
        ])
    }
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Signatures seen recently; a signature stays as long as its request could still pass
/// the timestamp check, and the oldest go first when the set is full.
#[derive(Debug, Default)]
struct ReplayGuard {
    seen: HashSet<String>,
    /// (forget after, unix seconds; signature), in insertion order.
    order: VecDeque<(i64, String)>,
}

impl ReplayGuard {
    /// `true` the first time `signature` is seen.
    fn first_time(&mut self, signature: &str, now: i64) -> bool {
        while let Some((until, _)) = self.order.front() {
            if *until >= now && self.order.len() < REPLAY_CAPACITY {
                break;
            }
            if let Some((_, old)) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        if self.seen.contains(signature) {
            return false;
        }
        self.seen.insert(signature.to_string());
        // The request's timestamp is within now ± skew, and it passes the check until
        // timestamp + skew: so at most until now + 2 × skew.
        self.order
            .push_back((now + 2 * MAX_SKEW_SECONDS, signature.to_string()));
        true
    }
}

/// What the interactivity handler shares.
#[derive(Clone)]
pub struct InteractState {
    signing_secret_file: PathBuf,
    client: kube::Client,
    slack: SlackApi,
    clock: Clock,
    counts: Arc<InteractCounts>,
    replays: Arc<Mutex<ReplayGuard>>,
}

impl InteractState {
    /// The handler's state: the signing secret's file (re-read on every request), a
    /// client for GpuPolicies and workloads, and the Slack API client.
    pub fn new(signing_secret_file: PathBuf, client: kube::Client, slack: SlackApi) -> Self {
        Self {
            signing_secret_file,
            client,
            slack,
            clock: Arc::new(Timestamp::now),
            counts: Arc::default(),
            replays: Arc::default(),
        }
    }

    /// `None` without `--slack-signing-secret-file`; an error naming the flag when the
    /// file cannot be read or there is no Slack notifier (no `--slack-token-file`).
    pub fn from_args(
        args: &NotifyArgs,
        client: kube::Client,
        slack: Option<&SlackNotifier>,
    ) -> Result<Option<Self>, String> {
        let Some(secret) = &args.slack_signing_secret_file else {
            return Ok(None);
        };
        read_secret_file(secret).map_err(|e| format!("--slack-signing-secret-file {e}"))?;
        let Some(slack) = slack else {
            return Err("--slack-signing-secret-file needs --slack-token-file: the buttons' answers are posted with the bot token".into());
        };
        Ok(Some(Self::new(secret.clone(), client, slack.api().clone())))
    }

    /// Replaces the clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The outcome counters.
    pub fn counts(&self) -> Arc<InteractCounts> {
        self.counts.clone()
    }
}

/// The interactivity route, to merge into an HTTP listener that Slack can reach.
pub fn router(state: InteractState) -> Router {
    Router::new()
        .route(PATH, post(interactivity))
        .with_state(state)
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// PURE: whether `signature` (`v0=<hex>`) is Slack's signature of `body` sent at
/// `timestamp` under `secret`, compared in constant time.
pub fn signature_matches(secret: &[u8], timestamp: &str, body: &[u8], signature: &str) -> bool {
    let Some(tag) = signature.strip_prefix("v0=").and_then(hex_decode) else {
        return false;
    };
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let mut base = Vec::with_capacity(body.len() + timestamp.len() + 4);
    base.extend_from_slice(b"v0:");
    base.extend_from_slice(timestamp.as_bytes());
    base.push(b':');
    base.extend_from_slice(body);
    ring::hmac::verify(&key, &base, &tag).is_ok()
}

/// Why a request is refused before its body is read.
struct Refusal {
    status: StatusCode,
    reason: String,
}

fn refuse(status: StatusCode, reason: impl Into<String>) -> Refusal {
    Refusal {
        status,
        reason: reason.into(),
    }
}

async fn authenticate(
    state: &InteractState,
    headers: &HeaderMap,
    body: &[u8],
    now: Timestamp,
) -> Result<(), Refusal> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let counts = &state.counts;
    let Some(timestamp) = header("x-slack-request-timestamp") else {
        inc(&counts.stale);
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "no X-Slack-Request-Timestamp header",
        ));
    };
    let Ok(sent) = timestamp.trim().parse::<i64>() else {
        inc(&counts.stale);
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "X-Slack-Request-Timestamp is not unix seconds",
        ));
    };
    if (now.as_second() - sent).abs() > MAX_SKEW_SECONDS {
        inc(&counts.stale);
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "X-Slack-Request-Timestamp is more than 5 minutes from now",
        ));
    }
    let Some(signature) = header("x-slack-signature") else {
        inc(&counts.bad_signature);
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "no X-Slack-Signature header",
        ));
    };
    let secret = match tokio::task::spawn_blocking({
        let path = state.signing_secret_file.clone();
        move || read_secret_file(&path)
    })
    .await
    {
        Ok(Ok(secret)) => secret,
        Ok(Err(e)) => {
            inc(&counts.no_secret);
            tracing::error!(error = %e, "cannot read --slack-signing-secret-file; Slack interactions are refused");
            return Err(refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the signing secret cannot be read",
            ));
        }
        Err(e) => {
            inc(&counts.no_secret);
            return Err(refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()));
        }
    };
    if !signature_matches(secret.as_bytes(), timestamp.trim(), body, signature.trim()) {
        inc(&counts.bad_signature);
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "X-Slack-Signature does not match the body",
        ));
    }
    let first = match state.replays.lock() {
        Ok(mut guard) => guard.first_time(signature.trim(), now.as_second()),
        Err(poisoned) => poisoned
            .into_inner()
            .first_time(signature.trim(), now.as_second()),
    };
    if !first {
        inc(&counts.replayed);
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "this signed request was already received (replay)",
        ));
    }
    Ok(())
}

/// What was clicked.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    /// Keep for this long (before the policy's cap).
    Keep(SignedDuration),
    NotMine,
}

/// One understood click.
#[derive(Debug, Clone, PartialEq)]
pub struct Click {
    pub choice: Choice,
    pub value: ButtonValue,
    /// Slack member ID of who clicked.
    pub user: String,
    pub response_url: String,
    /// The message's blocks as Slack sent them back, if it did.
    pub blocks: Vec<Value>,
}

/// What a request body asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Click(Click),
    /// Nothing for gpu-reaper to do; the reason is logged.
    Ignored(String),
}

#[derive(Deserialize)]
struct Payload {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    user: Option<User>,
    #[serde(default)]
    response_url: Option<String>,
    #[serde(default)]
    actions: Vec<Action>,
    #[serde(default)]
    message: Option<Message>,
}

#[derive(Deserialize)]
struct User {
    id: String,
}

#[derive(Deserialize)]
struct Action {
    #[serde(default)]
    action_id: String,
    #[serde(default)]
    value: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    blocks: Vec<Value>,
}

/// PURE: reads Slack's form body (`payload=<json>`); the error says what is wrong.
pub fn parse_request(body: &[u8]) -> Result<Request, String> {
    let payload = url::form_urlencoded::parse(body)
        .find(|(k, _)| k == "payload")
        .map(|(_, v)| v.into_owned())
        .ok_or("the form body has no `payload` field")?;
    let payload: Payload = serde_json::from_str(&payload)
        .map_err(|e| format!("`payload` is not an interaction payload: {e}"))?;
    if payload.kind != "block_actions" {
        return Ok(Request::Ignored(format!(
            "payload type {:?} is not block_actions",
            payload.kind
        )));
    }
    let Some(action) = payload.actions.first() else {
        return Err("block_actions payload without actions".into());
    };
    let choice = match action.action_id.as_str() {
        KEEP_4H => Choice::Keep(SignedDuration::from_hours(4)),
        KEEP_24H => Choice::Keep(SignedDuration::from_hours(24)),
        NOT_MINE => Choice::NotMine,
        other => {
            return Ok(Request::Ignored(format!(
                "action {other:?} needs no answer"
            )));
        }
    };
    let value = ButtonValue::parse(action.value.as_deref().unwrap_or_default())?;
    let user = payload
        .user
        .map(|u| u.id)
        .filter(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric()))
        .ok_or("block_actions payload without a usable user.id")?;
    let response_url = payload
        .response_url
        .filter(|u| !u.is_empty())
        .ok_or("block_actions payload without response_url")?;
    Ok(Request::Click(Click {
        choice,
        value,
        user,
        response_url,
        blocks: payload.message.map(|m| m.blocks).unwrap_or_default(),
    }))
}

/// PURE: the message as it should read after the click: the original blocks without
/// the decision buttons, plus a context line saying what happened.
pub fn answered_blocks(original: &[Value], note: &str) -> Vec<Value> {
    let mut blocks: Vec<Value> = original
        .iter()
        .filter(|b| {
            b["block_id"] != DECISION_BLOCK
                && !(b["type"] == "actions"
                    && b["elements"].as_array().is_some_and(|els| {
                        els.iter().any(|e| {
                            [KEEP_4H, KEEP_24H, NOT_MINE]
                                .contains(&e["action_id"].as_str().unwrap_or(""))
                        })
                    }))
        })
        .cloned()
        .collect();
    blocks.push(json!({"type": "context", "elements": [{"type": "mrkdwn", "text": note}]}));
    blocks
}

/// What applying a click led to.
struct Applied {
    /// Applied; `false`: it failed and `note` says why.
    done: bool,
    note: String,
}

async fn policy(state: &InteractState, name: &str) -> Result<GpuPolicy, String> {
    match Api::<GpuPolicy>::all(state.client.clone())
        .get_opt(name)
        .await
    {
        Ok(Some(p)) => Ok(p),
        Ok(None) => Err(format!("GpuPolicy {name} no longer exists")),
        Err(e) => Err(format!("cannot read GpuPolicy {name}: {e}")),
    }
}

async fn keep(
    state: &InteractState,
    click: &Click,
    workload: &ObjectInfo,
    asked: SignedDuration,
    now: Timestamp,
) -> Result<Applied, String> {
    let policy = policy(state, &click.value.p).await?;
    let max = crate::engine::Rules::from_spec(&policy.spec).max_snooze;
    if max <= SignedDuration::ZERO {
        return Err(format!(
            "GpuPolicy {} allows no snooze (exemptions.maxSnooze is 0)",
            click.value.p
        ));
    }
    let granted = asked.min(max);
    // Whole seconds, rounded down: never past what maxSnooze allows.
    let until = Timestamp::from_second(now.as_second().saturating_add(granted.as_secs()))
        .map_err(|e| format!("cannot compute the snooze time: {e}"))?;
    let patch = json!({"metadata": {"annotations": {keys::SNOOZE_UNTIL: until.to_string()}}});
    merge_patch(
        &state.client,
        workload,
        &patch,
        format!("setting {} on {}", keys::SNOOZE_UNTIL, click.value.w),
    )
    .await
    .map_err(|e| match &e.source {
        kube::Error::Api(s) if s.code == 404 => format!("{} no longer exists", click.value.w),
        _ => e.to_string(),
    })?;
    inc(&state.counts.kept);
    let capped = granted < asked;
    if capped {
        inc(&state.counts.capped);
    }
    tracing::info!(workload = %click.value.w, user = %click.user, until = %until, capped, "kept from Slack");
    Ok(Applied {
        done: true,
        note: format!(
            ":white_check_mark: {} kept until {until} by <@{}>{}",
            mrkdwn_escape(&click.value.w),
            click.user,
            if capped {
                format!(
                    " (capped at policy {}'s maxSnooze of {})",
                    mrkdwn_escape(&click.value.p),
                    human_duration(max.as_secs())
                )
            } else {
                String::new()
            }
        ),
    })
}

async fn not_mine(
    state: &InteractState,
    click: &Click,
    workload: &ObjectInfo,
) -> Result<Applied, String> {
    let policy = policy(state, &click.value.p).await?;
    let Some(channel) = policy
        .spec
        .warn
        .slack_channel
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty())
    else {
        return Err(format!(
            "GpuPolicy {} has no warn.slackChannel to tell; ask your platform team to fix the owner of {}",
            click.value.p, click.value.w
        ));
    };
    // Where the owner came from, as the controller recorded it when it warned.
    let resolved = match api_for(&state.client, workload)
        .get_opt(&workload.name)
        .await
    {
        Ok(Some(o)) => o
            .metadata
            .annotations
            .and_then(|a| a.get(keys::NOTIFIED_OWNER).cloned())
            .unwrap_or_else(|| format!("an unknown source (no {})", keys::NOTIFIED_OWNER)),
        Ok(None) => "an unknown source (the workload no longer exists)".into(),
        Err(e) => format!("an unknown source (cannot read the workload: {e})"),
    };
    let text = format!(
        "<@{}> says {} is not theirs; owner was resolved from {} (policy {}). Set {} on the workload, its pods or its namespace to route its warnings.",
        click.user,
        mrkdwn_escape(&click.value.w),
        mrkdwn_escape(&resolved),
        mrkdwn_escape(&click.value.p),
        keys::OWNER
    );
    state
        .slack
        .post_message(channel, &json!({"text": text}))
        .await
        .map_err(|e| format!("could not tell {channel}: {e}"))?;
    inc(&state.counts.not_mine);
    tracing::info!(workload = %click.value.w, user = %click.user, channel, "not mine, from Slack");
    Ok(Applied {
        done: true,
        note: format!(
            ":wave: <@{}> said this is not theirs; {} was told.",
            click.user,
            mrkdwn_escape(channel)
        ),
    })
}

/// Applies a click and answers on its `response_url`.
async fn handle(state: InteractState, click: Click, now: Timestamp) {
    let workload = match click.value.workload() {
        Ok(w) => w,
        Err(e) => {
            // parse_request checked it; kept for the type.
            inc(&state.counts.failed);
            tracing::warn!(error = %e, "Slack click on an unreadable workload");
            return;
        }
    };
    let applied = match &click.choice {
        Choice::Keep(asked) => keep(&state, &click, &workload, *asked, now).await,
        Choice::NotMine => not_mine(&state, &click, &workload).await,
    };
    let applied = applied.unwrap_or_else(|e| {
        inc(&state.counts.failed);
        tracing::warn!(workload = %click.value.w, user = %click.user, error = %e, "Slack click not applied");
        Applied {
            done: false,
            note: format!(":warning: Could not do that: {}", mrkdwn_escape(&e)),
        }
    });
    let answer = if applied.done {
        let mut answer = json!({"replace_original": true, "text": applied.note});
        if !click.blocks.is_empty() {
            answer["blocks"] = answered_blocks(&click.blocks, &applied.note).into();
        }
        answer
    } else {
        // Only the clicker sees why; the buttons stay for another try.
        json!({"response_type": "ephemeral", "replace_original": false, "text": applied.note})
    };
    if let Err(e) = state.slack.respond(&click.response_url, &answer).await {
        tracing::warn!(workload = %click.value.w, error = %e, "could not answer the Slack click on its response_url");
    }
}

async fn interactivity(
    State(state): State<InteractState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let now = (state.clock)();
    if let Err(refusal) = authenticate(&state, &headers, &body, now).await {
        tracing::warn!(status = %refusal.status, reason = %refusal.reason, "Slack interaction refused");
        return (refusal.status, format!("{}\n", refusal.reason)).into_response();
    }
    let click = match parse_request(&body) {
        Ok(Request::Click(click)) => click,
        Ok(Request::Ignored(why)) => {
            inc(&state.counts.ignored);
            tracing::debug!(reason = %why, "Slack interaction ignored");
            return StatusCode::OK.into_response();
        }
        Err(why) => {
            inc(&state.counts.malformed);
            tracing::warn!(reason = %why, "malformed Slack interaction");
            return (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response();
        }
    };
    let work = tokio::spawn(handle(state, click, now));
    // Slack shows the clicker an error after 3 s without an answer; the work goes on.
    let _ = tokio::time::timeout(ANSWER_WITHIN, work).await;
    StatusCode::OK.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slacks_documented_example_signature_verifies() {
        // The worked example of Slack's "Verifying requests from Slack".
        let secret = b"8f742231b10e8888abcd99yyyzzz85a5";
        let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        let good = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
        assert!(signature_matches(secret, "1531420618", body, good));
        assert!(!signature_matches(secret, "1531420619", body, good));
        assert!(!signature_matches(b"other", "1531420618", body, good));
        assert!(!signature_matches(
            secret,
            "1531420618",
            body,
            &good.replace("v0=", "v1=")
        ));
        assert!(!signature_matches(secret, "1531420618", body, "v0=zz"));
        assert!(!signature_matches(secret, "1531420618", body, "v0=abc"));
    }

    #[test]
    fn a_signature_is_accepted_once_and_the_memory_stays_bounded() {
        let mut guard = ReplayGuard::default();
        assert!(guard.first_time("v0=aa", 1000));
        assert!(!guard.first_time("v0=aa", 1001));
        // Long after it could pass the timestamp check, it is forgotten.
        assert!(guard.first_time("v0=bb", 1000 + 2 * MAX_SKEW_SECONDS + 1));
        assert!(!guard.seen.contains("v0=aa"));
        for i in 0..REPLAY_CAPACITY + 10 {
            guard.first_time(&format!("v0={i}"), 5000);
        }
        assert!(guard.order.len() <= REPLAY_CAPACITY);
        assert_eq!(guard.seen.len(), guard.order.len());
    }

    fn form(payload: &Value) -> Vec<u8> {
        url::form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &payload.to_string())
            .finish()
            .into_bytes()
    }

    fn click_payload(action_id: &str, value: &str) -> Value {
        json!({
            "type": "block_actions",
            "user": {"id": "U0ANA0001", "username": "ana"},
            "response_url": "https://hooks.slack.com/actions/T1/2/abc",
            "actions": [{"type": "button", "action_id": action_id, "value": value}],
            "message": {"blocks": [{"type": "header"}]},
        })
    }

    #[test]
    fn clicks_are_read_and_bad_payloads_named() {
        let value = r#"{"w":"ml/Deployment/chat","v":"apps/v1","p":"research"}"#;
        let Request::Click(click) = parse_request(&form(&click_payload(KEEP_24H, value))).unwrap()
        else {
            panic!("a click")
        };
        assert_eq!(click.choice, Choice::Keep(SignedDuration::from_hours(24)));
        assert_eq!(click.value.p, "research");
        assert_eq!(click.user, "U0ANA0001");
        assert_eq!(click.blocks.len(), 1);
        assert!(matches!(
            parse_request(&form(&click_payload("open_workload", ""))).unwrap(),
            Request::Ignored(_)
        ));
        assert!(matches!(
            parse_request(&form(&json!({"type": "view_submission"}))).unwrap(),
            Request::Ignored(_)
        ));
        for (body, why) in [
            (b"nothing=here".to_vec(), "no `payload`"),
            (b"payload=%7Bnot".to_vec(), "not an interaction payload"),
            (
                form(&json!({"type": "block_actions", "actions": []})),
                "without actions",
            ),
            (form(&click_payload(NOT_MINE, "{}")), "button value"),
            (
                form(&{
                    let mut p = click_payload(NOT_MINE, value);
                    p["user"]["id"] = "<!channel>".into();
                    p
                }),
                "user.id",
            ),
        ] {
            let err = parse_request(&body).unwrap_err();
            assert!(err.contains(why), "{why}: {err}");
        }
    }

    #[test]
    fn the_answered_message_loses_its_decision_buttons_only() {
        let original = vec![
            json!({"type": "header", "text": {"type": "plain_text", "text": "Idle"}}),
            json!({"type": "actions", "block_id": "gpu_reaper_link", "elements": [{"type": "button", "action_id": "open_workload", "url": "https://x"}]}),
            json!({"type": "actions", "block_id": "renamed-by-slack", "elements": [{"type": "button", "action_id": KEEP_4H}]}),
            json!({"type": "actions", "block_id": DECISION_BLOCK, "elements": []}),
        ];
        let blocks = answered_blocks(&original, "kept");
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[1]["block_id"], "gpu_reaper_link");
        assert_eq!(blocks[2]["elements"][0]["text"], "kept");
    }
}
