//! kubectl on our CRDs, served by the real kube-apiserver (scripts/testenv): the schema's
//! docs through `kubectl explain`, the printer columns of `kubectl get`, and the CEL rules
//! and schema limits enforced by the server itself, not by gpu-reaper.

use crate::common;

use common::cluster::cluster;

/// A GpuPolicy named `name` governing only `namespace`, with `spec` added (YAML lines
/// indented two spaces).
fn policy(name: &str, namespace: &str, spec: &str) -> String {
    format!(
        "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {name}}}\nspec:\n  match: {{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {namespace}}}}}}}\n{spec}"
    )
}

#[test]
fn kubectl_explain_prints_the_field_docs_from_the_rust_types() {
    let c = cluster();
    c.install_crds();
    let out = c.kubectl(&["explain", "gpupolicy.spec.idle.window"], None);
    assert!(out.contains("KIND:       GpuPolicy"), "{out}");
    assert!(out.contains("FIELD: window <string>"), "{out}");
    // The doc comment of the Rust field is the user doc the server returns.
    assert!(out.contains("DESCRIPTION:"), "{out}");
    assert!(out.lines().count() > 4, "no description: {out}");
    let out = c.kubectl(&["explain", "ra.spec.maxGpus"], None);
    assert!(out.contains("KIND:       ReadinessAttestation"), "{out}");
}

#[test]
fn kubectl_get_shows_the_printer_columns_of_policies_and_attestations() {
    let c = cluster();
    c.install_crds();
    let ns = c.namespace("crd-columns", &[]);
    let name = format!("columns-{ns}");
    c.apply(&policy(
        &name,
        &ns,
        "  mode: Enforce\n  warn: {after: 30m}\n  action: {type: Suspend, after: 1h}\n",
    ));
    let out = c.kubectl(&["get", "gpol", &name], None);
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "MODE", "ACTION", "GOVERNED", "IDLE", "WARNED", "SAVINGS", "USD", "READY",
            "DEGRADED", "AGE"
        ],
        "{out}"
    );
    // PRIORITY is a priority-1 column: the server's Table leaves it to `-o wide`.
    let wide = c.kubectl(&["get", "gpol", &name, "-o", "wide"], None);
    assert!(wide.lines().next().unwrap().contains("PRIORITY"), "{wide}");
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..3], [name.as_str(), "Enforce", "Suspend"], "{out}");
    c.apply(&format!(
        "apiVersion: gpureaper.io/v1alpha1\nkind: ReadinessAttestation\nmetadata: {{name: llama, namespace: {ns}}}\nspec:\n  selector: {{matchLabels: {{app: llama}}}}\n  maxGpus: 64\n  expiresAt: \"2030-01-01T00:00:00Z\"\n  owner: {{email: alice@example.com}}\n  evidence: {{datasetUri: \"s3://bucket/llama\", dataThroughputGBps: 40}}\n"
    ));
    let out = c.kubectl(&["get", "ra", "-n", &ns], None);
    let header = out.lines().next().unwrap();
    for column in ["MAX GPUS", "EXPIRES", "APPROVED", "AGE"] {
        assert!(header.contains(column), "{column} missing: {out}");
    }
    assert!(out.lines().nth(1).unwrap().contains("64"), "{out}");
    c.kubectl(&["delete", "gpupolicy", &name, "--wait=false"], None);
    c.kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
}

#[test]
fn the_api_server_enforces_the_crds_cel_rules_and_refuses_unknown_fields() {
    let c = cluster();
    c.install_crds();
    let ns = c.namespace("crd-cel", &[]);
    // Invariant 4, checked by the API server: no action before the warning.
    let early = c.try_kubectl(
        &["apply", "-f", "-"],
        Some(&policy(
            &format!("early-{ns}"),
            &ns,
            "  warn: {after: 2h}\n  action: {type: ScaleToZero, after: 1h}\n",
        )),
    );
    assert!(!early.ok, "admitted: {}", early.stdout);
    assert!(
        early
            .stderr
            .contains("spec.action.after must be at least spec.warn.after: gpu-reaper always warns before it acts"),
        "{}",
        early.stderr
    );
    let threshold = c.try_kubectl(
        &["apply", "-f", "-"],
        Some(&policy(
            &format!("threshold-{ns}"),
            &ns,
            "  idle: {threshold: 5}\n",
        )),
    );
    assert!(!threshold.ok);
    assert!(
        threshold
            .stderr
            .contains("spec.idle.threshold must be in (0, 1], e.g. 0.05 for 5 % activity"),
        "{}",
        threshold.stderr
    );
    // Strict field validation (kubectl's default): a misspelt field is named.
    let typo = c.try_kubectl(
        &["apply", "-f", "-"],
        Some(&policy(
            &format!("typo-{ns}"),
            &ns,
            "  idle: {windw: 30m}\n",
        )),
    );
    assert!(!typo.ok);
    assert!(typo.stderr.contains("windw"), "{}", typo.stderr);
    for name in ["early", "threshold", "typo"] {
        assert!(
            c.get("gpupolicy", None, &format!("{name}-{ns}")).is_none(),
            "{name} was stored"
        );
    }
    c.kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
}
