//! The Kubernetes Event notifier: an events.k8s.io/v1 Event on the root workload, visible
//! with `kubectl describe` (the Event names the workload by uid) and `kubectl get events`.
//! Always on.
//!
//! Why not kube's `Recorder`: it keys its series on (reason, action, object) and not on
//! the note, so a second `IdleGpus` or `Reclaimed` within minutes became a series count
//! on the first Event and the reader saw the first note — a warning's deadline from an
//! earlier period, the first action's details. Here an Event is one sentence: its name
//! is derived from the object's uid, the reason and the note ([`event_name`]), a new
//! sentence is a new Event, and only the very same sentence again (a restart, the other
//! replica) becomes a series update of the same Event, as the Events API intends. A
//! retry of a write whose result was never recorded (a warning's Event, after its leader
//! stopped) is [`EventWriter::publish_once`]: created if absent, else left as it is.

use futures::FutureExt;
use futures::future::BoxFuture;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use super::{Failure, Notification, Notifier, Severity};
use crate::cluster::inventory::ObjectInfo;

/// The Events API caps the note at 1 kB.
const NOTE_LIMIT: usize = 1000;

/// Writes Events, one per distinct sentence (the notifier below, and the controller's
/// Events on attestations and policies).
#[derive(Clone)]
pub struct EventWriter {
    client: kube::Client,
    instance: String,
}

/// Publishes notifications as Events through an [`EventWriter`].
pub struct EventNotifier {
    writer: EventWriter,
}

impl EventNotifier {
    pub fn new(client: kube::Client, instance: &str) -> Self {
        Self {
            writer: EventWriter::new(client, instance),
        }
    }
}

/// The note as written (at most [`NOTE_LIMIT`] bytes, cut on a character boundary).
pub fn note_of(message: &str) -> String {
    let mut end = message.len().min(NOTE_LIMIT);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_string()
}

/// FNV-1a, 64 bits: stable across builds and platforms (std's hasher is not).
fn fnv1a(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// The reference an Event about `w` carries: with its uid, so `kubectl describe` finds it.
pub fn reference_to(w: &ObjectInfo) -> ObjectReference {
    ObjectReference {
        api_version: Some(w.api_version.clone()),
        kind: Some(w.kind.clone()),
        name: Some(w.name.clone()),
        namespace: (!w.namespace.is_empty()).then(|| w.namespace.clone()),
        uid: (!w.uid.is_empty()).then(|| w.uid.clone()),
        ..ObjectReference::default()
    }
}

/// The Event's name: the object's name (cut to stay a valid DNS subdomain) and a digest
/// of what makes the sentence this one — the object (uid), the reason and the note. The
/// same sentence about the same object always has the same name.
pub fn event_name(regarding: &ObjectReference, reason: &str, note: &str) -> String {
    let field = |f: &Option<String>| f.clone().unwrap_or_default();
    let name = field(&regarding.name);
    let digest = fnv1a(&[
        &field(&regarding.uid),
        &field(&regarding.namespace),
        &field(&regarding.kind),
        &name,
        reason,
        note,
    ]);
    let mut prefix: String = name.chars().take(200).collect();
    while prefix.ends_with(['.', '-']) {
        prefix.pop();
    }
    if prefix.is_empty() {
        prefix = "gpu-reaper".into();
    }
    format!("{prefix}.{digest:016x}")
}

/// The Event first published at `now` (PURE). Events about cluster-scoped objects
/// (GpuPolicies) go to `default`, as kubectl's own do.
pub fn event_for(
    regarding: ObjectReference,
    reason: &str,
    severity: Severity,
    message: &str,
    instance: &str,
    now: Timestamp,
) -> Event {
    let note = note_of(message);
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(&regarding, reason, &note)),
            namespace: Some(
                regarding
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
            ),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some(reason.to_string()),
        reason: Some(reason.to_string()),
        note: Some(note),
        type_: Some(
            match severity {
                Severity::Normal => "Normal",
                Severity::Warning => "Warning",
            }
            .into(),
        ),
        regarding: Some(regarding),
        reporting_controller: Some("gpu-reaper".into()),
        reporting_instance: Some(instance.to_string()),
        ..Event::default()
    }
}

/// The series after one more occurrence of an existing Event at `now` (PURE).
pub fn next_series(existing: &Event, now: Timestamp) -> EventSeries {
    EventSeries {
        count: existing
            .series
            .as_ref()
            .map_or(1, |s| s.count)
            .saturating_add(1),
        last_observed_time: MicroTime(now),
    }
}

/// What writing a sentence that exists already does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Repeat {
    /// One more occurrence in its series.
    Count,
    /// Nothing: it was this write's own earlier attempt.
    Absent,
}

impl EventWriter {
    pub fn new(client: kube::Client, instance: &str) -> Self {
        Self {
            client,
            instance: instance.to_string(),
        }
    }

    /// Publishes one sentence about `regarding`: a new Event, or one more occurrence of
    /// the Event that already says exactly this.
    pub async fn publish(
        &self,
        regarding: ObjectReference,
        reason: &str,
        severity: Severity,
        message: &str,
    ) -> Result<(), kube::Error> {
        self.write(regarding, reason, severity, message, Repeat::Count)
            .await
    }

