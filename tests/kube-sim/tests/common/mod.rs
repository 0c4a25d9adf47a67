//! Helpers shared by kube-sim's integration tests: running kubectl with a timeout,
//! generating small CRDs, locating the shared fixtures, and a tiny HTTPS admission
//! webhook server that records what it receives.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use kube_sim::KubeSim;
use kube_sim::tls::Pki;
use serde_json::{Value, json};

/// Every wait on the server or kubectl ends by this long, so no test can hang.
pub const SAFETY: Duration = Duration::from_secs(60);

/// What a kubectl run printed.
#[derive(Debug)]
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs kubectl against `sim` (its own discovery cache), feeding `stdin` when given.
pub async fn kubectl(sim: &KubeSim, args: &[&str], stdin: Option<&str>) -> Run {
    let cache = sim.kubeconfig_path().with_file_name("kubectl-cache");
    let mut command = tokio::process::Command::new("kubectl");
    command
        .arg("--kubeconfig")
        .arg(sim.kubeconfig_path())
        .arg("--cache-dir")
        .arg(&cache)
        .args(args)
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .expect("kubectl is installed (/usr/bin/kubectl)");
    if let Some(input) = stdin {
        use tokio::io::AsyncWriteExt;
        let mut pipe = child.stdin.take().expect("piped stdin");
        pipe.write_all(input.as_bytes())
            .await
            .expect("write kubectl stdin");
        drop(pipe);
    }
    let output = tokio::time::timeout(SAFETY, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish within {SAFETY:?}"))
        .expect("kubectl ran");
    Run {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// kubectl that must succeed; returns stdout.
pub async fn kubectl_ok(sim: &KubeSim, args: &[&str], stdin: Option<&str>) -> String {
    let run = kubectl(sim, args, stdin).await;
    assert!(
        run.ok,
        "kubectl {args:?} failed:\nstdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    run.stdout
}

/// A CRD with one served+stored version, open schema, status and scale subresources.
pub fn crd(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "scope": if namespaced { "Namespaced" } else { "Cluster" },
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{
                "name": version, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
            }],
        },
    })
}

/// A file under the shared fixtures (`../shared/fixtures` beside the repository), if present.
pub fn fixture(relative: &str) -> Option<PathBuf> {
    // Committed copies under tests/fixtures first (CI clones have no shared/ beside them),
    // then the shared fixtures beside the repository.
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        manifest_dir.join("../fixtures"),
        manifest_dir.join("../../../shared/fixtures"),
    ]
    .into_iter()
    .map(|dir| dir.join(relative))
    .find(|path| path.exists())
}

/// What the webhook answers for one AdmissionReview request.
pub type Decide = dyn Fn(&Value) -> Value + Send + Sync;

/// A tiny HTTPS admission webhook: answers with `decide(request)` as the response.
pub struct Webhook {
    pub url: String,
    pub ca_bundle: String,
    pub received: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Webhook {
    /// `decide` gets the review's `request` and returns `response` fields
    /// (`allowed`, `status`, `warnings`); the uid is filled in.
    pub async fn start(decide: impl Fn(&Value) -> Value + Send + Sync + 'static) -> Self {
        Self::start_with_delay(decide, Duration::ZERO).await
    }

    pub async fn start_with_delay(
        decide: impl Fn(&Value) -> Value + Send + Sync + 'static,
        delay: Duration,
    ) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let pki = Pki::generate(&["localhost", "127.0.0.1", "webhook.gpu-reaper.svc"])
            .expect("webhook certificate");
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config().expect("webhook tls"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind webhook");
        let url = format!(
            "https://127.0.0.1:{}/validate",
            listener.local_addr().expect("addr").port()
        );
        let received = Arc::new(Mutex::new(Vec::new()));
        let decide: Arc<Decide> = Arc::new(decide);
        let seen = received.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let decide = decide.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let decide = decide.clone();
                            let seen = seen.clone();
                            async move {
                                let body = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes())
                                    .unwrap_or_default();
                                let review: Value =
                                    serde_json::from_slice(&body).unwrap_or(Value::Null);
                                seen.lock().unwrap().push(review.clone());
                                tokio::time::sleep(delay).await;
                                let mut response = decide(&review["request"]);
                                response["uid"] = review["request"]["uid"].clone();
                                let answer = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
                                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                                    Bytes::from(answer.to_string()),
                                )))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            url,
            ca_bundle: pki.ca_bundle(),
            received,
            task,
        }
    }

    /// A ValidatingWebhookConfiguration pointing at this server.
    pub fn configuration(&self, name: &str, rules: Value, failure_policy: &str) -> Value {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": format!("{name}.gpu-reaper.test"),
                "clientConfig": {"url": self.url, "caBundle": self.ca_bundle},
                "rules": rules,
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }],
        })
    }

    pub fn requests(&self) -> Vec<Value> {
        self.received.lock().unwrap().clone()
    }
}

/// Rules matching CREATE and UPDATE of pods.
pub fn pod_rules() -> Value {
    json!([{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "*"}])
}
