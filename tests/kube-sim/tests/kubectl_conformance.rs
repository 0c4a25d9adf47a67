//! Conformance suite: kubectl (a real client we did not write) drives kube-sim over
//! HTTPS with a kubeconfig that embeds kube-sim's CA. Each test starts its own server.

mod common;

use common::{SAFETY, Webhook, crd, fixture, kubectl, kubectl_ok, pod_rules};
use kube_sim::KubeSim;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

async fn sim() -> KubeSim {
    KubeSim::start().await.expect("kube-sim starts")
}

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: trainer
  labels: {app: trainer, gpu: "true"}
spec:
  containers:
  - name: main
    image: pytorch/pytorch:2.4.0
    resources:
      limits: {nvidia.com/gpu: "1"}
"#;

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: nginx
        image: nginx:1.27
"#;

#[tokio::test]
async fn kubectl_api_resources_lists_builtin_types_with_short_names() {
    let sim = sim().await;
    let out = kubectl_ok(&sim, &["api-resources", "--no-headers"], None).await;
    for (name, short, api_version, kind) in [
        ("pods", "po", "v1", "Pod"),
        ("deployments", "deploy", "apps/v1", "Deployment"),
        (
            "poddisruptionbudgets",
            "pdb",
            "policy/v1",
            "PodDisruptionBudget",
        ),
        (
            "customresourcedefinitions",
            "crd,crds",
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
        ),
        ("leases", "", "coordination.k8s.io/v1", "Lease"),
        ("resourceclaims", "", "resource.k8s.io/v1", "ResourceClaim"),
    ] {
        let found = out.lines().any(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            cols.first() == Some(&name)
                && cols.contains(&api_version)
                && cols.last() == Some(&kind)
                && (short.is_empty() || cols.contains(&short))
        });
        assert!(found, "{name} missing from api-resources:\n{out}");
    }
}

