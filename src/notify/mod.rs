//! Telling people: every ladder step and every action goes through the [`Notifier`]s the
//! controller is given. The Kubernetes Event notifier (`events`) always runs; Slack
//! (`slack`) and email (`email`) carry the warnings and reclaim notices of the policies
//! that list them in `warn.channels`, to the owner `owner` resolves, with the content
//! `content` renders. Delivery state (sent once per idle period, retried on failure) is
//! the controller's: see `controller::deliver`. `interact` answers the Slack buttons and
//! counts their outcomes in `metrics`; `error` is the room's one error type.

pub mod content;
pub mod email;
pub mod error;
pub mod events;
pub mod interact;
pub mod metrics;
pub mod owner;
pub mod slack;

use std::path::PathBuf;

use futures::future::BoxFuture;

use crate::cluster::inventory::ObjectInfo;
pub use email::SmtpSecurity;
pub use error::NotifyError;

/// Slack and email settings (docs/notifications.md), typed once by the command's edge
/// from the flags. A channel without its settings is off; a policy that asks for it then
/// records the failure in metrics and its status. Errors name the flag to fix.
#[derive(Debug, Clone, Default)]
pub struct NotifyConfig {
    /// File holding the Slack bot token (xoxb-…), re-read on every send.
    pub slack_token_file: Option<PathBuf>,
    /// File holding the Slack app's signing secret (verifies interactive payloads).
    pub slack_signing_secret_file: Option<PathBuf>,
    /// Slack Web API base URL.
    pub slack_api_url: String,
    /// Extra CA bundle (PEM) to trust for the Slack API URL.
    pub slack_ca_file: Option<PathBuf>,
    /// SMTP server host; email is off without it.
    pub smtp_host: Option<String>,
    /// SMTP port (None: 587 for starttls, 465 for tls, 25 for none).
    pub smtp_port: Option<u16>,
    pub smtp_security: SmtpSecurity,
    /// Extra CA bundle (PEM) to trust for the SMTP server.
    pub smtp_ca_file: Option<PathBuf>,
    /// SMTP user (with `smtp_password_file`).
    pub smtp_user: Option<String>,
    /// File holding the SMTP password, re-read on every send.
    pub smtp_password_file: Option<PathBuf>,
    /// From address of warning emails.
    pub smtp_from: String,
}

/// How loud a notification is (the Event type; a chat message's colour).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

/// One thing to tell a workload's owner.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// The root workload it is about.
    pub workload: ObjectInfo,
    /// Short PascalCase reason: `IdleGpus`, `WouldReclaim`, `Reclaimed`, `ReclaimRefused`,
    /// `ReclaimUnsupported`, `ReclaimFailed`, `Woken`, `RestoredByOwner`.
    pub reason: &'static str,
    pub severity: Severity,
    /// The sentence(s) a person reads: what, since when, what happens next, how to keep it.
    pub message: String,
    /// For Slack and email: the full content and who it is for. `None`: Event only.
    pub personal: Option<Personal>,
}

/// A warning or reclaim notice addressed to a person.
#[derive(Debug, Clone, PartialEq)]
pub struct Personal {
    pub kind: content::Kind,
    /// The values of every template field (content::FIELDS).
    pub fields: content::Fields,
    /// The subject and plain text, from the (possibly overridden) templates.
    pub rendered: content::Rendered,
    pub owner: owner::Owner,
    /// The governing policy's name (Slack buttons carry it to find `maxSnooze`).
    pub policy: String,
    /// The policy's `warn.slackChannel`.
    pub slack_channel: Option<String>,
}

/// Why a notification was not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Worth retrying later (server down, rate limited, 5xx…).
    Retry(String),
    /// Nobody to send it to on this channel (no owner address, no fallback channel):
    /// retrying cannot help until the owner annotation or the policy changes.
    Unrouted(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Retry(s) => write!(f, "{s}"),
            Failure::Unrouted(s) => write!(f, "not routed: {s}"),
        }
    }
}

/// A channel notifications are sent through.
pub trait Notifier: Send + Sync {
    /// Name for logs and metrics (`event`, `slack`, `email`).
    fn name(&self) -> &'static str;
    /// Sends one notification; `Ok` says to whom, an error why it was not delivered.
    fn notify<'a>(
        &'a self,
        notification: &'a Notification,
    ) -> BoxFuture<'a, Result<String, Failure>>;
    /// Sends again a notification whose first send may have happened (its result was
    /// never recorded). A channel that can tell delivers it at most once more (the
    /// Event: created if absent); the others send it again (at least once).
    fn resend<'a>(
        &'a self,
        notification: &'a Notification,
    ) -> BoxFuture<'a, Result<String, Failure>> {
        self.notify(notification)
    }
}
