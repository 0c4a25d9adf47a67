//! Pods × how many run at once, for each workload kind the gate governs.

use serde_json::{Map, Value};

use super::fields::*;
use super::pod::*;
use super::tally::*;
use super::*;

pub(super) fn job(
    tally: &mut Tally,
    spec: &Map<String, Value>,
    path: &str,
    suffix: &str,
) -> Result<(), CountError> {
    let parallelism = opt_count(spec, "parallelism", path)?.unwrap_or(1);
    let g = tally.pod_template(spec.get("template"), &join(path, "template"))?;
    tally.add(
        parallelism as f64 * g,
        format!("parallelism {parallelism} × {}{suffix}", gpus_text(g)),
    );
    Ok(())
}

pub(super) fn jobset(tally: &mut Tally, spec: &Map<String, Value>) -> Result<(), CountError> {
    let empty = Map::new();
    for (i, replicated) in opt_list(spec, "replicatedJobs", "spec")?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("spec.replicatedJobs[{i}]");
        let replicated = object_at(replicated, &path)?;
        let name =
            opt_str(replicated, "name", &path)?.map_or_else(|| format!("#{i}"), str::to_string);
        let replicas = opt_count(replicated, "replicas", &path)?.unwrap_or(1);
        let template_path = join(&path, "template");
        let template = opt_object(replicated, "template", &path)?.unwrap_or(&empty);
        let job_path = join(&template_path, "spec");
        let job_spec = opt_object(template, "spec", &template_path)?.unwrap_or(&empty);
        let parallelism = opt_count(job_spec, "parallelism", &job_path)?.unwrap_or(1);
        let g = tally.pod_template(job_spec.get("template"), &join(&job_path, "template"))?;
        tally.add(
            replicas as f64 * parallelism as f64 * g,
            format!(
                "{name} {} × {} × {}",
                n_text(replicas, "replica"),
                n_text(parallelism, "pod"),
                gpus_text(g)
            ),
        );
    }
    Ok(())
}

pub(super) fn ray_cluster(
    tally: &mut Tally,
    spec: &Map<String, Value>,
    path: &str,
) -> Result<(), CountError> {
    let head_path = join(path, "headGroupSpec");
    let head = match opt_object(spec, "headGroupSpec", path)? {
        Some(head) => tally.pod_template(head.get("template"), &join(&head_path, "template"))?,
        None => 0.0,
    };
    tally.add(head, format!("head {}", gpus_text(head)));
    let autoscaling = opt_bool(spec, "enableInTreeAutoscaling", path)?.unwrap_or(false);
    for (i, group) in opt_list(spec, "workerGroupSpecs", path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("{path}.workerGroupSpecs[{i}]");
        let group = object_at(group, &path)?;
        let name =
            opt_str(group, "groupName", &path)?.map_or_else(|| format!("#{i}"), str::to_string);
        let replicas = opt_count(group, "replicas", &path)?;
        let min = opt_count(group, "minReplicas", &path)?;
        let max = opt_count(group, "maxReplicas", &path)?;
        let hosts = opt_count(group, "numOfHosts", &path)?.unwrap_or(1);
        let (pods, note) = ray_worker_replicas(replicas, min, max, autoscaling);
        let g = tally.pod_template(group.get("template"), &join(&path, "template"))?;
        let hosts_text = if hosts == 1 {
            String::new()
        } else {
            format!(" × {hosts} hosts")
        };
        tally.add(
            pods as f64 * hosts as f64 * g,
            format!(
                "worker group {name} {}{hosts_text} × {}{note}",
                n_text(pods, "replica"),
                gpus_text(g)
            ),
        );
    }
    Ok(())
}

/// Worker replicas of a Ray worker group at its largest, and a note for the basis.
pub(super) fn ray_worker_replicas(
    replicas: Option<u64>,
    min: Option<u64>,
    max: Option<u64>,
    autoscaling: bool,
) -> (u64, &'static str) {
    // The CRD defaults maxReplicas to MaxInt32, meaning "no bound".
    const UNBOUNDED: u64 = i32::MAX as u64;
    let bound = max.filter(|m| *m < UNBOUNDED);
    let wanted = match (replicas, min) {
        (None, None) => 1,
        (replicas, min) => {
            let min = min.unwrap_or(0);
            replicas.unwrap_or(min).max(min)
        }
    };
    // KubeRay keeps the replicas within [min, max], and uses max when min > max.
    let desired = bound.map_or(wanted, |m| wanted.min(m));
    match (autoscaling, bound) {
        (true, Some(m)) => (m.max(desired), ""),
        (true, None) => (
            desired,
            " (autoscaling without maxReplicas: counted at replicas)",
        ),
        (false, _) => (desired, ""),
    }
}

