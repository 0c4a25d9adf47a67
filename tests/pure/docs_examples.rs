//! Every GpuPolicy and ReadinessAttestation written out in the docs is valid: parsed with
//! the CRDs' own rules (CEL and unknown fields), as `kubectl apply` would check them.

use gpu_reaper::api::validate::parse_resource;
use gpu_reaper::api::{GpuPolicy, ReadinessAttestation};

#[test]
fn every_resource_example_in_the_docs_is_valid() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/docs");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, block) in text.split("```yaml\n").skip(1).enumerate() {
            let raw = block.split("```").next().unwrap();
            // Blocks inside a numbered list are indented: dedent by the first line's indent.
            let indent = raw.len() - raw.trim_start_matches(' ').len();
            let body: String = raw
                .lines()
                .map(|l| {
                    l.get(indent.min(l.len() - l.trim_start_matches(' ').len())..)
                        .unwrap_or("")
                })
                .collect::<Vec<_>>()
                .join("\n");
            let body = body.as_str();
            let source = format!("{} (yaml block {})", path.display(), i + 1);
            if body.contains("kind: GpuPolicy\n") && body.starts_with("apiVersion: gpureaper.io") {
                parse_resource::<GpuPolicy>(body, &source).unwrap_or_else(|e| panic!("{e}"));
                checked += 1;
            } else if body.contains("kind: ReadinessAttestation\n")
                && body.starts_with("apiVersion: gpureaper.io")
            {
                parse_resource::<ReadinessAttestation>(body, &source)
                    .unwrap_or_else(|e| panic!("{e}"));
                checked += 1;
            }
        }
    }
    assert!(checked >= 4, "only {checked} examples found");
}

/// Leaf field paths under `spec` of a CRD's schema (`idle.window`, `match.kinds`…);
/// label selectors count as one field.
fn spec_fields(schema: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    match schema.get("properties").and_then(|p| p.as_object()) {
        Some(props) if !prefix.ends_with("Selector") => {
            for (name, sub) in props {
                let path = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}.{name}")
                };
                spec_fields(sub, &path, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

#[test]
fn the_policy_reference_documents_every_field_of_the_crd_and_no_other() {
    let crds =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/crds/gpu-reaper.yaml"))
            .unwrap();
    let crd = crds
        .split("\n---")
        .map(|doc| serde_yaml::from_str::<serde_json::Value>(doc).unwrap())
        .find(|d| d["spec"]["names"]["kind"] == "GpuPolicy")
        .expect("the GpuPolicy CRD");
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut fields = Vec::new();
    spec_fields(spec, "", &mut fields);
    assert!(fields.len() > 20, "{fields:?}");
    let reference =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/policies.md")).unwrap();
    // The reference table: rows "| `field` | default | meaning |".
    let documented: Vec<&str> = reference
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .collect();
    let missing: Vec<&String> = fields
        .iter()
        .filter(|f| {
            !documented
                .iter()
                .any(|d| d == f || f.starts_with(&format!("{d}.")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/policies.md has no row for {missing:?}: add one to its table"
    );
    let unknown: Vec<&&str> = documented
        .iter()
        .filter(|d| {
            !fields
                .iter()
                .any(|f| f == *d || f.starts_with(&format!("{d}.")))
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/policies.md documents fields the CRD does not have: {unknown:?}"
    );
}
