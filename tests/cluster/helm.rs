//! The Helm chart with the real helm (v4, built with the control plane by
//! scripts/testenv) on the real control plane: `helm lint`, `helm template`,
//! `helm install/upgrade/uninstall`, kubectl as the client, and the real gpu-reaper binary
//! running as the chart's ServiceAccounts with tokens the API server issued — the real
//! RBAC authorizer enforces the chart's roles, so a call the code makes and the chart does
//! not grant fails here with a 403.
//!
//! The cluster is shared: every release has a unique name (the chart's cluster-scoped
//! objects are named after it) and a namespace of its own; the sample policy and the
//! budget gate are narrowed to the test's namespaces; the chart's pods are kept off the
//! kwok nodes (`nodeSelector` matching no node), since a kwok "pod" serves nothing.

use crate::common;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use common::chart::{
    BIN, CHART, Cleanup, Gate, b64, documents, find, helm, render, service_account_kubeconfig,
    values_file,
};
use common::cluster::{Cluster, Run, cluster, run_with_stdin, unique, wait_until};
use common::{Dcgm, at, history_start, prometheus_with};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PodSpec, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// No node has this label: the chart's pods stay Pending (a Service without ready
/// endpoints fails fast, and failurePolicy Ignore admits) instead of "running" on kwok.
const NOWHERE: &str = "gpureaper.io/test-no-such-node";

/// The chart's defaults, with only what a shared cluster needs: the required Prometheus
/// URL, a sample policy named after the release and governing `governs` only, and pods
/// kept off the kwok nodes.
fn defaults(release: &str, governs: &str) -> Value {
    json!({
        "prometheus": {"url": "http://prometheus-operated.monitoring.svc:9090"},
        "samplePolicy": {"name": format!("{release}-audit"),
                         "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": governs}}},
        "controller": {"nodeSelector": {NOWHERE: "true"}},
        "webhook": {"nodeSelector": {NOWHERE: "true"}},
    })
}

/// `helm install RELEASE CHART -n NS -f values` (or `upgrade`); helm's output.
fn helm_release(cluster: &Cluster, verb: &str, release: &str, ns: &str, values: &Value) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let file = values_file(dir.path(), release, values);
    let mut args = vec![
        verb,
        release,
        CHART,
        "--namespace",
        ns,
        "-f",
        file.to_str().unwrap(),
    ];
    if verb == "upgrade" {
        // As docs/install.md and troubleshooting.md upgrade: take back what others edited
        // (here the webhook configuration's namespaceSelector from narrow_gate).
        args.push("--force-conflicts");
    }
    helm(cluster, &args)
}

/// The objects of an installed release (`helm get manifest`).
fn manifest(cluster: &Cluster, release: &str, ns: &str) -> (String, Vec<Value>) {
    let run = helm(cluster, &["get", "manifest", release, "--namespace", ns]);
    assert!(run.ok, "helm get manifest: {}", run.stderr);
    let objects = documents(&run.stdout);
    (run.stdout, objects)
}

/// A release's budget gate narrowed to `namespaces` at once (helm installs it for every
/// namespace but the excluded ones; other tests share the cluster).
fn narrow_gate(cluster: &Cluster, objects: &[Value], namespaces: &[&str]) {
    // Server-side, as a manager of its own: Helm 4 upgrades by server-side apply, and a
    // client-side edit of a field it owns would make the upgrade fail with a conflict.
    for kind in [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ] {
        let Some(config) = objects.iter().find(|o| o["kind"] == kind) else {
            continue;
        };
        cluster.kubectl(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=gpu-reaper-test",
                "-f",
                "-",
            ],
            Some(&common::chart::scoped(config, namespaces).to_string()),
        );
    }
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
            "MutatingWebhookConfiguration" => drop(typed::<MutatingWebhookConfiguration>(o)),
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

