//! End to end: kube-sim (the in-memory API server) calls the real `gpu-reaper webhook`
//! binary over HTTPS with a test CA through a ValidatingWebhookConfiguration; kubectl
//! creates GPU workloads and prints our denials and warnings; `gpu-reaper attest approve`
//! writes the approval. Also: certificate rotation without a failed request.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[path = "common/pki.rs"]
mod pki;

use kube_sim::KubeSim;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SAFETY: Duration = Duration::from_secs(60);
const BIN: &str = env!("CARGO_BIN_EXE_gpu-reaper");
const CRDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/gpu-reaper.yaml");

/// A throw-away CA and a serving certificate for 127.0.0.1, as PEM.
struct TestPki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
    leaf_der: Vec<u8>,
}

fn pki(label: &str) -> TestPki {
    let ca = pki::Ca::new(&format!("budget-gate test CA {label}"));
    let leaf = ca.leaf(&["127.0.0.1"], &format!("gpu-reaper webhook {label}"));
    TestPki {
        ca_pem: ca.pem,
        cert_pem: leaf.cert_pem,
        key_pem: leaf.key_pem,
        leaf_der: leaf.der,
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The webhook binary, killed on drop.
struct Webhook {
    _child: tokio::process::Child,
    port: u16,
    probe_port: u16,
    _dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
}

impl Webhook {
    async fn start(sim: &KubeSim, pki: &TestPki) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        std::fs::write(&cert, &pki.cert_pem).unwrap();
        std::fs::write(&key, &pki.key_pem).unwrap();
        let (port, probe_port) = (free_port(), free_port());
        let child = tokio::process::Command::new(BIN)
            .args(["webhook", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--probe-listen", &format!("127.0.0.1:{probe_port}")])
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .args(["--tls-reload-interval", "100ms", "--cache-debounce", "20ms"])
            .env("KUBECONFIG", sim.kubeconfig_path())
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

    fn configuration(&self, pki: &TestPki) -> String {
        use base64::Engine;
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(&pki.ca_pem);
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "gpu-reaper-budget-gate"},
            "webhooks": [{
                "name": "budget-gate.gpureaper.io",
                "clientConfig": {"url": format!("https://127.0.0.1:{}/validate", self.port), "caBundle": ca_bundle},
                "rules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]},
                    {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["jobs", "cronjobs"]},
                    {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["deployments", "statefulsets", "replicasets"]},
                    {"apiGroups": ["gpureaper.io"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["readinessattestations", "readinessattestations/status"]},
                ],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }],
        })
        .to_string()
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

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

async fn run(program: &str, sim: &KubeSim, args: &[&str], stdin: Option<&str>) -> Run {
    let mut command = tokio::process::Command::new(program);
    if program == "kubectl" {
        command
            .arg("--kubeconfig")
            .arg(sim.kubeconfig_path())
            .arg("--cache-dir")
            .arg(sim.kubeconfig_path().with_file_name("kubectl-cache"));
    } else {
        command.env("KUBECONFIG", sim.kubeconfig_path());
    }
    let mut child = command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input.as_bytes()).await.unwrap();
        drop(pipe);
    }
    let output = tokio::time::timeout(SAFETY, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} hung"))
        .unwrap();
    Run {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

async fn kubectl(sim: &KubeSim, args: &[&str], stdin: Option<&str>) -> Run {
    run("kubectl", sim, args, stdin).await
}

async fn kubectl_ok(sim: &KubeSim, args: &[&str], stdin: Option<&str>) -> String {
    let r = kubectl(sim, args, stdin).await;
    assert!(r.ok, "kubectl {args:?} failed: {}", r.stderr);
    r.stdout
}

fn job(name: &str, gpus_per_pod: u32, parallelism: u32) -> String {
    format!(
        r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
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

const POLICY: &str = r#"
apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata: {name: research}
spec:
  admission:
    largeClaimGpus: 8
    mode: Enforce
"#;

const ATTESTATION: &str = r#"
apiVersion: gpureaper.io/v1alpha1
kind: ReadinessAttestation
metadata: {name: llama-finetune, namespace: default}
spec:
  selector: {matchLabels: {app: llama-finetune}}
  maxGpus: 64
  expiresAt: "2030-01-01T00:00:00Z"
  owner: {email: alice@example.com}
  evidence: {datasetUri: "s3://bucket/llama/v3", dataThroughputGBps: 40, checkpointing: true}
"#;

/// Retries `kubectl create` until its outcome satisfies `done` (the webhook's caches
/// follow the API server within milliseconds, not instantly).
async fn create_until(sim: &KubeSim, manifest: &str, done: impl Fn(&Run) -> bool) -> Run {
    let deadline = Instant::now() + SAFETY;
    loop {
        let dry = kubectl(
            sim,
            &["create", "--dry-run=server", "-f", "-"],
            Some(manifest),
        )
        .await;
        if done(&dry) {
            return kubectl(sim, &["create", "-f", "-"], Some(manifest)).await;
        }
        assert!(
            Instant::now() < deadline,
            "never reached the expected outcome: {}",
            dry.stderr
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_users_are_denied_then_admitted_after_approval_and_an_edit_voids_it() {
    let sim = KubeSim::start().await.unwrap();
    kubectl_ok(&sim, &["apply", "-f", CRDS], None).await;
    kubectl_ok(&sim, &["apply", "-f", "-"], Some(POLICY)).await;
    let pki = pki("a");
    let webhook = Webhook::start(&sim, &pki).await;
    kubectl_ok(
        &sim,
        &["create", "-f", "-"],
        Some(&webhook.configuration(&pki)),
    )
    .await;

    // A small job passes; a 16-GPU job without attestation is denied with our sentence.
    kubectl_ok(&sim, &["create", "-f", "-"], Some(&job("small", 4, 2))).await;
    let denied = create_until(&sim, &job("train", 8, 2), |r| !r.ok).await;
    assert!(!denied.ok);
    assert!(
        denied.stderr.contains(
            "admission webhook \"budget-gate.gpureaper.io\" denied the request: Job default/train claims 16 GPUs, more than the 8 GpuPolicy \"research\" admits without a ReadinessAttestation, and no ReadinessAttestation in namespace default selects its labels; create one that does (see docs/budget-gate.md) and ask an approver to run `gpu-reaper attest approve default/<name>`."
        ),
        "{}",
        denied.stderr
    );
    assert!(sim.get("batch", "jobs", "default", "train").is_none());

    // The team writes an attestation: not approved yet.
    kubectl_ok(&sim, &["apply", "-f", "-"], Some(ATTESTATION)).await;
    let pending = create_until(&sim, &job("train", 8, 2), |r| {
        r.stderr.contains("is not approved")
    })
    .await;
    assert!(!pending.ok);
    assert!(pending.stderr.contains("ReadinessAttestation default/llama-finetune is not approved; ask an approver to review it and run `gpu-reaper attest approve default/llama-finetune`."), "{}", pending.stderr);

    // An approver approves it; the same create succeeds.
    let approve = run(
        BIN,
        &sim,
        &["attest", "approve", "default/llama-finetune"],
        None,
    )
    .await;
    assert!(approve.ok, "{}", approve.stderr);
    assert_eq!(
        approve.stdout.trim(),
        "readinessattestation default/llama-finetune approved by kube-sim for generation 1"
    );
    let stored = sim
        .get(
            "gpureaper.io",
            "readinessattestations",
            "default",
            "llama-finetune",
        )
        .unwrap();
    assert_eq!(stored["status"]["approvedGeneration"], 1);
    assert_eq!(stored["status"]["approvedBy"], "kube-sim");
    let admitted = create_until(&sim, &job("train", 8, 2), |r| r.ok).await;
    assert!(admitted.ok, "{}", admitted.stderr);
    assert!(sim.get("batch", "jobs", "default", "train").is_some());

    // Editing the spec voids the approval.
    kubectl_ok(
        &sim,
        &[
            "patch",
            "readinessattestation",
            "llama-finetune",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"maxGpus":128}}"#,
        ],
        None,
    )
    .await;
    let voided = create_until(&sim, &job("train-2", 8, 2), |r| {
        r.stderr.contains("has changed since")
    })
    .await;
    assert!(!voided.ok);
    assert!(
        voided.stderr.contains("ReadinessAttestation default/llama-finetune was approved for generation 1 but its spec has changed since (generation 2)"),
        "{}",
        voided.stderr
    );

    // Re-approval covers the new spec; revoking withdraws it.
    let again = run(
        BIN,
        &sim,
        &[
            "attest",
            "approve",
            "default/llama-finetune",
            "--approver",
            "lead",
        ],
        None,
    )
    .await;
    assert!(
        again.stdout.contains("approved by lead for generation 2"),
        "{}",
        again.stderr
    );
    assert!(create_until(&sim, &job("train-2", 8, 2), |r| r.ok).await.ok);
    let revoke = run(
        BIN,
        &sim,
        &["attest", "revoke", "default/llama-finetune"],
        None,
    )
    .await;
    assert!(revoke.ok, "{}", revoke.stderr);
    assert!(
        !create_until(&sim, &job("train-3", 8, 2), |r| !r.ok)
            .await
            .ok
    );

    // A team cannot approve by writing status itself with a stale generation.
    let forged = kubectl(
        &sim,
        &["patch", "readinessattestation", "llama-finetune", "--subresource", "status", "--type", "merge", "-p",
          r#"{"status":{"conditions":[{"type":"Approved","status":"True","reason":"Self","message":"me","lastTransitionTime":"2026-11-01T00:00:00Z"}],"approvedBy":"me","approvedGeneration":1}}"#],
        None,
    )
    .await;
    assert!(!forged.ok);
    assert!(
        forged
            .stderr
            .contains("status.approvedGeneration 1 must equal metadata.generation 2"),
        "{}",
        forged.stderr
    );

    // Warn mode admits with a kubectl warning.
    kubectl_ok(
        &sim,
        &[
            "patch",
            "gpupolicy",
            "research",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"admission":{"mode":"Warn"}}}"#,
        ],
        None,
    )
    .await;
    let warned = create_until(&sim, &job("train-4", 8, 2), |r| r.ok).await;
    assert!(warned.ok, "{}", warned.stderr);
    assert!(
        warned.stderr.contains("Warning: Job default/train-4 claims 16 GPUs, more than the 8 GpuPolicy \"research\" admits without a ReadinessAttestation, and ReadinessAttestation default/llama-finetune is not approved"),
        "{}",
        warned.stderr
    );

    // Every decision was counted.
    let metrics = plain_get_body(webhook.probe_port, "/metrics").await;
    assert!(
        metrics.contains(
            "gpu_reaper_admission_decisions_total{verdict=\"deny\",reason=\"no_attestation\"}"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "gpu_reaper_admission_decisions_total{verdict=\"allow\",reason=\"attested\"}"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "gpu_reaper_admission_decisions_total{verdict=\"warn\",reason=\"not_approved\"}"
        ),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("gpu_reaper_admission_cached_objects{resource=\"readinessattestations\"} 1"),
        "{metrics}"
    );
    drop(webhook);
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
    let sim = KubeSim::start().await.unwrap();
    kubectl_ok(&sim, &["apply", "-f", CRDS], None).await;
    let (old, new) = (pki("old"), pki("new"));
    let webhook = Webhook::start(&sim, &old).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_claimed_through_a_dra_claim_template_are_counted_from_the_webhook_cache() {
    let sim = KubeSim::start().await.unwrap();
    kubectl_ok(&sim, &["apply", "-f", CRDS], None).await;
    kubectl_ok(&sim, &["apply", "-f", "-"], Some(POLICY)).await;
    let template = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: four-gpus, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count: 4}
"#;
    kubectl_ok(&sim, &["apply", "-f", "-"], Some(template)).await;
    let pki = pki("dra");
    let webhook = Webhook::start(&sim, &pki).await;
    kubectl_ok(
        &sim,
        &["create", "-f", "-"],
        Some(&webhook.configuration(&pki)),
    )
    .await;
    // 4 pods, each with a claim made from the template: 16 GPUs, none in resources.limits.
    let job = r#"
apiVersion: batch/v1
kind: Job
metadata: {name: dra-train, labels: {app: llama-finetune}}
spec:
  parallelism: 4
  template:
    spec:
      restartPolicy: Never
      resourceClaims:
      - {name: gpus, resourceClaimTemplateName: four-gpus}
      containers:
      - name: train
        image: pytorch/pytorch:2.4.0
        resources:
          claims: [{name: gpus}]
"#;
    let denied = create_until(&sim, job, |r| !r.ok).await;
    assert!(
        denied
            .stderr
            .contains("denied the request: Job default/dra-train claims 16 GPUs, more than the 8"),
        "{}",
        denied.stderr
    );
    let metrics = plain_get_body(webhook.probe_port, "/metrics").await;
    assert!(
        metrics
            .contains("gpu_reaper_admission_cached_objects{resource=\"resourceclaimtemplates\"} 1"),
        "{metrics}"
    );
}