#[tokio::test]
async fn kubectl_create_from_file_then_get_yaml_round_trips_the_object() {
    let sim = sim().await;
    let out = kubectl_ok(&sim, &["create", "-f", "-"], Some(POD)).await;
    assert_eq!(out.trim(), "pod/trainer created");
    let out = kubectl_ok(&sim, &["get", "pod", "trainer", "-o", "json"], None).await;
    let pod: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "1"
    );
    assert_eq!(pod["metadata"]["namespace"], "default");
    assert_eq!(pod["status"]["phase"], "Pending");
    assert!(
        pod["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty())
    );
    assert!(
        pod["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|rv| rv.parse::<u64>().is_ok())
    );
    let yaml = kubectl_ok(&sim, &["get", "pod", "trainer", "-o", "yaml"], None).await;
    assert!(
        yaml.contains("name: trainer") && yaml.contains("nvidia.com/gpu: \"1\""),
        "{yaml}"
    );
    let table = kubectl_ok(&sim, &["get", "pods"], None).await;
    assert!(
        table.starts_with("NAME") && table.contains("trainer"),
        "{table}"
    );
}

#[tokio::test]
async fn kubectl_create_of_an_existing_object_reports_already_exists() {
    let sim = sim().await;
    kubectl_ok(&sim, &["create", "-f", "-"], Some(POD)).await;
    let run = kubectl(&sim, &["create", "-f", "-"], Some(POD)).await;
    assert!(!run.ok);
    assert!(
        run.stderr.contains("Error from server (AlreadyExists)")
            && run.stderr.contains("pods \"trainer\" already exists"),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn kubectl_get_of_a_missing_object_reports_not_found() {
    let sim = sim().await;
    let run = kubectl(&sim, &["get", "pod", "ghost"], None).await;
    assert!(!run.ok);
    assert!(
        run.stderr
            .contains("Error from server (NotFound): pods \"ghost\" not found"),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn kubectl_label_selectors_filter_the_list() {
    let sim = sim().await;
    kubectl_ok(&sim, &["create", "-f", "-"], Some(POD)).await;
    kubectl_ok(
        &sim,
        &["create", "-f", "-"],
        Some(
            &POD.replace("trainer", "other")
                .replace("gpu: \"true\"", "gpu: \"false\""),
        ),
    )
    .await;
    let out = kubectl_ok(&sim, &["get", "pods", "-l", "gpu=true", "-o", "name"], None).await;
    assert_eq!(out.trim(), "pod/trainer");
    let out = kubectl_ok(
        &sim,
        &[
            "get",
            "pods",
            "-l",
            "app in (other,trainer),gpu!=true",
            "-o",
            "name",
        ],
        None,
    )
    .await;
    assert_eq!(out.trim(), "pod/other");
}

#[tokio::test]
async fn kubectl_apply_server_side_is_idempotent_and_reports_conflicts_with_other_managers() {
    let sim = sim().await;
    let out = kubectl_ok(
        &sim,
        &["apply", "--server-side", "-f", "-"],
        Some(DEPLOYMENT),
    )
    .await;
    assert_eq!(out.trim(), "deployment.apps/web serverside-applied");
    let rv1 = kubectl_ok(
        &sim,
        &[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
        None,
    )
    .await;
    kubectl_ok(
        &sim,
        &["apply", "--server-side", "-f", "-"],
        Some(DEPLOYMENT),
    )
    .await;
    let rv2 = kubectl_ok(
        &sim,
        &[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
        None,
    )
    .await;
    assert!(rv2.parse::<u64>().unwrap() >= rv1.parse::<u64>().unwrap());
    let managers = kubectl_ok(
        &sim,
        &[
            "get",
            "deploy",
            "web",
            "--show-managed-fields",
            "-o",
            "jsonpath={.metadata.managedFields[*].manager}",
        ],
        None,
    )
    .await;
    assert_eq!(managers.trim(), "kubectl");

    // Another manager takes .spec.replicas; applying a different value now conflicts.
    kubectl_ok(
        &sim,
        &[
            "patch",
            "deploy",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":5}}"#,
            "--field-manager=hpa",
        ],
        None,
    )
    .await;
    let run = kubectl(
        &sim,
        &["apply", "--server-side", "-f", "-"],
        Some(DEPLOYMENT),
    )
    .await;
    assert!(!run.ok);
    assert!(
        run.stderr
            .contains("Apply failed with 1 conflict: conflict with \"hpa\""),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains(".spec.replicas"), "{}", run.stderr);
    kubectl_ok(
        &sim,
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(DEPLOYMENT),
    )
    .await;
    let replicas = kubectl_ok(
        &sim,
        &["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"],
        None,
    )
    .await;
    assert_eq!(replicas, "2");
}

#[tokio::test]
async fn kubectl_patch_with_merge_and_json_patches_changes_the_object() {
    let sim = sim().await;
    kubectl_ok(&sim, &["create", "-f", "-"], Some(DEPLOYMENT)).await;
    let out = kubectl_ok(
        &sim,
        &[
            "patch",
            "deploy",
            "web",
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"tier":"gpu"}}}"#,
        ],
        None,
    )
    .await;
    assert_eq!(out.trim(), "deployment.apps/web patched");
    let out = kubectl_ok(
        &sim,
        &["patch", "deploy", "web", "--type=json", "-p", r#"[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"nginx:1.28"}]"#],
        None,
    )
    .await;
    assert_eq!(out.trim(), "deployment.apps/web patched");
    let deploy: Value = serde_json::from_str(
        &kubectl_ok(&sim, &["get", "deploy", "web", "-o", "json"], None).await,
    )
    .unwrap();
    assert_eq!(deploy["metadata"]["labels"]["tier"], "gpu");
    assert_eq!(
        deploy["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.28"
    );
    assert_eq!(
        deploy["metadata"]["generation"], 2,
        "only the spec change bumps generation"
    );
    let run = kubectl(
        &sim,
        &[
            "patch",
            "deploy",
            "web",
            "--type=json",
            "-p",
            r#"[{"op":"test","path":"/spec/replicas","value":7}]"#,
        ],
        None,
    )
    .await;
    assert!(
        !run.ok && run.stderr.contains("The request is invalid"),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn kubectl_scale_sets_replicas_through_the_scale_subresource() {
    let sim = sim().await;
    kubectl_ok(&sim, &["create", "-f", "-"], Some(DEPLOYMENT)).await;
    let out = kubectl_ok(&sim, &["scale", "deploy", "web", "--replicas=0"], None).await;
    assert_eq!(out.trim(), "deployment.apps/web scaled");
    let replicas = kubectl_ok(
        &sim,
        &["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"],
        None,
    )
    .await;
    assert_eq!(replicas, "0");
    let run = kubectl(
        &sim,
        &[
            "scale",
            "deploy",
            "web",
            "--replicas=3",
            "--current-replicas=2",
        ],
        None,
    )
    .await;
    assert!(
        !run.ok,
        "a stale --current-replicas precondition must fail: {}",
        run.stdout
    );
}

#[tokio::test]
async fn kubectl_delete_removes_the_object() {
    let sim = sim().await;
    kubectl_ok(&sim, &["create", "-f", "-"], Some(POD)).await;
    let out = kubectl_ok(&sim, &["delete", "pod", "trainer", "--wait=false"], None).await;
    assert_eq!(out.trim(), "pod \"trainer\" deleted");
    assert!(sim.get("", "pods", "default", "trainer").is_none());
    let run = kubectl(&sim, &["delete", "pod", "trainer"], None).await;
    assert!(run.stderr.contains("NotFound"), "{}", run.stderr);
}

#[tokio::test]
async fn kubectl_delete_of_a_deployment_garbage_collects_its_replicaset() {
    let sim = sim().await;
    let deploy = sim
        .seed(serde_yaml::from_str::<Value>(DEPLOYMENT).unwrap())
        .unwrap();
    sim.seed(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-1", "namespace": "default", "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
            "uid": deploy["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
        }]},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }))
    .unwrap();
    kubectl_ok(
        &sim,
        &["delete", "deploy", "web", "--cascade=foreground"],
        None,
    )
    .await;
    assert!(sim.get("apps", "replicasets", "default", "web-1").is_none());
    assert!(sim.get("apps", "deployments", "default", "web").is_none());
}

#[tokio::test]
async fn kubectl_get_watch_prints_changes_as_they_happen() {
    let sim = sim().await;
    kubectl_ok(&sim, &["create", "-f", "-"], Some(POD)).await;
    let mut child = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(sim.kubeconfig_path())
        .args([
            "get",
            "pods",
            "--watch",
            "--output-watch-events",
            "--no-headers",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        tokio::time::timeout(SAFETY, lines.next_line())
            .await
            .expect("kubectl printed a line in time")
            .expect("read")
            .expect("kubectl still running")
    };
    let columns = |line: String| {
        line.split_whitespace()
            .take(2)
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(columns(next().await), ["ADDED", "trainer"]);
    kubectl_ok(&sim, &["label", "pod", "trainer", "phase=two"], None).await;
    assert_eq!(columns(next().await), ["MODIFIED", "trainer"]);
    kubectl_ok(&sim, &["delete", "pod", "trainer", "--wait=false"], None).await;
    assert_eq!(columns(next().await), ["DELETED", "trainer"]);
    child.kill().await.ok();
}

/// Kinds of the shared fixture manifests, with CRDs written here (open schemas).
const FIXTURE_KINDS: [(&str, &str, &str, &str, &str); 4] = [
    (
        "kueue.x-k8s.io",
        "v1beta2",
        "Workload",
        "workloads",
        "kueue__docs_concepts_workload.extracted-Workload.yaml",
    ),
    (
        "ray.io",
        "v1",
        "RayCluster",
        "rayclusters",
        "kuberay__ray-cluster.verl.yaml",
    ),
    (
        "jobset.x-k8s.io",
        "v1alpha2",
        "JobSet",
        "jobsets",
        "jobset__workload-aware-scheduling_dra_jobset.yaml",
    ),
    (
        "kubeflow.org",
        "v1",
        "Notebook",
        "notebooks",
        "kubeflow-v1.10.0__notebook-controller_samples__v1_notebook.yaml",
    ),
];

#[tokio::test]
async fn kubectl_creates_crds_then_the_real_project_manifests_as_custom_objects() {
    let sim = sim().await;
    for (group, version, kind, plural, _) in FIXTURE_KINDS {
        let out = kubectl_ok(
            &sim,
            &["create", "-f", "-"],
            Some(&crd(group, version, kind, plural, true).to_string()),
        )
        .await;
        assert_eq!(
            out.trim(),
            format!("customresourcedefinition.apiextensions.k8s.io/{plural}.{group} created")
        );
    }
    kubectl_ok(
        &sim,
        &[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=30s",
        ],
        None,
    )
    .await;
    // `kubectl create namespace` sends protobuf (not supported); a manifest sends JSON.
    let namespace =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}});
    kubectl_ok(&sim, &["create", "-f", "-"], Some(&namespace.to_string())).await;
    let mut found = 0;
    for (group, _, _, plural, file) in FIXTURE_KINDS {
        let Some(path) = fixture(&format!("manifests/{file}")) else {
            eprintln!("{file}: not found under tests/fixtures/manifests");
            continue;
        };
        found += 1;
        let path = path.to_string_lossy().into_owned();
        let out = kubectl_ok(&sim, &["create", "-f", &path], None).await;
        assert!(
            out.contains(&format!("{}.{group}/", plural.trim_end_matches('s'))),
            "{out}"
        );
        let listed = kubectl_ok(
            &sim,
            &["get", &format!("{plural}.{group}"), "-A", "-o", "name"],
            None,
        )
        .await;
        assert_eq!(listed.lines().count(), 1, "{listed}");
    }
    // The manifests are committed under tests/fixtures/manifests: all must be exercised.
    assert_eq!(found, FIXTURE_KINDS.len(), "fixture manifests missing");
    // A custom object made here, through its scale subresource.
    let object = json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "small"}, "spec": {"replicas": 1}});
    kubectl_ok(&sim, &["create", "-f", "-"], Some(&object.to_string())).await;
    kubectl_ok(
        &sim,
        &["scale", "rayclusters.ray.io", "small", "--replicas=4"],
        None,
    )
    .await;
    let replicas = kubectl_ok(
        &sim,
        &[
            "get",
            "rayclusters.ray.io",
            "small",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
        None,
    )
    .await;
    assert_eq!(replicas, "4");
    // Deleting the CRD deletes its objects and stops serving the type.
    kubectl_ok(&sim, &["delete", "crd", "rayclusters.ray.io"], None).await;
    assert!(sim.list("ray.io", "rayclusters", None).is_empty());
    let run = kubectl(&sim, &["get", "rayclusters.ray.io"], None).await;
    assert!(!run.ok, "{}", run.stdout);
}

#[tokio::test]
async fn kubectl_prints_a_webhook_denial_and_its_warnings() {
    let sim = sim().await;
    let webhook = Webhook::start(|request| {
        let gpus = request["object"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"].as_str();
        if gpus.is_some_and(|g| g.parse::<u32>().unwrap_or(0) > 4) {
            json!({"allowed": false, "status": {"code": 403, "message": "claims over 4 GPUs need a readiness attestation"}, "warnings": ["gpu-reaper is watching"]})
        } else {
            json!({"allowed": true, "warnings": ["idle GPUs are reclaimed after 30m"]})
        }
    })
    .await;
    let config = webhook.configuration("gpu-gate", pod_rules(), "Fail");
    kubectl_ok(&sim, &["create", "-f", "-"], Some(&config.to_string())).await;

    let run = kubectl(&sim, &["create", "-f", "-"], Some(POD)).await;
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("Warning: idle GPUs are reclaimed after 30m"),
        "{}",
        run.stderr
    );

    let big = POD
        .replace("trainer", "big")
        .replace("nvidia.com/gpu: \"1\"", "nvidia.com/gpu: \"8\"");
    let run = kubectl(&sim, &["create", "-f", "-"], Some(&big)).await;
    assert!(!run.ok);
    assert!(
        run.stderr.contains(
            "Error from server: error when creating \"STDIN\": admission webhook \"gpu-gate.gpu-reaper.test\" denied the request: claims over 4 GPUs need a readiness attestation"
        ),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("Warning: gpu-reaper is watching"),
        "{}",
        run.stderr
    );
    assert!(sim.get("", "pods", "default", "big").is_none());
    let requests = webhook.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1]["request"]["operation"], "CREATE");
    assert_eq!(
        requests[1]["request"]["kind"],
        json!({"group": "", "version": "v1", "kind": "Pod"})
    );
}