#[test]
fn the_chart_lints_installs_with_defaults_and_keeps_its_certificate_on_upgrade() {
    let cluster = cluster();
    cluster.install_crds();
    let lint = helm(cluster, &["lint", CHART]);
    assert!(lint.ok, "helm lint: {}{}", lint.stdout, lint.stderr);
    assert!(
        !lint.stdout.contains("[ERROR]") && !lint.stdout.contains("[WARNING]"),
        "helm lint: {}",
        lint.stdout
    );

    let mut cleanup = Cleanup::new(cluster);
    let ns = cluster.namespace("helm", &[]);
    cleanup.add("namespace", &ns);
    let release = format!("r{}", unique());
    let full = format!("{release}-gpu-reaper");
    cleanup.add(
        "validatingwebhookconfiguration",
        &format!("{full}-budget-gate"),
    );
    cleanup.add("gpupolicy", &format!("{release}-audit"));
    let values = defaults(&release, &ns);
    let install = helm_release(cluster, "install", &release, &ns, &values);
    assert!(install.ok, "helm install: {}", install.stderr);
    let (text, objects) = manifest(cluster, &release, &ns);
    narrow_gate(cluster, &objects, &[&ns]);
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
        let kind = o["kind"].as_str().unwrap();
        let name = o["metadata"]["name"].as_str().unwrap();
        let namespace = o["metadata"]["namespace"].as_str();
        assert!(
            cluster.get(kind, namespace, name).is_some(),
            "{kind} {name} was not applied"
        );
    }
    // The chart's CRDs (crds/) are established.
    for crd in [
        "gpupolicies.gpureaper.io",
        "readinessattestations.gpureaper.io",
    ] {
        assert!(cluster.get("crd", None, crd).is_some(), "{crd}");
    }

    // kubectl accepts the rendered manifest as it is (a server-side dry run of all of it).
    let dry = cluster.try_kubectl(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--dry-run=server",
            "-f",
            "-",
        ],
        Some(&text),
    );
    assert!(
        dry.ok,
        "kubectl apply of the rendered chart: {}",
        dry.stderr
    );
    assert!(
        dry.stdout.contains(&format!(
            "deployment.apps/{full}-webhook serverside-applied (server dry run)"
        )),
        "{}",
        dry.stdout
    );

    let controller = find(&objects, "Deployment", &format!("{full}-controller"));
    let webhook = find(&objects, "Deployment", &format!("{full}-webhook"));
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
    assert!(args.contains(&format!("--lease-namespace={ns}").as_str()));
    // The real Deployment controller made the ReplicaSets and pods, and the scheduler
    // leaves them Pending (no node matches the test's nodeSelector).
    wait_until("the chart's webhook pods", || {
        cluster
            .list("pods", &ns, Some("app.kubernetes.io/component=webhook"))
            .len()
            == 2
    });

    // The webhook configuration: safe defaults, exclusions, and the same CA as the
    // serving certificate.
    let vwc = find(
        &objects,
        "ValidatingWebhookConfiguration",
        &format!("{full}-budget-gate"),
    );
    let hook = &vwc["webhooks"][0];
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["failurePolicy"], "Ignore");
    // GPU pods and ResourceClaims fail closed: while the gate is down none is created.
    let pods = &vwc["webhooks"][1];
    assert_eq!(pods["name"], "pods.budget-gate.gpureaper.io");
    assert_eq!(pods["failurePolicy"], "Fail");
    assert_eq!(
        pods["namespaceSelector"], hook["namespaceSelector"],
        "the same namespaces are reviewed"
    );
    assert_eq!(hook["timeoutSeconds"], 3);
    let excluded = &hook["namespaceSelector"]["matchExpressions"][0]["values"];
    for excluded_ns in ["kube-system", "kube-node-lease", ns.as_str()] {
        assert!(
            excluded
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v == excluded_ns),
            "{excluded_ns} is excluded"
        );
    }
    // Workloads are all sent; pods only when they may reach GPUs (any creator: a
    // controller's pods are held to the namespace's total).
    assert!(hook["matchConditions"].is_null());
    assert_eq!(pods["matchConditions"].as_array().unwrap().len(), 1);
    assert_eq!(pods["clientConfig"], hook["clientConfig"]);
    let secret = find(&objects, "Secret", &format!("{full}-webhook-tls"));
    assert_eq!(hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    let leaf = String::from_utf8(b64(secret["data"]["tls.crt"].as_str().unwrap())).unwrap();
    assert!(leaf.contains("BEGIN CERTIFICATE"));
    let policy = find(&objects, "GpuPolicy", &format!("{release}-audit"));
    assert_eq!(
        policy["spec"]["mode"], "Audit",
        "the sample policy never acts"
    );

    // The upgrade reuses the generated certificate (lookup against the real server), and
    // applies the new value.
    let mut upgraded = values.clone();
    upgraded["webhook"]["timeoutSeconds"] = json!(5);
    let upgrade = helm_release(cluster, "upgrade", &release, &ns, &upgraded);
    assert!(upgrade.ok, "helm upgrade: {}", upgrade.stderr);
    let (_, after) = manifest(cluster, &release, &ns);
    narrow_gate(cluster, &after, &[&ns]);
    let vwc2 = find(
        &after,
        "ValidatingWebhookConfiguration",
        &format!("{full}-budget-gate"),
    );
    assert_eq!(vwc2["webhooks"][0]["timeoutSeconds"], 5);
    assert_eq!(
        vwc2["webhooks"][0]["clientConfig"]["caBundle"], hook["clientConfig"]["caBundle"],
        "an upgrade must not rotate the CA under running webhooks"
    );
    let live = cluster
        .get(
            "validatingwebhookconfiguration",
            None,
            &format!("{full}-budget-gate"),
        )
        .unwrap();
    assert_eq!(live["webhooks"][0]["timeoutSeconds"], 5);
    assert_eq!(
        live["webhooks"][0]["clientConfig"]["caBundle"],
        hook["clientConfig"]["caBundle"]
    );
    let live_secret = cluster
        .get("secret", Some(&ns), &format!("{full}-webhook-tls"))
        .unwrap();
    assert_eq!(live_secret["data"]["tls.crt"], secret["data"]["tls.crt"]);

    // The break-glass of docs/troubleshooting.md (a client-side patch of failurePolicy),
    // then its documented recovery: `helm upgrade --force-conflicts` takes the field back
    // (Helm 4 upgrades by server-side apply; kubectl's patch made kubectl its owner).
    let flipped = if hook["failurePolicy"] == "Ignore" {
        "Fail"
    } else {
        "Ignore"
    };
    cluster.kubectl(
        &[
            "patch",
            "validatingwebhookconfiguration",
            &format!("{full}-budget-gate"),
            "--type",
            "json",
            "-p",
            &format!(
                r#"[{{"op":"replace","path":"/webhooks/0/failurePolicy","value":"{flipped}"}}]"#
            ),
        ],
        None,
    );
    let recovery = helm_release(cluster, "upgrade", &release, &ns, &upgraded);
    assert!(recovery.ok, "the documented recovery: {}", recovery.stderr);
    let restored = cluster
        .get(
            "validatingwebhookconfiguration",
            None,
            &format!("{full}-budget-gate"),
        )
        .unwrap();
    assert_eq!(
        restored["webhooks"][0]["failurePolicy"], hook["failurePolicy"],
        "helm upgrade --force-conflicts puts the chart's failurePolicy back"
    );
    let (_, last) = manifest(cluster, &release, &ns);
    narrow_gate(cluster, &last, &[&ns]);

    // Uninstall removes the cluster-scoped objects too (the CRDs stay, as Helm does).
    let uninstall = helm(
        cluster,
        &["uninstall", &release, "--namespace", &ns, "--wait"],
    );
    assert!(uninstall.ok, "helm uninstall: {}", uninstall.stderr);
    for (kind, name) in [
        ("clusterrole", format!("{full}-controller")),
        (
            "validatingwebhookconfiguration",
            format!("{full}-budget-gate"),
        ),
        ("gpupolicy", format!("{release}-audit")),
    ] {
        assert!(cluster.get(kind, None, &name).is_none(), "{kind} {name}");
    }
    assert!(
        cluster
            .get("crd", None, "gpupolicies.gpureaper.io")
            .is_some()
    );
}

