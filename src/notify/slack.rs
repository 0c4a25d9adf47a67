//! Slack: warnings and reclaim notices as Block Kit messages, sent as a DM to the owner
//! (their Slack member IDs, or the members their email addresses belong to) or, with
//! nobody on Slack, to the policy's `warn.slackChannel` (docs/notifications.md#slack).
//!
//! IO edge over the Slack Web API (`chat.postMessage`, `users.lookupByEmail`) with
//! slack-morphism's typed client on a hyper connector whose rustls config is built here
//! (the process' ring provider, the platform's roots plus `--slack-ca-file`). The message
//! itself is built by the pure [`message_blocks`] from slack-morphism's Block Kit types;
//! warnings carry the "Keep 4h", "Keep 24h" and "Not mine" buttons whose clicks
//! `interact` handles. The bot token is re-read from its file on every send so a rotated
//! Secret is picked up without a restart.
//!
//! Failures map to [`Failure`]: rate limits (429 + `Retry-After`) are waited out up to a
//! bound (backon), then reported as `Retry` like 5xx answers and transport errors; Slack's
//! `channel_not_found` / `users_not_found` are `Unrouted` (retrying cannot help).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use backon::{ConstantBuilder, Retryable};
use futures::FutureExt;
use futures::future::BoxFuture;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use slack_morphism::api::{
    SlackApiChatPostMessageRequest, SlackApiPostWebhookMessageRequest,
    SlackApiUsersLookupByEmailRequest,
};
use slack_morphism::errors::SlackClientError;
use slack_morphism::hyper_tokio::SlackClientHyperConnector;
use slack_morphism::prelude::*;

use super::NotifyConfig;
use super::content::Kind;
use super::error::{NotifyError, Result};
use super::{Failure, Notification, Notifier, Personal};
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

