//! A test scenario on the real control plane: workloads in a namespace of their own,
//! their pods running on kwok nodes, DCGM history of exactly those pods backfilled into
//! the real Prometheus, a policy only this scenario's controller evaluates
//! (`--policy-selector`), a Lease of its own, and `gpu-reaper controller --once --now`
//! run at chosen instants (no test waits for an idle hour to pass).

use std::collections::HashMap;

use serde_json::{Value, json};

use super::cluster::{Cluster, cluster, unique, wait_until};
use super::{Dcgm, Prometheus, history_start, prometheus_with};

pub const BIN: &str = env!("CARGO_BIN_EXE_gpu-reaper");
pub const H100: &str = "NVIDIA H100 80GB HBM3";

/// A Deployment of `replicas` pods with one GPU each (labels `app: name`), with
/// `annotations` on the Deployment.
pub fn deployment(namespace: &str, name: &str, replicas: u32, annotations: Value) -> String {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}, "annotations": annotations},
           "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                                 "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.0",
                                                          "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    .to_string()
}

/// A Job `name` of one pod with `gpus` GPUs that runs until stopped (kwok never
/// completes it).
pub fn job(namespace: &str, name: &str, gpus: u32) -> String {
    json!({"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
               {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}}}})
    .to_string()
}

/// Pod names by workload.
pub type Pods = HashMap<String, Vec<String>>;

/// A workload of a scenario: its name, manifest, the selector of its pods and their
/// number once running.
pub struct Workload {
    pub name: &'static str,
    pub manifest: String,
    pub pods: (String, usize),
}

pub struct Scenario {
    pub cluster: &'static Cluster,
    pub ns: String,
    pub prometheus: Prometheus,
    /// Start of the recorded history (epoch seconds); the workloads were created before.
    pub t0: i64,
    pub pods: Pods,
}

impl Scenario {
    /// Runs `workloads(namespace)` in a new namespace, waits for their pods to run on the
    /// kwok nodes, then lays out `history` of those pods after their creation and
    /// backfills it into Prometheus.
    pub fn start(
        test: &str,
        workloads: impl FnOnce(&str) -> Vec<Workload>,
        history: impl FnOnce(&mut Dcgm, &str, &Pods),
    ) -> Self {
        let cluster = cluster();
        cluster.install_crds();
        let ns = cluster.namespace(&format!("ml-{test}"), &[]);
        let workloads = workloads(&ns);
        for w in &workloads {
            cluster.apply(&w.manifest);
        }
        let mut pods = Pods::new();
        for w in &workloads {
            let running = cluster.running_pods(&ns, &w.pods.0, w.pods.1);
            let mut names: Vec<String> = running
                .iter()
                .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
                .collect();
            names.sort();
            pods.insert(w.name.to_string(), names);
        }
        let t0 = history_start();
        let mut dcgm = Dcgm::new(t0);
        history(&mut dcgm, &ns, &pods);
        let prometheus = prometheus_with(&format!("{test}-{}", unique()), &dcgm.finish());
        Scenario {
            cluster,
            ns,
            prometheus,
            t0,
            pods,
        }
    }

    /// Applies this scenario's GpuPolicy: named after the namespace, governing only it,
    /// labelled for `--policy-selector`; `spec` is the rest of its spec (YAML, indented
    /// two spaces).
    pub fn apply_policy(&self, spec: &str) {
        let ns = &self.ns;
        self.cluster.apply(&format!(
            "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {ns}, labels: {{gpureaper.io/test: {ns}}}}}\nspec:\n  match: {{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}}}\n{spec}"
        ));
    }

    pub fn at(&self, minutes: i64) -> String {
        super::at(self.t0, minutes)
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        self.cluster.kubectl(args, None)
    }

    /// One evaluation as of `minutes` after T0; (success, stderr).
    pub async fn cycle(&self, minutes: i64, identity: &str) -> (bool, String) {
        self.cycle_with(minutes, identity, "15s", &[]).await
    }