#[test]
fn non_default_values_render_cert_manager_network_policy_and_monitoring() {
    let cluster = cluster();
    let mut cleanup = Cleanup::new(cluster);
    let ns = cluster.namespace("helm-values", &[]);
    cleanup.add("namespace", &ns);
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
    // cert-manager and the Prometheus operator are not installed: helm template renders
    // their kinds; the real server then validates every built-in object (dry run).
    let objects = render(cluster, "reaper", &ns, &values, &[]).expect("helm template");
    let builtin: Vec<&Value> = objects
        .iter()
        .filter(|o| {
            !["Certificate", "Issuer", "ServiceMonitor", "PrometheusRule"]
                .contains(&o["kind"].as_str().unwrap())
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": builtin}).to_string();
    let dry = cluster.try_kubectl(
        &["apply", "--server-side", "--dry-run=server", "-f", "-"],
        Some(&list),
    );
    assert!(
        dry.ok,
        "the real server refuses the rendered objects: {}",
        dry.stderr
    );
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
        format!("{ns}/reaper-gpu-reaper-webhook")
    );
    assert!(vwc["webhooks"][0]["clientConfig"]["caBundle"].is_null());
    assert_eq!(vwc["webhooks"][0]["failurePolicy"], "Fail");
    assert!(
        vwc["webhooks"][1]["matchConditions"][0]["expression"]
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
    let solo = render(cluster, "solo", &ns, &controller_only, &[]).expect("helm template");
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

#[test]
fn bad_values_are_refused_with_the_field_and_the_fix() {
    let cluster = cluster();
    let mut cleanup = Cleanup::new(cluster);
    let ns = cluster.namespace("helm-bad", &[]);
    cleanup.add("namespace", &ns);
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
        // A key no template reads (docs once showed a top-level extraArgs) is refused,
        // not silently ignored; so is a misspelt one.
        (
            json!({"prometheus": {"url": "http://p:9090"}, "extraArgs": ["--interval=30s"]}),
            "extraArgs",
        ),
        (
            json!({"prometheus": {"url": "http://p:9090"}, "controller": {"intervall": "30s"}}),
            "intervall",
        ),
    ];
    for (i, (values, expected)) in cases.iter().enumerate() {
        let run = helm_release(
            cluster,
            "install",
            &format!("bad{i}-{}", unique()),
            &ns,
            values,
        );
        assert!(!run.ok, "Helm refuses the values {values}: {}", run.stdout);
        assert!(
            run.stderr.contains(expected),
            "values {values}: {}",
            run.stderr
        );
    }
    // Nothing of a refused release reached the cluster.
    assert!(
        cluster.list("deployments", &ns, None).is_empty(),
        "a refused install applies nothing"
    );
    let releases = helm(
        cluster,
        &[
            "list",
            "--deployed",
            "--failed",
            "--pending",
            "--namespace",
            &ns,
            "-q",
        ],
    );
    assert!(
        releases.ok && releases.stdout.trim().is_empty(),
        "{releases:?}"
    );
}

/// kubectl or gpu-reaper as a given kubeconfig; success, and stdout then stderr.
fn run_as(program: &str, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut command = if program == "kubectl" {
        Command::new(cluster().bin("kubectl"))
    } else {
        Command::new(program)
    };
    command.args(args).env("KUBECONFIG", kubeconfig);
    let run = run_with_stdin(&mut command, stdin);
    (run.ok, format!("{}{}", run.stdout, run.stderr))
}

/// A release with the default values governing `governed`, installed into `system`; its
/// cluster-scoped objects are left to `cleanup`. (release, full name, its objects.)
fn install_defaults(
    cluster: &'static Cluster,
    cleanup: &mut Cleanup,
    system: &str,
    governed: &str,
) -> (String, String, Vec<Value>) {
    let release = format!("r{}", unique());
    let full = format!("{release}-gpu-reaper");
    cleanup.add(
        "validatingwebhookconfiguration",
        &format!("{full}-budget-gate"),
    );
    cleanup.add(
        "mutatingwebhookconfiguration",
        &format!("{full}-attestation-author"),
    );
    cleanup.add("gpupolicy", &format!("{release}-audit"));
    let install = helm_release(
        cluster,
        "install",
        &release,
        system,
        &defaults(&release, governed),
    );
    assert!(install.ok, "helm install: {}", install.stderr);
    let (_, objects) = manifest(cluster, &release, system);
    (release, full, objects)
}

#[test]
fn the_people_roles_let_teams_write_attestations_and_only_approvers_approve() {
    let cluster = cluster();
    cluster.install_crds();
    let mut cleanup = Cleanup::new(cluster);
    let system = cluster.namespace("helm-roles-sys", &[]);
    cleanup.add("namespace", &system);
    let team = cluster.namespace("team-a", &[]);
    cleanup.add("namespace", &team);
    let platform = cluster.namespace("platform", &[]);
    cleanup.add("namespace", &platform);
    let (release, full, objects) = install_defaults(cluster, &mut cleanup, &system, &team);
    narrow_gate(cluster, &objects, &[&team]);
    // A team member bound in their namespace; an approver bound for it. Both are the
    // testenv's people (client certificates): the webhook takes no ServiceAccount for a
    // person on either side of an approval (four eyes, docs/security.md).
    cluster.apply(&format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: attestation-editors, namespace: {team}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {full}-attestation-editor}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: attestation-approvers, namespace: {team}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {full}-attestation-approver}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: platform-oncall}}]