#[tokio::test]
async fn kubectl_client_side_apply_creates_configures_and_leaves_unchanged() {
    let sim = sim().await;
    let out = kubectl_ok(&sim, &["apply", "-f", "-"], Some(DEPLOYMENT)).await;
    assert_eq!(out.trim(), "deployment.apps/web created");
    let out = kubectl_ok(&sim, &["apply", "-f", "-"], Some(DEPLOYMENT)).await;
    assert_eq!(out.trim(), "deployment.apps/web unchanged");
    let changed = DEPLOYMENT.replace("nginx:1.27", "nginx:1.28");
    let out = kubectl_ok(&sim, &["apply", "-f", "-"], Some(&changed)).await;
    assert_eq!(out.trim(), "deployment.apps/web configured");
    let image = kubectl_ok(
        &sim,
        &[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ],
        None,
    )
    .await;
    assert_eq!(image, "nginx:1.28");
    let out = kubectl_ok(&sim, &["delete", "-f", "-"], Some(DEPLOYMENT)).await;
    assert_eq!(out.trim(), "deployment.apps \"web\" deleted");
}

#[tokio::test]
async fn kubectl_dry_run_server_does_not_store_the_object() {
    let sim = sim().await;
    let out = kubectl_ok(&sim, &["create", "--dry-run=server", "-f", "-"], Some(POD)).await;
    assert_eq!(out.trim(), "pod/trainer created (server dry run)");
    assert!(sim.get("", "pods", "default", "trainer").is_none());
}

