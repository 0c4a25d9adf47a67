//! The Kubernetes Event notifier: an events.k8s.io/v1 Event on the root workload, visible
//! with `kubectl describe` and `kubectl get events`. Always on.

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::{Failure, Notification, Notifier, Severity};

/// Publishes notifications as Events (series of the same reason are aggregated by the
/// recorder, as the API server expects).
pub struct EventNotifier {
    recorder: Recorder,
}

impl EventNotifier {
    pub fn new(client: kube::Client, instance: &str) -> Self {
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "gpu-reaper".into(),
                    instance: Some(instance.to_string()),
                },
            ),
        }
    }
}

impl Notifier for EventNotifier {
    fn name(&self) -> &'static str {
        "event"
    }

    fn notify<'a>(&'a self, n: &'a Notification) -> BoxFuture<'a, Result<String, Failure>> {
        async move {
            let w = &n.workload;
            let reference = ObjectReference {
                api_version: Some(w.api_version.clone()),
                kind: Some(w.kind.clone()),
                name: Some(w.name.clone()),
                namespace: Some(w.namespace.clone()),
                ..ObjectReference::default()
            };
            let event = Event {
                type_: match n.severity {
                    Severity::Normal => EventType::Normal,
                    Severity::Warning => EventType::Warning,
                },
                reason: n.reason.into(),
                // The Events API caps the note at 1 kB.
                note: Some(n.message.chars().take(1000).collect()),
                action: n.reason.into(),
                secondary: None,
            };
            self.recorder
                .publish(&event, &reference)
                .await
                .map(|()| format!("Event on {}", w.key()))
                .map_err(|e| Failure::Retry(e.to_string()))
        }
        .boxed()
    }
}