"#
    ));
    let dev = cluster.dir.join("alice.kubeconfig");
    let oncall = cluster.dir.join("approver.kubeconfig");
    let attestation = format!(
        "apiVersion: gpureaper.io/v1alpha1\nkind: ReadinessAttestation\nmetadata: {{name: llama, namespace: {team}}}\nspec:\n  selector: {{matchLabels: {{app: llama}}}}\n  maxGpus: 64\n  expiresAt: \"2099-01-01T00:00:00Z\"\n"
    );

    let (ok, text) = run_as("kubectl", &dev, &["apply", "-f", "-"], Some(&attestation));
    assert!(ok, "a team member writes the spec: {text}");
    let (ok, text) = run_as(
        "kubectl",
        &dev,
        &[
            "patch",
            "readinessattestation",
            "llama",
            "-n",
            &team,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"approvedBy":"me"}}"#,
        ],
        None,
    );
    assert!(
        !ok && text.contains("forbidden"),
        "a team cannot approve itself: {text}"
    );
    let target = format!("{team}/llama");
    let uid = cluster
        .get("readinessattestation", Some(&team), "llama")
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let (ok, text) = run_as(
        BIN,
        &dev,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "1",
            "--uid",
            &uid,
        ],
        None,
    );
    // Refused: her role has no right on the status subresource (the webhook, which would
    // also refuse her as the spec's author, does not run in this test).
    assert!(
        !ok && text.contains("cannot patch resource \"readinessattestations/status\""),
        "{text}"
    );
    let (ok, text) = run_as(
        "kubectl",
        &dev,
        &["apply", "-f", "-"],
        Some(&attestation.replace(
            &format!("namespace: {team}"),
            &format!("namespace: {platform}"),
        )),
    );
    assert!(
        !ok && text.contains("forbidden"),
        "the editor role is bound in {team} only: {text}"
    );

    let (ok, text) = run_as(
        BIN,
        &oncall,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "1",
            "--uid",
            &uid,
            "--approver",
            "oncall",
        ],
        None,
    );
    assert!(
        ok,
        "the approver approves with the approver role alone: {text}"
    );
    assert!(!text.contains("forbidden"), "{text}");
    let stored = cluster
        .get("readinessattestation", Some(&team), "llama")
        .unwrap();
    assert_eq!(stored["status"]["approvedBy"], "oncall");
    assert_eq!(stored["status"]["approvedGeneration"], 1);
    let (ok, text) = run_as(
        "kubectl",
        &oncall,
        &["delete", "readinessattestation", "llama", "-n", &team],
        None,
    );
    assert!(
        !ok && text.contains("forbidden"),
        "approvers change status only: {text}"
    );
    // The editor role aggregates into the built-in `edit` role (the real
    // clusterrole-aggregation controller): a namespace editor writes attestations.
    wait_until("gpu-reaper's rules aggregated into `edit`", || {
        cluster
            .get("clusterrole", None, "edit")
            .is_some_and(|r| r["rules"].to_string().contains("readinessattestations"))
    });
    let uninstall = helm(cluster, &["uninstall", &release, "--namespace", &system]);
    assert!(uninstall.ok, "{}", uninstall.stderr);
}

