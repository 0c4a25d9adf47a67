//! End to end on the real control plane (scripts/testenv): the real kube-apiserver calls
//! the real `gpu-reaper webhook` binary over TLS through the chart's own
//! ValidatingWebhookConfiguration (rendered by the real helm: its caBundle, rules,
//! matchConditions, failurePolicy and timeout) and the chart's Service, routed to the
//! webhook process on this machine, which serves the chart's generated certificate; the
//! API server verifies it against the Service's DNS name. kubectl creates GPU workloads
//! and prints our denials and warnings; `gpu-reaper attest approve` writes the approval;
//! the CRD's CEL rule refuses a forged one. Also: certificate rotation without a failed
//! request.
//!
//! Each test has a release namespace (the chart's Service), a namespace for its
//! workloads, a GpuPolicy governing only that namespace and a webhook configuration
//! scoped to it, so the tests share one cluster.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::chart::{BIN, Gate, GatedNamespace};
use common::cluster::{Cluster, Run, cluster, run_with_stdin, wait_until};
use common::pki;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SAFETY: Duration = Duration::from_secs(60);

/// One test's gate: a release of the chart (webhook only, failurePolicy Fail) for its
/// own namespace and policy.
fn setup(prefix: &str, policy: impl FnOnce(&str, &str) -> String) -> GatedNamespace {
    let values = json!({
        "controller": {"enabled": false},
        "samplePolicy": {"enabled": false},
        "webhook": {"failurePolicy": "Fail"},
    });
    GatedNamespace::start(prefix, &values, policy)
}

/// The policy of a test: admission only, for its namespace alone.
fn policy(name: &str, ns: &str) -> String {
    format!(
        r#"
apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata: {{name: {name}}}
spec:
  match: {{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}}}
  admission:
    largeClaimGpus: 8
    mode: Enforce
"#
    )
}

fn job(ns: &str, name: &str, gpus_per_pod: u32, parallelism: u32) -> String {
    format!(
        r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: {ns}
  labels: {{app: llama-finetune}}
spec:
  parallelism: {parallelism}
  template:
    metadata:
      labels: {{app: llama-finetune}}
    spec:
      restartPolicy: Never
      containers:
      - name: train
        image: pytorch/pytorch:2.4.0
        resources:
          limits: {{nvidia.com/gpu: "{gpus_per_pod}"}}
"#
    )
}

fn attestation(ns: &str) -> String {
    format!(
        r#"
apiVersion: gpureaper.io/v1alpha1
kind: ReadinessAttestation
metadata: {{name: llama-finetune, namespace: {ns}}}
spec:
  selector: {{matchLabels: {{app: llama-finetune}}}}
  maxGpus: 64
  expiresAt: "2030-01-01T00:00:00Z"
  owner: {{email: alice@example.com}}
  evidence: {{datasetUri: "s3://bucket/llama/v3", dataThroughputGBps: 40, checkpointing: true}}
"#
    )
}

/// The team of a namespace: the testenv's person alice, allowed everything in the
/// namespace (a RoleBinding to cluster-admin there). A person, not a ServiceAccount:
/// nobody approves a spec a ServiceAccount changed (four eyes, docs/security.md).
struct Team {
    kubeconfig: std::path::PathBuf,
    cluster: &'static Cluster,
}

impl Team {
    fn new(cluster: &'static Cluster, ns: &str) -> Self {
        cluster.kubectl(
            &[
                "create",
                "rolebinding",
                "team",
                "-n",
                ns,
                "--clusterrole=cluster-admin",
                "--user=alice",
            ],
            None,
        );
        Team {
            kubeconfig: cluster.dir.join("alice.kubeconfig"),
            cluster,
        }
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Run {
        run_with_stdin(
            Command::new(self.cluster.bin("kubectl"))
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args),
            stdin,
        )
    }
}

/// `gpu-reaper` with the cluster-admin kubeconfig.
fn gpu_reaper(cluster: &Cluster, args: &[&str]) -> Run {
    run_with_stdin(
        Command::new(BIN)
            .args(args)
            .env("KUBECONFIG", &cluster.kubeconfig),
        None,
    )
}

