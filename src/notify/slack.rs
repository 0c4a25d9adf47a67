//! Slack: warnings and reclaim notices as Block Kit messages, sent as a DM to the owner
//! (their Slack member IDs, or the members their email addresses belong to) or, with
//! nobody on Slack, to the policy's `warn.slackChannel` (docs/notifications.md#slack).
//!
//! IO edge over the Slack Web API (`chat.postMessage`, `users.lookupByEmail`) with
//! reqwest on the process' rustls provider. The message itself is built by the pure
//! [`message_blocks`]; warnings carry the "Keep 4h", "Keep 24h" and "Not mine" buttons
//! whose clicks `interact` handles. The bot token is re-read from its file on every send
//! so a rotated Secret is picked up without a restart.
//!
//! Failures map to [`Failure`]: rate limits (429 + `Retry-After`) are waited out up to a
//! bound, then reported as `Retry` like 5xx answers and transport errors; Slack's
//! `channel_not_found` / `users_not_found` are `Unrouted` (retrying cannot help).

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::content::Kind;
use super::{Failure, Notification, Notifier, Personal};
use crate::cli::NotifyArgs;
use crate::cluster::inventory::ObjectInfo;

/// `action_id`s of the warning's buttons (what `interact` answers to).
pub const KEEP_4H: &str = "keep_4h";
pub const KEEP_24H: &str = "keep_24h";
pub const NOT_MINE: &str = "not_mine";
/// `action_id` of the link button; Slack reports its clicks too, and they are ignored.
pub const OPEN_LINK: &str = "open_workload";
/// `block_id` of the actions block with the Keep / Not mine buttons; answering a click
/// removes it from the message.
pub const DECISION_BLOCK: &str = "gpu_reaper_decision";

/// Slack error codes that mean "no such recipient": retrying cannot help until the owner
/// or the policy changes. (`user_not_found` is the older spelling of the lookup's error.)
const UNROUTABLE: &[&str] = &[
    "channel_not_found",
    "users_not_found",
    "user_not_found",
    "user_disabled",
];

/// Largest Slack answer read, bytes.
const MAX_ANSWER: usize = 1 << 20;

/// What a Keep / Not mine button carries: the workload and the policy that governs it.
/// Serialized compactly as `{"w":"ns/Kind/name","v":"apps/v1","p":"policy"}` (a button
/// value holds at most 2,000 characters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ButtonValue {
    /// `namespace/Kind/name`.
    pub w: String,
    /// apiVersion of the kind.
    pub v: String,
    /// GpuPolicy name.
    pub p: String,
}

impl ButtonValue {
    pub fn new(workload: &ObjectInfo, policy: &str) -> Self {
        Self {
            w: format!("{}/{}/{}", workload.namespace, workload.kind, workload.name),
            v: workload.api_version.clone(),
            p: policy.to_string(),
        }
    }

    pub fn to_value(&self) -> String {
        // Three strings always serialize.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses a button's `value`; the error says what is wrong with it.
    pub fn parse(value: &str) -> Result<Self, String> {
        let v: Self = serde_json::from_str(value)
            .map_err(|e| format!("button value is not {{\"w\",\"v\",\"p\"}} JSON: {e}"))?;
        v.workload()?;
        if v.p.is_empty() {
            return Err("button value names no policy".into());
        }
        Ok(v)
    }

    /// The workload as the cluster actions address it (only identity fields are set).
    pub fn workload(&self) -> Result<ObjectInfo, String> {
        let mut parts = self.w.splitn(3, '/');
        let (Some(namespace), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "button workload {:?} is not namespace/Kind/name",
                self.w
            ));
        };
        if [namespace, kind, name, &self.v]
            .iter()
            .any(|s| s.is_empty() || s.contains(char::is_whitespace))
            || name.contains('/')
        {
            return Err(format!(
                "button workload {:?} (apiVersion {:?}) is not namespace/Kind/name with an apiVersion",
                self.w, self.v
            ));
        }
        Ok(ObjectInfo {
            api_version: self.v.clone(),
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            owner: None,
            labels: Default::default(),
            annotations: Default::default(),
            created_at: jiff::Timestamp::UNIX_EPOCH,
            deleting: false,
        })
    }
}

