//! `POST pods/<name>/eviction`: PodDisruptionBudget checks computed from the pods
//! themselves, the 429 the real server answers, and the pod deletion.

use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};

use crate::Shared;
use crate::admission::{self, Operation};
use crate::http::{Body, Req, Target, json_response, parse_body};
use crate::selectors::LabelSelector;
use crate::status::{ApiError, success_status};
use crate::store::Propagation;
use crate::write::read_current;

/// Resolves a PDB's `minAvailable`/`maxUnavailable` (int or percent) against `expected`.
pub(crate) fn scaled(value: &Value, expected: i64, round_up: bool) -> i64 {
    match value {
        Value::Number(n) => n.as_i64().unwrap_or(0),
        Value::String(s) => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            let raw = pct * expected;
            if round_up {
                (raw + 99) / 100
            } else {
                raw / 100
            }
        }
        _ => 0,
    }
}

pub(crate) fn is_healthy(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp").is_none()
        && pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && pod
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
}

/// POST pods/<name>/eviction: deletes the pod unless a matching PDB has no disruption
/// left, in which case 429 as the real server answers.
pub(crate) async fn evict(
    shared: &Arc<Shared>,
    req: &Req,
    target: &Target,
) -> Result<Response<Body>, ApiError> {
    let body = parse_body(&req.body)?;
    let pod = read_current(shared, target)?;
    let pdbs: Vec<Value> = {
        let state = shared.store.lock();
        state
            .list("policy", "poddisruptionbudgets", Some(target.ns()), None)
            .filter(|(_, pdb)| {
                pdb.pointer("/spec/selector")
                    .is_some_and(|s| LabelSelector::from_object(s).matches(&pod))
            })
            .map(|(_, pdb)| pdb.clone())
            .collect()
    };
    if pdbs.len() > 1 {
        return Err(ApiError::internal(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        ));
    }
    if let Some(pdb) = pdbs.first()
        && is_healthy(&pod)
    {
        let selector = LabelSelector::from_object(&pdb["spec"]["selector"]);
        let (expected, healthy) = {
            let state = shared.store.lock();
            let matching: Vec<&Value> = state
                .list("", "pods", Some(target.ns()), None)
                .map(|(_, p)| p)
                .filter(|p| selector.matches(p))
                .collect();
            (
                matching.len() as i64,
                matching.iter().filter(|p| is_healthy(p)).count() as i64,
            )
        };
        let desired = if let Some(min) = pdb.pointer("/spec/minAvailable") {
            scaled(min, expected, true)
        } else if let Some(max) = pdb.pointer("/spec/maxUnavailable") {
            expected - scaled(max, expected, true)
        } else {
            expected
        };
        if healthy - desired < 1 {
            let pdb_name = pdb["metadata"]["name"].as_str().unwrap_or_default();
            return Err(ApiError::new(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                )
                .with_details(json!({"causes": [{
                    "reason": "DisruptionBudget",
                    "message": format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently"),
                }]})));
        }
    }
    let dry_run = req.dry_run()
        || body
            .pointer("/deleteOptions/dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|v| v == "All"));
    // Like kube-apiserver: the eviction is admitted as a CREATE of pods/eviction.
    let mut eviction = body.clone();
    eviction["apiVersion"] = json!("policy/v1");
    eviction["kind"] = json!("Eviction");
    admission::validate(
        shared,
        target,
        Operation::Create,
        target.name(),
        Some(&eviction),
        None,
        dry_run,
    )
    .await?;
    if !dry_run {
        shared.store.lock().delete(
            &target.t,
            target.ns(),
            target.name(),
            Propagation::Background,
            None,
            None,
        )?;
    }
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    Ok(json_response(
        201,
        &success_status("", "pods", target.name(), uid),
        &[],
    ))
}
