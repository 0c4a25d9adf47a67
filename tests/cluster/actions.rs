//! The controller's actions on the real control plane (scripts/testenv: etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, kwok GPU nodes, and the Kueue
//! controller for the Kueue-aware suspend), and `gpu-reaper wake` restoring them. Each test
//! works in a namespace of its own; what gpu-reaper writes is then carried out by the real
//! controllers: the Deployment controller removes a scaled-down Deployment's pods and
//! brings them back, the Job controller deletes a suspended Job's pods, the disruption
//! controller computes the PodDisruptionBudget an eviction is checked against, and Kueue
//! evicts a deactivated Workload's Job. The third-party kinds (Kubeflow, KServe, KubeRay,
//! unknown CRDs) are served by minimal CRDs the real API server validates.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Mutex;

use common::cluster::{Cluster, PATIENCE, cluster, wait_until};
use futures::{StreamExt, TryStreamExt};
use gpu_reaper::api::policy::ActionType;
use gpu_reaper::cluster::actions::{self, Outcome, RestoreRecord, WorkerGroupRecord};
use gpu_reaper::cluster::inventory::{ObjectInfo, PodInfo, pod_info};
use gpu_reaper::gpus::GpuResources;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, WatchEvent, WatchParams};
use serde_json::{Value, json};

fn now() -> Timestamp {
    "2026-11-29T12:00:00Z".parse().unwrap()
}

/// A test's namespace on the shared cluster; deleted (with its pods, which hold GPUs) when
/// the test ends.
struct Ns {
    cluster: &'static Cluster,
    name: String,
}

impl Ns {
    fn new(test: &str) -> Self {
        let cluster = cluster();
        Ns {
            cluster,
            name: cluster.namespace(&format!("act-{test}"), &[]),
        }
    }

    /// Creates `object` in this namespace (`kubectl create`, so no last-applied
    /// annotation); what the server stored.
    fn create(&self, mut object: Value) -> Value {
        object["metadata"]["namespace"] = json!(self.name);
        let out = self.cluster.kubectl(
            &["create", "-o", "json", "-f", "-"],
            Some(&object.to_string()),
        );
        serde_json::from_str(&out).unwrap()
    }

    /// The stored object `resource`/`name` (kubectl's resource.group), which must exist.
    fn get(&self, resource: &str, name: &str) -> Value {
        self.try_get(resource, name)
            .unwrap_or_else(|| panic!("{resource} {}/{name} does not exist", self.name))
    }

    fn try_get(&self, resource: &str, name: &str) -> Option<Value> {
        self.cluster.get(resource, Some(&self.name), name)
    }

    /// Writes `status` through the status subresource (what the kind's controller would
    /// report; the server drops a status given at create).
    fn set_status(&self, resource: &str, name: &str, status: Value) {
        self.cluster.kubectl(
            &[
                "patch",
                resource,
                name,
                "-n",
                &self.name,
                "--subresource=status",
                "--type=merge",
                "-p",
                &json!({ "status": status }).to_string(),
            ],
            None,
        );
    }

    /// The pods of this namespace with `selector`, terminating ones included.
    fn pods(&self, selector: &str) -> Vec<Value> {
        self.cluster.list("pods", &self.name, Some(selector))
    }

    /// Waits until no pod with `selector` is left (the controller deleted them and the
    /// kwok node let them go).
    fn wait_no_pods(&self, selector: &str, who: &str) {
        wait_until(
            &format!("{who} to remove the pods {selector} of {}", self.name),
            || self.pods(selector).is_empty(),
        );
    }

    fn running(&self, selector: &str, count: usize) -> Vec<Value> {
        self.cluster.running_pods(&self.name, selector, count)
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = self
            .cluster
            .try_kubectl(&["delete", "namespace", &self.name, "--wait=false"], None);
    }
}

async fn client() -> kube::Client {
    cluster().client().await
}

fn deployment(name: &str, replicas: i32, annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "vllm/vllm-openai:v0.6.0",
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
    })
}

fn info(v: &Value) -> ObjectInfo {
    ObjectInfo::from_value(v).unwrap()
}

fn restore_of(v: &Value) -> RestoreRecord {
    serde_json::from_str(
        v["metadata"]["annotations"]["gpureaper.io/restore"]
            .as_str()
            .unwrap_or_else(|| panic!("no restore record: {v}")),
    )
    .unwrap()
}

fn annotations_of(v: &Value) -> serde_json::Map<String, Value> {
    v["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// A fixture manifest's text, from `../shared/fixtures/manifests` (read there, never
/// copied into the repository).
fn fixture(file: &str) -> String {
    let path = format!(
        "{}/../shared/fixtures/manifests/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("fixture {path} is needed (the shared fixtures next to the repository): {e}")
    })
}

/// The first document of a fixture manifest, its namespace left for [`Ns::create`].
fn manifest(file: &str) -> Value {
    use serde::Deserialize;
    let text = fixture(file);
    let mut object = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .find(|doc| !doc.is_null())
        .unwrap_or_else(|| panic!("{file} has no document"));
    object["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    object
}

/// A CRD for `kind` whose schema keeps whatever it is given (as the project's CRD would,
/// for the fields these tests touch), with `subresources` (`status`, and `scale` where
/// the real CRD has it).
fn crd(group: &str, version: &str, kind: &str, plural: &str, subresources: Value) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                 "versions": [{"name": version, "served": true, "storage": true,
                               "subresources": subresources,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]},
    })
}

/// Installs `crd` once per test binary (server-side, so other binaries re-applying it are
/// harmless) and waits until it is established.
fn install(crd: Value) {
    static DONE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let name = crd["metadata"]["name"].as_str().unwrap().to_string();
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if done.contains(&name) {
        return;
    }
    let cluster = cluster();
    cluster.kubectl(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&crd.to_string()),
    );
    cluster.wait_established(&[&name]);
    done.insert(name);
}

fn status() -> Value {
    json!({"status": {}})
}