/// Escapes the three characters Slack's mrkdwn reserves.
pub fn mrkdwn_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// At most `max` characters, with an ellipsis when cut (Block Kit rejects longer text).
fn cap(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn plain(text: &str, max: usize) -> Value {
    json!({"type": "plain_text", "text": cap(text, max)})
}

fn mrkdwn(text: &str, max: usize) -> Value {
    json!({"type": "mrkdwn", "text": cap(text, max)})
}

fn button(label: &str, action_id: &str, value: &str) -> Value {
    json!({"type": "button", "text": plain(label, 75), "action_id": action_id, "value": value})
}

/// PURE: the Block Kit blocks of a personal notification — a header (the subject), the
/// text, the key facts as fields, a context line (policy, owner), a link to the workload
/// when `url` is set, and on warnings the Keep 4h / Keep 24h / Not mine buttons.
pub fn message_blocks(n: &Notification, p: &Personal) -> Vec<Value> {
    let field = |name: &str| p.fields.get(name).map_or("", |v| v.trim());
    let joined = |parts: &[&str], sep: &str| {
        parts
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(sep)
    };
    let mut blocks = vec![
        json!({"type": "header", "text": plain(&p.rendered.subject, 150)}),
        json!({"type": "section", "text": plain(&p.rendered.text, 3000)}),
    ];

    let idle_for = field("idle_for");
    let idle_for = if idle_for.is_empty() {
        String::new()
    } else {
        format!("({idle_for})")
    };
    let wasted = match (field("wasted_usd"), field("hourly_usd")) {
        ("", "") => String::new(),
        (w, "") => format!("{w} USD"),
        ("", h) => format!("{h} USD/h"),
        (w, h) => format!("{w} USD ({h} USD/h)"),
    };
    let action_at = field("action_at");
    let action = match (p.kind, field("action"), action_at) {
        (Kind::Warning, a, at) if !a.is_empty() && !at.is_empty() => format!("{a} at {at}"),
        (_, a, _) => a.to_string(),
    };
    let facts = [
        ("GPUs", joined(&[field("gpus"), field("model")], " × ")),
        ("Idle since", joined(&[field("idle_since"), &idle_for], " ")),
        ("Shape", field("shape").to_string()),
        ("Wasted", wasted),
        (
            if p.kind == Kind::Warning {
                "Action"
            } else {
                "Done"
            },
            action,
        ),
    ];
    let fields: Vec<Value> = facts
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(label, v)| mrkdwn(&format!("*{label}*\n{}", mrkdwn_escape(v)), 2000))
        .collect();
    if !fields.is_empty() {
        blocks.push(json!({"type": "section", "fields": fields}));
    }

    let owner = match field("owner") {
        "" => p.owner.describe(),
        o => o.to_string(),
    };
    blocks.push(json!({"type": "context", "elements": [mrkdwn(
        &format!(
            "Policy *{}* · for {} · {}",
            mrkdwn_escape(&p.policy),
            mrkdwn_escape(&owner),
            n.reason
        ),
        2000,
    )]}));

    let url = field("url");
    if !url.is_empty() && url.len() <= 3000 {
        blocks.push(json!({"type": "actions", "block_id": "gpu_reaper_link", "elements": [
            {"type": "button", "text": plain("Open workload", 75), "action_id": OPEN_LINK, "url": url}
        ]}));
    }
    if p.kind == Kind::Warning {
        let value = ButtonValue::new(&n.workload, &p.policy).to_value();
        blocks.push(
            json!({"type": "actions", "block_id": DECISION_BLOCK, "elements": [
                button("Keep 4h", KEEP_4H, &value),
                button("Keep 24h", KEEP_24H, &value),
                button("Not mine", NOT_MINE, &value),
            ]}),
        );
    }
    blocks
}

