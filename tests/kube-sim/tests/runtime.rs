//! kube-runtime against kube-sim: `watcher`, `reflector`, `metadata_watcher` and
//! `Controller` run without errors, converge, and recover from an injected 410 Gone,
//! a compacted history and dropped watch connections.

mod common;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube_sim::{Fault, KubeSim, Options};
use serde_json::json;
use tokio::sync::mpsc;

use common::SAFETY;

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

async fn sim() -> KubeSim {
    KubeSim::start_with(Options {
        bookmark_interval: Duration::from_millis(200),
        ..Options::default()
    })
    .await
    .expect("kube-sim starts")
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": "default"}, "data": {"k": "v"}}),
    )
    .unwrap()
}

/// Waits, one watcher event at a time, until `done()` holds.
async fn until(events: &mut mpsc::UnboundedReceiver<()>, what: &str, done: impl Fn() -> bool) {
    tokio::time::timeout(SAFETY, async {
        while !done() {
            events.recv().await.expect("watcher still running");
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

/// Runs a reflector over config maps in "default"; every watcher event pings `events`.
fn reflect(
    api: Api<ConfigMap>,
    config: watcher::Config,
) -> (
    reflector::Store<ConfigMap>,
    mpsc::UnboundedReceiver<()>,
    tokio::task::JoinHandle<()>,
) {
    let (reader, writer) = reflector::store();
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    (reader, rx, task)
}

#[tokio::test]
async fn a_reflector_recovers_from_an_injected_410_and_a_dropped_watch() {
    let sim = sim().await;
    for name in ["a", "b", "c"] {
        sim.seed(config_map(name)).unwrap();
    }
    let api: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    let (reader, mut events, task) = reflect(api.clone(), watcher::Config::default());
    tokio::time::timeout(SAFETY, reader.wait_until_ready())
        .await
        .expect("ready in time")
        .unwrap();
    assert_eq!(reader.state().len(), 3);

    // The next watch request gets a 410 ERROR event; cutting the open watch forces one.
    sim.add_fault(Fault::on(CONFIGMAPS).watch_only().status(410).times(1));
    sim.drop_watches();
    api.create(&PostParams::default(), &config_map("after-410"))
        .await
        .unwrap();
    until(&mut events, "after-410 in the cache", || {
        reader
            .get(&ObjectRef::new("after-410").within("default"))
            .is_some()
    })
    .await;
    assert_eq!(sim.fault_hits(), [1], "the 410 was served");
    assert_eq!(reader.state().len(), 4);
    task.abort();
}

#[tokio::test]
async fn a_reflector_relists_after_its_resource_version_is_compacted_away() {
    let sim = sim().await;
    sim.seed(config_map("a")).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    let (reader, mut events, task) = reflect(api.clone(), watcher::Config::default());
    tokio::time::timeout(SAFETY, reader.wait_until_ready())
        .await
        .expect("ready in time")
        .unwrap();

    // Keep the watcher away while things change, then compact the history.
    sim.add_fault(Fault::on(CONFIGMAPS).watch_only().status(500));
    sim.add_fault(Fault::on(CONFIGMAPS).non_watch_only()); // counts lists
    sim.drop_watches();
    api.create(&PostParams::default(), &config_map("while-away"))
        .await
        .unwrap();
    api.delete("a", &Default::default()).await.unwrap();
    sim.compact();
    sim.clear_faults();
    sim.add_fault(Fault::on(CONFIGMAPS).non_watch_only());
    until(&mut events, "the relisted cache", || {
        reader
            .get(&ObjectRef::new("while-away").within("default"))
            .is_some()
            && reader.get(&ObjectRef::new("a").within("default")).is_none()
    })
    .await;
    assert!(sim.fault_hits()[0] >= 1, "the watcher relisted after 410");
    task.abort();
}

#[tokio::test]
async fn a_streaming_list_watcher_gets_initial_events_then_changes() {
    let sim = sim().await;
    for name in ["a", "b"] {
        sim.seed(config_map(name)).unwrap();
    }
    let api: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    let (reader, mut events, task) =
        reflect(api.clone(), watcher::Config::default().streaming_lists());
    tokio::time::timeout(SAFETY, reader.wait_until_ready())
        .await
        .expect("ready in time")
        .unwrap();
    assert_eq!(reader.state().len(), 2);
    api.create(&PostParams::default(), &config_map("c"))
        .await
        .unwrap();
    until(&mut events, "c in the cache", || {
        reader.get(&ObjectRef::new("c").within("default")).is_some()
    })
    .await;
    task.abort();
}

#[tokio::test]
async fn a_metadata_only_watcher_sees_the_objects() {
    let sim = sim().await;
    sim.seed(config_map("m")).unwrap();
    let api: Api<PartialObjectMeta<ConfigMap>> =
        Api::namespaced(sim.client().await.unwrap(), "default");
    let stream = watcher(api, watcher::Config::default()).applied_objects();
    futures::pin_mut!(stream);
    let first = tokio::time::timeout(SAFETY, stream.next())
        .await
        .expect("event in time")
        .unwrap()
        .unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("m"));
}

struct Ctx {
    api: Api<ConfigMap>,
    reconciled: mpsc::UnboundedSender<String>,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let marked = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "annotations": {"gpu-reaper.test/seen": "yes"}}});
    ctx.api
        .patch(
            &name,
            &PatchParams::apply("test-controller"),
            &Patch::Apply(marked),
        )
        .await?;
    let _ = ctx.reconciled.send(name);
    Ok(Action::await_change())
}