/// Retries `kubectl create` until its outcome satisfies `done` (the webhook's caches
/// follow the API server within milliseconds, not instantly). An admitted Job is deleted
/// again at once (its pods would hold GPUs of the shared kwok nodes).
fn create_until(cluster: &Cluster, manifest: &str, done: impl Fn(&Run) -> bool) -> Run {
    let deadline = Instant::now() + SAFETY;
    loop {
        let dry = cluster.try_kubectl(&["create", "--dry-run=server", "-f", "-"], Some(manifest));
        if done(&dry) {
            return cluster.try_kubectl(&["create", "-f", "-"], Some(manifest));
        }
        assert!(
            Instant::now() < deadline,
            "never reached the expected outcome: {}",
            dry.stderr
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn release_job(cluster: &Cluster, ns: &str, name: &str) {
    assert!(
        cluster.get("job", Some(ns), name).is_some(),
        "job {name} exists"
    );
    cluster.kubectl(&["delete", "job", name, "-n", ns, "--wait=false"], None);
}

/// `gauge` equals the number of `kind` objects in the whole cluster (other tests create
/// them too), read around it until both agree.
fn wait_cached(gate: &Gate, cluster: &Cluster, resource: &str) -> f64 {
    let series = format!("gpu_reaper_admission_cached_objects{{resource=\"{resource}\"}}");
    let mut seen = (None, 0);
    wait_until(&format!("{series} to match the cluster"), || {
        let count = |c: &Cluster| {
            let out = c.kubectl(&["get", resource, "-A", "-o", "name"], None);
            out.lines().count()
        };
        let before = count(cluster);
        let cached = gate.metric(&series);
        let after = count(cluster);
        seen = (cached, before);
        before == after && cached == Some(before as f64)
    });
    assert!(seen.1 >= 1, "{seen:?}");
    seen.1 as f64
}

#[test]
fn kubectl_users_are_denied_then_admitted_after_approval_and_an_edit_voids_it() {
    let s = setup("gate", policy);
    let (cluster, ns, research) = (s.cluster, s.ns.as_str(), s.policy.as_str());

    // A small job passes through the gate (the webhook decided it); a 16-GPU job without
    // attestation is denied with our sentence.
    let allowed = s
        .gate
        .metric("gpu_reaper_admission_decisions_total{verdict=\"allow\",reason=\"within_limit\"}")
        .unwrap_or(0.0);
    cluster.kubectl(&["create", "-f", "-"], Some(&job(ns, "small", 4, 2)));
    release_job(cluster, ns, "small");
    assert_eq!(
        s.gate.metric(
            "gpu_reaper_admission_decisions_total{verdict=\"allow\",reason=\"within_limit\"}"
        ),
        Some(allowed + 1.0),
        "the API server asked the gate about the small job: {}",
        s.gate.metrics()
    );
    let denied = create_until(cluster, &job(ns, "train", 8, 2), |r| !r.ok);
    assert!(!denied.ok);
    let expected = format!(
        "admission webhook \"budget-gate.gpureaper.io\" denied the request: Job {ns}/train claims 16 GPUs, more than the 8 GpuPolicy \"{research}\" admits without a ReadinessAttestation, and no ReadinessAttestation in namespace {ns} selects its labels; create one that does (see docs/budget-gate.md) and ask an approver to run `gpu-reaper attest approve {ns}/<name>`."
    );
    assert!(denied.stderr.contains(&expected), "{}", denied.stderr);
    assert!(cluster.get("job", Some(ns), "train").is_none());

    // The team (alice, a person with every right in the namespace) writes an
    // attestation: not approved yet. The mutating webhook records who changed the spec.
    let team = Team::new(cluster, ns);
    let wrote = team.kubectl(&["apply", "-f", "-"], Some(&attestation(ns)));
    assert!(wrote.ok, "{}", wrote.stderr);
    let pending = create_until(cluster, &job(ns, "train", 8, 2), |r| {
        r.stderr.contains("is not approved")
    });
    assert!(!pending.ok);
    assert!(pending.stderr.contains(&format!("ReadinessAttestation {ns}/llama-finetune is not approved; ask an approver to review it and run `gpu-reaper attest approve {ns}/llama-finetune`.")), "{}", pending.stderr);

    // An approver approves it; the same create succeeds.
    let target = format!("{ns}/llama-finetune");
    let uid = cluster
        .get("readinessattestation", Some(ns), "llama-finetune")
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    // Approving binds to the spec shown: without --generation it is refused and shown.
    let blind = gpu_reaper(cluster, &["attest", "approve", &target]);
    assert!(!blind.ok, "{}", blind.stdout);
    assert!(blind.stderr.contains("--generation 1"), "{}", blind.stderr);
    // The team may not approve its own spec (four eyes), whatever it claims to be.
    let own = run_with_stdin(
        Command::new(BIN)
            .args([
                "attest",
                "approve",
                &target,
                "--generation",
                "1",
                "--uid",
                &uid,
                "--approver",
                "lead",
            ])
            .env("KUBECONFIG", &team.kubeconfig),
        None,
    );
    assert!(!own.ok, "the author approved its own spec: {}", own.stdout);
    let approve = gpu_reaper(
        cluster,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "1",
            "--uid",
            &uid,
        ],
    );
    assert!(approve.ok, "{}", approve.stderr);
    // approvedBy is the identity the API server authenticated (the admin certificate's
    // CN), not the kubeconfig's name for its user entry ("admin").
    assert_eq!(
        approve.stdout.trim(),
        format!("readinessattestation {target} approved by testenv-admin for generation 1")
    );
    let stored = cluster
        .get("readinessattestation", Some(ns), "llama-finetune")
        .unwrap();
    assert_eq!(stored["status"]["approvedGeneration"], 1);
    assert_eq!(stored["status"]["approvedBy"], "testenv-admin");
    let admitted = create_until(cluster, &job(ns, "train", 8, 2), |r| r.ok);
    assert!(admitted.ok, "{}", admitted.stderr);
    release_job(cluster, ns, "train");

    // The team editing the spec voids the approval (the real server bumps
    // metadata.generation).
    let edit = team.kubectl(
        &[
            "patch",
            "readinessattestation",
            "llama-finetune",
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"maxGpus":128}}"#,
        ],
        None,
    );
    assert!(edit.ok, "{}", edit.stderr);
    let voided = create_until(cluster, &job(ns, "train-2", 8, 2), |r| {
        r.stderr.contains("has changed since")
    });
    assert!(!voided.ok);
    assert!(
        voided.stderr.contains(&format!("ReadinessAttestation {ns}/llama-finetune was approved for generation 1 but its spec has changed since (generation 2)")),
        "{}",
        voided.stderr
    );

    // Re-approval covers the new spec; revoking withdraws it.
    let again = gpu_reaper(
        cluster,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "2",
            "--uid",
            &uid,
            "--approver",
            "lead",
        ],
    );
    assert!(
        again.stdout.contains("approved by lead for generation 2"),
        "{}",
        again.stderr
    );
    assert!(create_until(cluster, &job(ns, "train-2", 8, 2), |r| r.ok).ok);
    release_job(cluster, ns, "train-2");
    let revoke = gpu_reaper(cluster, &["attest", "revoke", &target]);
    assert!(revoke.ok, "{}", revoke.stderr);
    assert!(!create_until(cluster, &job(ns, "train-3", 8, 2), |r| !r.ok).ok);

    // A team cannot approve by writing status itself: the webhook knows it last changed
    // the spec (four eyes)…
    let forged_status = r#"{"status":{"conditions":[{"type":"Approved","status":"True","reason":"Self","message":"me","lastTransitionTime":"2026-11-01T00:00:00Z"}],"approvedBy":"me","approvedGeneration":2}}"#;
    let patch_status = |status: &str| -> Vec<String> {
        [
            "patch",
            "readinessattestation",
            "llama-finetune",
            "-n",
            ns,
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            status,
        ]
        .map(String::from)
        .to_vec()
    };
    let args = patch_status(forged_status);
    let own = team.kubectl(&args.iter().map(String::as_str).collect::<Vec<_>>(), None);
    assert!(!own.ok, "the team approved its own spec");
    assert!(
        own.stderr.contains("who may not approve it (four eyes)"),
        "{}",
        own.stderr
    );
    // …and nobody approves a generation that is not the current one: the CRD's CEL
    // rule, evaluated by the real API server.
    let args = patch_status(
        &forged_status.replace("\"approvedGeneration\":2", "\"approvedGeneration\":1"),
    );
    let forged = cluster.try_kubectl(&args.iter().map(String::as_str).collect::<Vec<_>>(), None);
    assert!(!forged.ok);
    assert!(
        forged
            .stderr
            .contains("status.approvedGeneration 1 must equal metadata.generation 2"),
        "{}",
        forged.stderr
    );

    // Warn mode admits with a kubectl warning.
    cluster.kubectl(
        &[
            "patch",
            "gpupolicy",
            research,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"admission":{"mode":"Warn"}}}"#,
        ],
        None,
    );
    let warned = create_until(cluster, &job(ns, "train-4", 8, 2), |r| r.ok);
    assert!(warned.ok, "{}", warned.stderr);
    assert!(
        warned.stderr.contains(&format!("Warning: Job {ns}/train-4 claims 16 GPUs, more than the 8 GpuPolicy \"{research}\" admits without a ReadinessAttestation, and ReadinessAttestation {ns}/llama-finetune is not approved")),
        "{}",
        warned.stderr
    );
    release_job(cluster, ns, "train-4");

    // Every decision was counted.
    let metrics = s.gate.metrics();
    for series in [
        "gpu_reaper_admission_decisions_total{verdict=\"deny\",reason=\"no_attestation\"}",
        "gpu_reaper_admission_decisions_total{verdict=\"allow\",reason=\"attested\"}",
        "gpu_reaper_admission_decisions_total{verdict=\"warn\",reason=\"not_approved\"}",
    ] {
        assert!(metrics.contains(series), "{series}: {metrics}");
    }
    wait_cached(&s.gate, cluster, "readinessattestations");
}

