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