/// How long one HTTP exchange with Slack may take, and connecting to it.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

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
    pub fn parse(value: &str) -> Result<Self> {
        let v: Self =
            serde_json::from_str(value).map_err(|source| NotifyError::ButtonJson { source })?;
        v.workload()?;
        if v.p.is_empty() {
            return Err(NotifyError::ButtonPolicy);
        }
        Ok(v)
    }

    /// The workload as the cluster actions address it (only identity fields are set).
    pub fn workload(&self) -> Result<ObjectInfo> {
        let mut parts = self.w.splitn(3, '/');
        let (Some(namespace), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(NotifyError::ButtonWorkload {
                workload: self.w.clone(),
                api_version: None,
            });
        };
        if [namespace, kind, name, &self.v]
            .iter()
            .any(|s| s.is_empty() || s.contains(char::is_whitespace))
            || name.contains('/')
        {
            return Err(NotifyError::ButtonWorkload {
                workload: self.w.clone(),
                api_version: Some(self.v.clone()),
            });
        }
        Ok(ObjectInfo {
            api_version: self.v.clone(),
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: String::new(),
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

fn plain(text: &str, max: usize) -> SlackBlockPlainTextOnly {
    SlackBlockPlainTextOnly::from(cap(text, max))
}

fn mrkdwn(text: &str, max: usize) -> SlackBlockMarkDownText {
    SlackBlockMarkDownText::new(cap(text, max))
}

fn button(label: &str, action_id: &str, value: &str) -> SlackActionBlockElement {
    SlackBlockButtonElement::new(plain(label, 75))
        .with_action_id(SlackActionId(action_id.to_string()))
        .with_value(value.to_string())
        .into()
}

/// A context block with one mrkdwn line (the answered-click note uses it too).
pub fn context_line(text: &str) -> SlackBlock {
    SlackContextBlock::new(vec![mrkdwn(text, 2000).into()]).into()
}

/// PURE: the Block Kit blocks of a personal notification — a header (the subject), the
/// text, the key facts as fields, a context line (policy, owner), a link to the workload
/// when `url` is set (and is a URL), and on warnings the Keep 4h / Keep 24h / Not mine
/// buttons.
pub fn message_blocks(n: &Notification, p: &Personal) -> Vec<SlackBlock> {
    let field = |name: &str| p.fields.get(name).map_or("", |v| v.trim());
    let joined = |parts: &[&str], sep: &str| {
        parts
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(sep)
    };
    let mut blocks: Vec<SlackBlock> = vec![
        SlackHeaderBlock::new(plain(&p.rendered.subject, 150)).into(),
        SlackSectionBlock::new()
            .with_text(plain(&p.rendered.text, 3000).into())
            .into(),
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
    let fields: Vec<SlackBlockText> = facts
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(label, v)| mrkdwn(&format!("*{label}*\n{}", mrkdwn_escape(v)), 2000).into())
        .collect();
    if !fields.is_empty() {
        blocks.push(SlackSectionBlock::new().with_fields(fields).into());
    }

    let owner = match field("owner") {
        "" => p.owner.describe(),
        o => o.to_string(),
    };
    blocks.push(context_line(&format!(
        "Policy *{}* · for {} · {}",
        mrkdwn_escape(&p.policy),
        mrkdwn_escape(&owner),
        n.reason
    )));

    let url = field("url");
    if let Some(url) = (url.len() <= 3000)
        .then(|| url::Url::parse(url).ok())
        .flatten()
    {
        let link = SlackBlockButtonElement::new(plain("Open workload", 75))
            .with_action_id(SlackActionId(OPEN_LINK.to_string()))
            .with_url(url);
        blocks.push(
            SlackActionsBlock::new(vec![link.into()])
                .with_block_id(SlackBlockId("gpu_reaper_link".to_string()))
                .into(),
        );
    }
    if p.kind == Kind::Warning {
        let value = ButtonValue::new(&n.workload, &p.policy).to_value();
        blocks.push(
            SlackActionsBlock::new(vec![
                button("Keep 4h", KEEP_4H, &value),
                button("Keep 24h", KEEP_24H, &value),
                button("Not mine", NOT_MINE, &value),
            ])
            .with_block_id(SlackBlockId(DECISION_BLOCK.to_string()))
            .into(),
        );
    }
    blocks
}

/// How connections to Slack leave the process: straight, or through an HTTP CONNECT
/// tunnel when the proxy settings name a proxy for the `https` destination (and
/// `NO_PROXY` does not exempt its host) — what reqwest did with the same variables.
#[derive(Clone, Debug)]
pub struct Egress {
    http: HttpConnector,
    proxies: Arc<Matcher>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<hyper::Uri> for Egress {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = BoxError;
    type Future =
        Pin<Box<dyn Future<Output = std::result::Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: hyper::Uri) -> Self::Future {
        let mut http = self.http.clone();
        let proxy = match dst.scheme_str() {
            // Plain http (a local --slack-api-url) is never proxied.
            Some("https") => self.proxies.intercept(&dst),
            _ => None,
        };
        match proxy {
            Some(proxy) => {
                let mut tunnel = Tunnel::new(proxy.uri().clone(), http);
                if let Some(auth) = proxy.basic_auth() {
                    tunnel = tunnel.with_auth(auth.clone());
                }
                Box::pin(async move {
                    std::future::poll_fn(|cx| tunnel.poll_ready(cx)).await?;
                    Ok(tunnel.call(dst).await?)
                })
            }
            None => Box::pin(async move { Ok(http.call(dst).await?) }),
        }
    }
}

/// The HTTPS connector for Slack: rustls on the process' ring provider, verifying with
/// the platform's roots (as reqwest does) plus the PEM bundle in `ca_file`; plain `http`
/// is allowed for a local `--slack-api-url`; `HTTPS_PROXY`/`ALL_PROXY`/`NO_PROXY` are
/// honoured. Errors name `flag`.
pub fn https_connector(
    ca_file: Option<&Path>,
    flag: &'static str,
) -> Result<HttpsConnector<Egress>> {
    https_connector_with_proxies(ca_file, flag, Matcher::from_env())
}

/// [`https_connector`] with the proxy settings given rather than read from the environment.
pub fn https_connector_with_proxies(
    ca_file: Option<&Path>,
    flag: &'static str,
    proxies: Matcher,
) -> Result<HttpsConnector<Egress>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = match ca_file {
        None => rustls_platform_verifier::Verifier::new(provider.clone()),
        Some(path) => {
            use rustls::pki_types::CertificateDer;
            use rustls::pki_types::pem::PemObject;
            let pem = std::fs::read(path).map_err(|source| NotifyError::File {
                flag,
                path: path.to_path_buf(),
                source,
            })?;
            let certs = CertificateDer::pem_slice_iter(&pem)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|source| NotifyError::Pem {
                    flag,
                    path: path.to_path_buf(),
                    source,
                })?;
            if certs.is_empty() {
                return Err(NotifyError::Invalid {
                    flag,
                    message: format!("{}: no CERTIFICATE block found", path.display()),
                });
            }
            rustls_platform_verifier::Verifier::new_with_extra_roots(certs, provider.clone())
        }
    }
    .map_err(|source| NotifyError::Tls { flag, source })?;
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| NotifyError::Tls { flag, source })?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(Egress {
            http,
            proxies: Arc::new(proxies),
        }))
}

/// Reads a secret file (token, signing secret) as every send does: trimmed, not empty.
/// The error names the flag and the file.
pub fn read_secret_file(path: &Path, flag: &'static str) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(|source| NotifyError::File {
        flag,
        path: path.to_path_buf(),
        source,
    })?;
    let text = text.trim().to_string();
    if text.is_empty() {
        return Err(NotifyError::EmptyFile {
            flag,
            path: path.to_path_buf(),
        });
    }
    Ok(text)
}

