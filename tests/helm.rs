//! The Helm chart with a real Helm engine (Helm v4's library, from the helm-sdkpy wheel,
//! driven by tests/helm/helm.py) installing into kube-sim, kubectl as the client, and the
//! real gpu-reaper binary running as the chart's ServiceAccounts — kube-sim enforces the
//! chart's RBAC on them, so a call the code makes and the chart does not grant fails here.

mod common;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{free_port, prometheus_with};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PodSpec, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube_sim::KubeSim;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-reaper");
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/helm/gpu-reaper");
const HELM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/helm/helm.py");
const NS: &str = "gpu-reaper";

/// Runs tests/helm/helm.py; its JSON answer, or Helm's error message.
async fn helm(args: &[&str]) -> Result<Value, String> {
    let out = tokio::process::Command::new("python3")
        .arg(HELM)
        .args(args)
        .output()
        .await
        .expect("python3 runs (.ci/run installs helm-sdkpy)");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("helm.py prints JSON"))
}

fn defaults() -> Value {
    json!({"prometheus": {"url": "http://prometheus-operated.monitoring.svc:9090"}})
}

async fn install(sim: &KubeSim, release: &str, values: &Value) -> Result<Value, String> {
    let kubeconfig = sim.kubeconfig_path().to_string_lossy().into_owned();
    helm(&[
        "install",
        CHART,
        "--kubeconfig",
        &kubeconfig,
        "--namespace",
        NS,
        "--release",
        release,
        "--values",
        &values.to_string(),
    ])
    .await
}

/// The YAML documents of a Helm manifest, as JSON values.
fn documents(manifest: &str) -> Vec<Value> {
    manifest
        .split("\n---")
        .filter_map(|doc| serde_yaml::from_str::<Value>(doc).ok())
        .filter(|v| v.is_object())
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("the chart renders no {kind} {name}"))
}

/// Paths present in `original` but lost when read into the typed struct: misspelt or
/// misplaced fields the API server would drop silently.
fn lost_fields(original: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => lost_fields(v, w, &format!("{path}.{k}"), out),
                    None if v.is_null() => {}
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, v) in a.iter().enumerate() {
                match b.get(i) {
                    Some(w) => lost_fields(v, w, &format!("{path}[{i}]"), out),
                    None => out.push(format!("{path}[{i}]")),
                }
            }
        }
        _ => {}
    }
}

fn typed<K: DeserializeOwned + Serialize>(object: &Value) -> K {
    let name = format!("{} {}", object["kind"], object["metadata"]["name"]);
    let parsed: K = serde_json::from_value(object.clone())
        .unwrap_or_else(|e| panic!("{name} does not parse into its Kubernetes type: {e}"));
    let mut lost = Vec::new();
    lost_fields(
        object,
        &serde_json::to_value(&parsed).unwrap(),
        "",
        &mut lost,
    );
    assert!(
        lost.is_empty(),
        "{name} has fields its type does not know: {lost:?}"
    );
    parsed
}

/// Every rendered object parses into its k8s-openapi type with no field lost; the kinds
/// that are not built in are checked by hand. Returns the kinds seen.
fn check_types(objects: &[Value]) -> BTreeSet<String> {
    let mut kinds = BTreeSet::new();
    for o in objects {
        let kind = o["kind"].as_str().expect("every object has a kind");
        match kind {
            "Deployment" => drop(typed::<Deployment>(o)),
            "Service" => drop(typed::<Service>(o)),
            "ServiceAccount" => drop(typed::<ServiceAccount>(o)),
            "Secret" => drop(typed::<Secret>(o)),
            "ClusterRole" => drop(typed::<ClusterRole>(o)),
            "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(o)),
            "Role" => drop(typed::<Role>(o)),
            "RoleBinding" => drop(typed::<RoleBinding>(o)),
            "PodDisruptionBudget" => drop(typed::<PodDisruptionBudget>(o)),
            "NetworkPolicy" => drop(typed::<NetworkPolicy>(o)),
            "ConfigMap" => drop(typed::<k8s_openapi::api::core::v1::ConfigMap>(o)),
            "ValidatingWebhookConfiguration" => drop(typed::<ValidatingWebhookConfiguration>(o)),
            "GpuPolicy" => {
                let text = serde_yaml::to_string(o).unwrap();
                gpu_reaper::api::validate::parse_resource::<gpu_reaper::api::policy::GpuPolicy>(
                    &text,
                    "the chart's sample policy",
                )
                .unwrap_or_else(|e| panic!("{e}"));
            }
            "ServiceMonitor" | "PrometheusRule" | "Certificate" | "Issuer" => {
                assert!(o["spec"].is_object(), "{kind} has a spec");
            }
            other => panic!("the chart renders a {other}: add it to check_types"),
        }
        kinds.insert(kind.to_string());
    }
    kinds
}

