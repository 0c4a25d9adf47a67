//! The Helm chart on the real control plane, shared by tests/cluster/budget_gate.rs and
//! tests/cluster/helm.rs: the real helm (built with the control plane) renders or installs
//! `helm/gpu-reaper`, and [`Gate`] runs the real `gpu-reaper webhook` binary on this
//! machine behind the chart's own Service and ValidatingWebhookConfiguration, so the real
//! API server calls it over TLS, verifies the chart's certificate against the Service's
//! DNS name, and evaluates the chart's rules, matchConditions, failurePolicy and timeout.
//!
//! The cluster is shared by every test, so a gate is scoped to the namespaces of its test
//! (an extra `kubernetes.io/metadata.name In [...]` namespaceSelector term) and named
//! after a unique release.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use super::cluster::{Cluster, Run, run_with_stdin, wait_until};

pub const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/helm/gpu-reaper");
pub const BIN: &str = env!("CARGO_BIN_EXE_gpu-reaper");

/// The real helm against `cluster` (its kubeconfig), with Helm's own state in a
/// directory of this run rather than the user's home.
pub fn helm(cluster: &Cluster, args: &[&str]) -> Run {
    let home = std::env::temp_dir().join(format!("gpu-reaper-helm-{}", std::process::id()));
    let mut command = Command::new(cluster.bin("helm"));
    command
        .args(args)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    run_with_stdin(&mut command, None)
}

/// `values` as a file helm reads with `-f` (JSON is YAML).
pub fn values_file(dir: &Path, name: &str, values: &Value) -> PathBuf {
    let path = dir.join(format!("{name}.values.json"));
    std::fs::write(&path, values.to_string()).unwrap();
    path
}

/// `helm template RELEASE CHART -n NAMESPACE -f values` plus `extra` flags; the rendered
/// objects, or helm's error.
pub fn render(
    cluster: &Cluster,
    release: &str,
    namespace: &str,
    values: &Value,
    extra: &[&str],
) -> Result<Vec<Value>, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = values_file(dir.path(), release, values);
    let mut args = vec![
        "template",
        release,
        CHART,
        "--namespace",
        namespace,
        "-f",
        file.to_str().unwrap(),
    ];
    args.extend(extra);
    let run = helm(cluster, &args);
    if !run.ok {
        return Err(run.stderr);
    }
    Ok(documents(&run.stdout))
}

/// The YAML documents of a Helm manifest, as JSON values.
pub fn documents(manifest: &str) -> Vec<Value> {
    manifest
        .split("\n---")
        .filter_map(|doc| serde_yaml::from_str::<Value>(doc).ok())
        .filter(|v| v.is_object())
        .collect()
}

pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("the chart renders no {kind} {name}"))
}

pub fn find_kind<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("the chart renders no {kind}"))
}

pub fn b64(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64")
}

/// This machine's non-loopback IPv4 address (a Service endpoint may not be loopback).
pub fn host_ip(cluster: &Cluster) -> String {
    std::fs::read_to_string(cluster.dir.join("host-ip"))
        .expect("scripts/testenv writes DIR/host-ip")
        .trim()
        .to_string()
}

/// A kubeconfig for `cluster` that authenticates with `token` (a ServiceAccount's, from
/// `kubectl create token`), written to `dir/name.kubeconfig`. The context's user entry is
/// called `name`.
pub fn token_kubeconfig(cluster: &Cluster, dir: &Path, name: &str, token: &str) -> PathBuf {
    let mut config: Value =
        serde_yaml::from_str(&std::fs::read_to_string(&cluster.kubeconfig).unwrap()).unwrap();
    config["users"] = json!([{"name": name, "user": {"token": token}}]);
    config["contexts"][0]["context"]["user"] = json!(name);
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

/// A kubeconfig for the ServiceAccount `namespace/name`, with a real token the API server
/// issued (`kubectl create token`).
pub fn service_account_kubeconfig(
    cluster: &Cluster,
    dir: &Path,
    namespace: &str,
    name: &str,
) -> PathBuf {
    let token = cluster.kubectl(
        &["create", "token", name, "-n", namespace, "--duration=2h"],
        None,
    );
    token_kubeconfig(cluster, dir, &format!("{namespace}-{name}"), token.trim())
}

/// The chart's webhook Service routed to `host_ip:port` on this machine: the Service made
/// selector-less (its pods cannot run on kwok nodes) and an EndpointSlice for it.
pub fn route_service(cluster: &Cluster, service: &Value, host_ip: &str, port: u16) {
    let mut service = service.clone();
    service["spec"].as_object_mut().unwrap().remove("selector");
    let (ns, name) = (
        service["metadata"]["namespace"]
            .as_str()
            .unwrap()
            .to_string(),
        service["metadata"]["name"].as_str().unwrap().to_string(),
    );
    // `replace` (not apply): a Service helm installed loses its selector too.
    if cluster.get("service", Some(&ns), &name).is_some() {
        cluster.kubectl(
            &[
                "patch",
                "service",
                &name,
                "-n",
                &ns,
                "--type=json",
                "-p",
                r#"[{"op":"remove","path":"/spec/selector"}]"#,
            ],
            None,
        );
    } else {
        cluster.apply(&service.to_string());
    }
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-local"), "namespace": ns,
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host_ip], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    });
    cluster.apply(&slice.to_string());
}

