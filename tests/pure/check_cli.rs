//! `gpu-reaper check`: the budget gate offline on manifest files, as a CI step runs it.
//! Exit 0 admitted, 1 denied, 2 bad input.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gpu-reaper");
/// The public GPU manifests, beside the checkout (never copied into it).
const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures/manifests");

const POLICY: &str = r#"
apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata: {name: research}
spec:
  match:
    namespaceSelector: {matchLabels: {gpu-tier: research}}
  admission: {largeClaimGpus: 2, mode: Enforce}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-a, labels: {gpu-tier: research}}
"#;

/// The real RayService fixture claims 4 GPUs at its largest (see src/admission/count.rs
/// tests); an attestation selects it by a label this test adds.
fn attestation(approved: bool) -> String {
    let status = if approved {
        "status:\n  conditions: [{type: Approved, status: \"True\", reason: Approved, message: ok, lastTransitionTime: \"2026-11-01T00:00:00Z\"}]\n  approvedBy: oncall\n  approvedGeneration: 1\n"
    } else {
        ""
    };
    format!(
        "apiVersion: gpureaper.io/v1alpha1\nkind: ReadinessAttestation\nmetadata: {{name: ray, namespace: team-a}}\nspec:\n  selector: {{matchLabels: {{team: ray}}}}\n  maxGpus: 64\n  expiresAt: \"2030-01-01T00:00:00Z\"\n{status}"
    )
}

fn check(dir: &Path, manifest: &str, extra: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("check")
        .arg("-f")
        .arg(dir.join(manifest))
        .arg("--policies")
        .arg(dir.join("policies"))
        .args(["--namespace", "team-a", "--now", "2026-11-29T12:00:00Z"])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("policies")).unwrap();
    std::fs::write(dir.path().join("policies/research.yaml"), POLICY).unwrap();
    let ray = std::fs::read_to_string(format!("{MANIFESTS}/kuberay__ray-service.llm-serve.yaml"))
        .unwrap();
    // Derived: the real manifest with a label the attestation selects.
    let labelled = ray.replacen("metadata:\n", "metadata:\n  labels: {team: ray}\n", 1);
    assert_ne!(labelled, ray, "fixture layout changed");
    std::fs::write(dir.path().join("ray.yaml"), labelled).unwrap();
    dir
}

#[test]
fn a_large_claim_without_attestation_exits_1_with_the_webhook_sentence() {
    let dir = setup();
    let (code, stdout, stderr) = check(dir.path(), "ray.yaml", &[]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stdout.contains("deny: RayService team-a/ray-serve-llm (4 GPUs): RayService team-a/ray-serve-llm claims 4 GPUs,"), "{stdout}");
    assert!(stdout.contains("allow: Secret team-a/"), "{stdout}");
    assert!(stdout.contains("more than the 2 GpuPolicy \"research\" admits without a ReadinessAttestation, and no ReadinessAttestation in namespace team-a selects its labels"), "{stdout}");
    assert!(
        stderr.contains("the budget gate denied 1 object(s)"),
        "{stderr}"
    );
}

#[test]
fn an_approved_attestation_admits_and_an_unapproved_one_is_named() {
    let dir = setup();
    std::fs::write(dir.path().join("ra.yaml"), attestation(true)).unwrap();
    let ra = dir.path().join("ra.yaml");
    let (code, stdout, _) = check(
        dir.path(),
        "ray.yaml",
        &["--attestations", ra.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains("allow: RayService team-a/ray-serve-llm (4 GPUs): attested"),
        "{stdout}"
    );
    std::fs::write(&ra, attestation(false)).unwrap();
    let (code, stdout, _) = check(
        dir.path(),
        "ray.yaml",
        &["--attestations", ra.to_str().unwrap(), "-o", "json"],
    );
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v[0]["verdict"], "deny");
    assert_eq!(v[0]["reason"], "not_approved");
    assert_eq!(v[0]["attestation"], "ray");
}