/// Why a Slack Web API call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// Slack answered `ok: false` with this error code.
    Slack { method: String, error: String },
    /// No usable answer: transport error, rate limited beyond the bound, 5xx, an
    /// unreadable answer or token file. Retrying later may help.
    Transient(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Slack { method, error } => write!(f, "Slack {method}: {error}"),
            ApiError::Transient(s) => write!(f, "{s}"),
        }
    }
}

impl ApiError {
    /// "There is no such recipient" rather than "try again".
    pub fn is_unroutable(&self) -> bool {
        matches!(self, ApiError::Slack { error, .. } if UNROUTABLE.contains(&error.as_str()))
    }

    pub fn to_failure(&self) -> Failure {
        if self.is_unroutable() {
            Failure::Unrouted(self.to_string())
        } else {
            Failure::Retry(self.to_string())
        }
    }
}

/// A Slack Web API client: base URL, token file and an HTTP client trusting any extra CA.
/// Cheap to clone (the HTTP client is shared).
#[derive(Debug, Clone)]
pub struct SlackApi {
    base_url: String,
    token_file: PathBuf,
    http: reqwest::Client,
    /// How many 429 answers are waited out per call before giving up.
    pub rate_limit_retries: u32,
    /// The longest `Retry-After` waited out; a longer one gives up at once.
    pub max_retry_after: Duration,
}

/// An HTTP client on the process' rustls provider, trusting the PEM bundle in `ca_file`
/// too; errors name `flag`.
pub fn http_client(ca_file: Option<&Path>, flag: &str) -> Result<reqwest::Client, String> {
    let mut builder = crate::http::builder()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(5));
    if let Some(ca) = ca_file {
        builder = crate::http::trust_ca(builder, ca, flag)?;
    }
    builder
        .build()
        .map_err(|e| format!("cannot build the HTTP client for Slack: {e}"))
}

/// Reads a secret file (token, signing secret) as every send does: trimmed, not empty.
/// The error names the file.
pub fn read_secret_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = text.trim().to_string();
    if text.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(text)
}

impl SlackApi {
    /// `base_url` like `https://slack.com/api`; the token is read from `token_file` on
    /// every call.
    pub fn new(base_url: &str, token_file: PathBuf, http: reqwest::Client) -> Self {
        Self {
            base_url: base_url.trim_end_matches('/').to_string(),
            token_file,
            http,
            rate_limit_retries: 3,
            max_retry_after: Duration::from_secs(30),
        }
    }

    fn token(&self) -> Result<String, ApiError> {
        read_secret_file(&self.token_file)
            .map_err(|e| ApiError::Transient(format!("cannot read --slack-token-file {e}")))
    }