/// Restricted Pod Security and probes on every pod of the chart.
fn check_hardened(deployment: &Value) {
    let d: Deployment = serde_json::from_value(deployment.clone()).unwrap();
    let name = d.metadata.name.clone().unwrap_or_default();
    let spec: PodSpec = d.spec.unwrap().template.spec.unwrap();
    let pod = spec.security_context.as_ref().expect("pod securityContext");
    assert_eq!(pod.run_as_non_root, Some(true), "{name}");
    assert_eq!(
        pod.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault"),
        "{name}"
    );
    assert!(
        spec.topology_spread_constraints.is_some(),
        "{name} spreads replicas"
    );
    for c in &spec.containers {
        let sc = c
            .security_context
            .as_ref()
            .expect("container securityContext");
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{name}");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{name}");
        assert_eq!(
            sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_string()]),
            "{name}"
        );
        let path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
            p.as_ref()
                .and_then(|p| p.http_get.as_ref())
                .and_then(|h| h.path.clone())
        };
        assert_eq!(
            path(&c.liveness_probe).as_deref(),
            Some("/healthz"),
            "{name}"
        );
        assert_eq!(
            path(&c.readiness_probe).as_deref(),
            Some("/readyz"),
            "{name}"
        );
        let resources = c.resources.as_ref().expect("resources");
        assert!(
            resources.requests.is_some() && resources.limits.is_some(),
            "{name}"
        );
    }
}