#[tokio::test]
async fn scale_to_zero_records_the_replicas_first_and_wake_puts_them_back() {
    let ns = Ns::new("scale");
    let client = client().await;
    ns.create(deployment(
        "chat",
        3,
        json!({"gpureaper.io/warned-at": "2026-11-29T11:00:00Z"}),
    ));
    ns.running("app=chat", 3);
    let root = info(&ns.get("deployments.apps", "chat"));
    let outcome = actions::act(&client, ActionType::ScaleToZero, &root, &[], now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!(
            "scaled {}/Deployment/chat from 3 replicas to 0",
            ns.name
        ))
    );
    let after = ns.get("deployments.apps", "chat");
    assert_eq!(after["spec"]["replicas"], 0);
    assert_eq!(
        restore_of(&after),
        RestoreRecord {
            replicas: Some(3),
            state: gpu_reaper::cluster::actions::RestoreState::Done,
            ..RestoreRecord::default()
        }
    );
    assert_eq!(
        after["metadata"]["annotations"]["gpureaper.io/reaped-action"],
        "ScaleToZero"
    );
    assert_eq!(
        after["metadata"]["annotations"]["gpureaper.io/reaped-at"],
        "2026-11-29T12:00:00Z"
    );
    // The Deployment controller (through its ReplicaSet) removes the pods: the GPUs free.
    ns.wait_no_pods("app=chat", "the Deployment controller");

    // Acting again changes nothing and keeps the record.
    let again = actions::act(&client, ActionType::ScaleToZero, &info(&after), &[], now())
        .await
        .unwrap();
    assert!(matches!(again, Outcome::AlreadyDone(_)), "{again:?}");
    assert_eq!(
        restore_of(&ns.get("deployments.apps", "chat")).replicas,
        Some(3)
    );

    // `gpu-reaper wake` with kubectl's kubeconfig.
    assert_eq!(
        common::wake(
            &ns.cluster.kubeconfig,
            &format!("{}/Deployment/chat", ns.name)
        )
        .await,
        format!("scaled {}/Deployment/chat back to 3 replicas", ns.name)
    );
    let woken = ns.get("deployments.apps", "chat");
    assert_eq!(woken["spec"]["replicas"], 3);
    let annotations = woken["metadata"]["annotations"].as_object().unwrap();
    for gone in [
        "gpureaper.io/restore",
        "gpureaper.io/reaped-at",
        "gpureaper.io/reaped-action",
        "gpureaper.io/warned-at",
    ] {
        assert!(
            !annotations.contains_key(gone),
            "{gone} left: {annotations:?}"
        );
    }
    assert!(annotations.contains_key("gpureaper.io/woken-at"));
    // The pods are back, scheduled on the GPU nodes and running.
    ns.running("app=chat", 3);
}

#[tokio::test]
async fn a_controller_killed_between_the_restore_record_and_the_scale_finishes_without_losing_it() {
    let ns = Ns::new("killed");
    let client = client().await;
    // What a run killed right after its first write leaves: the record says pending, the
    // replicas are still up.
    let pending = json!({"gpureaper.io/restore": "{\"replicas\":4,\"state\":\"pending\"}",
                         "gpureaper.io/reaped-at": "2026-11-29T11:59:00Z",
                         "gpureaper.io/reaped-action": "ScaleToZero"});
    ns.create(deployment("chat", 4, pending));
    ns.running("app=chat", 4);
    let root = info(&ns.get("deployments.apps", "chat"));
    let outcome = actions::act(&client, ActionType::ScaleToZero, &root, &[], now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!(
            "scaled {}/Deployment/chat from 4 replicas to 0",
            ns.name
        ))
    );
    let after = ns.get("deployments.apps", "chat");
    assert_eq!(after["spec"]["replicas"], 0);
    assert_eq!(
        restore_of(&after),
        RestoreRecord {
            replicas: Some(4),
            state: gpu_reaper::cluster::actions::RestoreState::Done,
            ..RestoreRecord::default()
        }
    );
    // The first run's reclaim time is kept: it is one action, not two.
    assert_eq!(
        after["metadata"]["annotations"]["gpureaper.io/reaped-at"],
        "2026-11-29T11:59:00Z"
    );
    ns.wait_no_pods("app=chat", "the Deployment controller");
}

/// Request-driven inference under `action.inference.minReplicas`: scaled down to the
/// minimum, not to zero; the record says how many stayed, an interrupted action finishes
/// at the same minimum, and wake puts the full count back.
#[tokio::test]
async fn request_driven_inference_is_scaled_to_its_minimum_and_wake_restores_every_replica() {
    let ns = Ns::new("minimum");
    let client = client().await;
    ns.create(deployment("chat", 4, json!({})));
    ns.running("app=chat", 4);
    let root = info(&ns.get("deployments.apps", "chat"));
    let outcome = actions::scale_to_minimum(&client, &root, 1, now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!(
            "scaled {}/Deployment/chat from 4 replicas to 1",
            ns.name
        ))
    );
    let after = ns.get("deployments.apps", "chat");
    assert_eq!(after["spec"]["replicas"], 1);
    assert_eq!(
        restore_of(&after),
        RestoreRecord {
            replicas: Some(4),
            kept: Some(1),
            state: gpu_reaper::cluster::actions::RestoreState::Done,
            ..RestoreRecord::default()
        }
    );
    // The Deployment controller keeps exactly the one replica.
    wait_until("one pod of chat left", || ns.pods("app=chat").len() == 1);
    ns.running("app=chat", 1);
    // At the minimum already: nothing more to do.
    let again = actions::scale_to_minimum(&client, &info(&after), 1, now())
        .await
        .unwrap();
    assert_eq!(
        again,
        Outcome::AlreadyDone(format!(
            "{}/Deployment/chat already has 1 replicas",
            ns.name
        ))
    );
    let woken = actions::wake(&client, &info(&after), now()).await.unwrap();
    assert_eq!(
        woken,
        Outcome::Done(format!(
            "scaled {}/Deployment/chat back to 4 replicas",
            ns.name
        ))
    );
    assert_eq!(ns.get("deployments.apps", "chat")["spec"]["replicas"], 4);
    ns.running("app=chat", 4);

    // A run killed after its restore record: the next finishes at the recorded minimum,
    // whichever way it is called (the controller's housekeeping calls scale_to_zero).
    let pending =
        json!({"gpureaper.io/restore": "{\"replicas\":3,\"kept\":2,\"state\":\"pending\"}"});
    ns.create(deployment("embed", 3, pending));
    let root = info(&ns.get("deployments.apps", "embed"));
    let outcome = actions::scale_to_zero(&client, &root, now()).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!(
            "scaled {}/Deployment/embed from 3 replicas to 2",
            ns.name
        ))
    );
    assert_eq!(ns.get("deployments.apps", "embed")["spec"]["replicas"], 2);
    ns.running("app=embed", 2);

    // A kind with its own way to stop cannot keep replicas: said, not zeroed.
    let notebook = ObjectInfo {
        api_version: "kubeflow.org/v1".into(),
        kind: "Notebook".into(),
        ..info(&ns.get("deployments.apps", "embed"))
    };
    let outcome = actions::scale_to_minimum(&client, &notebook, 1, now())
        .await
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Unsupported(ref s) if s.contains("cannot keep 1 replicas")),
        "{outcome:?}"
    );
}