    /// Publishes a sentence that may already have been published once (a retry of a
    /// write whose result was never recorded): the Event is created if absent, and an
    /// existing one is left as it is — not one more occurrence.
    pub async fn publish_once(
        &self,
        regarding: ObjectReference,
        reason: &str,
        severity: Severity,
        message: &str,
    ) -> Result<(), kube::Error> {
        self.write(regarding, reason, severity, message, Repeat::Absent)
            .await
    }

    async fn write(
        &self,
        regarding: ObjectReference,
        reason: &str,
        severity: Severity,
        message: &str,
        repeat: Repeat,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let event = event_for(regarding, reason, severity, message, &self.instance, now);
        let name = event.metadata.name.clone().unwrap_or_default();
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        match events.create(&PostParams::default(), &event).await {
            Ok(_) => Ok(()),
            // The same sentence again (a retry, a restart, the other replica): one more
            // occurrence of that Event, not a new one.
            Err(kube::Error::Api(status)) if status.code == 409 && repeat == Repeat::Absent => {
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let existing = events.get(&name).await?;
                let patch = serde_json::json!({"series": next_series(&existing, now)});
                events
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
            }
            Err(e) => Err(e),
        }
    }
}

impl Notifier for EventNotifier {
    fn name(&self) -> &'static str {
        "event"
    }

    fn notify<'a>(&'a self, n: &'a Notification) -> BoxFuture<'a, Result<String, Failure>> {
        async move {
            self.writer
                .publish(reference_to(&n.workload), n.reason, n.severity, &n.message)
                .await
                .map(|()| format!("Event on {}", n.workload.key()))
                .map_err(|e| Failure::Retry(e.to_string()))
        }
        .boxed()
    }

    fn resend<'a>(&'a self, n: &'a Notification) -> BoxFuture<'a, Result<String, Failure>> {
        async move {
            self.writer
                .publish_once(reference_to(&n.workload), n.reason, n.severity, &n.message)
                .await
                .map(|()| format!("Event on {}", n.workload.key()))
                .map_err(|e| Failure::Retry(e.to_string()))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(uid: &str) -> ObjectInfo {
        ObjectInfo {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: "ml".into(),
            name: "chat".into(),
            uid: uid.into(),
            owner: None,
            labels: Default::default(),
            annotations: Default::default(),
            created_at: Timestamp::UNIX_EPOCH,
            deleting: false,
        }
    }

    fn event(w: &ObjectInfo, message: &str, instance: &str) -> Event {
        event_for(
            reference_to(w),
            "IdleGpus",
            Severity::Warning,
            message,
            instance,
            Timestamp::UNIX_EPOCH,
        )
    }

    #[test]
    fn an_event_names_its_workload_by_uid_so_describe_shows_it() {
        let e = event(&workload("4a1e-uid"), "idle", "pod-a");
        let r = e.regarding.unwrap();
        assert_eq!(r.uid.as_deref(), Some("4a1e-uid"));
        assert_eq!(r.kind.as_deref(), Some("Deployment"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reporting_instance.as_deref(), Some("pod-a"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("ml"));
    }

    #[test]
    fn a_new_sentence_is_a_new_event_and_the_same_sentence_the_same_event() {
        let w = workload("4a1e-uid");
        let first = event(&w, "due at 03:44", "a");
        let again = event(&w, "due at 03:44", "b");
        let later = event(&w, "due at 03:47", "a");
        assert_eq!(first.metadata.name, again.metadata.name);
        assert_ne!(first.metadata.name, later.metadata.name);
        assert_eq!(later.note.as_deref(), Some("due at 03:47"));
        // Another object of the same name (deleted and re-created) gets its own Event.
        let other = event(&workload("other-uid"), "due at 03:44", "a");
        assert_ne!(other.metadata.name, first.metadata.name);
    }

    #[test]
    fn a_repeated_event_counts_one_more_occurrence() {
        let at = Timestamp::UNIX_EPOCH;
        let mut e = event(&workload("u"), "x", "a");
        assert_eq!(next_series(&e, at).count, 2);
        e.series = Some(next_series(&e, at));
        assert_eq!(next_series(&e, at).count, 3);
    }

    #[test]
    fn names_stay_valid_for_long_workload_names_and_notes_stay_under_the_limit() {
        let mut w = workload("u");
        w.name = format!("{}-", "a".repeat(252));
        let e = event(&w, &"é".repeat(900), "a");
        let name = e.metadata.name.unwrap();
        assert!(name.len() <= 253, "{}", name.len());
        assert!(!name.contains("-."));
        assert!(e.note.unwrap().len() <= NOTE_LIMIT);
    }

    #[test]
    fn events_about_cluster_scoped_objects_go_to_default() {
        let mut w = workload("u");
        w.namespace = String::new();
        assert_eq!(
            event(&w, "x", "a").metadata.namespace.as_deref(),
            Some("default")
        );
    }
}