fn error_policy(_: Arc<ConfigMap>, _: &kube::Error, _: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_millis(100))
}

#[tokio::test]
async fn a_controller_reconciles_every_object_through_410s_and_dropped_watches() {
    let sim = sim().await;
    sim.seed(config_map("one")).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    let (tx, mut reconciled) = mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx {
        api: api.clone(),
        reconciled: tx,
    });
    let (errors_tx, mut errors) = mpsc::unbounded_channel::<String>();
    let controller = tokio::spawn(
        Controller::new(api.clone(), watcher::Config::default())
            .run(reconcile, error_policy, ctx)
            .for_each(move |result| {
                if let Err(e) = &result {
                    let _ = errors_tx.send(e.to_string());
                }
                async {}
            }),
    );
    let mut wait_for = async |name: &str| {
        tokio::time::timeout(SAFETY, async {
            while reconciled.recv().await.expect("controller running") != name {}
        })
        .await
        .unwrap_or_else(|_| panic!("{name} was not reconciled in time"));
    };
    wait_for("one").await;
    sim.add_fault(Fault::on(CONFIGMAPS).watch_only().status(410).times(1));
    sim.drop_watches();
    api.create(&PostParams::default(), &config_map("two"))
        .await
        .unwrap();
    wait_for("two").await;
    sim.drop_watches();
    api.create(&PostParams::default(), &config_map("three"))
        .await
        .unwrap();
    wait_for("three").await;
    for name in ["one", "two", "three"] {
        let cm = sim.get("", "configmaps", "default", name).unwrap();
        assert_eq!(
            cm["metadata"]["annotations"]["gpu-reaper.test/seen"], "yes",
            "{name}"
        );
    }
    assert_eq!(sim.fault_hits(), [1]);
    // Reconcile errors would be failures of kube-sim; watcher errors from the
    // injected faults are expected and retried.
    while let Ok(e) = errors.try_recv() {
        assert!(!e.contains("reconciler"), "reconcile failed: {e}");
    }
    controller.abort();
}

#[tokio::test]
async fn the_event_recorder_creates_an_event_then_patches_its_series() {
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::Resource;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};

    let sim = sim().await;
    let client = sim.client().await.unwrap();
    let cm = sim.seed(config_map("watched")).unwrap();
    let cm: ConfigMap = serde_json::from_value(cm).unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "gpu-reaper".into(),
            instance: None,
        },
    );
    let event = Event {
        type_: EventType::Warning,
        reason: "GpuIdle".into(),
        note: Some("GPU 0 idle for 30m".into()),
        action: "Warn".into(),
        secondary: None,
    };
    let reference = cm.object_ref(&());
    tokio::time::timeout(SAFETY, recorder.publish(&event, &reference))
        .await
        .expect("in time")
        .unwrap();
    tokio::time::timeout(SAFETY, recorder.publish(&event, &reference))
        .await
        .expect("in time")
        .unwrap();
    let events: Api<K8sEvent> = Api::namespaced(client, "default");
    let list = events.list(&Default::default()).await.unwrap();
    assert_eq!(
        list.items.len(),
        1,
        "the second publish patches the first event"
    );
    let stored = &list.items[0];
    assert_eq!(stored.reason.as_deref(), Some("GpuIdle"));
    assert_eq!(stored.series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(
        stored.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("watched")
    );
}