#[tokio::test]
async fn the_binary_serves_kubectl_through_the_kubeconfig_it_writes() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--port", "0", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kube-sim binary");
    let mut lines = tokio::io::BufReader::new(server.stdout.take().unwrap()).lines();
    let serving = tokio::time::timeout(SAFETY, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("kube-sim serving on https://127.0.0.1:") {
                return line;
            }
        }
        panic!("the binary exited before serving");
    })
    .await
    .expect("the binary started in time");
    assert!(kubeconfig.exists(), "{serving}");
    let output = tokio::time::timeout(
        SAFETY,
        tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "namespaces", "-o", "name"])
            .output(),
    )
    .await
    .expect("kubectl finished in time")
    .expect("kubectl ran");
    let names = String::from_utf8_lossy(&output.stdout);
    assert!(
        names.contains("namespace/default") && names.contains("namespace/kube-system"),
        "{names}"
    );
    server.kill().await.ok();
}

#[tokio::test]
async fn kubectl_get_prints_pod_columns_and_crd_printer_columns() {
    let sim = sim().await;
    let mut pod: Value = serde_yaml::from_str(POD).unwrap();
    pod["status"] = json!({"phase": "Running", "containerStatuses": [{"name": "main", "ready": true, "restartCount": 2, "image": "x", "imageID": "", "started": true}]});
    sim.seed(pod).unwrap();
    let out = kubectl_ok(&sim, &["get", "pods"], None).await;
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..4], ["trainer", "1/1", "Running", "2"]);

    let mut definition = crd(
        "gpu-reaper.io",
        "v1alpha1",
        "GpuPolicy",
        "gpupolicies",
        false,
    );
    definition["spec"]["versions"][0]["additionalPrinterColumns"] = json!([
        {"name": "Idle-After", "type": "string", "jsonPath": ".spec.idleAfter"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
    ]);
    kubectl_ok(&sim, &["create", "-f", "-"], Some(&definition.to_string())).await;
    sim.seed(json!({
        "apiVersion": "gpu-reaper.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "default"},
        "spec": {"idleAfter": "30m"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap();
    let out = kubectl_ok(&sim, &["get", "gpupolicies"], None).await;
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "IDLE-AFTER", "READY", "AGE"]);
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..3], ["default", "30m", "True"]);
}