type Connector = SlackClientHyperConnector<HttpsConnector<Egress>>;

/// The part of `chat.postMessage`'s answer gpu-reaper needs. slack-morphism's own
/// response type also decodes the echoed message; a field it does not expect there must
/// not turn a delivered warning into a failure (and so a duplicate on retry).
#[derive(Debug, Deserialize)]
struct Posted {
    channel: Option<SlackChannelId>,
}

/// What is posted to an interaction's `response_url`: slack-morphism's webhook message
/// plus `response_type`, which its request type does not carry.
#[derive(Debug, Serialize)]
pub struct ResponseMessage {
    #[serde(flatten)]
    pub message: SlackApiPostWebhookMessageRequest,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_type: Option<SlackMessageResponseType>,
}

/// A Slack Web API client: slack-morphism's client on [`https_connector`], pointed at
/// `--slack-api-url`, and the token file. Cheap to clone (the client is shared).
#[derive(Clone)]
pub struct SlackApi {
    client: Arc<SlackClient<Connector>>,
    token_file: PathBuf,
    /// How many 429 answers are waited out per call before giving up.
    pub rate_limit_retries: usize,
    /// The longest `Retry-After` waited out; a longer one gives up at once.
    pub max_retry_after: Duration,
}

impl std::fmt::Debug for SlackApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackApi")
            .field("token_file", &self.token_file)
            .field("rate_limit_retries", &self.rate_limit_retries)
            .field("max_retry_after", &self.max_retry_after)
            .finish()
    }
}

/// One failed attempt of `method`: rate limited (wait and try again, within bounds) or
/// not.
fn attempt_error(method: &str, e: SlackClientError) -> NotifyError {
    let what = format!("Slack {method}");
    match e {
        SlackClientError::ApiError(api) => NotifyError::Slack {
            method: method.to_string(),
            code: api.code,
        },
        SlackClientError::RateLimitError(rate) => NotifyError::RateLimited {
            what,
            // No (or an unreadable) Retry-After: a second, as Slack's docs suggest.
            retry_after_s: rate.retry_after.map_or(1, |d| d.as_secs()).max(1),
            waited: 0,
        },
        SlackClientError::HttpError(http) => NotifyError::Http {
            what,
            status: http.status_code.to_string(),
            excerpt: http
                .http_response_body
                .as_deref()
                .map(|b| b.chars().take(200).collect::<String>().trim().to_string())
                .unwrap_or_default(),
        },
        source => NotifyError::Transport { what, source },
    }
}

impl SlackApi {
    /// `base_url` like `https://slack.com/api`; the token is read from `token_file` on
    /// every call.
    pub fn new(base_url: &str, token_file: PathBuf, https: HttpsConnector<Egress>) -> Self {
        let connector = SlackClientHyperConnector::with_connector(https)
            .with_slack_api_url(base_url.trim_end_matches('/'));
        Self {
            client: Arc::new(SlackClient::new(connector)),
            token_file,
            rate_limit_retries: 3,
            max_retry_after: Duration::from_secs(30),
        }
    }

    fn token(&self) -> Result<SlackApiToken> {
        let token = read_secret_file(&self.token_file, "--slack-token-file").map_err(|e| {
            NotifyError::Token {
                source: Box::new(e),
            }
        })?;
        Ok(SlackApiToken::new(SlackApiTokenValue(token)))
    }

    /// Runs `call` (one HTTP exchange, bounded by [`CALL_TIMEOUT`]), waiting out rate
    /// limits: each 429's `Retry-After`, at most `rate_limit_retries` times and only
    /// when it is within `max_retry_after`. Other failures return at once: the
    /// controller's delivery state retries them later.
    async fn with_rate_limits<T, F, Fut>(&self, method: &str, mut call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, SlackClientError>>,
    {
        let waited = AtomicUsize::new(0);
        let max_retry_after = self.max_retry_after;
        let attempt = || {
            let call = call();
            async move {
                match tokio::time::timeout(CALL_TIMEOUT, call).await {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(attempt_error(method, e)),
                    Err(_) => Err(NotifyError::Timeout {
                        what: format!("Slack {method}"),
                        seconds: CALL_TIMEOUT.as_secs(),
                    }),
                }
            }
        };
        let result = attempt
            .retry(ConstantBuilder::default().with_max_times(self.rate_limit_retries))
            .when(|e| matches!(e, NotifyError::RateLimited { .. }))
            .adjust(|e, next| match (e, next) {
                (NotifyError::RateLimited { retry_after_s, .. }, Some(_))
                    if Duration::from_secs(*retry_after_s) <= max_retry_after =>
                {
                    Some(Duration::from_secs(*retry_after_s))
                }
                _ => None,
            })
            .notify(|_, after| {
                waited.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    method,
                    retry_after_s = after.as_secs(),
                    "Slack rate limit; waiting"
                );
            })
            .await;
        result.map_err(|e| match e {
            NotifyError::RateLimited {
                what,
                retry_after_s,
                ..
            } => NotifyError::RateLimited {
                what,
                retry_after_s,
                waited: waited.load(Ordering::Relaxed),
            },
            e => e,
        })
    }