pub(super) fn kubeflow_replicas(
    tally: &mut Tally,
    spec: &Map<String, Value>,
) -> Result<(), CountError> {
    let elastic_max = match opt_object(spec, "elasticPolicy", "spec")? {
        Some(elastic) => opt_count(elastic, "maxReplicas", "spec.elasticPolicy")?,
        None => None,
    };
    let mut keys: Vec<&String> = spec
        .keys()
        .filter(|k| k.ends_with("ReplicaSpecs"))
        .collect();
    keys.sort();
    for key in keys {
        let path = join("spec", key);
        let Some(specs) = opt_object(spec, key, "spec")? else {
            continue;
        };
        let mut roles: Vec<(&String, &Value)> =
            specs.iter().filter(|(_, v)| !v.is_null()).collect();
        roles.sort_by(|a, b| a.0.cmp(b.0));
        for (role, replica_spec) in roles {
            let path = member(&path, role);
            let replica_spec = object_at(replica_spec, &path)?;
            let mut replicas = opt_count(replica_spec, "replicas", &path)?.unwrap_or(1);
            if role == "Worker"
                && let Some(max) = elastic_max
            {
                replicas = replicas.max(max);
            }
            let g = tally.pod_template(replica_spec.get("template"), &join(&path, "template"))?;
            tally.add(
                replicas as f64 * g,
                format!("{role} {} × {}", n_text(replicas, "replica"), gpus_text(g)),
            );
        }
    }
    Ok(())
}

pub(super) fn train_job(tally: &mut Tally, spec: &Map<String, Value>) -> Result<(), CountError> {
    let Some(trainer) = opt_object(spec, "trainer", "spec")? else {
        tally.add(
            0.0,
            "no spec.trainer: the runtime's GPUs are not seen".to_string(),
        );
        return Ok(());
    };
    let grants = super::devices::loose_container_grants(
        tally.ctx,
        trainer,
        "spec.trainer",
        "the trainer",
        "resourcesPerNode",
    )?;
    tally.device_grants.extend(grants);
    let nodes = opt_count(trainer, "numNodes", "spec.trainer")?.unwrap_or(1);
    let g = match opt_object(trainer, "resourcesPerNode", "spec.trainer")? {
        Some(res) => resources_gpus(tally.ctx, res, "spec.trainer.resourcesPerNode")?,
        None => 0.0,
    };
    tally.add(
        nodes as f64 * g,
        format!("{} × {}", n_text(nodes, "node"), gpus_text(g)),
    );
    Ok(())
}

pub(super) fn inference_service(
    tally: &mut Tally,
    spec: &Map<String, Value>,
) -> Result<(), CountError> {
    for component in ["predictor", "transformer", "explainer"] {
        let Some(c) = opt_object(spec, component, "spec")? else {
            continue;
        };
        let path = join("spec", component);
        let min = opt_count(c, "minReplicas", &path)?.unwrap_or(0);
        let max = opt_count(c, "maxReplicas", &path)?.unwrap_or(0);
        let replicas = min.max(max).max(1);
        if let Some(labels) = opt_object(c, "labels", &path)? {
            let labels = string_map(labels, &join(&path, "labels"))?;
            tally.add_labels(labels);
        }
        // The framework shorthand (`model`, `pytorch`, `huggingface`, …) is one container.
        let mut shorthand = 0.0;
        let mut children: Vec<(&String, &Value)> = c
            .iter()
            .filter(|(k, v)| {
                !matches!(
                    k.as_str(),
                    "containers"
                        | "initContainers"
                        | "workerSpec"
                        | "labels"
                        | "annotations"
                        | "nodeSelector"
                ) && v.as_object().is_some_and(|o| o.contains_key("resources"))
            })
            .collect();
        children.sort_by(|a, b| a.0.cmp(b.0));
        for (key, child) in children {
            shorthand += container_gpus(tally.ctx, child, &join(&path, key))?;
        }
        // The shorthand is a container of the predictor's pod, whether or not it names
        // resources: its variables reach devices like a container's.
        let mut shorthands: Vec<(&String, &Map<String, Value>)> = c
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "containers" | "initContainers" | "workerSpec" | "labels" | "annotations"
                )
            })
            .filter_map(|(k, v)| Some((k, v.as_object()?)))
            .filter(|(_, o)| o.contains_key("env"))
            .collect();
        shorthands.sort_by(|a, b| a.0.cmp(b.0));
        for (key, child) in shorthands {
            let grants = super::devices::loose_container_grants(
                tally.ctx,
                child,
                &join(&path, key),
                &format!("container {key:?}"),
                "resources",
            )?;
            tally.device_grants.extend(grants);
        }
        let component_value = spec.get(component).unwrap_or(&Value::Null);
        let head = tally.pod_spec(Some(component_value), &path, shorthand)?;
        let Some(worker) = opt_object(c, "workerSpec", &path)? else {
            tally.add(
                replicas as f64 * head,
                format!(
                    "{component} {} × {}",
                    n_text(replicas, "replica"),
                    gpus_text(head)
                ),
            );
            continue;
        };
        let worker_path = join(&path, "workerSpec");
        let pipeline = opt_count(worker, "pipelineParallelSize", &worker_path)?;
        let workers = pipeline.map_or(1, |p| p.saturating_sub(1).max(1));
        let w = tally.pod_spec(c.get("workerSpec"), &worker_path, 0.0)?;
        tally.add(
            replicas as f64 * (head + workers as f64 * w),
            format!(
                "{component} {} × (head {} + {} × {})",
                n_text(replicas, "replica"),
                gpus_text(head),
                n_text(workers, "worker"),
                gpus_text(w)
            ),
        );
    }
    Ok(())
}