#[tokio::test]
async fn kubectl_describe_shows_the_pod_and_its_events() {
    let sim = sim().await;
    let pod = sim
        .seed(serde_yaml::from_str::<Value>(POD).unwrap())
        .unwrap();
    sim.seed(json!({
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "trainer.1"},
        "involvedObject": {"kind": "Pod", "name": "trainer", "namespace": "default", "uid": pod["metadata"]["uid"]},
        "reason": "GpuIdle", "message": "GPU 0 idle for 30m", "type": "Warning", "count": 1,
        "source": {"component": "gpu-reaper"},
    }))
    .unwrap();
    let out = kubectl_ok(&sim, &["describe", "pod", "trainer"], None).await;
    assert!(out.contains("Name:") && out.contains("trainer"), "{out}");
    assert!(out.contains("nvidia.com/gpu:  1"), "{out}");
    assert!(
        out.contains("GpuIdle") && out.contains("GPU 0 idle for 30m"),
        "{out}"
    );
}

#[tokio::test]
async fn kubectl_registers_the_projects_own_crds_and_serves_the_sample_policy() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (crds, sample) = (
        root.join("crds/gpu-reaper.yaml"),
        root.join("config/samples/policy.yaml"),
    );
    if !crds.exists() || !sample.exists() {
        eprintln!(
            "skipped: {} or {} not found",
            crds.display(),
            sample.display()
        );
        return;
    }
    let sim = sim().await;
    kubectl_ok(&sim, &["create", "-f", &crds.to_string_lossy()], None).await;
    kubectl_ok(
        &sim,
        &[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=30s",
        ],
        None,
    )
    .await;
    let out = kubectl_ok(&sim, &["create", "-f", &sample.to_string_lossy()], None).await;
    assert!(out.contains("gpupolicy.gpureaper.io/"), "{out}");
    let name = out
        .split_whitespace()
        .next()
        .unwrap()
        .trim_start_matches("gpupolicy.gpureaper.io/")
        .to_string();
    // Printer columns as the CRD file declares them: priority 0 by default, the rest
    // only with -o wide. Read from the file, so the test follows the CRD as it changes.
    let text = std::fs::read_to_string(&crds).unwrap();
    let definition = text
        .split("\n---")
        .filter_map(|doc| serde_yaml::from_str::<Value>(doc).ok())
        .find(|doc| doc["spec"]["names"]["kind"] == "GpuPolicy")
        .expect("a GpuPolicy CRD in crds/");
    let short = definition["spec"]["names"]["shortNames"][0]
        .as_str()
        .unwrap_or("gpupolicies")
        .to_string();
    let columns = definition["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let header_of = |out: &str| out.lines().next().unwrap_or_default().to_string();
    let out = kubectl_ok(&sim, &["get", &short], None).await;
    let wide = kubectl_ok(&sim, &["get", &short, "-o", "wide"], None).await;
    assert!(out.lines().nth(1).unwrap().starts_with(&name), "{out}");
    for column in &columns {
        let title = column["name"].as_str().unwrap().to_uppercase();
        let in_default = column["priority"].as_i64().unwrap_or(0) == 0;
        assert_eq!(
            header_of(&out).contains(&title),
            in_default,
            "{title} in {out}"
        );
        assert!(header_of(&wide).contains(&title), "{title} in {wide}");
    }
    if let Some(category) = definition["spec"]["names"]["categories"][0].as_str() {
        let out = kubectl_ok(&sim, &["get", category, "-o", "name"], None).await;
        assert!(
            out.contains(&format!("gpupolicy.gpureaper.io/{name}")),
            "{out}"
        );
    }
    let kinds = kubectl_ok(
        &sim,
        &["api-resources", "--api-group=gpureaper.io", "-o", "name"],
        None,
    )
    .await;
    assert!(
        kinds.lines().any(|k| k == "gpupolicies.gpureaper.io"),
        "{kinds}"
    );
}