/// The first change to the Job after `rv` that touches its suspend flag or its restore
/// record (the Job controller's status writes in between are skipped).
async fn first_reclaim_write(jobs: &Api<Job>, name: &str, rv: &str) -> Job {
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    let mut events = jobs.watch(&params, rv).await.unwrap().boxed();
    let next = async {
        while let Some(event) = events.try_next().await.unwrap() {
            match event {
                WatchEvent::Modified(job) => {
                    let suspended = job.spec.as_ref().and_then(|s| s.suspend) == Some(true);
                    let recorded = job
                        .metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key("gpureaper.io/restore"));
                    if suspended || recorded {
                        return job;
                    }
                }
                WatchEvent::Bookmark(_) => {}
                other => panic!("watching Job {name}: {other:?}"),
            }
        }
        panic!("the watch of Job {name} ended")
    };
    tokio::time::timeout(PATIENCE, next)
        .await
        .expect("the suspend shows in the watch")
}

#[tokio::test]
async fn a_job_is_suspended_in_the_same_write_as_its_restore_record_and_resumed_by_wake() {
    let ns = Ns::new("suspend");
    let client = client().await;
    ns.create(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x",
                 "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}},
    }));
    ns.running("job-name=train", 1);
    let before = ns.get("jobs.batch", "train");
    let root = info(&before);
    let rv = before["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let outcome = actions::act(&client, ActionType::Suspend, &root, &[], now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!("suspended {}/Job/train", ns.name))
    );
    // One write: the first change after the one read carries both the flag and the record
    // (the Job controller's own status writes are all there is besides).
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let first = first_reclaim_write(&jobs, "train", &rv).await;
    assert_eq!(first.spec.as_ref().unwrap().suspend, Some(true));
    assert!(
        first
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("gpureaper.io/restore")),
        "suspended without the restore record: {:?}",
        first.metadata.annotations
    );
    let after = ns.get("jobs.batch", "train");
    assert_eq!(after["spec"]["suspend"], true);
    assert_eq!(restore_of(&after).suspend, Some(false));
    // The Job controller deletes the suspended Job's pod and says so.
    ns.wait_no_pods("job-name=train", "the Job controller");
    wait_until("the Job's Suspended condition", || {
        common::kueue::condition(&ns.get("jobs.batch", "train"), "Suspended") == Some(true)
    });

    let woken = actions::wake(&client, &info(&after), now()).await.unwrap();
    assert_eq!(
        woken,
        Outcome::Done(format!("resumed {}/Job/train", ns.name))
    );
    let resumed = ns.get("jobs.batch", "train");
    assert_eq!(resumed["spec"]["suspend"], false);
    assert!(
        resumed["metadata"]["annotations"]
            .get("gpureaper.io/restore")
            .is_none()
    );
    // The Job controller starts its pod again.
    ns.running("job-name=train", 1);
}

#[tokio::test]
async fn suspend_on_a_deployment_is_refused_with_the_alternative() {
    let ns = Ns::new("refused");
    let client = client().await;
    ns.create(deployment("chat", 1, json!({})));
    let root = info(&ns.get("deployments.apps", "chat"));
    let outcome = actions::act(&client, ActionType::Suspend, &root, &[], now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Unsupported(format!(
            "{}/Deployment/chat: Suspend works on Job, JobSet, RayJob, RayCluster, RayService and Kubeflow training jobs; use ScaleToZero or Evict for a Deployment",
            ns.name
        ))
    );
    assert_eq!(ns.get("deployments.apps", "chat")["spec"]["replicas"], 1);
    ns.running("app=chat", 1);
}

/// The PodDisruptionBudget's status once the disruption controller has computed it for
/// its current spec.
fn computed_budget(ns: &Ns, name: &str, allowed: i64) -> Value {
    let mut pdb = Value::Null;
    wait_until(
        &format!("the disruption controller to allow {allowed} disruptions of {name}"),
        || {
            pdb = ns.get("poddisruptionbudgets.policy", name);
            pdb["status"]["observedGeneration"] == pdb["metadata"]["generation"]
                && pdb["status"]["disruptionsAllowed"] == allowed
        },
    );
    pdb
}

