//! Kueue for real: its CRDs read from the pinned module (`tests/k8s/kueue`, sigs.k8s.io/kueue)
//! at test time, and its controller (`DIR/bin/kueue`, built by `scripts/testenv build`) run
//! as a process against the test cluster, once per test binary.
//!
//! How it is run outside a pod, and why:
//! - Kueue without its internal certificate management reads the metrics certificate from a
//!   fixed path (`/etc/kueue/metrics/certs`, cmd/kueue/main.go); with it, its cert rotator
//!   writes the webhook certificate into a Secret (`kueue-system/kueue-webhook-server-cert`,
//!   which must exist, empty, as the kustomize install creates it) and waits for the kubelet
//!   to mount it into `webhook.certDir`. Here no kubelet mounts it: [`start`] copies the
//!   Secret's `tls.crt`/`tls.key` into the directory, as the mount would.
//! - The rotator injects its CA into the conversion webhooks of five CRDs and refuses to
//!   become ready when a CRD has none: the CRDs get the conversion stanza of Kueue's own
//!   `config/components/crd/patches/webhook_in_*.yaml` (service
//!   `kueue-system/kueue-webhook-service`), and that Service is routed to Kueue's webhook
//!   server on this machine (a selector-less Service and an EndpointSlice), so the API server
//!   really converts v1beta1 through Kueue. The admission webhooks are not registered with
//!   the API server (no webhook configurations), so Kueue's Job defaulting (`spec.suspend:
//!   true` for a queued Job) is done by the test when it creates the Job.
//! - Only the `batch/job` integration is on (other suites install minimal Kubeflow/Ray CRDs
//!   Kueue must not manage); metrics, health probes and the visibility server are off; leader
//!   election is on, so two test binaries never run two acting Kueues.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

use serde::Deserialize;
use serde_json::{Value, json};

use super::cluster::{Cluster, PATIENCE};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
pub const NAMESPACE: &str = "kueue-system";
const SECRET: &str = "kueue-webhook-server-cert";
const SERVICE: &str = "kueue-webhook-service";
/// The CRDs Kueue's kustomization gives a conversion webhook.
const CONVERTED: [&str; 5] = [
    "localqueues",
    "clusterqueues",
    "cohorts",
    "workloads",
    "multikueueclusters",
];

/// The running Kueue controller of this test binary.
pub struct Kueue {
    pub dir: PathBuf,
    /// The shell that runs Kueue and stops it with this binary.
    _watchdog: std::process::Child,
}

impl Kueue {
    /// The end of Kueue's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("kueue.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Polls `done` until it holds; fails naming `what`, with Kueue's log, after
    /// [`PATIENCE`].
    pub fn wait_until(&self, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !done() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; Kueue's log ends:\n{}",
                self.log_tail()
            );
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }
}

/// Where the pinned Kueue module is (the Go module cache).
pub fn module_dir() -> PathBuf {
    let out = Command::new("go")
        .args(["list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kueue"])
        .current_dir(Path::new(ROOT).join("tests/k8s/kueue"))
        .output()
        .expect("go runs (the Kueue CRDs are read from its module)");
    assert!(
        out.status.success(),
        "go list -m sigs.k8s.io/kueue in tests/k8s/kueue: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert!(
        dir.join("config/components/crd/bases").is_dir(),
        "{} has no config/components/crd/bases (run `go mod download` in tests/k8s/kueue)",
        dir.display()
    );
    dir
}

/// Kueue's CRDs from its module (`config/components/crd/bases`), with the conversion
/// webhook of its kustomization, applied server-side once per binary and established.
pub fn install_crds(cluster: &Cluster) {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let bases = module_dir().join("config/components/crd/bases");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&bases)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        let mut names = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let mut crd = Value::deserialize(doc).unwrap();
                if crd.is_null() {
                    continue;
                }
                let plural = crd["spec"]["names"]["plural"].as_str().unwrap().to_string();
                if CONVERTED.contains(&plural.as_str()) {
                    crd["spec"]["conversion"] = json!({"strategy": "Webhook", "webhook": {
                        "clientConfig": {"service": {"namespace": NAMESPACE, "name": SERVICE, "path": "/convert"}},
                        "conversionReviewVersions": ["v1"]}});
                }
                names.push(crd["metadata"]["name"].as_str().unwrap().to_string());
                cluster.kubectl(
                    &["apply", "--server-side", "--force-conflicts", "-f", "-"],
                    Some(&crd.to_string()),
                );
            }
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        cluster.wait_established(&names);
    });
}

