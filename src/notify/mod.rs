//! Telling people: every ladder step and every action goes through the [`Notifier`]s the
//! controller is given. The Kubernetes Event notifier (`events`) always runs; Slack and
//! email plug in here (their own issue).

pub mod events;

use futures::future::BoxFuture;

use crate::cluster::inventory::ObjectInfo;

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
}

/// A channel notifications are sent through.
pub trait Notifier: Send + Sync {
    /// Name for logs and metrics (`event`, `slack`, `email`).
    fn name(&self) -> &'static str;
    /// Sends one notification; an error says why it was not delivered.
    fn notify<'a>(&'a self, notification: &'a Notification) -> BoxFuture<'a, Result<(), String>>;
}
