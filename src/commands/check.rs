//! `gpu-reaper check` (the edge): the budget gate's decision offline, on manifest files, for CI
//! pipelines before `kubectl apply` — the same `admit` the webhook runs, over a snapshot
//! read from files instead of caches.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use jiff::Timestamp;
use serde::Deserialize;
use serde_json::Value;

use crate::admission::message::gpu_count;
use crate::admission::review::{AdmissionRequest, GroupVersionKind, Operation, UserInfo};
use crate::admission::{Decision, Settings, Snapshot, Verdict, admit};
use crate::api::validate::parse_resource;
use crate::api::{GpuPolicy, ReadinessAttestation};
use crate::cli::{CheckArgs, CheckOutput};
use crate::gpus::{self, Counted};
use crate::{Error, Result};

/// One YAML/JSON document and where it came from.
struct Document {
    source: String,
    value: Value,
}

fn read_source(path: &Path) -> Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|source| Error::Io {
                path: "<stdin>".into(),
                source,
            })?;
        return Ok(text);
    }
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Files named by `paths`: files as given, directories' `*.yaml`/`*.yml`/`*.json` sorted.
fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("yaml" | "yml" | "json")
                    )
                })
                .collect();
            files.sort();
            out.extend(files);
        } else {
            out.push(path.clone());
        }
    }
    Ok(out)
}

/// Every non-empty document of the files.
fn documents(paths: &[PathBuf], flag: &'static str) -> Result<Vec<Document>> {
    let mut out = Vec::new();
    for path in expand(paths)? {
        let text = read_source(&path)?;
        let name = if path == Path::new("-") {
            "<stdin>".to_string()
        } else {
            path.display().to_string()
        };
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = Value::deserialize(doc).map_err(|e| Error::InvalidArgument {
                flag,
                message: format!("{name}: document {}: not YAML: {e}", i + 1),
            })?;
            if value.is_null() {
                continue;
            }
            if !value.is_object() {
                return Err(Error::InvalidArgument {
                    flag,
                    message: format!(
                        "{name}: document {} is not a Kubernetes object (a mapping with apiVersion and kind)",
                        i + 1
                    ),
                });
            }
            let source = format!("{name} (document {})", i + 1);
            // `kubectl get -o yaml` of several objects writes a `kind: List` (and typed
            // lists such as `GpuPolicyList`): each item is an object of its own.
            if is_list(&value) {
                let Some(items) = value["items"].as_array() else {
                    return Err(Error::InvalidArgument {
                        flag,
                        message: format!(
                            "{source} is a {} without an `items` list",
                            kind_of(&value)
                        ),
                    });
                };
                for (j, item) in items.iter().enumerate() {
                    if !item.is_object() {
                        return Err(Error::InvalidArgument {
                            flag,
                            message: format!(
                                "{source}: items[{j}] is not a Kubernetes object (a mapping with apiVersion and kind)"
                            ),
                        });
                    }
                    out.push(Document {
                        source: format!("{source} items[{j}]"),
                        value: item.clone(),
                    });
                }
                continue;
            }
            out.push(Document { source, value });
        }
    }
    Ok(out)
}

/// `kind: List`, or a typed list (`PodList`, `GpuPolicyList`) with `items`.
fn is_list(v: &Value) -> bool {
    let kind = kind_of(v);
    kind == "List" || (kind.ends_with("List") && v.get("items").is_some())
}

fn kind_of(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or("")
}

fn labels_of(v: &Value) -> BTreeMap<String, String> {
    crate::api::selector::string_map(&v["metadata"]["labels"])
}

fn parse_typed<K>(doc: &Document) -> Result<K>
where
    K: kube::CustomResourceExt + serde::Serialize + serde::de::DeserializeOwned,
{
    let text = serde_yaml::to_string(&doc.value)?;
    Ok(parse_resource::<K>(&text, &doc.source)?)
}