#[tokio::test]
async fn eviction_refused_by_a_disruption_budget_is_reported_and_succeeds_once_allowed() {
    let ns = Ns::new("evict");
    // As the controller builds its client: no blanket retry of 429, so a PDB refusal
    // comes back at once and the next cycle retries.
    let kubeconfig = kube::config::Kubeconfig::read_from(&ns.cluster.kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    ns.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "nb-0", "labels": {"app": "nb"}},
        "spec": {"containers": [{"name": "c", "image": "jupyter", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }));
    ns.create(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "nb"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "nb"}}},
    }));
    let stored_pod = ns.running("app=nb", 1).remove(0);
    // The disruption controller sees the one healthy pod at minAvailable: none allowed.
    let pdb = computed_budget(&ns, "nb", 0);
    assert_eq!(pdb["status"]["currentHealthy"], 1);
    assert_eq!(pdb["status"]["desiredHealthy"], 1);
    let root = info(&stored_pod);
    let pods: Vec<PodInfo> = vec![pod_info(&stored_pod, &GpuResources::default(), now()).unwrap()];
    let outcome = actions::act(&client, ActionType::Evict, &root, &pods, now())
        .await
        .unwrap();
    let Outcome::Refused(text) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        text.starts_with(&format!(
            "evicted 0 of 1 pods of {}/Pod/nb-0; a PodDisruptionBudget refused the rest",
            ns.name
        )),
        "{text}"
    );
    let still = ns.get("pods", "nb-0");
    assert!(
        still["metadata"]["deletionTimestamp"].is_null(),
        "never forced"
    );
    // The budget is lifted: once the disruption controller allows it, the next cycle's
    // eviction goes through.
    let mut relaxed = pdb.clone();
    relaxed["spec"]["minAvailable"] = json!(0);
    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(client.clone(), &ns.name)
        .replace(
            "nb",
            &Default::default(),
            &serde_json::from_value(relaxed).unwrap(),
        )
        .await
        .unwrap();
    computed_budget(&ns, "nb", 1);
    let outcome = actions::act(&client, ActionType::Evict, &root, &pods, now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!("evicted 1 pods of {}/Pod/nb-0", ns.name))
    );
    wait_until("the evicted pod to go", || {
        ns.try_get("pods", "nb-0").is_none()
    });
}

#[tokio::test]
async fn a_notebook_is_stopped_with_its_controller_annotation_and_started_again_by_wake() {
    install(crd("kubeflow.org", "v1", "Notebook", "notebooks", status()));
    let ns = Ns::new("notebook");
    let client = client().await;
    // The real sample Notebook from the Kubeflow notebook controller.
    let stored_nb = ns.create(manifest(
        "kubeflow-v1.10.0__notebook-controller_samples__v1_notebook.yaml",
    ));
    let outcome = actions::act(
        &client,
        ActionType::ScaleToZero,
        &info(&stored_nb),
        &[],
        now(),
    )
    .await
    .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!(
            "stopped {}/Notebook/notebook-sample-v1 (kubeflow-resource-stopped)",
            ns.name
        ))
    );
    let stopped = ns.get("notebooks.kubeflow.org", "notebook-sample-v1");
    assert_eq!(
        stopped["metadata"]["annotations"]["kubeflow-resource-stopped"],
        "2026-11-29T12:00:00Z"
    );
    assert_eq!(
        restore_of(&stopped).annotation.as_deref(),
        Some("kubeflow-resource-stopped")
    );
    let woken = actions::wake(&client, &info(&stopped), now())
        .await
        .unwrap();
    assert_eq!(
        woken,
        Outcome::Done(format!(
            "started {}/Notebook/notebook-sample-v1 again (removed kubeflow-resource-stopped)",
            ns.name
        ))
    );
    let started = ns.get("notebooks.kubeflow.org", "notebook-sample-v1");
    assert!(
        started["metadata"]["annotations"]
            .get("kubeflow-resource-stopped")
            .is_none(),
        "{started}"
    );
}

/// The training operator's PyTorchJob CRD: status, and /scale over the Worker replicas.
fn pytorchjob_crd() -> Value {
    crd(
        "kubeflow.org",
        "v1",
        "PyTorchJob",
        "pytorchjobs",
        json!({"status": {}, "scale": {
            "specReplicasPath": ".spec.pytorchReplicaSpecs.Worker.replicas",
            "statusReplicasPath": ".status.replicaStatuses.Worker.active",
            "labelSelectorPath": ".status.replicaStatuses.Worker.selector"}}),
    )
}

#[tokio::test]
async fn a_pytorchjob_is_suspended_through_its_run_policy() {
    install(pytorchjob_crd());
    let ns = Ns::new("pytorch");
    let client = client().await;
    // The real training-operator MNIST NCCL sample.
    let job = ns.create(manifest(
        "training-operator-release-1.9__pytorch_job_mnist_nccl.yaml",
    ));
    let name = job["metadata"]["name"].as_str().unwrap().to_string();
    let outcome = actions::act(&client, ActionType::Suspend, &info(&job), &[], now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!("suspended {}/PyTorchJob/{name}", ns.name))
    );
    let suspended = ns.get("pytorchjobs.kubeflow.org", &name);
    assert_eq!(
        suspended["spec"]["runPolicy"]["suspend"], true,
        "{suspended}"
    );
    assert!(
        suspended["spec"].get("suspend").is_none(),
        "not spec.suspend"
    );
    actions::wake(&client, &info(&suspended), now())
        .await
        .unwrap();
    let resumed = ns.get("pytorchjobs.kubeflow.org", &name);
    assert_eq!(resumed["spec"]["runPolicy"]["suspend"], false);
}

fn isvc_crd() -> Value {
    crd(
        "serving.kserve.io",
        "v1beta1",
        "InferenceService",
        "inferenceservices",
        status(),
    )
}