/// The chart's ValidatingWebhookConfiguration, narrowed to `namespaces` (besides the
/// chart's own exclusions) so other tests on the shared cluster never reach this gate.
pub fn scoped(vwc: &Value, namespaces: &[&str]) -> Value {
    let mut vwc = vwc.clone();
    for hook in vwc["webhooks"].as_array_mut().unwrap() {
        if hook["namespaceSelector"]["matchExpressions"].is_null() {
            // (the attestation-author hook has none: every namespace)
            hook["namespaceSelector"]["matchExpressions"] = json!([]);
        }
        let expressions = hook["namespaceSelector"]["matchExpressions"]
            .as_array_mut()
            .unwrap();
        expressions.push(
            json!({"key": "kubernetes.io/metadata.name", "operator": "In",
                                "values": namespaces}),
        );
    }
    vwc
}

/// The real `gpu-reaper webhook` on this machine, behind the chart's Service and webhook
/// configuration. Killed, and its webhook configuration deleted, on drop.
pub struct Gate {
    child: Child,
    cluster: &'static Cluster,
    /// HTTPS port on [`host_ip`].
    pub port: u16,
    /// Plain-HTTP probe and metrics port on loopback.
    pub probe_port: u16,
    pub dir: tempfile::TempDir,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub vwc_name: String,
    /// The chart's MutatingWebhookConfiguration (it records who changed an attestation's
    /// spec, for four eyes), when it renders one.
    pub mwc_name: Option<String>,
}