/// What `check` decided for one object.
#[derive(serde::Serialize, Debug, Clone, PartialEq)]
pub struct CheckResult {
    pub source: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub verdict: &'static str,
    pub reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attestation: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Decides every object of `args.files`.
pub fn evaluate(args: &CheckArgs, settings: &Settings, now: Timestamp) -> Result<Vec<CheckResult>> {
    let mut namespaces: HashMap<String, BTreeMap<String, String>> = HashMap::new();
    for entry in &args.namespace_labels {
        let parsed = entry.split_once(':').and_then(|(ns, kv)| {
            let (k, v) = kv.split_once('=')?;
            Some((ns, k, v))
        });
        let Some((ns, k, v)) = parsed else {
            return Err(Error::InvalidArgument {
                flag: "namespace-label",
                message: format!(
                    "{entry:?} is not <namespace>:<key>=<value>, e.g. team-a:gpu-tier=research"
                ),
            });
        };
        namespaces
            .entry(ns.to_string())
            .or_default()
            .insert(k.to_string(), v.to_string());
    }
    let mut policies = Vec::new();
    for doc in documents(&args.policies, "policies")? {
        match kind_of(&doc.value) {
            "GpuPolicy" => policies.push(Arc::new(parse_typed::<GpuPolicy>(&doc)?)),
            "Namespace" => add_namespace(&mut namespaces, &doc.value),
            other => return Err(unexpected("policies", &doc, other, "GpuPolicy")),
        }
    }
    let mut attestations = Vec::new();
    for doc in documents(&args.attestations, "attestations")? {
        match kind_of(&doc.value) {
            "ReadinessAttestation" => {
                let mut a = parse_typed::<ReadinessAttestation>(&doc)?;
                // A file written by hand has no generation; the API server gives a new
                // object generation 1, which is what an approval of it would record.
                a.metadata.generation.get_or_insert(1);
                a.metadata
                    .namespace
                    .get_or_insert_with(|| args.namespace.clone());
                attestations.push(Arc::new(a));
            }
            "Namespace" => add_namespace(&mut namespaces, &doc.value),
            other => {
                return Err(unexpected(
                    "attestations",
                    &doc,
                    other,
                    "ReadinessAttestation",
                ));
            }
        }
    }
    let manifests = documents(&args.files, "filename")?;
    let mut templates = HashMap::new();
    let mut claims = HashMap::new();
    for doc in &manifests {
        let v = &doc.value;
        if kind_of(v) == "Namespace" {
            add_namespace(&mut namespaces, v);
        }
        if kind_of(v) == "ResourceClaim" {
            let ns = namespace_of(v, &args.namespace);
            if let (Ok(Counted::Claim(c)), Some(name)) = (
                gpus::count(v, &ns, &settings.resources, &()),
                v["metadata"]["name"].as_str(),
            ) {
                claims.insert((ns, name.to_string()), c.gpus);
            }
        }
        if kind_of(v) == "ResourceClaimTemplate" {
            let ns = namespace_of(v, &args.namespace);
            if let (Ok(Counted::Claim(c)), Some(name)) = (
                gpus::count(v, &ns, &settings.resources, &()),
                v["metadata"]["name"].as_str(),
            ) {
                templates.insert((ns, name.to_string()), c.gpus);
            }
        }
    }
    let mut snapshot = Snapshot::build(policies, attestations, namespaces, templates);
    snapshot.gpu_nodes = args.gpu_nodes;
    // ResourceClaims are judged as they come, like any claim; pods that name them count
    // them from here.
    snapshot.claims = claims;
    let mut results = Vec::new();
    for (i, doc) in manifests.iter().enumerate() {
        let v = &doc.value;
        let (group, version) = match v["apiVersion"].as_str().unwrap_or("").split_once('/') {
            Some((g, ver)) => (g.to_string(), ver.to_string()),
            None => (
                String::new(),
                v["apiVersion"].as_str().unwrap_or("").to_string(),
            ),
        };
        let namespace = namespace_of(v, &args.namespace);
        let name = v["metadata"]["name"]
            .as_str()
            .or_else(|| v["metadata"]["generateName"].as_str())
            .unwrap_or("")
            .to_string();
        let request = AdmissionRequest {
            uid: format!("check-{}", i + 1),
            kind: GroupVersionKind {
                group,
                version,
                kind: kind_of(v).to_string(),
            },
            resource: None,
            sub_resource: None,
            name: name.clone(),
            namespace: namespace.clone(),
            operation: Operation::Create,
            user_info: UserInfo::default(),
            object: Some(v.clone()),
            old_object: None,
            dry_run: true,
        };
        let d: Decision = admit(&request, &snapshot, settings, now);
        // One apply: what this object was admitted with counts against the ones after it
        // (G1), under its pods' labels (the last label set: its pod template's).
        if d.allowed()
            && let Some(gpus) = d.gpus.filter(|g| *g > 0.0)
            && let Ok(Counted::Claim(claim)) = gpus::count(v, &namespace, &settings.resources, &())
        {
            let labels = claim.label_sets.last().cloned().unwrap_or_default();
            snapshot.add_held(&namespace, labels, gpus - claim.named_claim_gpus);
        }
        results.push(CheckResult {
            source: doc.source.clone(),
            kind: kind_of(v).to_string(),
            namespace,
            name,
            verdict: d.verdict.as_str(),
            reason: d.reason.as_str(),
            gpus: d.gpus,
            policy: d.policy.clone(),
            attestation: d.attestation.clone(),
            message: d.message.clone(),
            warnings: d.warnings.clone(),
        });
    }
    Ok(results)
}

fn namespace_of(v: &Value, default: &str) -> String {
    v["metadata"]["namespace"]
        .as_str()
        .unwrap_or(default)
        .to_string()
}

fn add_namespace(namespaces: &mut HashMap<String, BTreeMap<String, String>>, v: &Value) {
    if let Some(name) = v["metadata"]["name"].as_str() {
        namespaces
            .entry(name.to_string())
            .or_default()
            .extend(labels_of(v));
    }
}

fn unexpected(flag: &'static str, doc: &Document, kind: &str, expected: &str) -> Error {
    Error::InvalidArgument {
        flag,
        message: format!(
            "{} is a {:?}, expected {expected} (or Namespace)",
            doc.source, kind
        ),
    }
}

pub fn run(args: &CheckArgs) -> Result<()> {
    let settings = super::gpu_settings(&args.gpus)?;
    let now = args.now.unwrap_or_else(Timestamp::now);
    let results = evaluate(args, &settings, now)?;
    match args.output {
        CheckOutput::Json => println!("{}", serde_json::to_string_pretty(&results)?),
        CheckOutput::Text => {
            for r in &results {
                let who = if r.namespace.is_empty() {
                    format!("{} {}", r.kind, r.name)
                } else {
                    format!("{} {}/{}", r.kind, r.namespace, r.name)
                };
                let gpus = r
                    .gpus
                    .map(|g| format!(" ({} GPUs)", gpu_count(g)))
                    .unwrap_or_default();
                match &r.message {
                    Some(m) => println!("{}: {who}{gpus}: {m}", r.verdict),
                    None => println!("{}: {who}{gpus}: {}", r.verdict, r.reason.replace('_', " ")),
                }
                for w in &r.warnings {
                    println!("  warning: {w}");
                }
            }
        }
    }
    let denied = results
        .iter()
        .filter(|r| r.verdict == Verdict::Deny.as_str())
        .count();
    if denied > 0 {
        return Err(Error::Denied(denied));
    }
    Ok(())
}