    /// Sends what `build` makes, waiting out rate limits (429 + `Retry-After`) up to the
    /// bound; a 2xx answer's body, or why there is none.
    async fn send(
        &self,
        what: &str,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<Vec<u8>, ApiError> {
        let mut waited = 0;
        loop {
            let response = build()
                .send()
                .await
                .map_err(|e| ApiError::Transient(format!("{what}: {e}")))?;
            let status = response.status();
            if status == StatusCode::TOO_MANY_REQUESTS {
                let after = response
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(1);
                let after = Duration::from_secs(after.max(1));
                if waited >= self.rate_limit_retries || after > self.max_retry_after {
                    return Err(ApiError::Transient(format!(
                        "{what}: rate limited by Slack (HTTP 429, retry after {}s; waited {waited} time(s))",
                        after.as_secs()
                    )));
                }
                waited += 1;
                tracing::info!(
                    what,
                    retry_after_s = after.as_secs(),
                    "Slack rate limit; waiting"
                );
                tokio::time::sleep(after).await;
                continue;
            }
            let body = response
                .bytes()
                .await
                .map_err(|e| ApiError::Transient(format!("{what}: reading the answer: {e}")))?;
            if !status.is_success() {
                let excerpt: String = String::from_utf8_lossy(&body[..body.len().min(200)])
                    .trim()
                    .to_string();
                return Err(ApiError::Transient(format!(
                    "{what}: HTTP {status}{}",
                    if excerpt.is_empty() {
                        String::new()
                    } else {
                        format!(" ({excerpt})")
                    }
                )));
            }
            if body.len() > MAX_ANSWER {
                return Err(ApiError::Transient(format!(
                    "{what}: answer larger than {MAX_ANSWER} bytes"
                )));
            }
            return Ok(body.to_vec());
        }
    }

    /// One Web API method: `ok: true` answers, or `ApiError::Slack` with Slack's code.
    async fn call(
        &self,
        method: &str,
        build: impl Fn(&str) -> reqwest::RequestBuilder,
    ) -> Result<Value, ApiError> {
        let token = self.token()?;
        let body = self
            .send(&format!("Slack {method}"), || build(&token))
            .await?;
        let answer: Value = serde_json::from_slice(&body).map_err(|e| {
            ApiError::Transient(format!("Slack {method}: the answer is not JSON: {e}"))
        })?;
        match answer["ok"].as_bool() {
            Some(true) => Ok(answer),
            Some(false) => Err(ApiError::Slack {
                method: method.to_string(),
                error: answer["error"]
                    .as_str()
                    .unwrap_or("unknown_error")
                    .to_string(),
            }),
            None => Err(ApiError::Transient(format!(
                "Slack {method}: the answer has no \"ok\" field"
            ))),
        }
    }

    /// `chat.postMessage` with a JSON body (`channel` plus `message`'s fields, e.g. `text`
    /// and `blocks`). Returns the channel Slack posted in.
    pub async fn post_message(&self, channel: &str, message: &Value) -> Result<String, ApiError> {
        let mut body = message.clone();
        body["channel"] = channel.into();
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let url = format!("{}/chat.postMessage", self.base_url);
        let answer = self
            .call("chat.postMessage", |token| {
                self.http
                    .post(&url)
                    .header(AUTHORIZATION, format!("Bearer {token}"))
                    .header(CONTENT_TYPE, "application/json; charset=utf-8")
                    .body(body.clone())
            })
            .await?;
        Ok(answer["channel"].as_str().unwrap_or(channel).to_string())
    }

    /// `users.lookupByEmail` (GET, the address as a query parameter): the member ID, or
    /// `None` when nobody on the workspace has that address.
    pub async fn lookup_by_email(&self, email: &str) -> Result<Option<String>, ApiError> {
        let mut url = url::Url::parse(&format!("{}/users.lookupByEmail", self.base_url))
            .map_err(|e| ApiError::Transient(format!("--slack-api-url: {e}")))?;
        url.query_pairs_mut().append_pair("email", email);
        match self
            .call("users.lookupByEmail", |token| {
                self.http
                    .get(url.clone())
                    .header(AUTHORIZATION, format!("Bearer {token}"))
            })
            .await
        {
            Ok(answer) => match answer["user"]["id"].as_str() {
                Some(id) if !id.is_empty() => Ok(Some(id.to_string())),
                _ => Err(ApiError::Transient(
                    "Slack users.lookupByEmail: ok, but no user.id in the answer".into(),
                )),
            },
            Err(e) if e.is_unroutable() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Posts `body` (JSON) to an interaction's `response_url`. No token: the URL itself
    /// is the credential. Only `https` URLs are used.
    pub async fn respond(&self, response_url: &str, body: &Value) -> Result<(), ApiError> {
        let url = url::Url::parse(response_url)
            .map_err(|e| ApiError::Transient(format!("response_url {response_url:?}: {e}")))?;
        if url.scheme() != "https" {
            return Err(ApiError::Transient(format!(
                "response_url {response_url:?} is not https"
            )));
        }
        let body = serde_json::to_vec(body).unwrap_or_default();
        self.send("Slack response_url", || {
            self.http
                .post(url.clone())
                .header(CONTENT_TYPE, "application/json; charset=utf-8")
                .body(body.clone())
        })
        .await
        .map(|_| ())
    }
}

/// The Slack channel of notifications.
#[derive(Debug, Clone)]
pub struct SlackNotifier {
    api: SlackApi,
}

impl SlackNotifier {
    /// `None` without `--slack-token-file`; an error naming the flag when the token or
    /// CA file cannot be read or the API URL is unusable.
    pub fn from_args(args: &NotifyArgs) -> Result<Option<SlackNotifier>, String> {
        let Some(token_file) = &args.slack_token_file else {
            return Ok(None);
        };
        read_secret_file(token_file).map_err(|e| format!("--slack-token-file {e}"))?;
        let base = url::Url::parse(&args.slack_api_url)
            .map_err(|e| format!("--slack-api-url {:?}: {e}", args.slack_api_url))?;
        if !matches!(base.scheme(), "https" | "http") {
            return Err(format!(
                "--slack-api-url {:?}: must be an http(s) URL",
                args.slack_api_url
            ));
        }
        let http = http_client(args.slack_ca_file.as_deref(), "--slack-ca-file")?;
        Ok(Some(Self::new(SlackApi::new(
            &args.slack_api_url,
            token_file.clone(),
            http,
        ))))
    }

    pub fn new(api: SlackApi) -> Self {
        Self { api }
    }

    /// The API client, shared with the interactivity handler.
    pub fn api(&self) -> &SlackApi {
        &self.api
    }

    async fn send(&self, n: &Notification, p: &Personal) -> Result<String, Failure> {
        let message = json!({
            "text": cap(&p.rendered.subject, 3000),
            "blocks": message_blocks(n, p),
            "unfurl_links": false,
            "unfurl_media": false,
        });
        // Who gets a DM: the owner's member IDs, else the members of their addresses.
        let mut recipients: Vec<String> = Vec::new();
        let mut notes: Vec<String> = Vec::new();
        for id in &p.owner.slack_ids {
            if !recipients.contains(id) {
                recipients.push(id.clone());
            }
        }
        if recipients.is_empty() {
            for email in &p.owner.emails {
                match self.api.lookup_by_email(email).await {
                    Ok(Some(id)) if !recipients.contains(&id) => recipients.push(id),
                    Ok(Some(_)) => {}
                    Ok(None) => notes.push(format!("{email} is not on Slack")),
                    // Falling back to the channel now would misroute a warning whose
                    // owner may well be on Slack: try again later.
                    Err(e) => return Err(Failure::Retry(e.to_string())),
                }
            }
        }
        let mut delivered = Vec::new();
        let mut transient: Option<String> = None;
        for id in &recipients {
            match self.api.post_message(id, &message).await {
                Ok(_) => delivered.push(id.as_str()),
                Err(e) if e.is_unroutable() => notes.push(format!("cannot DM {id}: {e}")),
                Err(e) => {
                    notes.push(format!("not delivered to {id}: {e}"));
                    transient.get_or_insert(e.to_string());
                }
            }
        }
        let notes_text = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join("; "))
        };
        if !delivered.is_empty() {
            // Delivered to someone: not retried, so nobody gets it twice.
            return Ok(format!("Slack DM to {}{notes_text}", delivered.join(", ")));
        }
        if let Some(e) = transient {
            return Err(Failure::Retry(e));
        }
        let why = if p.owner.is_nobody() {
            "no owner".to_string()
        } else if notes.is_empty() {
            "the owner has no Slack member ID or email".to_string()
        } else {
            notes.join("; ")
        };
        match p.slack_channel.as_deref().map(str::trim) {
            Some(channel) if !channel.is_empty() => self
                .api
                .post_message(channel, &message)
                .await
                .map(|posted| format!("Slack channel {channel} ({posted}): {why}"))
                .map_err(|e| e.to_failure()),
            _ => Err(Failure::Unrouted(format!(
                "nobody to message on Slack ({why}) and policy {} has no warn.slackChannel",
                p.policy
            ))),
        }
    }
}

impl Notifier for SlackNotifier {
    fn name(&self) -> &'static str {
        "slack"
    }