impl Drop for Gate {
    fn drop(&mut self) {
        let _ = self.cluster.try_kubectl(
            &[
                "delete",
                "validatingwebhookconfiguration",
                &self.vwc_name,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
        if let Some(name) = &self.mwc_name {
            let _ = self.cluster.try_kubectl(
                &[
                    "delete",
                    "mutatingwebhookconfiguration",
                    name,
                    "--ignore-not-found",
                    "--wait=false",
                ],
                None,
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gate {
    /// Starts the webhook with the chart's serving certificate (its TLS Secret) and the
    /// chart's flags, as `kubeconfig`'s identity, routes the chart's Service to it and
    /// applies the chart's webhook configuration scoped to `namespaces` (or narrows the
    /// one helm installed: `kubectl apply` over it).
    pub fn start(
        cluster: &'static Cluster,
        objects: &[Value],
        namespaces: &[&str],
        kubeconfig: &Path,
    ) -> Gate {
        let dir = tempfile::tempdir().unwrap();
        let secret = objects
            .iter()
            .find(|o| o["kind"] == "Secret" && o["type"] == "kubernetes.io/tls")
            .expect("the chart renders its webhook TLS Secret");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, b64(secret["data"]["tls.crt"].as_str().unwrap())).unwrap();
        std::fs::write(&key, b64(secret["data"]["tls.key"].as_str().unwrap())).unwrap();
        let deployment = objects
            .iter()
            .find(|o| {
                o["kind"] == "Deployment"
                    && o["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"
            })
            .expect("the chart renders the webhook Deployment");
        // The chart's flags, but this machine's addresses and files.
        let args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .filter(|a| {
                !["--listen", "--probe-listen", "--tls-cert", "--tls-key"]
                    .iter()
                    .any(|f| a.starts_with(f))
            })
            .map(String::from)
            .collect();
        let ip = host_ip(cluster);
        let port = std::net::TcpListener::bind((ip.as_str(), 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let probe_port = super::free_port();
        let log = std::fs::File::create(dir.path().join("webhook.log")).unwrap();
        let child = Command::new(BIN)
            .args(&args)
            .arg(format!("--listen={ip}:{port}"))
            .arg(format!("--probe-listen=127.0.0.1:{probe_port}"))
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .args(["--tls-reload-interval", "100ms"])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the gpu-reaper binary runs");
        let vwc = find_kind(objects, "ValidatingWebhookConfiguration");
        let mut gate = Gate {
            child,
            cluster,
            port,
            probe_port,
            cert,
            key,
            vwc_name: vwc["metadata"]["name"].as_str().unwrap().to_string(),
            mwc_name: None,
            dir,
        };
        wait_until("the webhook's /readyz (its caches synced)", || {
            if let Ok(Some(status)) = gate.child.try_wait() {
                panic!("the webhook exited ({status}): {}", gate.log());
            }
            super::http_ok(probe_port, "/readyz")
        });
        let service = objects
            .iter()
            .find(|o| {
                o["kind"] == "Service"
                    && o["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"
            })
            .expect("the chart renders the webhook Service");
        route_service(cluster, service, &ip, port);
        cluster.apply(&scoped(vwc, namespaces).to_string());
        if let Some(mwc) = objects
            .iter()
            .find(|o| o["kind"] == "MutatingWebhookConfiguration")
        {
            cluster.apply(&scoped(mwc, namespaces).to_string());
            gate.mwc_name = Some(mwc["metadata"]["name"].as_str().unwrap().to_string());
        }
        gate
    }

    /// Stops the webhook process, leaving its configuration registered: the API server
    /// then applies each webhook's failurePolicy, as when the gate is down.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// What the webhook logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("webhook.log")).unwrap_or_default()
    }

    /// The webhook's Prometheus metrics.
    pub fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.probe_port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// The value of the metric line starting with `series` (name and labels), if any.
    pub fn metric(&self, series: &str) -> Option<f64> {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    /// Admission reviews the webhook has decided, all verdicts.
    pub fn decisions(&self) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with("gpu_reaper_admission_decisions_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits until the API server really calls this gate: a server-side dry run of a
    /// Job in `namespace` reaches the webhook (its decision count grows). The API server
    /// picks up a new webhook configuration and EndpointSlice asynchronously.
    pub fn wait_called(&self, namespace: &str) {
        let probe = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "gate-probe", "namespace": namespace},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "x"}]}}}})
        .to_string();
        wait_until("the API server calling the webhook", || {
            let before = self.decisions();
            let _ = self
                .cluster
                .try_kubectl(&["create", "--dry-run=server", "-f", "-"], Some(&probe));
            self.decisions() > before
        });
    }
}

/// Deletes what a test made on the shared cluster when it ends, pass or fail: its
/// namespaces (and all in them) and its cluster-scoped objects, as `(kind, name)`.
pub struct Cleanup {
    cluster: &'static Cluster,
    objects: Vec<(String, String)>,
}

impl Cleanup {
    pub fn new(cluster: &'static Cluster) -> Self {
        Cleanup {
            cluster,
            objects: Vec::new(),
        }
    }

    pub fn add(&mut self, kind: &str, name: &str) {
        self.objects.push((kind.to_string(), name.to_string()));
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for (kind, name) in self.objects.iter().rev() {
            let _ = self.cluster.try_kubectl(
                &["delete", kind, name, "--ignore-not-found", "--wait=false"],
                None,
            );
        }
    }
}

/// One test's gate on the shared cluster: a release of the chart rendered with `values`
/// into `{prefix}-sys-N`, its webhooks serving the namespace `{prefix}-N` alone, and the
/// GpuPolicy `research-{prefix}-N` written by `policy(name, namespace)`. Everything is
/// removed when it is dropped.
pub struct GatedNamespace {
    pub cluster: &'static Cluster,
    pub ns: String,
    pub policy: String,
    /// What the chart rendered (its roles, its webhook configurations…).
    pub objects: Vec<Value>,
    pub gate: Gate,
    pub cleanup: Cleanup,
}

impl GatedNamespace {
    pub fn start(prefix: &str, values: &Value, policy: impl FnOnce(&str, &str) -> String) -> Self {
        use super::cluster::{cluster, unique};
        let cluster = cluster();
        cluster.install_crds();
        let mut cleanup = Cleanup::new(cluster);
        let system = cluster.namespace(&format!("{prefix}-sys"), &[]);
        cleanup.add("namespace", &system);
        let ns = cluster.namespace(prefix, &[]);
        cleanup.add("namespace", &ns);
        let name = format!("research-{ns}");
        cluster.apply(&policy(&name, &ns));
        cleanup.add("gpupolicy", &name);
        let release = format!("{prefix}-{}", unique());
        let objects = render(cluster, &release, &system, values, &[]).expect("helm template");
        let gate = Gate::start(cluster, &objects, &[&ns], &cluster.kubeconfig);
        cleanup.add("validatingwebhookconfiguration", &gate.vwc_name);
        if let Some(mwc) = &gate.mwc_name {
            cleanup.add("mutatingwebhookconfiguration", mwc);
        }
        gate.wait_called(&ns);
        GatedNamespace {
            cluster,
            ns,
            policy: name,
            objects,
            gate,
            cleanup,
        }
    }
}
