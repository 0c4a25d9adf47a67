//! Slack interactivity: what happens when someone clicks "Keep 4h", "Keep 24h" or
//! "Not mine" on a warning (docs/notifications.md#slack-buttons).
//!
//! `POST /slack/interactivity` takes Slack's form body (`payload=<json>`) only once it is
//! authentic: slack-morphism's `SlackEventSignatureVerifier` checks the
//! `X-Slack-Signature` HMAC-SHA256 of `v0:<timestamp>:<body>` under the app's signing
//! secret (re-read on every request; compared in constant time) and that
//! `X-Slack-Request-Timestamp` is within 5 minutes of now; a signature seen before is a
//! replay (a bounded in-memory set). The payload's user, actions, `response_url` and
//! blocks are read as slack-morphism's types. A Keep writes `gpureaper.io/snooze-until` on the workload
//! (now + the asked time, capped by the policy's `exemptions.maxSnooze`); "Not mine"
//! tells the policy's `warn.slackChannel`. Either way the message is replaced through the
//! interaction's `response_url`, without its buttons, saying who did what. Every request's
//! outcome is counted in [`InteractionMetrics`].
//!
//! Touches: GpuPolicies (get), the workload named in the button (get, merge patch of one
//! annotation), the Slack Web API. Answers Slack 200 with an empty body once applied (or
//! after 2.5 s, Slack's patience being 3 s; the work then finishes in the background).

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
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
use serde_json::json;
use slack_morphism::api::SlackApiPostWebhookMessageRequest;
use slack_morphism::prelude::{
    SlackActionBlockElement, SlackBasicUserInfo, SlackBlock, SlackInteractionActionInfo,
    SlackMessageContent, SlackMessageResponseType, SlackResponseUrl, SlackSigningSecret,
};
use slack_morphism::signature_verifier::{
    SlackEventSignatureVerifier, SlackEventSignatureVerifierError,
};

use super::NotifyConfig;
use super::error::{NotifyError, Result};
pub use super::metrics::{InteractionMetrics, Outcome};
use super::slack::{
    ButtonValue, DECISION_BLOCK, KEEP_4H, KEEP_24H, NOT_MINE, ResponseMessage, SlackApi,
    SlackNotifier, context_line, mrkdwn_escape, read_secret_file,
};
use crate::api::keys;
use crate::api::policy::GpuPolicy;
use crate::cluster::actions::{api_for, merge_patch};
use crate::cluster::inventory::ObjectInfo;
use crate::engine::classify::human;

/// The path Slack's Interactivity Request URL points at.
pub const PATH: &str = "/slack/interactivity";
/// How far a request's timestamp may be from now (Slack's recommendation, and what
/// slack-morphism's verifier enforces).
pub const MAX_SKEW_SECONDS: i64 = SlackEventSignatureVerifier::MAX_TIMESTAMP_AGE_SECONDS;
/// Signatures remembered against replays.
const REPLAY_CAPACITY: usize = 10_000;
/// How long the handler waits for the work before answering Slack anyway.
const ANSWER_WITHIN: Duration = Duration::from_millis(2500);

/// A clock, injectable for tests.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

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
    metrics: InteractionMetrics,
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
            metrics: InteractionMetrics::default(),
            replays: Arc::default(),
        }
    }

    /// `None` without `--slack-signing-secret-file`; an error naming the flag when the
    /// file cannot be read or there is no Slack notifier (no `--slack-token-file`).
    pub fn from_config(
        args: &NotifyConfig,
        client: kube::Client,
        slack: Option<&SlackNotifier>,
    ) -> Result<Option<Self>> {
        let Some(secret) = &args.slack_signing_secret_file else {
            return Ok(None);
        };
        read_secret_file(secret, "--slack-signing-secret-file")?;
        let Some(slack) = slack else {
            return Err(NotifyError::Invalid {
                flag: "--slack-signing-secret-file",
                message:
                    "needs --slack-token-file: the buttons' answers are posted with the bot token"
                        .into(),
            });
        };
        Ok(Some(Self::new(secret.clone(), client, slack.api().clone())))
    }

    /// Counts into `metrics` (registered with the process' `/metrics`).
    pub fn with_metrics(mut self, metrics: InteractionMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The outcome counters.
    pub fn metrics(&self) -> &InteractionMetrics {
        &self.metrics
    }
}

/// The interactivity route, to merge into an HTTP listener that Slack can reach.
pub fn router(state: InteractState) -> Router {
    Router::new()
        .route(PATH, post(interactivity))
        .with_state(state)
}

/// What slack-morphism's verifier says of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Authentic,
    /// The signature does not match (or the secret is empty).
    BadSignature,
    /// The signature matches, but the timestamp is not within 5 minutes of now.
    Stale,
}