#[tokio::test]
async fn an_inference_service_is_stopped_with_the_kserve_stop_annotation_and_wake_puts_its_old_value_back()
 {
    install(isvc_crd());
    let ns = Ns::new("isvc-stop");
    let client = client().await;
    // The real KServe GPU sample, as a KServe that knows the stop annotation reports it
    // (a Stopped condition, False), and with the annotation set to "false" by its owner.
    let mut isvc = manifest("kserve__autoscaling_autoscale_gpu.yaml");
    isvc["metadata"]["annotations"]["serving.kserve.io/stop"] = json!("false");
    ns.create(isvc);
    ns.set_status(
        "inferenceservices.serving.kserve.io",
        "flowers-sample-gpu",
        json!({"conditions": [{"type": "Ready", "status": "True"}, {"type": "Stopped", "status": "False"}]}),
    );
    let get = || ns.get("inferenceservices.serving.kserve.io", "flowers-sample-gpu");
    let outcome = actions::act(&client, ActionType::ScaleToZero, &info(&get()), &[], now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!(
            "stopped {}/InferenceService/flowers-sample-gpu (serving.kserve.io/stop: \"true\"); KServe removes its serving pods and keeps the service",
            ns.name
        ))
    );
    let stopped = get();
    let annotations = annotations_of(&stopped);
    assert_eq!(annotations["serving.kserve.io/stop"], "true");
    assert_eq!(
        annotations["autoscaling.knative.dev/target"], "1",
        "other annotations kept"
    );
    assert_eq!(
        restore_of(&stopped),
        RestoreRecord {
            annotation: Some("serving.kserve.io/stop".into()),
            annotation_value: Some("false".into()),
            state: gpu_reaper::cluster::actions::RestoreState::Done,
            ..RestoreRecord::default()
        }
    );
    assert_eq!(
        stopped["spec"],
        manifest("kserve__autoscaling_autoscale_gpu.yaml")["spec"],
        "the spec is KServe's to change, not ours"
    );
    // Idempotent: a second action writes nothing.
    let rv = stopped["metadata"]["resourceVersion"].clone();
    let again = actions::act(
        &client,
        ActionType::ScaleToZero,
        &info(&stopped),
        &[],
        now(),
    )
    .await
    .unwrap();
    assert!(matches!(again, Outcome::AlreadyDone(_)), "{again:?}");
    assert_eq!(get()["metadata"]["resourceVersion"], rv);

    let woken = actions::wake(&client, &info(&stopped), now())
        .await
        .unwrap();
    assert_eq!(
        woken,
        Outcome::Done(format!(
            "started {}/InferenceService/flowers-sample-gpu again (serving.kserve.io/stop back to \"false\")",
            ns.name
        ))
    );
    let started = annotations_of(&get());
    assert_eq!(started["serving.kserve.io/stop"], "false");
    assert!(!started.contains_key("gpureaper.io/restore"));
}

#[tokio::test]
async fn an_llm_inference_service_is_stopped_and_wake_removes_the_annotation_it_did_not_have() {
    install(crd(
        "serving.kserve.io",
        "v1alpha2",
        "LLMInferenceService",
        "llminferenceservices",
        status(),
    ));
    let ns = Ns::new("llmisvc");
    let client = client().await;
    ns.create(manifest(
        "kserve__llmisvc_single-node-gpu_llm-inference-service-qwen2-7b-gpu.yaml",
    ));
    let get = || {
        ns.get(
            "llminferenceservices.serving.kserve.io",
            "qwen2-7b-instruct-single",
        )
    };
    let outcome = actions::act(&client, ActionType::ScaleToZero, &info(&get()), &[], now())
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Done(_)), "{outcome:?}");
    let stopped = get();
    assert_eq!(annotations_of(&stopped)["serving.kserve.io/stop"], "true");
    assert_eq!(restore_of(&stopped).annotation_value, None);
    assert_eq!(stopped["spec"]["replicas"], 3, "replicas untouched");
    actions::wake(&client, &info(&stopped), now())
        .await
        .unwrap();
    assert!(
        !annotations_of(&get()).contains_key("serving.kserve.io/stop"),
        "{}",
        get()
    );
}

#[tokio::test]
async fn an_inference_service_of_a_kserve_without_stop_scales_its_predictor_to_zero_or_says_why_not()
 {
    install(isvc_crd());
    let ns = Ns::new("isvc-old");
    let client = client().await;
    const ISVC: &str = "inferenceservices.serving.kserve.io";
    // Serverless (the old default), no Stopped condition: an older KServe.
    let mut serverless = manifest("kserve__autoscaling_autoscale_gpu.yaml");
    serverless["spec"]["predictor"]["minReplicas"] = json!(2);
    let ready = json!({"conditions": [{"type": "Ready", "status": "True"}]});
    ns.create(serverless.clone());
    ns.set_status(ISVC, "flowers-sample-gpu", ready.clone());
    let get = |name: &str| ns.get(ISVC, name);
    let outcome = actions::act(
        &client,
        ActionType::ScaleToZero,
        &info(&get("flowers-sample-gpu")),
        &[],
        now(),
    )
    .await
    .unwrap();
    assert!(
        matches!(&outcome, Outcome::Done(s) if s.starts_with(&format!("set spec.predictor.minReplicas of {}/InferenceService/flowers-sample-gpu from 2 to 0", ns.name))),
        "{outcome:?}"
    );
    let scaled = get("flowers-sample-gpu");
    assert_eq!(scaled["spec"]["predictor"]["minReplicas"], 0);
    assert!(
        !annotations_of(&scaled).contains_key("serving.kserve.io/stop"),
        "an old KServe ignores the stop annotation"
    );
    assert_eq!(
        restore_of(&scaled).spec_patch,
        Some(json!({"predictor": {"minReplicas": 2}}))
    );
    actions::wake(&client, &info(&scaled), now()).await.unwrap();
    assert_eq!(
        get("flowers-sample-gpu")["spec"]["predictor"]["minReplicas"],
        2
    );

    // No minReplicas before: wake removes the field again.
    let mut unset = serverless.clone();
    unset["metadata"]["name"] = json!("unset");
    unset["spec"]["predictor"]
        .as_object_mut()
        .unwrap()
        .remove("minReplicas");
    ns.create(unset);
    ns.set_status(ISVC, "unset", ready.clone());
    actions::act(
        &client,
        ActionType::ScaleToZero,
        &info(&get("unset")),
        &[],
        now(),
    )
    .await
    .unwrap();
    assert_eq!(get("unset")["spec"]["predictor"]["minReplicas"], 0);
    actions::wake(&client, &info(&get("unset")), now())
        .await
        .unwrap();
    assert!(
        get("unset")["spec"]["predictor"]
            .get("minReplicas")
            .is_none(),
        "{}",
        get("unset")
    );

    // RawDeployment on such a KServe cannot go to zero: said, and nothing written.
    let mut raw = serverless;
    raw["metadata"]["name"] = json!("raw");
    raw["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] = json!("RawDeployment");
    ns.create(raw);
    ns.set_status(ISVC, "raw", ready);
    let before = get("raw");
    let outcome = actions::act(&client, ActionType::ScaleToZero, &info(&before), &[], now())
        .await
        .unwrap();
    let Outcome::Unsupported(text) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        text.contains("RawDeployment") && text.contains("upgrade KServe"),
        "{text}"
    );
    assert_eq!(get("raw"), before);
}