fn b64(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_lints_installs_with_defaults_and_keeps_its_certificate_on_upgrade() {
    let lint = helm(&["lint", CHART]).await.expect("helm lint runs");
    let errors: Vec<&Value> = lint["lint"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["severity"] == "error")
        .collect();
    assert!(errors.is_empty(), "helm lint: {errors:?}");

    let sim = KubeSim::start().await.unwrap();
    let kubeconfig = sim.kubeconfig_path().to_string_lossy().into_owned();
    let mut upgraded = defaults();
    upgraded["webhook"] = json!({"timeoutSeconds": 5});
    let out = helm(&[
        "install",
        CHART,
        "--kubeconfig",
        &kubeconfig,
        "--release",
        "gpu-reaper",
        "--values",
        &defaults().to_string(),
        "--upgrade-values",
        &upgraded.to_string(),
    ])
    .await
    .expect("helm install");
    let objects = documents(out["manifest"].as_str().unwrap());
    let kinds = check_types(&objects);
    for kind in [
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "Role",
        "PodDisruptionBudget",
        "ValidatingWebhookConfiguration",
        "Secret",
        "GpuPolicy",
    ] {
        assert!(kinds.contains(kind), "defaults render a {kind}: {kinds:?}");
    }
    for kind in ["NetworkPolicy", "ServiceMonitor", "PrometheusRule"] {
        assert!(!kinds.contains(kind), "{kind} is off by default");
    }
    // Everything Helm rendered is in the API server.
    for o in &objects {
        let (group, _) = o["apiVersion"]
            .as_str()
            .unwrap()
            .rsplit_once('/')
            .unwrap_or(("", ""));
        let plural = match o["kind"].as_str().unwrap() {
            "PodDisruptionBudget" => "poddisruptionbudgets".to_string(),
            "NetworkPolicy" => "networkpolicies".to_string(),
            "GpuPolicy" => "gpupolicies".to_string(),
            k => format!("{}s", k.to_lowercase()),
        };
        let ns = o["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = o["metadata"]["name"].as_str().unwrap();
        assert!(
            sim.get(group, &plural, ns, name).is_some(),
            "{} {name} was not applied",
            o["kind"]
        );
    }

    // kubectl accepts the rendered manifest as it is (a server-side dry run of all of it).
    let (ok, text) = kubectl(
        &sim,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--dry-run=server",
            "-f",
            "-",
        ],
        Some(out["manifest"].as_str().unwrap()),
    )
    .await;
    assert!(ok, "kubectl apply of the rendered chart: {text}");
    assert!(
        text.contains("deployment.apps/gpu-reaper-webhook serverside-applied (server dry run)"),
        "{text}"
    );

    let controller = find(&objects, "Deployment", "gpu-reaper-controller");
    let webhook = find(&objects, "Deployment", "gpu-reaper-webhook");
    check_hardened(controller);
    check_hardened(webhook);
    assert_eq!(controller["spec"]["replicas"], 2, "a standby controller");
    assert_eq!(webhook["spec"]["replicas"], 2);
    let args: Vec<&str> = controller["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(args.contains(&"--prometheus-url=http://prometheus-operated.monitoring.svc:9090"));
    assert!(args.contains(&"--lease-namespace=gpu-reaper"));
    // (The e2e test below runs the binary with these very flags.)

    // The webhook configuration: safe defaults, exclusions, and the same CA as the
    // serving certificate.
    let vwc = find(
        &objects,
        "ValidatingWebhookConfiguration",
        "gpu-reaper-budget-gate",
    );
    let hook = &vwc["webhooks"][0];
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["timeoutSeconds"], 3);
    let excluded = &hook["namespaceSelector"]["matchExpressions"][0]["values"];
    for ns in ["kube-system", "kube-node-lease", NS] {
        assert!(
            excluded.as_array().unwrap().iter().any(|v| v == ns),
            "{ns} is excluded"
        );
    }
    assert_eq!(hook["matchConditions"].as_array().unwrap().len(), 2);
    let secret = find(&objects, "Secret", "gpu-reaper-webhook-tls");
    assert_eq!(hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    let leaf = String::from_utf8(b64(secret["data"]["tls.crt"].as_str().unwrap())).unwrap();
    assert!(leaf.contains("BEGIN CERTIFICATE"));

    // The upgrade reuses the generated certificate (lookup), and applies the new value.
    let after = documents(out["upgrade_manifest"].as_str().unwrap());
    let vwc2 = find(
        &after,
        "ValidatingWebhookConfiguration",
        "gpu-reaper-budget-gate",
    );
    assert_eq!(vwc2["webhooks"][0]["timeoutSeconds"], 5);
    assert_eq!(
        vwc2["webhooks"][0]["clientConfig"]["caBundle"], hook["clientConfig"]["caBundle"],
        "an upgrade must not rotate the CA under running webhooks"
    );
    let policy = find(&objects, "GpuPolicy", "default-audit");
    assert_eq!(
        policy["spec"]["mode"], "Audit",
        "the sample policy never acts"
    );
}

/// Minimal CRDs for the optional integrations' kinds, so kube-sim serves them.
fn integration_crds() -> Vec<Value> {
    [
        ("cert-manager.io", "certificates", "Certificate"),
        ("cert-manager.io", "issuers", "Issuer"),
        ("monitoring.coreos.com", "servicemonitors", "ServiceMonitor"),
        ("monitoring.coreos.com", "prometheusrules", "PrometheusRule"),
    ]
    .iter()
    .map(|(group, plural, kind)| {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": format!("{plural}.{group}")},
               "spec": {"group": group, "scope": "Namespaced",
                        "names": {"plural": plural, "kind": kind, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                        "versions": [{"name": "v1", "served": true, "storage": true,
                                      "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_default_values_render_cert_manager_network_policy_and_monitoring() {
    let sim = KubeSim::start().await.unwrap();
    for crd in integration_crds() {
        sim.seed(crd).unwrap();
    }
    let values = json!({
        "prometheus": {"url": "https://thanos.monitoring.svc:10902", "ca": {"configMapName": "thanos-ca"}, "clientCert": {"secretName": "thanos-client"},
                       "basicAuth": {"user": "reaper", "passwordSecret": {"name": "thanos-auth"}}},
        "image": {"digest": "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
        "gpu": {"resources": ["nvidia.com/gpu", "amd.com/gpu"]},
        "controller": {"replicaCount": 3, "priorityClassName": "system-cluster-critical",
                       "rbac": {"extraRules": [{"apiGroups": ["example.com"], "resources": ["widgets", "widgets/scale"], "verbs": ["get", "patch"]}]}},
        "webhook": {"failurePolicy": "Fail", "excludedNamespaces": ["monitoring"], "replicaCount": 3,
                    "certificate": {"source": "cert-manager"}},
        "samplePolicy": {"enabled": false},
        "networkPolicy": {"enabled": true, "apiServer": {"cidrs": ["10.0.0.1/32"]},
                          "prometheus": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}, "port": 10902}},
        "serviceMonitor": {"enabled": true, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": true},
        "grafanaDashboard": {"enabled": true},
        "notifications": {"slack": {"tokenSecret": {"name": "slack-bot"}, "signingSecret": {"name": "slack-app"}},
                          "email": {"host": "smtp.example.com", "security": "tls", "user": "reaper", "passwordSecret": {"name": "smtp"}},
                          "templates": {"warning": {"subject": "{workload} idle", "text": "{gpus} GPUs idle since {idle_since}"}}},
    });
    let out = install(&sim, "reaper", &values)
        .await
        .expect("helm install");
    let objects = documents(out["manifest"].as_str().unwrap());
    let kinds = check_types(&objects);
    for kind in [
        "NetworkPolicy",
        "ServiceMonitor",
        "PrometheusRule",
        "Certificate",
        "Issuer",
        "ConfigMap",
    ] {
        assert!(kinds.contains(kind), "{kind} rendered: {kinds:?}");
    }
    assert!(!kinds.contains("GpuPolicy") && !kinds.contains("Secret"));

    // cert-manager: the CA comes from its injector, the Certificate feeds the Secret
    // the webhook mounts.
    let vwc = find(
        &objects,
        "ValidatingWebhookConfiguration",
        "reaper-gpu-reaper-budget-gate",
    );
    assert_eq!(
        vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "gpu-reaper/reaper-gpu-reaper-webhook"
    );
    assert!(vwc["webhooks"][0]["clientConfig"]["caBundle"].is_null());
    assert_eq!(vwc["webhooks"][0]["failurePolicy"], "Fail");
    assert!(
        vwc["webhooks"][0]["matchConditions"][1]["expression"]
            .as_str()
            .unwrap()
            .contains("'amd.com/gpu'"),
        "the configured GPU resources reach the match condition"
    );
    let cert = find(&objects, "Certificate", "reaper-gpu-reaper-webhook");
    let webhook = find(&objects, "Deployment", "reaper-gpu-reaper-webhook");
    let volumes = &webhook["spec"]["template"]["spec"]["volumes"];
    assert_eq!(
        volumes[0]["secret"]["secretName"],
        cert["spec"]["secretName"]
    );
    assert!(
        webhook["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap()
            .ends_with("@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
    );

    // Prometheus CA, basic auth and the extra RBAC rule reach the controller.
    let controller = find(&objects, "Deployment", "reaper-gpu-reaper-controller");
    let spec = &controller["spec"]["template"]["spec"];
    assert_eq!(spec["priorityClassName"], "system-cluster-critical");
    let args = spec["containers"][0]["args"].to_string();
    assert!(args.contains("--prometheus-ca-file=/etc/gpu-reaper/prometheus-ca/ca.crt"));
    assert!(
        args.contains("--prometheus-client-cert-file=/etc/gpu-reaper/prometheus-client/tls.crt")
    );
    assert!(
        args.contains("--prometheus-client-key-file=/etc/gpu-reaper/prometheus-client/tls.key")
    );
    assert!(
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "prometheus-client"
                && v["secret"]["secretName"] == "thanos-client"),
        "{}",
        spec["volumes"]
    );
    assert!(args.contains(
        "--prometheus-basic-auth-password-file=/etc/gpu-reaper/prometheus-password/password"
    ));
    for flag in [
        "--slack-token-file=/etc/gpu-reaper/slack-token/token",
        "--slack-signing-secret-file=/etc/gpu-reaper/slack-signing/signing-secret",
        "--smtp-host=smtp.example.com",
        "--smtp-security=tls",
        "--smtp-password-file=/etc/gpu-reaper/smtp-password/password",
        "--notify-templates=/etc/gpu-reaper/templates/templates.yaml",
    ] {
        assert!(args.contains(flag), "{flag} in {args}");
    }
    let templates = find(
        &objects,
        "ConfigMap",
        "reaper-gpu-reaper-controller-templates",
    );
    let text = templates["data"]["templates.yaml"].as_str().unwrap();
    gpu_reaper::notify::content::Templates::from_yaml(text, "the chart's templates")
        .expect("the chart renders templates the controller accepts");
    let role = find(&objects, "ClusterRole", "reaper-gpu-reaper-controller");
    assert!(role["rules"].to_string().contains("widgets/scale"));

    // NetworkPolicy: the API server CIDR and the Prometheus port are the egress.
    let np = find(&objects, "NetworkPolicy", "reaper-gpu-reaper-controller");
    let egress = np["spec"]["egress"].to_string();
    assert!(
        egress.contains("10.0.0.1/32") && egress.contains("10902"),
        "{egress}"
    );

    // The PrometheusRule carries exactly files/alerts.yaml; the dashboard is valid JSON.
    let alerts: Value = serde_yaml::from_str(
        &std::fs::read_to_string(Path::new(CHART).join("files/alerts.yaml")).unwrap(),
    )
    .unwrap();
    let rule = find(&objects, "PrometheusRule", "reaper-gpu-reaper");
    assert_eq!(rule["spec"]["groups"], alerts["groups"]);
    assert!(!alerts["groups"].as_array().unwrap().is_empty());
    let dashboard = find(&objects, "ConfigMap", "reaper-gpu-reaper-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value =
        serde_json::from_str(dashboard["data"]["gpu-reaper.json"].as_str().unwrap()).unwrap();
    assert!(json["panels"].is_array());
    // Without the webhook, its alert group is left out (its "down" alert would fire).
    let controller_only = json!({"prometheus": {"url": "http://p:9090"}, "webhook": {"enabled": false},
                                 "prometheusRule": {"enabled": true}, "samplePolicy": {"enabled": false}});
    let out = install(&sim, "solo", &controller_only)
        .await
        .expect("helm install");
    let solo = documents(out["manifest"].as_str().unwrap());
    let names: Vec<&str> = find(&solo, "PrometheusRule", "solo-gpu-reaper")["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    assert_eq!(names, ["gpu-reaper-controller"]);
    assert!(
        !solo
            .iter()
            .any(|o| o["kind"] == "ValidatingWebhookConfiguration")
    );

    let monitor = find(&objects, "ServiceMonitor", "reaper-gpu-reaper");
    assert_eq!(
        monitor["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_values_are_refused_with_the_field_and_the_fix() {
    let sim = KubeSim::start().await.unwrap();
    let cases = [
        (json!({}), "prometheus.url is required"),
        (
            json!({"prometheus": {"url": "http://p:9090"}, "webhook": {"certificate": {"source": "vault"}}}),
            "/webhook/certificate/source",
        ),
        (
            json!({"prometheus": {"url": "http://p:9090"}, "webhook": {"certificate": {"source": "secret"}}}),
            "webhook.certificate.existingSecret is required",
        ),
        (
            json!({"prometheus": {"url": "http://p:9090"}, "webhook": {"certificate": {"source": "secret", "existingSecret": "tls"}}}),
            "webhook.certificate.caBundle is required",
        ),
        (
            json!({"prometheus": {"url": "http://p:9090"}, "webhook": {"failurePolicy": "Sometimes"}}),
            "/webhook/failurePolicy",
        ),
    ];
    for (i, (values, expected)) in cases.iter().enumerate() {
        let err = install(&sim, &format!("bad{i}"), values)
            .await
            .expect_err("Helm refuses the values");
        assert!(err.contains(expected), "values {values}: {err}");
    }
    // Nothing of a refused release reached the cluster.
    assert!(
        sim.list("apps", "deployments", Some(NS)).is_empty(),
        "a refused install applies nothing"
    );
}

// ---- the installed chart at work, as its own ServiceAccounts ----

/// A kubeconfig for kube-sim that authenticates as `system:serviceaccount:gpu-reaper:name`.
fn service_account_kubeconfig(sim: &KubeSim, dir: &Path, name: &str) -> std::path::PathBuf {
    user_kubeconfig(sim, dir, NS, name)
}

/// A kubeconfig for kube-sim that authenticates as `system:serviceaccount:ns:name`.
fn user_kubeconfig(sim: &KubeSim, dir: &Path, ns: &str, name: &str) -> std::path::PathBuf {
    let mut config: Value =
        serde_yaml::from_str(&std::fs::read_to_string(sim.kubeconfig_path()).unwrap()).unwrap();
    config["users"][0]["user"] = json!({"token": format!("system:serviceaccount:{ns}:{name}")});
    let path = dir.join(format!("{ns}-{name}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

async fn kubectl(sim: &KubeSim, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut child = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(sim.kubeconfig_path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    if let Some(text) = stdin {
        use tokio::io::AsyncWriteExt;
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).await.unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().await.unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Minute boundary ten minutes ahead: objects kube-sim stamps now are ten minutes old
/// at the start of the history (see tests/controller.rs).
fn t0() -> i64 {
    static T0: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *T0.get_or_init(|| jiff::Timestamp::now().as_second() / 60 * 60 + 600)
}

fn at(minutes: i64) -> String {
    jiff::Timestamp::from_second(t0() + minutes * 60)
        .unwrap()
        .to_string()
}

/// Three hours of idle GPUs for `ml/chat-0` (Deployment), `ml/train-0` (Job) and the bare
/// pod `ml/scratch`.
fn idle_history() -> Vec<u8> {
    let mut s = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
    for pod in ["chat-0", "train-0", "scratch", "nb-0", "queued-0", "db-0"] {
        // Every 30 s, the chart's default --scrape-interval.
        for step in 0..=360 {
            let _ = writeln!(
                s,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"0\",UUID=\"GPU-{pod}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"n1\",namespace=\"ml\",pod=\"{pod}\",container=\"main\"}} 0 {}",
                t0() + step * 30
            );
        }
    }
    s.push_str("# EOF\n");
    s.into_bytes()
}

fn workloads() -> Vec<Value> {
    let gpu = json!({"limits": {"nvidia.com/gpu": "1"}});
    let pod = |name: &str, owner: Option<Value>| {
        let mut meta = json!({"name": name, "namespace": "ml", "labels": {"app": name}});
        if let Some(o) = owner {
            meta["ownerReferences"] = json!([o]);
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
               "spec": {"containers": [{"name": "main", "image": "x", "resources": gpu}]},
               "status": {"phase": "Running"}})
    };
    vec![
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat", "namespace": "ml"},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "chat"}},
                        "template": {"metadata": {"labels": {"app": "chat"}}, "spec": {"containers": [{"name": "main", "image": "x", "resources": gpu}]}}}}),
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "chat-1", "namespace": "ml",
               "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat", "uid": "u-d", "controller": true}]},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "chat"}}, "template": {"metadata": {"labels": {"app": "chat"}}, "spec": {"containers": [{"name": "main", "image": "x"}]}}}}),
        pod(
            "chat-0",
            Some(
                json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "chat-1", "uid": "u-rs", "controller": true}),
            ),
        ),
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "ml"},
               "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x", "resources": gpu}]}}}}),
        pod(
            "train-0",
            Some(
                json!({"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-j", "controller": true}),
            ),
        ),
        pod("scratch", None),
        // A StatefulSet no Enforce policy takes: the chart's Audit sample policy governs it.
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db", "namespace": "ml"},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "db"}}, "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "main", "image": "x", "resources": gpu}]}}}}),
        pod(
            "db-0",
            Some(
                json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "u-db", "controller": true}),
            ),
        ),
        // A Kubeflow Notebook (its controller's StatefulSet and pod) ...
        crd("kubeflow.org", "Notebook", "notebooks"),
        json!({"apiVersion": "kubeflow.org/v1", "kind": "Notebook", "metadata": {"name": "nb", "namespace": "ml"},
               "spec": {"template": {"spec": {"containers": [{"name": "nb", "image": "jupyter", "resources": gpu}]}}}}),
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "nb", "namespace": "ml",
               "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "Notebook", "name": "nb", "uid": "u-nb", "controller": true}]},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "nb"}}, "template": {"metadata": {"labels": {"app": "nb"}}, "spec": {"containers": [{"name": "nb", "image": "jupyter"}]}}}}),
        pod(
            "nb-0",
            Some(
                json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "nb", "uid": "u-sts", "controller": true}),
            ),
        ),
        // ... and a Job queued by Kueue, with the Workload Kueue made for it.
        crd("kueue.x-k8s.io", "Workload", "workloads"),
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "queued", "namespace": "ml", "labels": {"kueue.x-k8s.io/queue-name": "team"}},
               "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x", "resources": gpu}]}}}}),
        pod(
            "queued-0",
            Some(
                json!({"apiVersion": "batch/v1", "kind": "Job", "name": "queued", "uid": "u-q", "controller": true}),
            ),
        ),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": "job-queued", "namespace": "ml",
               "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "queued", "uid": "u-q", "controller": true}]},
               "spec": {"active": true, "queueName": "team", "podSets": []}}),
    ]
}