    pub async fn cycle_with(
        &self,
        minutes: i64,
        identity: &str,
        lease: &str,
        extra: &[&str],
    ) -> (bool, String) {
        let out = tokio::process::Command::new(BIN)
            .args(["controller", "--once", "--now", &self.at(minutes)])
            .args(self.controller_args(identity, lease))
            .args(extra)
            .env("KUBECONFIG", &self.cluster.kubeconfig)
            .env("RUST_LOG", "info")
            .output()
            .await
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// What every controller of this test runs with: its Prometheus, its policy, its
    /// Lease (in its namespace), the cluster's kubeconfig.
    pub fn controller_args(&self, identity: &str, lease: &str) -> Vec<String> {
        [
            "--prometheus-url",
            &self.prometheus.url,
            "--scrape-interval",
            "1m",
            "--policy-selector",
            &format!("gpureaper.io/test={}", self.ns),
            "--lease-namespace",
            &self.ns,
            "--identity",
            identity,
            "--lease-duration",
            lease,
        ]
        .map(String::from)
        .to_vec()
    }

    /// `kubectl annotate deployment NAME` in this namespace, with `annotations` (`k=v`).
    pub fn annotate_deployment(&self, name: &str, annotations: &[&str]) {
        let mut args = vec!["annotate", "deployment", name, "-n", &self.ns];
        args.extend(annotations);
        self.kubectl(&args);
    }

    pub fn deployment(&self, name: &str) -> Value {
        self.cluster
            .get("deployment", Some(&self.ns), name)
            .unwrap_or_else(|| panic!("deployment {name} exists"))
    }

    pub fn policy_status(&self) -> Value {
        self.cluster.get("gpupolicy", None, &self.ns).unwrap()["status"].clone()
    }

    /// gpu-reaper's Events about `name`, as (reason, note); the cluster's own controllers
    /// write theirs too (SuccessfulCreate, ScalingReplicaSet…).
    pub fn events_for(&self, name: &str) -> Vec<(String, String)> {
        self.cluster
            .list("events", &self.ns, None)
            .into_iter()
            .filter(|e| {
                e["involvedObject"]["name"] == name && e["reportingComponent"] == "gpu-reaper"
            })
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or("").to_string(),
                    e["message"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    /// Waits until `name`'s pods are `count` (the Deployment controller's doing).
    pub fn wait_for_pods(&self, app: &str, count: usize) {
        wait_until(&format!("{count} pods of {app}"), || {
            self.cluster
                .list("pods", &self.ns, Some(&format!("app={app}")))
                .iter()
                .filter(|p| {
                    p["metadata"]["deletionTimestamp"].is_null()
                        && p["status"]["phase"] == "Running"
                })
                .count()
                == count
                && self
                    .cluster
                    .list("pods", &self.ns, Some(&format!("app={app}")))
                    .len()
                    == count
        });
    }
}

impl Drop for Scenario {
    /// The namespace and the policy go (the cluster is shared: their pods hold GPUs).
    fn drop(&mut self) {
        let _ = self
            .cluster
            .try_kubectl(&["delete", "namespace", &self.ns, "--wait=false"], None);
        let _ = self.cluster.try_kubectl(
            &[
                "delete",
                "gpupolicy",
                &self.ns,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

/// The GpuPolicy CRD as a newer gpu-reaper might install it: `spec.action.type` also
/// allows `Hibernate`, which this gpu-reaper does not know.
pub fn newer_policy_crd() -> String {
    use kube::CustomResourceExt;
    let mut crd = serde_json::to_value(gpu_reaper::api::GpuPolicy::crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["action"]["properties"]["type"]["enum"]
        .as_array_mut()
        .expect("action.type is an enum in the CRD")
        .push("Hibernate".into());
    crd.to_string()
}

/// The GpuPolicy CRD as an older gpu-reaper installed it, before the CEL rules on its
/// durations: what it stored then is still there after an upgrade, whatever the new
/// schema says.
pub fn older_policy_crd() -> String {
    use kube::CustomResourceExt;
    let mut crd = serde_json::to_value(gpu_reaper::api::GpuPolicy::crd()).unwrap();
    let spec = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    spec.as_object_mut()
        .expect("the spec's schema")
        .remove("x-kubernetes-validations")
        .expect("the spec's CEL rules");
    crd.to_string()
}

/// Applies `manifest` while the CRD `crd` (JSON) is installed, then puts the committed
/// CRDs back (objects already stored are kept as they are). Runs while no other test of
/// this process uses the cluster: the API server re-initializes the storage after each
/// CRD change.
pub fn apply_under_crd(cluster: &'static super::cluster::Cluster, crd: &str, manifest: &str) {
    super::cluster::with_crd_change(|| {
        let _committed = CommittedCrds(cluster);
        super::cluster::wait_until("the other CRD to admit the object", || {
            cluster.kubectl(
                &["apply", "--server-side", "--force-conflicts", "-f", "-"],
                Some(crd),
            );
            cluster
                .try_kubectl(&["apply", "-f", "-"], Some(manifest))
                .ok
        });
    });
}

/// Puts the committed CRDs back when dropped (also when the test fails half-way).
pub struct CommittedCrds(pub &'static super::cluster::Cluster);

impl Drop for CommittedCrds {
    fn drop(&mut self) {
        let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/gpu-reaper.yaml");
        let _ = self.0.try_kubectl(
            &["apply", "--server-side", "--force-conflicts", "-f", crds],
            None,
        );
        // Served again (kubectl waits out the API server's 429 while it re-initializes).
        super::cluster::wait_until("GpuPolicies to be served again", || {
            self.0.try_kubectl(&["get", "gpupolicies"], None).ok
        });
    }
}

/// Deletes a GpuPolicy when dropped.
pub struct DeletePolicy(pub &'static super::cluster::Cluster, pub String);

impl Drop for DeletePolicy {
    fn drop(&mut self) {
        let _ = self.0.try_kubectl(
            &[
                "delete",
                "gpupolicy",
                &self.1,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}