#[test]
fn gpus_claimed_through_a_dra_claim_template_are_counted_from_the_webhook_cache() {
    let s = setup("gate-dra", policy);
    let (cluster, ns) = (s.cluster, s.ns.as_str());
    // resource.k8s.io/v1, validated by the real server.
    let template = format!(
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: four-gpus, namespace: {ns}}}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {{deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count: 4}}
"#
    );
    cluster.apply(&template);
    // 4 pods, each with a claim made from the template: 16 GPUs, none in resources.limits.
    let job = format!(
        r#"
apiVersion: batch/v1
kind: Job
metadata: {{name: dra-train, namespace: {ns}, labels: {{app: llama-finetune}}}}
spec:
  parallelism: 4
  template:
    spec:
      restartPolicy: Never
      resourceClaims:
      - {{name: gpus, resourceClaimTemplateName: four-gpus}}
      containers:
      - name: train
        image: pytorch/pytorch:2.4.0
        resources:
          claims: [{{name: gpus}}]
"#
    );
    let denied = create_until(cluster, &job, |r| !r.ok);
    assert!(
        denied.stderr.contains(&format!(
            "denied the request: Job {ns}/dra-train claims 16 GPUs, more than the 8"
        )),
        "{}",
        denied.stderr
    );
    wait_cached(&s.gate, cluster, "resourceclaimtemplates");
}