const RAY_SERVICES: &str = "rayservices.ray.io";
const RAY_CLUSTERS: &str = "rayclusters.ray.io";

fn install_ray() {
    install(crd("ray.io", "v1", "RayService", "rayservices", status()));
    install(crd("ray.io", "v1", "RayCluster", "rayclusters", status()));
}

/// A RayService's active RayCluster as KubeRay creates it from `spec.rayClusterConfig`,
/// owned by the RayService (its real UID: the garbage collector deletes what an absent
/// owner owned).
fn ray_service_and_cluster(ns: &Ns) -> (Value, Value) {
    install_ray();
    ns.create(manifest("kuberay__ray-service.llm-serve.yaml"));
    ns.set_status(
        RAY_SERVICES,
        "ray-serve-llm",
        json!({"activeServiceStatus": {"rayClusterName": "ray-serve-llm-x7k2p"},
               "pendingServiceStatus": {}}),
    );
    let service = ns.get(RAY_SERVICES, "ray-serve-llm");
    ns.create(json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": "ray-serve-llm-x7k2p",
                     "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayService", "name": "ray-serve-llm",
                                          "uid": service["metadata"]["uid"], "controller": true}]},
        "spec": service["spec"]["rayClusterConfig"],
    }));
    let cluster = ns.get(RAY_CLUSTERS, "ray-serve-llm-x7k2p");
    (service, cluster)
}

#[tokio::test]
async fn a_ray_service_is_reclaimed_through_the_worker_groups_of_its_active_cluster_and_woken_back()
{
    let ns = Ns::new("ray");
    let client = client().await;
    let (service, _) = ray_service_and_cluster(&ns);
    let outcome = actions::act(
        &client,
        ActionType::ScaleToZero,
        &info(&service),
        &[],
        now(),
    )
    .await
    .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!(
            "scaled the worker groups of RayCluster {0}/ray-serve-llm-x7k2p of {0}/RayService/ray-serve-llm to 0 (were gpu-group 1); its head keeps running",
            ns.name
        ))
    );
    let cluster = ns.get(RAY_CLUSTERS, "ray-serve-llm-x7k2p");
    let group = &cluster["spec"]["workerGroupSpecs"][0];
    assert_eq!(
        (
            &group["replicas"],
            &group["minReplicas"],
            &group["maxReplicas"]
        ),
        (&json!(0), &json!(0), &json!(0))
    );
    assert_eq!(
        group["template"], service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"],
        "only the replica fields change"
    );
    let after = ns.get(RAY_SERVICES, "ray-serve-llm");
    assert_eq!(
        after["spec"], service["spec"],
        "the RayService spec is not touched: KubeRay would not pass it on"
    );
    assert_eq!(
        restore_of(&after),
        RestoreRecord {
            ray_cluster: Some("ray-serve-llm-x7k2p".into()),
            worker_groups: vec![WorkerGroupRecord {
                group_name: "gpu-group".into(),
                replicas: Some(1),
                min_replicas: Some(1),
                max_replicas: Some(1),
            }],
            state: gpu_reaper::cluster::actions::RestoreState::Done,
            ..RestoreRecord::default()
        }
    );
    let again = actions::act(&client, ActionType::ScaleToZero, &info(&after), &[], now())
        .await
        .unwrap();
    assert!(matches!(again, Outcome::AlreadyDone(_)), "{again:?}");

    let woken = actions::wake(&client, &info(&after), now()).await.unwrap();
    assert_eq!(
        woken,
        Outcome::Done(format!(
            "scaled the worker groups of RayCluster {}/ray-serve-llm-x7k2p back (gpu-group 1)",
            ns.name
        ))
    );
    let restored = ns.get(RAY_CLUSTERS, "ray-serve-llm-x7k2p");
    let group = &restored["spec"]["workerGroupSpecs"][0];
    assert_eq!(
        (
            &group["replicas"],
            &group["minReplicas"],
            &group["maxReplicas"]
        ),
        (&json!(1), &json!(1), &json!(1))
    );
    assert!(
        !annotations_of(&ns.get(RAY_SERVICES, "ray-serve-llm"))
            .contains_key("gpureaper.io/restore")
    );
}