#[tokio::test]
async fn kubectl_get_watch_with_a_request_timeout_ends_by_itself() {
    let sim = sim().await;
    kubectl_ok(&sim, &["create", "-f", "-"], Some(POD)).await;
    // `kubectl` returns once its 2 s request timeout cuts the watch; SAFETY bounds the wait.
    let out = kubectl_ok(
        &sim,
        &[
            "get",
            "pods",
            "--watch",
            "--request-timeout=2s",
            "--no-headers",
        ],
        None,
    )
    .await;
    assert!(out.starts_with("trainer"), "{out}");
}

#[tokio::test]
async fn kubectl_patches_and_reads_the_status_and_scale_subresources() {
    let sim = sim().await;
    kubectl_ok(&sim, &["create", "-f", "-"], Some(DEPLOYMENT)).await;
    kubectl_ok(
        &sim,
        &[
            "patch",
            "deploy",
            "web",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":2,"readyReplicas":1},"spec":{"replicas":9}}"#,
        ],
        None,
    )
    .await;
    let deploy: Value = serde_json::from_str(
        &kubectl_ok(&sim, &["get", "deploy", "web", "-o", "json"], None).await,
    )
    .unwrap();
    assert_eq!(deploy["status"]["readyReplicas"], 1);
    assert_eq!(
        deploy["spec"]["replicas"], 2,
        "a status write leaves spec alone"
    );
    let scale: Value = serde_json::from_str(
        &kubectl_ok(
            &sim,
            &["get", "deploy", "web", "--subresource=scale", "-o", "json"],
            None,
        )
        .await,
    )
    .unwrap();
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 2);
    assert_eq!(scale["status"]["replicas"], 2);
    assert_eq!(scale["status"]["selector"], "app=web");
}