/// Kueue running against `cluster` (started on first use, stopped when this test binary
/// exits).
pub fn start(cluster: &'static Cluster) -> &'static Kueue {
    static KUEUE: OnceLock<Kueue> = OnceLock::new();
    KUEUE.get_or_init(|| {
        let bin = cluster.bin("kueue");
        assert!(
            bin.exists(),
            "{} is missing: `scripts/testenv build` builds it (tests/k8s/kueue)",
            bin.display()
        );
        install_crds(cluster);
        for (what, doc) in [
            (
                "namespace",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
            ),
            (
                "secret",
                json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                       "metadata": {"name": SECRET, "namespace": NAMESPACE}}),
            ),
        ] {
            let run = cluster.try_kubectl(&["create", "-f", "-"], Some(&doc.to_string()));
            assert!(
                run.ok || run.stderr.contains("AlreadyExists"),
                "creating Kueue's {what}: {}",
                run.stderr
            );
        }

        // The webhook Service routed to this machine (a selector-less Service and an
        // EndpointSlice; a Service endpoint may not be loopback), so the API server reaches
        // Kueue's conversion webhook as it would in a cluster; the certificate the rotator
        // issues names the Service.
        let host_ip = std::fs::read_to_string(cluster.dir.join("host-ip"))
            .expect("scripts/testenv writes DIR/host-ip")
            .trim()
            .to_string();
        let port = super::free_port();
        cluster.apply(
            &json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": SERVICE, "namespace": NAMESPACE},
                    "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}})
            .to_string(),
        );
        cluster.apply(
            &json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": format!("{SERVICE}-local"), "namespace": NAMESPACE,
                                 "labels": {"kubernetes.io/service-name": SERVICE}},
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [host_ip], "conditions": {"ready": true}}],
                    "ports": [{"name": "https", "port": port, "protocol": "TCP"}]})
            .to_string(),
        );

        let dir = std::env::temp_dir().join(format!("gpu-reaper-kueue-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("certs")).unwrap();
        let config = json!({
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": "0"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": host_ip, "port": port,
                        "certDir": dir.join("certs")},
            "leaderElection": {"leaderElect": true, "resourceName": "c1f6bfd2.kueue.x-k8s.io",
                               "resourceNamespace": NAMESPACE},
            "internalCertManagement": {"enable": true, "webhookServiceName": SERVICE,
                                       "webhookSecretName": SECRET},
            "integrations": {"frameworks": ["batch/job"]},
            "featureGates": {"VisibilityOnDemand": false},
        });
        std::fs::write(dir.join("config.yaml"), config.to_string()).unwrap();
        // Kueue lives as long as this test binary: a watchdog stops it when the binary
        // (its owner) is gone, however the binary ends.
        let script = format!(
            "{bin} --config {dir}/config.yaml --kubeconfig {kubeconfig} >{dir}/kueue.log 2>&1 &\n\
             k=$!\n\
             while kill -0 {owner} 2>/dev/null && kill -0 $k 2>/dev/null; do sleep 1; done\n\
             kill $k 2>/dev/null\n",
            bin = bin.display(),
            dir = dir.display(),
            kubeconfig = cluster.kubeconfig.display(),
            owner = std::process::id(),
        );
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh runs");
        let kueue = Kueue {
            dir,
            _watchdog: watchdog,
        };

        // What the kubelet's Secret volume would do: the rotator's certificate, into
        // webhook.certDir.
        let mut data = Value::Null;
        kueue.wait_until("Kueue's cert rotator to fill its Secret", || {
            data = cluster
                .get("secret", Some(NAMESPACE), SECRET)
                .map(|s| s["data"].clone())
                .unwrap_or_default();
            data["tls.crt"].is_string() && data["tls.key"].is_string()
        });
        for file in ["tls.crt", "tls.key"] {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data[file].as_str().unwrap())
                .unwrap();
            std::fs::write(kueue.dir.join("certs").join(file), bytes).unwrap();
        }
        kueue.wait_until("Kueue to start its manager", || {
            std::fs::read_to_string(kueue.dir.join("kueue.log"))
                .is_ok_and(|log| log.contains("Starting manager"))
        });
        kueue
    })
}

/// A ResourceFlavor and a ClusterQueue (cluster-scoped, named after `name`) with `gpus`
/// of `nvidia.com/gpu` quota for `namespace`, and LocalQueue `queue` there pointing at it.
/// Waits until Kueue reports the ClusterQueue active.
pub fn queues(
    cluster: &Cluster,
    kueue: &Kueue,
    name: &str,
    namespace: &str,
    queue: &str,
    gpus: u32,
) {
    cluster.apply(
        &json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": name}})
        .to_string(),
    );
    cluster.apply(
        &json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                         "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                                             "flavors": [{"name": name, "resources": [
                                                 {"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]}})
        .to_string(),
    );
    cluster.apply(
        &json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": queue, "namespace": namespace},
                "spec": {"clusterQueue": name}})
        .to_string(),
    );
    kueue.wait_until(&format!("ClusterQueue {name} to be active"), || {
        cluster
            .get("clusterqueues.kueue.x-k8s.io", None, name)
            .is_some_and(|cq| condition(&cq, "Active") == Some(true))
    });
}

/// Deletes what [`queues`] made, and waits, while Kueue still runs to take off its
/// finalizers (`namespace` first: its Workloads hold the ClusterQueue).
pub fn delete_queues(cluster: &Cluster, name: &str, namespace: &str) {
    for args in [
        vec![
            "delete",
            "namespace",
            namespace,
            "--ignore-not-found",
            "--timeout=90s",
        ],
        vec![
            "delete",
            "clusterqueue",
            name,
            "--ignore-not-found",
            "--timeout=60s",
        ],
        vec![
            "delete",
            "resourceflavor",
            name,
            "--ignore-not-found",
            "--timeout=60s",
        ],
    ] {
        let _ = cluster.try_kubectl(&args, None);
    }
}

/// The status of condition `kind` of an object, if it has one.
pub fn condition(object: &Value, kind: &str) -> Option<bool> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| c["status"] == "True")
}