#[tokio::test]
async fn suspending_a_ray_service_scales_its_workers_and_an_interrupted_one_finishes_with_the_first_record()
 {
    let ns = Ns::new("ray-suspend");
    let client = client().await;
    let (service, _) = ray_service_and_cluster(&ns);
    let outcome = actions::act(&client, ActionType::Suspend, &info(&service), &[], now())
        .await
        .unwrap();
    assert!(
        matches!(&outcome, Outcome::Done(s) if s.starts_with("scaled the worker groups")),
        "{outcome:?}"
    );
    let after = ns.get(RAY_SERVICES, "ray-serve-llm");
    assert_eq!(
        annotations_of(&after)["gpureaper.io/reaped-action"],
        "Suspend"
    );
    assert!(after["spec"].get("suspend").is_none(), "no spec.suspend");

    // A run killed after its record: pending with the counts it saw; the cluster was
    // meanwhile changed to 3 by hand. The next cycle finishes with the recorded 1.
    actions::wake(&client, &info(&after), now()).await.unwrap();
    let pending = json!({"rayCluster": "ray-serve-llm-x7k2p", "state": "pending",
        "workerGroups": [{"groupName": "gpu-group", "replicas": 1, "minReplicas": 1, "maxReplicas": 1}]});
    let mut service = ns.get(RAY_SERVICES, "ray-serve-llm");
    service["metadata"]["annotations"]["gpureaper.io/restore"] = json!(pending.to_string());
    let outcome = actions::scale_to_zero(&client, &info(&service), now())
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Done(_)), "{outcome:?}");
    let cluster = ns.get(RAY_CLUSTERS, "ray-serve-llm-x7k2p");
    assert_eq!(cluster["spec"]["workerGroupSpecs"][0]["replicas"], 0);
    let record = restore_of(&ns.get(RAY_SERVICES, "ray-serve-llm"));
    assert_eq!(
        record.state,
        gpu_reaper::cluster::actions::RestoreState::Done
    );
    assert_eq!(record.worker_groups[0].replicas, Some(1));
}

#[tokio::test]
async fn a_ray_service_without_an_active_cluster_or_mid_upgrade_is_left_for_a_later_cycle() {
    install_ray();
    let ns = Ns::new("ray-later");
    let client = client().await;
    let mut starting = manifest("kuberay__ray-service.llm-serve.yaml");
    starting["metadata"]["name"] = json!("starting");
    ns.create(starting);
    let mut upgrading = manifest("kuberay__ray-service.llm-serve.yaml");
    upgrading["metadata"]["name"] = json!("upgrading");
    ns.create(upgrading);
    ns.set_status(
        RAY_SERVICES,
        "upgrading",
        json!({"activeServiceStatus": {"rayClusterName": "upgrading-a"},
               "pendingServiceStatus": {"rayClusterName": "upgrading-b"}}),
    );
    for (name, expected) in [
        ("starting", "has no active RayCluster yet"),
        ("upgrading", "is moving to a new RayCluster (upgrading-b)"),
    ] {
        let before = ns.get(RAY_SERVICES, name);
        let outcome = actions::act(&client, ActionType::ScaleToZero, &info(&before), &[], now())
            .await
            .unwrap();
        assert!(
            matches!(&outcome, Outcome::Refused(s) if s.contains(expected)),
            "{name}: {outcome:?}"
        );
        assert_eq!(ns.get(RAY_SERVICES, name), before, "nothing written");
    }
}

/// A CRD with a `/scale` subresource and a plural that is not the conventional one
/// ("matrixes"): only discovery finds it.
fn scalable_crd() -> Value {
    crd(
        "inference.example.com",
        "v1",
        "Matrix",
        "matrices",
        json!({"status": {}, "scale": {
            "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}),
    )
}

#[tokio::test]
async fn an_unknown_crd_with_a_scale_subresource_is_scaled_through_it_and_woken_back() {
    install(scalable_crd());
    let ns = Ns::new("matrix");
    let client = client().await;
    ns.create(
        json!({"apiVersion": "inference.example.com/v1", "kind": "Matrix",
                     "metadata": {"name": "mm"}, "spec": {"replicas": 4}}),
    );
    let get = || ns.get("matrices.inference.example.com", "mm");
    let outcome = actions::act(&client, ActionType::ScaleToZero, &info(&get()), &[], now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!("scaled {}/Matrix/mm from 4 replicas to 0", ns.name))
    );
    assert_eq!(get()["spec"]["replicas"], 0);
    assert_eq!(restore_of(&get()).replicas, Some(4));
    let woken = actions::wake(&client, &info(&get()), now()).await.unwrap();
    assert_eq!(
        woken,
        Outcome::Done(format!("scaled {}/Matrix/mm back to 4 replicas", ns.name))
    );
    assert_eq!(get()["spec"]["replicas"], 4);
    assert!(!annotations_of(&get()).contains_key("gpureaper.io/restore"));
}

/// What a write would change: everything but the status and the server's bookkeeping
/// of it (the Job controller keeps writing a Job's status).
fn written(v: &Value) -> Value {
    let mut v = v.clone();
    v.as_object_mut().unwrap().remove("status");
    let meta = v["metadata"].as_object_mut().unwrap();
    meta.remove("resourceVersion");
    meta.remove("managedFields");
    v
}

#[tokio::test]
async fn a_kind_without_a_scale_subresource_is_reported_as_unscalable_every_time_and_never_written()
{
    install(crd(
        "trainer.example.com",
        "v1",
        "Trainer",
        "trainers",
        json!({}),
    ));
    let ns = Ns::new("unscalable");
    let client = client().await;
    ns.create(
        json!({"apiVersion": "trainer.example.com/v1", "kind": "Trainer",
                     "metadata": {"name": "t"}, "spec": {"replicas": 2}}),
    );
    ns.create(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}},
    }));
    let trainer_before = ns.get("trainers.trainer.example.com", "t");
    let job_before = ns.get("jobs.batch", "train");
    for _ in 0..2 {
        let trainer = info(&ns.get("trainers.trainer.example.com", "t"));
        let outcome = actions::act(&client, ActionType::ScaleToZero, &trainer, &[], now())
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Outcome::Unsupported(format!(
                "{}/Trainer/t: cannot scale a Trainer (trainer.example.com/v1): it has no /scale subresource; use Evict for it",
                ns.name
            ))
        );
        let job = info(&ns.get("jobs.batch", "train"));
        let outcome = actions::act(&client, ActionType::ScaleToZero, &job, &[], now())
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Outcome::Unsupported(format!(
                "{}/Job/train: cannot scale a Job (batch/v1): it has no /scale subresource; use Suspend for it",
                ns.name
            ))
        );
    }
    assert_eq!(
        ns.get("trainers.trainer.example.com", "t"),
        trainer_before,
        "nothing was written to the Trainer"
    );
    assert_eq!(
        written(&ns.get("jobs.batch", "train")),
        written(&job_before),
        "nothing was written to the Job"
    );
}