#[test]
fn the_installed_chart_gates_and_reaps_as_its_own_service_accounts() {
    let cluster = cluster();
    cluster.install_crds();
    let mut cleanup = Cleanup::new(cluster);
    let system = cluster.namespace("helm-e2e-sys", &[]);
    cleanup.add("namespace", &system);
    let ml = cluster.namespace("ml-helm", &[]);
    cleanup.add("namespace", &ml);
    let (release, full, objects) = install_defaults(cluster, &mut cleanup, &system, &ml);
    let dir = tempfile::tempdir().unwrap();

    // The webhook as the chart's webhook ServiceAccount (a real token), with the chart's
    // certificate and flags, behind the chart's Service and webhook configuration.
    let webhook_sa =
        service_account_kubeconfig(cluster, dir.path(), &system, &format!("{full}-webhook"));
    let gate = Gate::start(cluster, &objects, &[&ml], &webhook_sa);
    gate.wait_called(&ml);

    // Policies for this test's namespace, selected by this test's controller only.
    let mut policies = String::new();
    for (name, kind, action) in [
        ("serve", "Deployment", "ScaleToZero"),
        ("batch", "Job", "Suspend"),
        ("bare", "Pod", "Evict"),
    ] {
        let name = format!("{release}-{name}");
        cleanup.add("gpupolicy", &name);
        let _ = write!(
            policies,
            "---\napiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {name}, labels: {{app.kubernetes.io/instance: {release}}}}}\nspec:\n  mode: Enforce\n  match: {{kinds: [{kind}], namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ml}}}}}}}\n  idle: {{window: 30m, startupGrace: 20m, minCoverage: 0.4}}\n  warn: {{after: 30m}}\n  action: {{type: {action}, after: 60m}}\n  admission: {{mode: Enforce, largeClaimGpus: 8}}\n"
        );
    }
    cluster.apply(&policies);
    // The gate sees the policies once its caches catch up; a 16-GPU job without an
    // attestation is then refused with the one-sentence reason.
    let big = format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: big, namespace: {ml}}}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{{name: main, image: x, resources: {{limits: {{nvidia.com/gpu: \"16\"}}}}}}]\n"
    );
    let mut denial = String::new();
    wait_until("the gate denying a 16-GPU job", || {
        let run = cluster.try_kubectl(&["create", "--dry-run=server", "-f", "-"], Some(&big));
        denial = run.stderr;
        !run.ok
    });
    assert!(
        denial.contains("budget-gate.gpureaper.io") && denial.contains("ReadinessAttestation"),
        "{denial}"
    );

    // Real workloads, scheduled onto the kwok nodes: a Deployment, a Job, a bare pod and
    // a StatefulSet only the chart's Audit sample policy governs.
    let gpu = json!({"limits": {"nvidia.com/gpu": "1"}});
    let container = json!([{"name": "main", "image": "x", "resources": gpu}]);
    for object in [
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat", "namespace": ml},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "chat"}},
                        "template": {"metadata": {"labels": {"app": "chat"}}, "spec": {"containers": container}}}}),
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": ml},
               "spec": {"template": {"metadata": {"labels": {"app": "train"}}, "spec": {"restartPolicy": "Never", "containers": container}}}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "scratch", "namespace": ml, "labels": {"app": "scratch"}},
               "spec": {"containers": container}}),
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db", "namespace": ml},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "db"}},
                        "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": container}}}}),
    ] {
        cluster.apply(&object.to_string());
    }
    let mut pods = Vec::new();
    for app in ["chat", "train", "scratch", "db"] {
        let running = cluster.running_pods(&ml, &format!("app={app}"), 1);
        pods.push(running[0]["metadata"]["name"].as_str().unwrap().to_string());
    }
    // Three hours of idle GPUs after their creation, one sample a minute: half the chart's
    // default --scrape-interval (30s) expects, hence the policies' minCoverage 0.4.
    let t0 = history_start();
    let mut dcgm = Dcgm::new(t0);
    for pod in &pods {
        dcgm.gpu(&ml, pod, 0, "NVIDIA H100 80GB HBM3", 0..=180, |_| Some(0.0));
    }
    let prometheus = prometheus_with(&format!("helm-e2e-{}", unique()), &dcgm.finish());

    // The controller, as the chart's controller ServiceAccount, with the chart's flags.
    let controller_sa =
        service_account_kubeconfig(cluster, dir.path(), &system, &format!("{full}-controller"));
    let controller = find(&objects, "Deployment", &format!("{full}-controller"));
    let chart_args: Vec<String> = controller["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| !a.starts_with("--prometheus-url") && !a.starts_with("--listen"))
        .map(String::from)
        .collect();
    for minutes in [60, 150] {
        let out = Command::new(BIN)
            .args(&chart_args)
            .args(["--prometheus-url", &prometheus.url])
            .args(["--listen", &format!("127.0.0.1:{}", common::free_port())])
            .args(["--once", "--now", &at(t0, minutes)])
            .args(["--identity", "gpu-reaper-controller-a"])
            .args([
                "--policy-selector",
                &format!("app.kubernetes.io/instance={release}"),
            ])
            .env("KUBECONFIG", &controller_sa)
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "controller at +{minutes}m: {log}");
        for refused in ["forbidden", "Forbidden", "code: 403", "status: 403"] {
            assert!(
                !log.contains(refused),
                "the chart's RBAC refused a call at +{minutes}m: {log}"
            );
        }
    }
    // G2: the GPU quota of the namespace the gate governs, written with the chart's RBAC.
    let quota = cluster
        .get("resourcequota", Some(&ml), "gpu-reaper-gpus")
        .expect("the controller keeps the namespace's GPU quota");
    assert_eq!(
        quota["spec"]["hard"]["requests.nvidia.com/gpu"], "8",
        "{quota}"
    );
    let deployment = cluster.get("deployment", Some(&ml), "chat").unwrap();
    assert_eq!(deployment["spec"]["replicas"], 0, "scaled to zero");
    let job = cluster.get("job", Some(&ml), "train").unwrap();
    assert_eq!(job["spec"]["suspend"], true, "suspended");
    wait_until("the evicted pod gone", || {
        cluster.get("pod", Some(&ml), "scratch").is_none()
    });
    let db = cluster.get("statefulset", Some(&ml), "db").unwrap();
    assert_eq!(
        db["spec"]["replicas"], 1,
        "the Audit sample policy never acts"
    );
    // The Lease and the Audit-mode state in the release namespace, policy status.
    assert!(
        cluster
            .get("lease", Some(&system), &format!("{full}-controller"))
            .is_some()
    );
    let serve = cluster
        .get("gpupolicy", None, &format!("{release}-serve"))
        .unwrap();
    assert!(serve["status"].is_object(), "status written: {serve}");
    assert!(
        !cluster.list("events.events.k8s.io", &ml, None).is_empty(),
        "events recorded"
    );

    // A 16-GPU pod with a hand-written controller reference: gated when a token of the
    // namespace's own ServiceAccounts writes it (the webhook counts it as bare), and held
    // to the namespace's total from the Job controller's.
    let role = format!("{release}-pod-writer");
    cleanup.add("clusterrole", &role);
    cleanup.add("clusterrolebinding", &role);
    cluster.apply(&format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: ci-bot, namespace: {ml}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {role}}}