/// Slack's signature check, by slack-morphism: whether `signature` (`v0=<hex>`) is the
/// HMAC-SHA256 of `v0:<timestamp>:<body>` under `secret`, sent within 5 minutes of now.
pub fn verify(secret: &str, timestamp: &str, body: &str, signature: &str) -> Verdict {
    let verifier = SlackEventSignatureVerifier::new(&SlackSigningSecret(secret.to_string()));
    match verifier.verify(signature, body, timestamp) {
        Ok(()) => Verdict::Authentic,
        Err(SlackEventSignatureVerifierError::IncorrectOrExpiredTimestampError(_)) => {
            Verdict::Stale
        }
        Err(_) => Verdict::BadSignature,
    }
}

/// Why a request is refused before its body is read.
struct Refusal {
    status: StatusCode,
    outcome: Outcome,
    reason: &'static str,
}

fn refuse(status: StatusCode, outcome: Outcome, reason: &'static str) -> Refusal {
    Refusal {
        status,
        outcome,
        reason,
    }
}

async fn authenticate(
    state: &InteractState,
    headers: &HeaderMap,
    body: &[u8],
    now: Timestamp,
) -> std::result::Result<(), Refusal> {
    let unauthorized = StatusCode::UNAUTHORIZED;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let Some(timestamp) = header(SlackEventSignatureVerifier::SLACK_SIGNED_TIMESTAMP) else {
        return Err(refuse(
            unauthorized,
            Outcome::Stale,
            "no X-Slack-Request-Timestamp header",
        ));
    };
    if timestamp.parse::<i64>().is_err() {
        return Err(refuse(
            unauthorized,
            Outcome::Stale,
            "X-Slack-Request-Timestamp is not unix seconds",
        ));
    }
    let Some(signature) = header(SlackEventSignatureVerifier::SLACK_SIGNED_HASH_HEADER) else {
        return Err(refuse(
            unauthorized,
            Outcome::BadSignature,
            "no X-Slack-Signature header",
        ));
    };
    let secret = match tokio::task::spawn_blocking({
        let path = state.signing_secret_file.clone();
        move || read_secret_file(&path, "--slack-signing-secret-file")
    })
    .await
    {
        Ok(Ok(secret)) => secret,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "cannot read the signing secret; Slack interactions are refused");
            return Err(refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                Outcome::NoSecret,
                "the signing secret cannot be read",
            ));
        }
        Err(e) => {
            tracing::error!(error = %e, "reading the signing secret failed");
            return Err(refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                Outcome::NoSecret,
                "the signing secret cannot be read",
            ));
        }
    };
    // Slack's form bodies are ASCII; anything else is not what Slack signed.
    let Ok(body) = std::str::from_utf8(body) else {
        return Err(refuse(
            unauthorized,
            Outcome::BadSignature,
            "X-Slack-Signature does not match the body",
        ));
    };
    match verify(&secret, timestamp, body, signature) {
        Verdict::Authentic => {}
        Verdict::BadSignature => {
            return Err(refuse(
                unauthorized,
                Outcome::BadSignature,
                "X-Slack-Signature does not match the body",
            ));
        }
        Verdict::Stale => {
            return Err(refuse(
                unauthorized,
                Outcome::Stale,
                "X-Slack-Request-Timestamp is more than 5 minutes from now",
            ));
        }
    }
    let first = match state.replays.lock() {
        Ok(mut guard) => guard.first_time(signature, now.as_second()),
        Err(poisoned) => poisoned.into_inner().first_time(signature, now.as_second()),
    };
    if !first {
        return Err(refuse(
            unauthorized,
            Outcome::Replayed,
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

impl Choice {
    fn outcome(&self) -> Outcome {
        match self {
            Choice::Keep(asked) if *asked <= SignedDuration::from_hours(4) => Outcome::Kept4h,
            Choice::Keep(_) => Outcome::Kept24h,
            Choice::NotMine => Outcome::NotMine,
        }
    }
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
    pub blocks: Vec<SlackBlock>,
}

/// What a request body asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Click(Click),
    /// Nothing for gpu-reaper to do; the reason is logged.
    Ignored(String),
}

/// The `type` of a payload, read first: another type's fields may not fit [`Payload`].
#[derive(Deserialize)]
struct PayloadType {
    #[serde(rename = "type", default)]
    kind: String,
}

/// The parts of an interaction payload a click needs, each one slack-morphism's type.
/// The envelope is gpu-reaper's: slack-morphism's `SlackInteractionBlockActionsEvent`
/// also requires `team`, `api_app_id`, `container` and `trigger_id`, which nothing here
/// reads, and a click must not be refused for a field it does not use. Other interaction
/// types are answered 200 whether or not slack-morphism models them.
#[derive(Deserialize)]
struct Payload {
    #[serde(default)]
    user: Option<SlackBasicUserInfo>,
    #[serde(default)]
    response_url: Option<SlackResponseUrl>,
    #[serde(default)]
    actions: Vec<SlackInteractionActionInfo>,
    #[serde(default)]
    message: Option<PayloadMessage>,
}

/// The clicked message as Slack sends it back: only its Block Kit blocks are used.
#[derive(Deserialize)]
struct PayloadMessage {
    #[serde(default)]
    blocks: Vec<SlackBlock>,
}

/// PURE: reads Slack's form body (`payload=<json>`); the error says what is wrong.
pub fn parse_request(body: &[u8]) -> Result<Request> {
    let payload = url::form_urlencoded::parse(body)
        .find(|(k, _)| k == "payload")
        .map(|(_, v)| v.into_owned())
        .ok_or(NotifyError::NoPayload)?;
    let kind: PayloadType =
        serde_json::from_str(&payload).map_err(|source| NotifyError::Payload { source })?;
    if kind.kind != "block_actions" {
        return Ok(Request::Ignored(format!(
            "payload type {:?} is not block_actions",
            kind.kind
        )));
    }
    let event: Payload =
        serde_json::from_str(&payload).map_err(|source| NotifyError::Payload { source })?;
    let Some(action) = event.actions.first() else {
        return Err(NotifyError::Incomplete("actions"));
    };
    let choice = match action.action_id.0.as_str() {
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
    let user = event
        .user
        .map(|u| u.id.0)
        .filter(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric()))
        .ok_or(NotifyError::Incomplete("a usable user.id"))?;
    let response_url = event
        .response_url
        .map(|u| u.0.to_string())
        .ok_or(NotifyError::Incomplete("response_url"))?;
    Ok(Request::Click(Click {
        choice,
        value,
        user,
        response_url,
        blocks: event.message.map(|m| m.blocks).unwrap_or_default(),
    }))
}

/// Whether a block is the decision block: by its `block_id`, or (Slack may rename it) by
/// holding one of the Keep / Not mine buttons.
fn is_decision(block: &SlackBlock) -> bool {
    let ours = |id: Option<&str>| id.is_some_and(|id| [KEEP_4H, KEEP_24H, NOT_MINE].contains(&id));
    match block {
        SlackBlock::Actions(a) => {
            a.block_id.as_ref().is_some_and(|id| id.0 == DECISION_BLOCK)
                || a.elements.iter().any(|e| match e {
                    SlackActionBlockElement::Button(b) => {
                        ours(b.action_id.as_ref().map(|id| id.0.as_str()))
                    }
                    _ => false,
                })
        }
        SlackBlock::Unknown(v) => {
            v["block_id"] == DECISION_BLOCK
                || (v["type"] == "actions"
                    && v["elements"]
                        .as_array()
                        .is_some_and(|els| els.iter().any(|e| ours(e["action_id"].as_str()))))
        }
        _ => false,
    }
}

/// PURE: the message as it should read after the click: the original blocks without
/// the decision buttons, plus a context line saying what happened.
pub fn answered_blocks(original: &[SlackBlock], note: &str) -> Vec<SlackBlock> {
    let mut blocks: Vec<SlackBlock> = original
        .iter()
        .filter(|b| !is_decision(b))
        .cloned()
        .collect();
    blocks.push(context_line(note));
    blocks
}

/// What applying a click led to: the note for the message.
struct Applied {
    note: String,
}

async fn policy(state: &InteractState, name: &str) -> Result<GpuPolicy> {
    // Read untyped, then as the controller reads policies (`api::read_dynamic`): a policy
    // this gpu-reaper cannot read is an error naming the field, never a panic.
    let resource = kube::api::ApiResource::erase::<GpuPolicy>(&());
    match Api::<kube::api::DynamicObject>::all_with(state.client.clone(), &resource)
        .get_opt(name)
        .await
    {
        Ok(Some(p)) => {
            crate::api::read_dynamic(&p).map_err(|problem| NotifyError::PolicyUnreadable {
                name: name.into(),
                problem,
            })
        }
        Ok(None) => Err(NotifyError::PolicyGone { name: name.into() }),
        Err(source) => Err(NotifyError::PolicyRead {
            name: name.into(),
            source,
        }),
    }
}

async fn keep(
    state: &InteractState,
    click: &Click,
    workload: &ObjectInfo,
    asked: SignedDuration,
    now: Timestamp,
) -> Result<Applied> {
    let policy = policy(state, &click.value.p).await?;
    let max = crate::engine::Rules::from_spec(&policy.spec).max_snooze;
    if max <= SignedDuration::ZERO {
        return Err(NotifyError::NoSnooze {
            policy: click.value.p.clone(),
        });
    }
    let granted = asked.min(max);
    // Whole seconds, rounded down: never past what maxSnooze allows.
    let until = Timestamp::from_second(now.as_second().saturating_add(granted.as_secs()))
        .map_err(|source| NotifyError::SnoozeTime { source })?;
    let patch = json!({"metadata": {"annotations": {keys::SNOOZE_UNTIL: until.to_string()}}});
    merge_patch(
        &state.client,
        workload,
        &patch,
        format!("setting {} on {}", keys::SNOOZE_UNTIL, click.value.w),
    )
    .await
    .map_err(|e| match &e.source {
        kube::Error::Api(s) if s.code == 404 => NotifyError::WorkloadGone {
            workload: click.value.w.clone(),
        },
        _ => NotifyError::Patch { source: e },
    })?;
    let capped = granted < asked;
    if capped {
        state.metrics.record_capped();
    }
    tracing::info!(workload = %click.value.w, user = %click.user, until = %until, capped, "kept from Slack");
    Ok(Applied {
        note: format!(
            ":white_check_mark: {} kept until {until} by <@{}>{}",
            mrkdwn_escape(&click.value.w),
            click.user,
            if capped {
                format!(
                    " (capped at policy {}'s maxSnooze of {})",
                    mrkdwn_escape(&click.value.p),
                    human(jiff::SignedDuration::from_mins(max.as_secs().max(0) / 60))
                )
            } else {
                String::new()
            }
        ),
    })
}

async fn not_mine(state: &InteractState, click: &Click, workload: &ObjectInfo) -> Result<Applied> {
    let policy = policy(state, &click.value.p).await?;
    let Some(channel) = policy
        .spec
        .warn
        .slack_channel
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty())
    else {
        return Err(NotifyError::NoChannel {
            policy: click.value.p.clone(),
            workload: click.value.w.clone(),
        });
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
        .post_message(channel, SlackMessageContent::new().with_text(text))
        .await
        .map_err(|e| NotifyError::TellChannel {
            channel: channel.to_string(),
            source: Box::new(e),
        })?;
    tracing::info!(workload = %click.value.w, user = %click.user, channel, "not mine, from Slack");
    Ok(Applied {
        note: format!(
            ":wave: <@{}> said this is not theirs; {} was told.",
            click.user,
            mrkdwn_escape(channel)
        ),
    })
}

/// Applies a click, counts its outcome and answers on its `response_url`.
async fn handle(state: InteractState, click: Click, now: Timestamp) {
    let applied = match click.value.workload() {
        Ok(workload) => match &click.choice {
            Choice::Keep(asked) => keep(&state, &click, &workload, *asked, now).await,
            Choice::NotMine => not_mine(&state, &click, &workload).await,
        },
        // parse_request checked it; kept for the type.
        Err(e) => Err(e),
    };
    let answer = match applied {
        Ok(applied) => {
            state.metrics.record(click.choice.outcome());
            let mut content = SlackMessageContent::new().with_text(applied.note.clone());
            if !click.blocks.is_empty() {
                content = content.with_blocks(answered_blocks(&click.blocks, &applied.note));
            }
            ResponseMessage {
                message: SlackApiPostWebhookMessageRequest::new(content)
                    .with_replace_original(true),
                response_type: None,
            }
        }
        Err(e) => {
            state.metrics.record(match e {
                NotifyError::PolicyGone { .. } | NotifyError::WorkloadGone { .. } => {
                    Outcome::UnknownWorkload
                }
                _ => Outcome::Error,
            });
            tracing::warn!(workload = %click.value.w, user = %click.user, error = %e, "Slack click not applied");
            // Only the clicker sees why; the buttons stay for another try.
            let note = format!(
                ":warning: Could not do that: {}",
                mrkdwn_escape(&e.to_string())
            );
            ResponseMessage {
                message: SlackApiPostWebhookMessageRequest::new(
                    SlackMessageContent::new().with_text(note),
                )
                .with_replace_original(false),
                response_type: Some(SlackMessageResponseType::Ephemeral),
            }
        }
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
        state.metrics.record(refusal.outcome);
        tracing::warn!(status = %refusal.status, reason = refusal.reason, "Slack interaction refused");
        return (refusal.status, format!("{}\n", refusal.reason)).into_response();
    }
    let click = match parse_request(&body) {
        Ok(Request::Click(click)) => click,
        Ok(Request::Ignored(why)) => {
            state.metrics.record(Outcome::Ignored);
            tracing::debug!(reason = %why, "Slack interaction ignored");
            return StatusCode::OK.into_response();
        }
        Err(why) => {
            state.metrics.record(Outcome::Malformed);
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
#[path = "interact_tests.rs"]
mod tests;