#[tokio::test]
async fn kubectl_reports_schema_and_cel_failures_and_unknown_fields_of_custom_objects() {
    let sim = sim().await;
    let mut definition = crd("test.gpu-reaper.io", "v1", "Budget", "budgets", true);
    definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = json!({
        "type": "object",
        "properties": {"spec": {
            "type": "object",
            "x-kubernetes-validations": [{"rule": "self.gpus <= 8", "message": "at most 8 GPUs without an attestation"}],
            "properties": {"gpus": {"type": "integer", "minimum": 0}},
        }},
    });
    kubectl_ok(&sim, &["create", "-f", "-"], Some(&definition.to_string())).await;
    let budget = |spec: Value| {
        json!({"apiVersion": "test.gpu-reaper.io/v1", "kind": "Budget", "metadata": {"name": "b"}, "spec": spec}).to_string()
    };
    let run = kubectl(
        &sim,
        &["create", "-f", "-"],
        Some(&budget(json!({"gpus": 16}))),
    )
    .await;
    assert!(!run.ok);
    assert!(
        run.stderr.contains("The Budget \"b\" is invalid: spec: Invalid value: \"object\": at most 8 GPUs without an attestation"),
        "{}",
        run.stderr
    );
    // kubectl asks for strict field validation: an unknown field is an error.
    let run = kubectl(
        &sim,
        &["create", "-f", "-"],
        Some(&budget(json!({"gpus": 1, "gpuz": 2}))),
    )
    .await;
    assert!(!run.ok);
    assert!(
        run.stderr.contains("unknown field \"spec.gpuz\""),
        "{}",
        run.stderr
    );
    kubectl_ok(
        &sim,
        &["create", "-f", "-"],
        Some(&budget(json!({"gpus": 1}))),
    )
    .await;
}