#[test]
fn a_namespace_outside_the_policy_is_not_gated() {
    let dir = setup();
    let out = Command::new(BIN)
        .args(["check", "-f"])
        .arg(dir.path().join("ray.yaml"))
        .arg("--policies")
        .arg(dir.path().join("policies"))
        .args(["--namespace", "team-b"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(": no policy"));
}

#[test]
fn bad_input_exits_2_naming_the_file_and_field() {
    let dir = setup();
    std::fs::write(
        dir.path().join("policies/broken.yaml"),
        "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {name: broken}\nspec:\n  admission: {largeClaimGpus: 0}\n",
    )
    .unwrap();
    let (code, _, stderr) = check(dir.path(), "ray.yaml", &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("broken.yaml"), "{stderr}");
    assert!(
        stderr.contains("spec.admission.largeClaimGpus must be between 1 and 1000000"),
        "{stderr}"
    );
    std::fs::remove_file(dir.path().join("policies/broken.yaml")).unwrap();
    let out = Command::new(BIN)
        .args(["check", "-f"])
        .arg(dir.path().join("ray.yaml"))
        .arg("--policies")
        .arg(dir.path().join("policies"))
        .args(["--now", "yesterday"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("--now") && stderr.contains("\"yesterday\" is not an RFC 3339 time"),
        "{stderr}"
    );
}

fn job(name: &str, gpus: u32) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: {name}, namespace: team-a}}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        image: trainer\n        resources: {{limits: {{nvidia.com/gpu: \"{gpus}\"}}}}\n"
    )
}

/// What `kubectl get jobs -o yaml` writes for several objects.
fn kind_list(items: &[String]) -> String {
    let mut out =
        String::from("apiVersion: v1\nkind: List\nmetadata: {resourceVersion: \"\"}\nitems:\n");
    for item in items {
        for (i, line) in item.lines().enumerate() {
            out.push_str(if i == 0 { "- " } else { "  " });
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[test]
fn a_kind_list_is_judged_item_by_item_and_a_large_item_is_denied() {
    let dir = setup();
    // Before: "allow: List …: not a claim", exit 0, while the webhook denies the Job.
    std::fs::write(dir.path().join("list.yaml"), kind_list(&[job("big", 64)])).unwrap();
    let (code, stdout, stderr) = check(dir.path(), "list.yaml", &[]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("deny: Job team-a/big (64 GPUs)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("items[0]") || !stdout.contains("List"),
        "{stdout}"
    );
}

#[test]
fn policies_and_attestations_as_kubectl_get_writes_them_are_read() {
    let dir = setup();
    // `kubectl get gpupolicies -o yaml > policies.yaml` writes a List.
    let policy = POLICY.split("---").next().unwrap().trim().to_string();
    std::fs::remove_file(dir.path().join("policies/research.yaml")).unwrap();
    std::fs::write(
        dir.path().join("policies/list.yaml"),
        kind_list(&[policy]) + "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: team-a, labels: {gpu-tier: research}}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("attestations.yaml"),
        kind_list(&[attestation(true)]),
    )
    .unwrap();
    let attestations = dir.path().join("attestations.yaml");
    let (code, stdout, stderr) = check(
        dir.path(),
        "ray.yaml",
        &["--attestations", attestations.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("allow: RayService team-a/ray-serve-llm (4 GPUs): attested"),
        "{stdout}"
    );
}

#[test]
fn several_files_are_judged_as_one_apply_so_a_split_claim_is_caught() {
    let dir = setup();
    // largeClaimGpus 2: two 2-GPU Jobs are each within the limit, not together.
    std::fs::write(dir.path().join("a.yaml"), job("a", 2)).unwrap();
    std::fs::write(dir.path().join("b.yaml"), job("b", 2)).unwrap();
    let out = Command::new(BIN)
        .arg("check")
        .arg("-f")
        .arg(dir.path().join("a.yaml"))
        .arg("-f")
        .arg(dir.path().join("b.yaml"))
        .arg("--policies")
        .arg(dir.path().join("policies"))
        .args(["--namespace", "team-a", "--now", "2026-11-29T12:00:00Z"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("allow: Job team-a/a (2 GPUs): within limit"),
        "{stdout}"
    );
    assert!(
        stdout.contains("deny: Job team-a/b (2 GPUs): Job team-a/b claims 2 GPUs, but namespace team-a already holds 2 GPUs outside any approved ReadinessAttestation"),
        "{stdout}"
    );
}