/// The managers (field owners) that set `spec.suspend` of an object, from its
/// managedFields.
fn suspend_managers(v: &Value) -> Vec<String> {
    v["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| !m["fieldsV1"]["f:spec"]["f:suspend"].is_null())
        .map(|m| m["manager"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// What deletes the Kueue test's namespace and queues while Kueue still runs (its
/// finalizers on Workloads and ClusterQueues need it).
struct KueueGuard {
    ns: Ns,
    queues: String,
}

impl Drop for KueueGuard {
    fn drop(&mut self) {
        common::kueue::delete_queues(self.ns.cluster, &self.queues, &self.ns.name);
    }
}

/// Kueue for real (the pinned sigs.k8s.io/kueue controller against the cluster): a Job in
/// a LocalQueue with `nvidia.com/gpu` quota is admitted and runs; gpu-reaper's Suspend
/// deactivates its Workload and Kueue — not gpu-reaper — suspends the Job, whose pods the
/// Job controller then removes; wake reactivates the Workload and Kueue admits it again.
#[tokio::test]
async fn a_kueue_managed_job_is_deactivated_through_its_workload_not_suspended() {
    let cluster = cluster();
    let kueue = common::kueue::start(cluster);
    let guard = KueueGuard {
        ns: Ns::new("kueue"),
        queues: format!("gpu-reaper-{}", common::cluster::unique()),
    };
    let ns = &guard.ns;
    common::kueue::queues(cluster, kueue, &guard.queues, &ns.name, "team-a-queue", 2);
    let client = client().await;
    const WORKLOADS: &str = "workloads.kueue.x-k8s.io";
    // Created suspended, as Kueue's Job webhook would default it (its admission webhooks
    // are not registered here): Kueue unsuspends it once admitted.
    ns.create(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "sample-job", "labels": {"kueue.x-k8s.io/queue-name": "team-a-queue"}},
        "spec": {"suspend": true,
                 "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x",
                 "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}},
    }));
    // Kueue creates the Workload, reserves the quota and starts the Job.
    let mut workload = Value::Null;
    kueue.wait_until("Kueue to admit the Job's Workload", || {
        workload = ns
            .cluster
            .list(WORKLOADS, &ns.name, None)
            .into_iter()
            .next()
            .unwrap_or_default();
        common::kueue::condition(&workload, "Admitted") == Some(true)
    });
    let wl = workload["metadata"]["name"].as_str().unwrap().to_string();
    let owner = &workload["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"], &owner["controller"]),
        (&json!("Job"), &json!("sample-job"), &json!(true)),
        "{workload}"
    );
    ns.running("job-name=sample-job", 1);
    let job = ns.get("jobs.batch", "sample-job");
    assert_eq!(job["spec"]["suspend"], false, "Kueue started it");

    let outcome = actions::act(&client, ActionType::Suspend, &info(&job), &[], now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!(
            "deactivated Kueue Workload {0}/{wl} of {0}/Job/sample-job; Kueue evicts it",
            ns.name
        ))
    );
    assert_eq!(ns.get(WORKLOADS, &wl)["spec"]["active"], false);
    // Read at v1beta1 (what gpu-reaper falls back to before Kueue 0.15), the API server
    // converts it through Kueue's conversion webhook.
    let older: Value = serde_json::from_str(&ns.cluster.kubectl(
        &[
            "get",
            "workloads.v1beta1.kueue.x-k8s.io",
            &wl,
            "-n",
            &ns.name,
            "-o",
            "json",
        ],
        None,
    ))
    .unwrap();
    assert_eq!(
        (&older["apiVersion"], &older["spec"]["active"]),
        (&json!("kueue.x-k8s.io/v1beta1"), &json!(false))
    );
    // Kueue evicts the inactive Workload and suspends the Job; the Job controller
    // removes its pod.
    kueue.wait_until("Kueue to suspend the Job", || {
        ns.get("jobs.batch", "sample-job")["spec"]["suspend"] == true
    });
    ns.wait_no_pods("job-name=sample-job", "the Job controller");
    let job_after = ns.get("jobs.batch", "sample-job");
    // Who set spec.suspend, from the server's managedFields (kubectl hides them).
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let managers =
        suspend_managers(&serde_json::to_value(jobs.get("sample-job").await.unwrap()).unwrap());
    assert!(
        !managers.is_empty() && managers.iter().all(|m| m.starts_with("kueue")),
        "spec.suspend is set by Kueue alone, never by gpu-reaper: {managers:?}"
    );
    assert_eq!(
        restore_of(&job_after).kueue_workload.as_deref(),
        Some(wl.as_str())
    );
    kueue.wait_until("the Workload's quota to be released", || {
        common::kueue::condition(&ns.get(WORKLOADS, &wl), "QuotaReserved") != Some(true)
    });

    let woken = actions::wake(&client, &info(&job_after), now())
        .await
        .unwrap();
    assert_eq!(
        woken,
        Outcome::Done(format!(
            "reactivated Kueue Workload {0}/{wl} of {0}/Job/sample-job",
            ns.name
        ))
    );
    assert_eq!(ns.get(WORKLOADS, &wl)["spec"]["active"], true);
    // Kueue admits it again and resumes the Job: its pod runs again.
    kueue.wait_until("Kueue to admit the Workload again", || {
        common::kueue::condition(&ns.get(WORKLOADS, &wl), "Admitted") == Some(true)
    });
    kueue.wait_until("Kueue to resume the Job", || {
        ns.get("jobs.batch", "sample-job")["spec"]["suspend"] == false
    });
    ns.running("job-name=sample-job", 1);
    drop(guard);
}