/// One workload of an LLMInferenceService (the main one, or `spec.prefill`).
pub(super) fn llm_workload(
    tally: &mut Tally,
    spec: &Map<String, Value>,
    path: &str,
    prefix: &str,
) -> Result<(), CountError> {
    let replicas = opt_count(spec, "replicas", path)?.unwrap_or(1);
    let has_template = opt_object(spec, "template", path)?.is_some();
    let template = tally.pod_spec(spec.get("template"), &join(path, "template"), 0.0)?;
    if opt_object(spec, "worker", path)?.is_none() {
        tally.add(
            replicas as f64 * template,
            format!(
                "{prefix}{} × {}",
                n_text(replicas, "replica"),
                gpus_text(template)
            ),
        );
        return Ok(());
    }
    let worker = tally.pod_spec(spec.get("worker"), &join(path, "worker"), 0.0)?;
    let size = match opt_object(spec, "parallelism", path)? {
        Some(p) => parallelism_size(p, &join(path, "parallelism"))?,
        None => 1,
    };
    let leader = if has_template { template } else { worker };
    let workers = size.saturating_sub(1);
    tally.add(
        replicas as f64 * (leader + workers as f64 * worker),
        format!(
            "{prefix}{} × (leader {} + {} × {})",
            n_text(replicas, "replica"),
            gpus_text(leader),
            n_text(workers, "worker"),
            gpus_text(worker)
        ),
    );
    Ok(())
}

/// Pods per LeaderWorkerSet group, as KServe's `ParallelismSpec.GetSize` computes it.
pub(super) fn parallelism_size(p: &Map<String, Value>, path: &str) -> Result<u64, CountError> {
    let data = opt_count(p, "data", path)?;
    let data_local = opt_count(p, "dataLocal", path)?;
    let pipeline = opt_count(p, "pipeline", path)?;
    if data.unwrap_or(0) > 0 || data_local.unwrap_or(0) > 0 {
        let data = data.unwrap_or(1).max(1);
        let local = data_local.unwrap_or(1).max(1);
        return Ok((data / local).max(1));
    }
    Ok(pipeline.filter(|p| *p > 0).unwrap_or(1))
}

pub(super) fn leader_worker_set(
    tally: &mut Tally,
    spec: &Map<String, Value>,
) -> Result<(), CountError> {
    let replicas = opt_count(spec, "replicas", "spec")?.unwrap_or(1);
    let path = "spec.leaderWorkerTemplate";
    let empty = Map::new();
    let lwt = opt_object(spec, "leaderWorkerTemplate", "spec")?.unwrap_or(&empty);
    let size = opt_count(lwt, "size", path)?.unwrap_or(1);
    let leader = match opt_object(lwt, "leaderTemplate", path)? {
        Some(_) => {
            Some(tally.pod_template(lwt.get("leaderTemplate"), &join(path, "leaderTemplate"))?)
        }
        None => None,
    };
    let worker = tally.pod_template(lwt.get("workerTemplate"), &join(path, "workerTemplate"))?;
    let groups = n_text(replicas, "group");
    match leader {
        Some(leader) => {
            let workers = size.saturating_sub(1);
            tally.add(
                replicas as f64 * (leader + workers as f64 * worker),
                format!(
                    "{groups} × (leader {} + {} × {})",
                    gpus_text(leader),
                    n_text(workers, "worker"),
                    gpus_text(worker)
                ),
            );
        }
        None => {
            let pods = size.max(1);
            tally.add(
                replicas as f64 * pods as f64 * worker,
                format!("{groups} × {} × {}", n_text(pods, "pod"), gpus_text(worker)),
            );
        }
    }
    Ok(())
}