// ---- certificate rotation: the webhook's TLS listener, with clients of our own ----

/// A throw-away CA and a serving certificate for 127.0.0.1, as PEM.
struct TestPki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
    leaf_der: Vec<u8>,
}

fn test_pki(label: &str) -> TestPki {
    let ca = pki::Ca::new(&format!("budget-gate test CA {label}"));
    let leaf = ca.leaf(&["127.0.0.1"], &format!("gpu-reaper webhook {label}"));
    TestPki {
        ca_pem: ca.pem,
        cert_pem: leaf.cert_pem,
        key_pem: leaf.key_pem,
        leaf_der: leaf.der,
    }
}

/// The webhook binary on loopback with a test certificate (its caches on the real
/// cluster), killed on drop.
struct Webhook {
    _child: tokio::process::Child,
    port: u16,
    probe_port: u16,
    _dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
}

impl Webhook {
    async fn start(cluster: &Cluster, pki: &TestPki) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        std::fs::write(&cert, &pki.cert_pem).unwrap();
        std::fs::write(&key, &pki.key_pem).unwrap();
        let (port, probe_port) = (common::free_port(), common::free_port());
        let child = tokio::process::Command::new(BIN)
            .args(["webhook", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--probe-listen", &format!("127.0.0.1:{probe_port}")])
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .args(["--tls-reload-interval", "100ms", "--cache-debounce", "20ms"])
            .env("KUBECONFIG", &cluster.kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("gpu-reaper binary runs");
        let webhook = Self {
            _child: child,
            port,
            probe_port,
            _dir: dir,
            cert,
            key,
        };
        let deadline = Instant::now() + SAFETY;
        loop {
            if let Ok(status) = plain_get(probe_port, "/readyz").await
                && status == 200
            {
                break;
            }
            assert!(Instant::now() < deadline, "webhook never became ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        webhook
    }
}

/// `GET path` over plain HTTP on loopback; the status code.
async fn plain_get(port: u16, path: &str) -> std::io::Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad response {response:?}")))
}

async fn plain_get_body(port: u16, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

/// One HTTPS `GET /healthz` on a new connection; the leaf certificate the server showed.
async fn tls_get(port: u16, connector: &tokio_rustls::TlsConnector) -> Result<Vec<u8>, String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .ok_or("no certificate")?[0]
        .to_vec();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    tls.read_to_end(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    if !response.starts_with(b"HTTP/1.1 200") {
        return Err(String::from_utf8_lossy(&response).into_owned());
    }
    Ok(leaf)
}

fn connector(cas: &[&str]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    // Full handshakes only: a resumed session would report the certificate of the
    // session it resumes, not the one served now.
    config.resumption = rustls::client::Resumption::disabled();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

fn replace(path: &Path, contents: &str) {
    // As a Secret volume update does: the new file appears whole, by rename.
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_to_new_connections_and_no_request_fails() {
    let cluster = cluster();
    cluster.install_crds();
    let (old, new) = (test_pki("old"), test_pki("new"));
    let webhook = Webhook::start(cluster, &old).await;
    let connector = connector(&[&old.ca_pem, &new.ca_pem]);
    assert_eq!(
        tls_get(webhook.port, &connector).await.unwrap(),
        old.leaf_der
    );

    // Clients keep connecting while the files are replaced.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let load = {
        let (stop, served, failures, connector, port) = (
            stop.clone(),
            served.clone(),
            failures.clone(),
            connector.clone(),
            webhook.port,
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match tls_get(port, &connector).await {
                    Ok(_) => served.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        failures.lock().unwrap().push(e);
                        0
                    }
                };
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Key first, then certificate: for a moment the pair does not match, and the
    // webhook must keep serving the old pair until the new one is whole.
    replace(&webhook.key, &new.key_pem);
    tokio::time::sleep(Duration::from_millis(250)).await;
    replace(&webhook.cert, &new.cert_pem);
    let deadline = Instant::now() + SAFETY;
    while tls_get(webhook.port, &connector).await.unwrap() != new.leaf_der {
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert_eq!(failures.lock().unwrap().clone(), Vec::<String>::new());
    assert!(
        served.load(Ordering::Relaxed) >= 10,
        "only {} requests",
        served.load(Ordering::Relaxed)
    );
    // Clients that trust only the new CA now connect.
    assert_eq!(
        tls_get(webhook.port, &connector_new_only(&new))
            .await
            .unwrap(),
        new.leaf_der
    );
    let metrics = plain_get_body(webhook.probe_port, "/metrics").await;
    assert!(
        metrics.contains("gpu_reaper_admission_tls_reloads_total{result=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpu_reaper_admission_tls_reloads_total{result=\"error\"}"),
        "the mismatched pair was refused: {metrics}"
    );
    drop(webhook);
}

fn connector_new_only(new: &TestPki) -> tokio_rustls::TlsConnector {
    connector(&[&new.ca_pem])
}

/// Issue 20's first bypass, through the real API server: `kubectl scale` writes the
/// Deployment's `/scale` subresource, which the chart routes to the gate; 100 replicas of
/// 8 GPUs in a namespace allowed 8 are refused with one sentence before any pod is tried.
#[test]
fn kubectl_scale_of_an_8_gpu_deployment_to_100_replicas_is_refused_by_the_gate() {
    let s = setup("scale", policy);
    let (cluster, ns) = (s.cluster, s.ns.as_str());
    let deployment = format!(
        r#"{{"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {{"name": "serve", "namespace": "{ns}"}},
            "spec": {{"replicas": 1, "selector": {{"matchLabels": {{"app": "serve"}}}},
                     "template": {{"metadata": {{"labels": {{"app": "serve"}}}},
                                  "spec": {{"containers": [{{"name": "main", "image": "vllm/vllm-openai:v0.6.0",
                                                           "resources": {{"limits": {{"nvidia.com/gpu": "8"}}}}}}]}}}}}}}}"#
    );
    let created = cluster.try_kubectl(&["create", "-f", "-"], Some(&deployment));
    assert!(
        created.ok,
        "one replica of 8 GPUs is within the allowance: {}",
        created.stderr
    );
    // Wait until the webhook's pod cache holds the running replica, so the scale-up is
    // judged against what the namespace really holds.
    cluster.running_pods(ns, "app=serve", 1);
    let decisions = s.gate.decisions();
    let scaled = cluster.try_kubectl(
        &["scale", "deployment", "serve", "-n", ns, "--replicas=100"],
        None,
    );
    assert!(!scaled.ok, "scaled to 100: {}", scaled.stdout);
    assert!(
        scaled
            .stderr
            .contains("admission webhook \"budget-gate.gpureaper.io\" denied the request"),
        "{}",
        scaled.stderr
    );
    assert!(scaled.stderr.contains("GPU"), "{}", scaled.stderr);
    assert!(s.gate.decisions() > decisions, "the gate decided the scale");
    let after = cluster.get("deployment", Some(ns), "serve").unwrap();
    assert_eq!(after["spec"]["replicas"], 1, "the scale went through");
    cluster.kubectl(
        &["delete", "deployment", "serve", "-n", ns, "--wait=false"],
        None,
    );
}

/// An HPA is one more way to write `/scale`: its controller's scale-up of an 8-GPU
/// Deployment past the allowance is refused by the gate like a person's.
#[test]
fn an_hpa_scaling_an_8_gpu_deployment_past_the_allowance_is_refused_by_the_gate() {
    let s = setup("hpa", policy);
    let (cluster, ns) = (s.cluster, s.ns.as_str());
    cluster.apply(&gpu_deployment(ns, "serve", 1, 8));
    cluster.running_pods(ns, "app=serve", 1);
    wait_until("the webhook caches the Deployment", || {
        cluster
            .try_kubectl(
                &[
                    "scale",
                    "deployment",
                    "serve",
                    "-n",
                    ns,
                    "--replicas=2",
                    "--dry-run=server",
                ],
                None,
            )
            .stderr
            .contains("denied the request")
    });
    let hpa = format!(
        r#"{{"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {{"name": "serve", "namespace": "{ns}"}},
            "spec": {{"scaleTargetRef": {{"apiVersion": "apps/v1", "kind": "Deployment", "name": "serve"}},
                     "minReplicas": 4, "maxReplicas": 8}}}}"#
    );
    cluster.apply(&hpa);
    // The HPA controller scales to minReplicas without metrics; its write is judged.
    let mut condition = Value::Null;
    wait_until("the HPA reports the refused rescale", || {
        let hpa = cluster.get("hpa", Some(ns), "serve").unwrap_or_default();
        condition = hpa["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "AbleToScale" && c["reason"] == "FailedUpdateScale")
            .cloned()
            .unwrap_or(Value::Null);
        !condition.is_null()
    });
    let message = condition["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("admission webhook \"budget-gate.gpureaper.io\" denied the request")
            && message.contains("GPU"),
        "{condition}"
    );
    let after = cluster.get("deployment", Some(ns), "serve").unwrap();
    assert_eq!(after["spec"]["replicas"], 1, "the HPA's scale went through");
    cluster.kubectl(
        &[
            "delete",
            "hpa,deployment",
            "--all",
            "-n",
            ns,
            "--wait=false",
        ],
        None,
    );
}

/// A Deployment of `replicas` pods with `gpus` GPUs each (labels `app: name`).
fn gpu_deployment(ns: &str, name: &str, replicas: u32, gpus: u32) -> String {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
           "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                                 "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.0",
                                                          "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}}}})
    .to_string()
}

/// The hard limit of the namespace's GPU quota for `key`, once the quota controller has
/// taken it up (the API server enforces `status.hard`).
fn quota_hard(cluster: &Cluster, ns: &str, key: &str) -> Option<String> {
    let q = cluster.get("resourcequota", Some(ns), "gpu-reaper-gpus")?;
    let spec = q["spec"]["hard"][key].as_str()?.to_string();
    (q["status"]["hard"][key].as_str() == Some(spec.as_str())).then_some(spec)
}

/// G2: with no webhook running at all, the controller's ResourceQuota makes the API
/// server refuse the pods past what the gate allows; an approved attestation raises it,
/// an edit after approval or the expiry lowers it again (and the attestation says why),
/// and a namespace no longer governed loses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_webhook_stopped_the_controllers_quota_refuses_the_pods_past_the_allowance() {
    let s = common::scenario::Scenario::start(
        "quota",
        |ns| {
            vec![common::scenario::Workload {
                name: "serve",
                manifest: gpu_deployment(ns, "serve", 1, 8),
                pods: ("app=serve".into(), 1),
            }]
        },
        |dcgm, ns, pods| {
            dcgm.gpu(
                ns,
                &pods["serve"][0],
                0,
                common::scenario::H100,
                0..=240,
                |_| Some(0.9),
            );
        },
    );
    let (cluster, ns) = (s.cluster, s.ns.clone());
    let ns = ns.as_str();
    s.apply_policy("  admission:\n    largeClaimGpus: 8\n    mode: Enforce\n");
    let cycle = |minutes: i64| {
        let s = &s;
        async move {
            let (ok, log) = s.cycle(minutes, "quota-test").await;
            assert!(ok, "{log}");
            log
        }
    };
    let log = cycle(0).await;
    assert!(log.contains("GPU quota written"), "{log}");
    let gpu = "requests.nvidia.com/gpu";
    wait_until("the quota controller takes up the quota", || {
        quota_hard(cluster, ns, gpu).as_deref() == Some("8")
    });
    // The kwok MIG node serves 1g.10gb slices: seven of them make a GPU.
    assert_eq!(
        quota_hard(cluster, ns, "requests.nvidia.com/mig-1g.10gb").as_deref(),
        Some("56")
    );
    // No webhook is registered for this namespace: the scale itself is admitted, and
    // the ReplicaSet's new pods are refused by the API server.
    cluster.kubectl(
        &["scale", "deployment", "serve", "-n", ns, "--replicas=3"],
        None,
    );
    let mut refusal = String::new();
    wait_until(
        "the ReplicaSet reports FailedCreate naming the quota",
        || {
            refusal = cluster
                .list("events", ns, None)
                .into_iter()
                .filter(|e| {
                    e["reason"] == "FailedCreate" && e["involvedObject"]["kind"] == "ReplicaSet"
                })
                .filter_map(|e| e["message"].as_str().map(String::from))
                .find(|m| m.contains("exceeded quota: gpu-reaper-gpus"))
                .unwrap_or_default();
            !refusal.is_empty()
        },
    );
    assert!(refusal.contains("requests.nvidia.com/gpu"), "{refusal}");
    let running = |c: &Cluster| {
        c.list("pods", ns, Some("app=serve"))
            .into_iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count()
    };
    assert_eq!(running(cluster), 1, "a pod past the quota was created");
    // An approved 16-GPU attestation: 8 + 16 GPUs.
    let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(2);
    let attestation = |max: u32| {
        format!(
            r#"{{"apiVersion": "gpureaper.io/v1alpha1", "kind": "ReadinessAttestation",
                "metadata": {{"name": "serve", "namespace": "{ns}"}},
                "spec": {{"selector": {{"matchLabels": {{"app": "serve"}}}}, "maxGpus": {max},
                         "expiresAt": "{expires}", "owner": {{"email": "alice@example.com"}},
                         "evidence": {{"datasetUri": "s3://bucket/v3", "dataThroughputGBps": 40, "checkpointing": true}}}}}}"#,
            expires = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
        )
    };
    cluster.apply(&attestation(16));
    let target = format!("{ns}/serve");
    let uid = cluster
        .get("readinessattestation", Some(ns), "serve")
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let approve = gpu_reaper(
        cluster,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "1",
            "--uid",
            &uid,
        ],
    );
    assert!(approve.ok, "{}", approve.stderr);
    cycle(1).await;
    wait_until("the quota grows to 24", || {
        quota_hard(cluster, ns, gpu).as_deref() == Some("24")
    });
    // The ReplicaSet retries with a backoff; a scale event makes it try now.
    cluster.kubectl(
        &["scale", "deployment", "serve", "-n", ns, "--replicas=2"],
        None,
    );
    cluster.kubectl(
        &["scale", "deployment", "serve", "-n", ns, "--replicas=3"],
        None,
    );
    wait_until("three pods run within the quota", || running(cluster) == 3);
    // Edited after approval: the approval no longer counts, and says so.
    cluster.apply(&attestation(64));
    cycle(2).await;
    let reason = |c: &Cluster| {
        c.kubectl(
            &["get", "readinessattestation", "serve", "-n", ns, "--no-headers", "-o",
              "custom-columns=A:.status.conditions[?(@.type==\"Approved\")].status,R:.status.conditions[?(@.type==\"Approved\")].reason"],
            None,
        )
        .split_whitespace()
        .map(String::from)
        .collect::<Vec<_>>()
    };
    assert_eq!(reason(cluster), ["False", "SpecChanged"]);
    let lapsed: Vec<String> = cluster
        .list("events", ns, None)
        .into_iter()
        .filter(|e| {
            e["involvedObject"]["kind"] == "ReadinessAttestation" && e["reason"] == "ApprovalLapsed"
        })
        .filter_map(|e| e["message"].as_str().map(String::from))
        .collect();
    assert!(
        lapsed.iter().any(|m| m.contains("generation 1 (now 2)")),
        "{lapsed:?}"
    );
    let table = cluster.kubectl(&["get", "readinessattestation", "serve", "-n", ns], None);
    assert!(
        table.contains("REASON") && table.contains("SpecChanged"),
        "{table}"
    );
    wait_until("the quota shrinks back to 8", || {
        quota_hard(cluster, ns, gpu).as_deref() == Some("8")
    });
    assert_eq!(
        running(cluster),
        3,
        "a quota never takes GPUs from running pods"
    );
    // Approved again, then past its expiry.
    let approve = gpu_reaper(
        cluster,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "2",
            "--uid",
            &uid,
        ],
    );
    assert!(approve.ok, "{}", approve.stderr);
    cycle(3).await;
    wait_until("the quota grows to 72", || {
        quota_hard(cluster, ns, gpu).as_deref() == Some("72")
    });
    cycle(200).await;
    assert_eq!(reason(cluster), ["False", "Expired"]);
    wait_until("the quota shrinks to 8 after the expiry", || {
        quota_hard(cluster, ns, gpu).as_deref() == Some("8")
    });
    // Warn mode does not enforce: the quota goes.
    s.apply_policy("  admission:\n    largeClaimGpus: 8\n    mode: Warn\n");
    let log = cycle(201).await;
    assert!(log.contains("GPU quota removed"), "{log}");
    assert!(
        cluster
            .get("resourcequota", Some(ns), "gpu-reaper-gpus")
            .is_none()
    );
}