#[tokio::test]
async fn events_recorded_through_events_k8s_io_show_in_kubectl_describe() {
    let sim = sim().await;
    let pod = sim
        .seed(serde_yaml::from_str::<Value>(POD).unwrap())
        .unwrap();
    let client = sim.client().await.unwrap();
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(client, "default");
    let event: k8s_openapi::api::events::v1::Event = serde_json::from_value(json!({
        "metadata": {"name": "trainer.idle"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "regarding": {"kind": "Pod", "name": "trainer", "namespace": "default", "uid": pod["metadata"]["uid"], "apiVersion": "v1"},
        "reason": "GpuIdle", "note": "GPU 0 idle for 30m", "type": "Warning", "action": "Warn",
        "reportingController": "gpu-reaper", "reportingInstance": "gpu-reaper-0",
    }))
    .unwrap();
    tokio::time::timeout(SAFETY, events.create(&Default::default(), &event))
        .await
        .expect("in time")
        .unwrap();
    // The same object through core/v1, as kubectl reads it.
    let core = kubectl_ok(
        &sim,
        &["get", "events.v1.", "trainer.idle", "-o", "json"],
        None,
    )
    .await;
    let core: Value = serde_json::from_str(&core).unwrap();
    assert_eq!(core["involvedObject"]["name"], "trainer");
    assert_eq!(core["message"], "GPU 0 idle for 30m");
    let out = kubectl_ok(&sim, &["describe", "pod", "trainer"], None).await;
    assert!(
        out.contains("GpuIdle") && out.contains("GPU 0 idle for 30m"),
        "{out}"
    );
    // And back through events.k8s.io, selected by the object it regards.
    let listed = tokio::time::timeout(
        SAFETY,
        events.list(&kube::api::ListParams::default().fields("regarding.name=trainer")),
    )
    .await
    .expect("in time")
    .unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].note.as_deref(), Some("GPU 0 idle for 30m"));
}

#[tokio::test]
async fn kubectl_get_prints_the_usual_columns_for_deployments_and_namespaces() {
    let sim = sim().await;
    let mut deploy: Value = serde_yaml::from_str(DEPLOYMENT).unwrap();
    deploy["status"] =
        json!({"readyReplicas": 1, "updatedReplicas": 2, "availableReplicas": 1, "replicas": 2});
    sim.seed(deploy).unwrap();
    let out = kubectl_ok(&sim, &["get", "deploy"], None).await;
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]);
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..4], ["web", "1/2", "2", "1"]);
    let out = kubectl_ok(&sim, &["get", "ns", "default"], None).await;
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..2], ["default", "Active"]);
}

#[tokio::test]
async fn kubectl_drain_cordons_and_evicts_but_a_pdb_holds_the_last_pod() {
    let sim = sim().await;
    sim.seed(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
    )
    .unwrap();
    for name in ["free", "guarded"] {
        sim.seed(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
            "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
    }
    sim.seed(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep-one", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}}))
        .unwrap();
    // A server-side dry run evicts nothing.
    kubectl_ok(
        &sim,
        &[
            "drain",
            "gpu-node-1",
            "--force",
            "--pod-selector=app=free",
            "--dry-run=server",
            "--timeout=20s",
        ],
        None,
    )
    .await;
    assert!(sim.get("", "pods", "default", "free").is_some());
    let run = kubectl(
        &sim,
        &["drain", "gpu-node-1", "--force", "--timeout=3s"],
        None,
    )
    .await;
    assert!(!run.ok, "the PDB keeps the drain from finishing");
    assert!(
        run.stdout.contains("node/gpu-node-1 cordoned"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("evicting pod default/free"),
        "{}",
        run.stdout
    );
    assert!(
        run.stderr
            .contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{}",
        run.stderr
    );
    assert!(sim.get("", "pods", "default", "free").is_none());
    assert!(sim.get("", "pods", "default", "guarded").is_some());
    assert_eq!(
        sim.get("", "nodes", "", "gpu-node-1").unwrap()["spec"]["unschedulable"],
        true
    );
}