rules: [{{apiGroups: [""], resources: [pods], verbs: [get, create]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {role}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}
subjects:
- {{kind: ServiceAccount, name: ci-bot, namespace: {ml}}}
- {{kind: ServiceAccount, name: job-controller, namespace: kube-system}}
"#
    ));
    let uid = job["metadata"]["uid"].as_str().unwrap();
    let apply_as = |ns: &str, name: &str| {
        let pod = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: by-{name}\n  namespace: {ml}\n  ownerReferences: [{{apiVersion: batch/v1, kind: Job, name: train, uid: {uid}, controller: true}}]\nspec:\n  restartPolicy: Never\n  containers: [{{name: main, image: x, resources: {{limits: {{nvidia.com/gpu: \"16\"}}}}}}]\n"
        );
        let kubeconfig = service_account_kubeconfig(cluster, dir.path(), ns, name);
        run_as("kubectl", &kubeconfig, &["create", "-f", "-"], Some(&pod))
    };
    let (ok, text) = apply_as(&ml, "ci-bot");
    assert!(
        !ok,
        "the namespace's own ServiceAccount slipped past the gate: {text}"
    );
    assert!(text.contains("budget-gate.gpureaper.io"), "{text}");
    // kube-controller-manager's identity is not asked for an attestation (its Job was
    // gated), but what its pod adds is held to the namespace's total: 16 GPUs where 8 are
    // allowed are refused by the gate, naming the Job (and by the GPU quota, G2, when the
    // gate is not there).
    let (ok, text) = apply_as("kube-system", "job-controller");
    assert!(!ok, "{text}");
    assert!(
        text.contains("admission webhook \"pods.budget-gate.gpureaper.io\" denied the request")
            && text.contains(&format!(
                "Pod {ml}/by-job-controller, which Job train creates, claims 16 GPUs"
            )),
        "{text}"
    );
    assert!(cluster.get("pod", Some(&ml), "by-job-controller").is_none());
    drop(gate);
    let uninstall = helm(cluster, &["uninstall", &release, "--namespace", &system]);
    assert!(uninstall.ok, "{}", uninstall.stderr);
}