    /// `chat.postMessage` (JSON body). Returns the channel Slack posted in.
    pub async fn post_message(
        &self,
        channel: &str,
        content: SlackMessageContent,
    ) -> Result<String> {
        let token = self.token()?;
        let request =
            SlackApiChatPostMessageRequest::new(SlackChannelId(channel.to_string()), content)
                .with_unfurl_links(false)
                .with_unfurl_media(false);
        let posted: Posted = self
            .with_rate_limits("chat.postMessage", || {
                let session = self.client.open_session(&token);
                let request = &request;
                async move {
                    session
                        .http_session_api
                        .http_post("chat.postMessage", request, None)
                        .await
                }
            })
            .await?;
        Ok(posted.channel.map_or_else(|| channel.to_string(), |c| c.0))
    }

    /// `users.lookupByEmail`: the member ID, or `None` when nobody on the workspace has
    /// that address.
    pub async fn lookup_by_email(&self, email: &str) -> Result<Option<String>> {
        let token = self.token()?;
        let request = SlackApiUsersLookupByEmailRequest::new(EmailAddress(email.to_string()));
        match self
            .with_rate_limits("users.lookupByEmail", || {
                let session = self.client.open_session(&token);
                let request = &request;
                async move { session.users_lookup_by_email(request).await }
            })
            .await
        {
            Ok(answer) if !answer.user.id.0.is_empty() => Ok(Some(answer.user.id.0)),
            Ok(_) => Err(NotifyError::Answer {
                what: "Slack users.lookupByEmail".into(),
                message: "ok, but no user.id in the answer",
            }),
            Err(e) if e.is_unroutable() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Posts `answer` to an interaction's `response_url`. No token: the URL itself is
    /// the credential. Only `https` URLs are used.
    pub async fn respond(&self, response_url: &str, answer: &ResponseMessage) -> Result<()> {
        let url = url::Url::parse(response_url).map_err(|e| NotifyError::ResponseUrl {
            url: response_url.to_string(),
            message: e.to_string(),
        })?;
        if url.scheme() != "https" {
            return Err(NotifyError::ResponseUrl {
                url: response_url.to_string(),
                message: "is not https".into(),
            });
        }
        let span = tracing::Span::current();
        let _: serde_json::Value = self
            .with_rate_limits("response_url", || {
                let context = SlackClientApiCallContext {
                    rate_control_params: None,
                    token: None,
                    tracing_span: &span,
                    // The URL is a credential: slack-morphism logs it redacted.
                    is_sensitive_url: true,
                };
                self.client
                    .http_api
                    .connector
                    .http_post_uri(url.clone(), answer, context)
            })
            .await?;
        Ok(())
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
    pub fn from_config(args: &NotifyConfig) -> Result<Option<SlackNotifier>> {
        let Some(token_file) = &args.slack_token_file else {
            return Ok(None);
        };
        read_secret_file(token_file, "--slack-token-file")?;
        let base = url::Url::parse(&args.slack_api_url).map_err(|e| NotifyError::Invalid {
            flag: "--slack-api-url",
            message: format!("{:?}: {e}", args.slack_api_url),
        })?;
        if !matches!(base.scheme(), "https" | "http") {
            return Err(NotifyError::Invalid {
                flag: "--slack-api-url",
                message: format!("{:?}: must be an http(s) URL", args.slack_api_url),
            });
        }
        let https = https_connector(args.slack_ca_file.as_deref(), "--slack-ca-file")?;
        Ok(Some(Self::new(SlackApi::new(
            &args.slack_api_url,
            token_file.clone(),
            https,
        ))))
    }

    pub fn new(api: SlackApi) -> Self {
        Self { api }
    }

    /// The API client, shared with the interactivity handler.
    pub fn api(&self) -> &SlackApi {
        &self.api
    }

    async fn send(&self, n: &Notification, p: &Personal) -> std::result::Result<String, Failure> {
        let content = SlackMessageContent::new()
            .with_text(cap(&p.rendered.subject, 3000))
            .with_blocks(message_blocks(n, p));
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
            match self.api.post_message(id, content.clone()).await {
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
                .post_message(channel, content)
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

    fn notify<'a>(
        &'a self,
        n: &'a Notification,
    ) -> BoxFuture<'a, std::result::Result<String, Failure>> {
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
#[path = "slack_tests.rs"]
mod tests;