fn crd(group: &str, kind: &str, plural: &str) -> Value {
    let version = if group == "kueue.x-k8s.io" {
        "v1beta2"
    } else {
        "v1"
    };
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": format!("{plural}.{group}")},
           "spec": {"group": group, "scope": "Namespaced",
                    "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                    "versions": [{"name": version, "served": true, "storage": true,
                                  "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

fn policies() -> String {
    let mut out = String::new();
    for (name, kind, action) in [
        ("serve", "Deployment", "ScaleToZero"),
        ("batch", "Job", "Suspend"),
        ("bare", "Pod", "Evict"),
        ("notebooks", "Notebook", "ScaleToZero"),
    ] {
        let _ = write!(
            out,
            "---\napiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {name}}}\nspec:\n  mode: Enforce\n  match: {{kinds: [{kind}]}}\n  idle: {{window: 30m, startupGrace: 20m, minCoverage: 0.8}}\n  warn: {{after: 30m}}\n  action: {{type: {action}, after: 60m}}\n  admission: {{mode: Enforce, largeClaimGpus: 8}}\n"
        );
    }
    out
}

async fn wait_ready(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let _ = s
                .write_all(b"GET /readyz HTTP/1.0\r\nHost: x\r\n\r\n")
                .await;
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf).await;
            if buf.starts_with("HTTP/1.0 200") || buf.starts_with("HTTP/1.1 200") {
                return;
            }
        }
        assert!(Instant::now() < deadline, "the webhook never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_installed_chart_gates_and_reaps_as_its_own_service_accounts() {
    let prometheus = prometheus_with("helm-e2e", &idle_history());
    let sim = KubeSim::start().await.unwrap();
    let out = install(&sim, "gpu-reaper", &defaults())
        .await
        .expect("helm install");
    let objects = documents(out["manifest"].as_str().unwrap());
    let dir = tempfile::tempdir().unwrap();

    // The webhook, with the chart's certificate, as the chart's webhook ServiceAccount,
    // reached through the chart's ValidatingWebhookConfiguration (service + caBundle).
    let secret = find(&objects, "Secret", "gpu-reaper-webhook-tls");
    for file in ["tls.crt", "tls.key"] {
        std::fs::write(
            dir.path().join(file),
            b64(secret["data"][file].as_str().unwrap()),
        )
        .unwrap();
    }
    let (port, probe) = (free_port(), free_port());
    let _webhook = tokio::process::Command::new(BIN)
        .args(["webhook", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--probe-listen", &format!("127.0.0.1:{probe}")])
        .arg("--tls-cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("tls.key"))
        .env(
            "KUBECONFIG",
            service_account_kubeconfig(&sim, dir.path(), "gpu-reaper-webhook"),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    sim.route_service(
        NS,
        "gpu-reaper-webhook",
        &format!("https://127.0.0.1:{port}"),
    );
    wait_ready(probe).await;

    sim.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}))
        .unwrap();
    let (ok, text) = kubectl(&sim, &["apply", "-f", "-"], Some(&policies())).await;
    assert!(ok, "{text}");
    // The gate sees the policies once its caches catch up; a 16-GPU job without an
    // attestation is then refused with the one-sentence reason.
    let big = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: big, namespace: ml}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: main, image: x, resources: {limits: {nvidia.com/gpu: \"16\"}}}]\n";
    let deadline = Instant::now() + Duration::from_secs(30);
    let denial = loop {
        let (ok, text) = kubectl(&sim, &["apply", "-f", "-"], Some(big)).await;
        if !ok {
            break text;
        }
        let _ = kubectl(&sim, &["delete", "job", "big", "-n", "ml"], None).await;
        assert!(Instant::now() < deadline, "the gate never denied: {text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        denial.contains("budget-gate.gpureaper.io") && denial.contains("ReadinessAttestation"),
        "{denial}"
    );

    // The controller, as the chart's controller ServiceAccount, with the chart's flags.
    for object in workloads() {
        sim.seed(object).unwrap();
    }
    let controller_kubeconfig =
        service_account_kubeconfig(&sim, dir.path(), "gpu-reaper-controller");
    let controller = find(&objects, "Deployment", "gpu-reaper-controller");
    let chart_args: Vec<String> = controller["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| !a.starts_with("--prometheus-url") && !a.starts_with("--listen"))
        .map(String::from)
        .collect();
    for (minutes, identity) in [
        (60, "gpu-reaper-controller-a"),
        (150, "gpu-reaper-controller-a"),
    ] {
        let out = tokio::process::Command::new(BIN)
            .args(&chart_args)
            .args(["--prometheus-url", &prometheus.url])
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--once", "--now", &at(minutes), "--identity", identity])
            .env("KUBECONFIG", &controller_kubeconfig)
            .output()
            .await
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "controller at +{minutes}m: {log}");
        eprintln!(
            "controller at +{minutes}m:\n{log}{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let deployment = sim.get("apps", "deployments", "ml", "chat").unwrap();
    assert_eq!(deployment["spec"]["replicas"], 0, "scaled to zero");
    let job = sim.get("batch", "jobs", "ml", "train").unwrap();
    assert_eq!(job["spec"]["suspend"], true, "suspended");
    assert!(sim.get("", "pods", "ml", "scratch").is_none(), "evicted");
    let db = sim.get("apps", "statefulsets", "ml", "db").unwrap();
    assert_eq!(
        db["spec"]["replicas"], 1,
        "the Audit sample policy never acts"
    );
    let notebook = sim.get("kubeflow.org", "notebooks", "ml", "nb").unwrap();
    assert!(
        notebook["metadata"]["annotations"]["kubeflow-resource-stopped"].is_string(),
        "the notebook is stopped: {notebook}"
    );
    let workload = sim
        .get("kueue.x-k8s.io", "workloads", "ml", "job-queued")
        .unwrap();
    assert_eq!(
        workload["spec"]["active"], false,
        "Kueue's Workload deactivated"
    );
    let queued = sim.get("batch", "jobs", "ml", "queued").unwrap();
    assert!(
        queued["spec"]["suspend"].is_null(),
        "gpu-reaper never fights Kueue over spec.suspend"
    );

    // Every call both components made was granted by the chart's RBAC, and the calls
    // that matter were made.
    let accesses = sim.accesses();
    let refused: Vec<_> = accesses.iter().filter(|a| !a.allowed).collect();
    assert!(refused.is_empty(), "the chart's RBAC refused: {refused:#?}");
    let made = |user: &str, verb: &str, resource: &str| {
        accesses
            .iter()
            .any(|a| a.user.ends_with(user) && a.verb == verb && a.resource == resource)
    };
    for (user, verb, resource) in [
        (":gpu-reaper-webhook", "watch", "readinessattestations"),
        (":gpu-reaper-controller", "patch", "deployments/scale"),
        (":gpu-reaper-controller", "patch", "jobs"),
        (":gpu-reaper-controller", "create", "pods/eviction"),
        (":gpu-reaper-controller", "patch", "notebooks"),
        (":gpu-reaper-controller", "patch", "workloads"),
        (":gpu-reaper-controller", "patch", "gpupolicies/status"),
        (":gpu-reaper-controller", "create", "leases"),
        (":gpu-reaper-controller", "get", "configmaps"),
        (":gpu-reaper-controller", "patch", "configmaps"),
        (":gpu-reaper-controller", "create", "events"),
    ] {
        assert!(
            made(user, verb, resource),
            "{user} never made {verb} {resource}: {accesses:#?}"
        );
    }

    // A 16-GPU pod with a hand-written controller reference: gated when a token of the
    // namespace's own ServiceAccounts writes it (the chart's matchCondition sends it to
    // the webhook, which counts it as bare), admitted from the Job controller's.
    sim.seed(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "pod-writer"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create"]}]}),
    )
    .unwrap();
    sim.seed(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "pod-writers"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pod-writer"},
        "subjects": [{"kind": "ServiceAccount", "name": "ci-bot", "namespace": "ml"},
                     {"kind": "ServiceAccount", "name": "job-controller", "namespace": "kube-system"}]}))
    .unwrap();
    // `kubectl apply` of such a pod as the service account `ns:name`.
    let apply_as = |ns: &'static str, name: &'static str| {
        let pod = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: by-{name}\n  namespace: ml\n  ownerReferences: [{{apiVersion: batch/v1, kind: Job, name: big, uid: u-big, controller: true}}]\nspec:\n  restartPolicy: Never\n  containers: [{{name: main, image: x, resources: {{limits: {{nvidia.com/gpu: \"16\"}}}}}}]\n"
        );
        let kubeconfig = user_kubeconfig(&sim, dir.path(), ns, name);
        async move { run_as("kubectl", &kubeconfig, &["apply", "-f", "-"], Some(&pod)).await }
    };
    let (ok, text) = apply_as("ml", "ci-bot").await;
    assert!(
        !ok,
        "the namespace's own ServiceAccount slipped past the gate: {text}"
    );
    assert!(text.contains("budget-gate.gpureaper.io"), "{text}");
    let (ok, text) = apply_as("kube-system", "job-controller").await;
    assert!(ok, "{text}");
    assert!(sim.get("", "pods", "ml", "by-job-controller").is_some());
}

/// kubectl or gpu-reaper as a given kubeconfig.
async fn run_as(
    program: &str,
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String) {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        use tokio::io::AsyncWriteExt;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .await
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().await.unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_people_roles_let_teams_write_attestations_and_only_approvers_approve() {
    let sim = KubeSim::start().await.unwrap();
    install(&sim, "gpu-reaper", &defaults())
        .await
        .expect("helm install");
    sim.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}))
        .unwrap();
    // A team member bound in their namespace; an approver bound cluster-wide.
    sim.seed(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "attestation-editors", "namespace": "team-a"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpu-reaper-attestation-editor"},
        "subjects": [{"kind": "ServiceAccount", "name": "dev", "namespace": "team-a"}]}))
    .unwrap();
    sim.seed(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "attestation-approvers"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpu-reaper-attestation-approver"},
        "subjects": [{"kind": "ServiceAccount", "name": "oncall", "namespace": "platform"}]}))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dev = user_kubeconfig(&sim, dir.path(), "team-a", "dev");
    let oncall = user_kubeconfig(&sim, dir.path(), "platform", "oncall");
    let attestation = "apiVersion: gpureaper.io/v1alpha1\nkind: ReadinessAttestation\nmetadata: {name: llama, namespace: team-a}\nspec:\n  selector: {matchLabels: {app: llama}}\n  maxGpus: 64\n  expiresAt: \"2099-01-01T00:00:00Z\"\n";

    let (ok, text) = run_as("kubectl", &dev, &["apply", "-f", "-"], Some(attestation)).await;
    assert!(ok, "a team member writes the spec: {text}");
    let (ok, text) = run_as(
        "kubectl",
        &dev,
        &[
            "patch",
            "readinessattestation",
            "llama",
            "-n",
            "team-a",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"approvedBy":"me"}}"#,
        ],
        None,
    )
    .await;
    assert!(
        !ok && text.contains("forbidden"),
        "a team cannot approve itself: {text}"
    );
    let (ok, text) = run_as(BIN, &dev, &["attest", "approve", "team-a/llama"], None).await;
    assert!(!ok && text.contains("forbidden"), "{text}");
    let (ok, text) = run_as(
        "kubectl",
        &dev,
        &["apply", "-f", "-"],
        Some(&attestation.replace("namespace: team-a", "namespace: default")),
    )
    .await;
    assert!(
        !ok && text.contains("forbidden"),
        "the editor role is bound in team-a only: {text}"
    );

    let (ok, text) = run_as(
        BIN,
        &oncall,
        &["attest", "approve", "team-a/llama", "--approver", "oncall"],
        None,
    )
    .await;
    assert!(ok, "the approver approves: {text}");
    let stored = sim
        .get("gpureaper.io", "readinessattestations", "team-a", "llama")
        .unwrap();
    assert_eq!(stored["status"]["approvedBy"], "oncall");
    let (ok, text) = run_as(
        "kubectl",
        &oncall,
        &["delete", "readinessattestation", "llama", "-n", "team-a"],
        None,
    )
    .await;
    assert!(
        !ok && text.contains("forbidden"),
        "approvers change status only: {text}"
    );
    let refused: Vec<_> = sim
        .accesses()
        .into_iter()
        .filter(|a| !a.allowed && a.user.ends_with(":oncall") && a.verb != "delete")
        .collect();
    assert!(
        refused.is_empty(),
        "attest approve needs more than the approver role: {refused:#?}"
    );
}
