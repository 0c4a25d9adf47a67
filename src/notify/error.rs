//! The notify room's one error type. Start-up errors name the flag to fix; delivery
//! errors say what was tried against whom, and become a [`super::Failure`] (retry or
//! unrouted) at the `Notifier` boundary; interaction errors become the sentence the
//! clicker reads. Wrapped errors keep their cause as `#[source]`.

use std::path::PathBuf;

use slack_morphism::errors::SlackClientError;

/// Slack error codes that mean "no such recipient": retrying cannot help until the owner
/// or the policy changes. (`user_not_found` is the older spelling of the lookup's error.)
const UNROUTABLE: &[&str] = &[
    "channel_not_found",
    "users_not_found",
    "user_not_found",
    "user_disabled",
];

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    // ---- configuration (start-up; each names its flag) ------------------------------
    /// A flag's value is unusable; `message` says why (it starts with the value).
    #[error("{flag} {message}")]
    Invalid { flag: &'static str, message: String },
    /// A file named by a flag (token, signing secret, password, CA) cannot be read.
    #[error("{flag} {}: {source}", path.display())]
    File {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A secret file holds nothing but whitespace.
    #[error("{flag} {}: the file is empty", path.display())]
    EmptyFile { flag: &'static str, path: PathBuf },
    /// A CA file is not a PEM bundle rustls can use.
    #[error("{flag} {}: not a PEM certificate bundle ({source})", path.display())]
    Pem {
        flag: &'static str,
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    /// The TLS set-up for an HTTPS or SMTP client failed.
    #[error("{flag}: cannot set up TLS ({source})")]
    Tls {
        flag: &'static str,
        source: rustls::Error,
    },
    /// lettre refused the SMTP TLS parameters.
    #[error("{flag}: cannot set up TLS ({source})")]
    SmtpTls {
        flag: &'static str,
        source: lettre::transport::smtp::Error,
    },
    /// A templates file is not YAML of the expected shape.
    #[error(
        "{file}: not a templates file ({source}); expected `warning:` and/or `reclaimed:` with `subject` and `text`"
    )]
    TemplatesFile {
        file: String,
        source: serde_yaml::Error,
    },
    /// A template names a field that does not exist.
    #[error("{file}: {template} uses {{{field}}}, which is not a field; use one of {known}")]
    UnknownField {
        file: String,
        template: String,
        field: String,
        known: String,
    },

    // ---- Slack Web API --------------------------------------------------------------
    /// Slack answered `ok: false` with this error code.
    #[error("Slack {method}: {code}")]
    Slack { method: String, code: String },
    /// HTTP 429 for longer than gpu-reaper waits, or more often.
    #[error(
        "{what}: rate limited by Slack (HTTP 429, retry after {retry_after_s}s; waited {waited} time(s))"
    )]
    RateLimited {
        what: String,
        retry_after_s: u64,
        waited: usize,
    },
    /// A non-2xx answer other than 429.
    #[error("{what}: HTTP {status}{}", if excerpt.is_empty() { String::new() } else { format!(" ({excerpt})") })]
    Http {
        what: String,
        status: String,
        excerpt: String,
    },
    /// No usable answer: connection, TLS, an unreadable body.
    #[error("{what}: {source}")]
    Transport {
        what: String,
        source: SlackClientError,
    },
    /// No answer within the bound.
    #[error("{what}: no answer within {seconds} s")]
    Timeout { what: String, seconds: u64 },
    /// An `ok: true` answer without what it should carry.
    #[error("{what}: {message}")]
    Answer { what: String, message: &'static str },
    /// An interaction's `response_url` gpu-reaper will not post to.
    #[error("response_url {url:?}: {message}")]
    ResponseUrl { url: String, message: String },
    /// The bot token could not be read at send time.
    #[error("cannot read {source}")]
    Token { source: Box<NotifyError> },

    // ---- interactivity ----------------------------------------------------------------
    /// The form body has no `payload` field.
    #[error("the form body has no `payload` field")]
    NoPayload,
    /// `payload` is not JSON of an interaction.
    #[error("`payload` is not an interaction payload: {source}")]
    Payload { source: serde_json::Error },
    /// A block_actions payload lacks a part the click needs.
    #[error("block_actions payload without {0}")]
    Incomplete(&'static str),
    /// A button value that is not gpu-reaper's JSON.
    #[error("button value is not {{\"w\",\"v\",\"p\"}} JSON: {source}")]
    ButtonJson { source: serde_json::Error },
    /// A button value whose workload is not `namespace/Kind/name` with an apiVersion.
    #[error("button workload {workload:?}{} is not namespace/Kind/name{}",
        api_version.as_ref().map(|v| format!(" (apiVersion {v:?})")).unwrap_or_default(),
        if api_version.is_some() { " with an apiVersion" } else { "" })]
    ButtonWorkload {
        workload: String,
        api_version: Option<String>,
    },
    #[error("button value names no policy")]
    ButtonPolicy,
    #[error("GpuPolicy {name} no longer exists")]
    PolicyGone { name: String },
    #[error("cannot read GpuPolicy {name}: {source}")]
    PolicyRead { name: String, source: kube::Error },
    #[error(
        "GpuPolicy {name} cannot be read by this gpu-reaper ({problem}); fix the policy or upgrade gpu-reaper"
    )]
    PolicyUnreadable { name: String, problem: String },
    #[error("GpuPolicy {policy} allows no snooze (exemptions.maxSnooze is 0)")]
    NoSnooze { policy: String },
    #[error("cannot compute the snooze time: {source}")]
    SnoozeTime { source: jiff::Error },
    #[error("{workload} no longer exists")]
    WorkloadGone { workload: String },
    #[error("{source}")]
    Patch {
        source: crate::cluster::actions::ActionError,
    },
    #[error(
        "GpuPolicy {policy} has no warn.slackChannel to tell; ask your platform team to fix the owner of {workload}"
    )]
    NoChannel { policy: String, workload: String },
    #[error("could not tell {channel}: {source}")]
    TellChannel {
        channel: String,
        source: Box<NotifyError>,
    },

    // ---- email --------------------------------------------------------------------------
    /// lettre could not build the message.
    #[error("building the email for {workload}: {source}")]
    EmailMessage {
        workload: String,
        source: lettre::error::Error,
    },
}

impl NotifyError {
    /// "There is no such recipient" rather than "try again".
    pub fn is_unroutable(&self) -> bool {
        matches!(self, NotifyError::Slack { code, .. } if UNROUTABLE.contains(&code.as_str()))
    }

    /// How the controller's delivery state treats it.
    pub fn to_failure(&self) -> super::Failure {
        if self.is_unroutable() {
            super::Failure::Unrouted(self.to_string())
        } else {
            super::Failure::Retry(self.to_string())
        }
    }
}

pub type Result<T, E = NotifyError> = std::result::Result<T, E>;