    fn notify<'a>(&'a self, n: &'a Notification) -> BoxFuture<'a, Result<String, Failure>> {
        async move {
            match &n.personal {
                Some(p) => self.send(n, p).await,
                None => Ok("not a personal notification".into()),
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::Severity;
    use crate::notify::content::{Fields, Templates};
    use crate::notify::owner::{self, OwnerSource};

    fn workload() -> ObjectInfo {
        ObjectInfo {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: "ml".into(),
            name: "chat".into(),
            owner: None,
            labels: Default::default(),
            annotations: Default::default(),
            created_at: jiff::Timestamp::UNIX_EPOCH,
            deleting: false,
        }
    }

    fn notification(kind: Kind, url: &str) -> Notification {
        let fields = Fields::from([
            ("workload", "ml/Deployment/chat".to_string()),
            ("gpus", "2".to_string()),
            ("model", "NVIDIA H100 80GB HBM3".to_string()),
            ("idle_since", "2026-11-29T10:00:00Z".to_string()),
            ("idle_for", "2h".to_string()),
            ("shape", "MemoryHeld".to_string()),
            ("wasted_usd", "16.00".to_string()),
            ("hourly_usd", "8.00".to_string()),
            ("action", "ScaleToZero".to_string()),
            ("action_at", "2026-11-29T13:00:00Z".to_string()),
            ("owner", "ana@example.com (from the workload)".to_string()),
            ("url", url.to_string()),
        ]);
        let rendered = Templates::default().render(kind, &fields);
        Notification {
            workload: workload(),
            reason: "IdleGpus",
            severity: Severity::Warning,
            message: rendered.text.clone(),
            personal: Some(Personal {
                kind,
                fields,
                rendered,
                owner: owner::parse("ana@example.com", OwnerSource::Workload),
                policy: "research".into(),
                slack_channel: Some("C0GPUS".into()),
            }),
        }
    }

    fn blocks_of(n: &Notification) -> Vec<Value> {
        message_blocks(n, n.personal.as_ref().unwrap())
    }

    #[test]
    fn a_warning_has_header_text_facts_context_link_and_three_buttons() {
        let n = notification(Kind::Warning, "https://grafana.example.com/d/ml/chat");
        let blocks = blocks_of(&n);
        let types: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "header", "section", "section", "context", "actions", "actions"
            ]
        );
        assert_eq!(
            blocks[0]["text"]["text"],
            "Idle GPUs: ml/Deployment/chat will be reclaimed at 2026-11-29T13:00:00Z"
        );
        let facts: Vec<&str> = blocks[2]["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["text"].as_str().unwrap())
            .collect();
        assert_eq!(
            facts,
            [
                "*GPUs*\n2 × NVIDIA H100 80GB HBM3",
                "*Idle since*\n2026-11-29T10:00:00Z (2h)",
                "*Shape*\nMemoryHeld",
                "*Wasted*\n16.00 USD (8.00 USD/h)",
                "*Action*\nScaleToZero at 2026-11-29T13:00:00Z",
            ]
        );
        let context = blocks[3]["elements"][0]["text"].as_str().unwrap();
        assert!(context.contains("Policy *research*"), "{context}");
        assert!(
            context.contains("ana@example.com (from the workload)"),
            "{context}"
        );
        assert_eq!(
            blocks[4]["elements"][0]["url"],
            "https://grafana.example.com/d/ml/chat"
        );
        let decision = &blocks[5];
        assert_eq!(decision["block_id"], DECISION_BLOCK);
        let ids: Vec<&str> = decision["elements"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["action_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [KEEP_4H, KEEP_24H, NOT_MINE]);
        let value = decision["elements"][0]["value"].as_str().unwrap();
        assert_eq!(
            value,
            r#"{"w":"ml/Deployment/chat","v":"apps/v1","p":"research"}"#
        );
        assert_eq!(
            ButtonValue::parse(value).unwrap().workload().unwrap().kind,
            "Deployment"
        );
    }

    #[test]
    fn a_reclaim_notice_has_no_buttons_and_no_link_without_url() {
        let n = notification(Kind::Reclaimed, "");
        let blocks = blocks_of(&n);
        assert!(blocks.iter().all(|b| b["type"] != "actions"), "{blocks:?}");
        let facts = blocks[2]["fields"].to_string();
        assert!(facts.contains("*Done*\\nScaleToZero"), "{facts}");
        assert!(!facts.contains(" at 2026"), "{facts}");
    }

    #[test]
    fn text_is_escaped_and_capped_to_block_kit_limits() {
        let mut n = notification(Kind::Warning, "");
        let p = n.personal.as_mut().unwrap();
        p.rendered.subject = "x".repeat(400);
        p.rendered.text = "y".repeat(5000);
        p.fields.insert("model", "A<B>&C".into());
        p.fields.insert("shape", String::new());
        let blocks = blocks_of(&n);
        assert_eq!(
            blocks[0]["text"]["text"].as_str().unwrap().chars().count(),
            150
        );
        assert_eq!(
            blocks[1]["text"]["text"].as_str().unwrap().chars().count(),
            3000
        );
        let facts = blocks[2]["fields"].to_string();
        assert!(facts.contains("A&lt;B&gt;&amp;C"), "{facts}");
        assert!(
            !facts.contains("Shape"),
            "empty facts are left out: {facts}"
        );
    }

    #[test]
    fn malformed_button_values_are_refused_with_a_reason() {
        for (value, why) in [
            ("nope", "not {"),
            (
                r#"{"w":"ml/chat","v":"apps/v1","p":"x"}"#,
                "namespace/Kind/name",
            ),
            (
                r#"{"w":"ml/Deployment/a/b","v":"apps/v1","p":"x"}"#,
                "namespace/Kind/name",
            ),
            (r#"{"w":"ml/Deployment/chat","v":"","p":"x"}"#, "apiVersion"),
            (
                r#"{"w":"ml/Deployment/chat","v":"apps/v1","p":""}"#,
                "no policy",
            ),
        ] {
            let err = ButtonValue::parse(value).unwrap_err();
            assert!(err.contains(why), "{value}: {err}");
        }
    }

    #[test]
    fn only_missing_recipients_are_unrouted() {
        let e = |error: &str| ApiError::Slack {
            method: "chat.postMessage".into(),
            error: error.into(),
        };
        assert!(matches!(
            e("channel_not_found").to_failure(),
            Failure::Unrouted(_)
        ));
        assert_eq!(
            e("invalid_auth").to_failure(),
            Failure::Retry("Slack chat.postMessage: invalid_auth".into())
        );
    }

    #[test]
    fn from_args_is_off_without_a_token_and_names_the_flag_on_errors() {
        let args = NotifyArgs {
            slack_api_url: "https://slack.com/api".into(),
            ..NotifyArgs::default()
        };
        assert!(SlackNotifier::from_args(&args).unwrap().is_none());
        let dir = tempfile::tempdir().unwrap();
        let missing = NotifyArgs {
            slack_token_file: Some(dir.path().join("absent")),
            ..args.clone()
        };
        let err = SlackNotifier::from_args(&missing).unwrap_err();
        assert!(err.starts_with("--slack-token-file "), "{err}");
        let token = dir.path().join("token");
        std::fs::write(&token, "xoxb-1\n").unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate").unwrap();
        let bad_ca = NotifyArgs {
            slack_token_file: Some(token.clone()),
            slack_ca_file: Some(ca),
            ..args.clone()
        };
        let err = SlackNotifier::from_args(&bad_ca).unwrap_err();
        assert!(err.starts_with("--slack-ca-file "), "{err}");
        let ok = NotifyArgs {
            slack_token_file: Some(token),
            ..args
        };
        let notifier = SlackNotifier::from_args(&ok).unwrap().unwrap();
        assert_eq!(notifier.name(), "slack");
    }
}
