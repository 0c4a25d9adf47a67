//! GPUs of one pod: containers, init phase, DRA claims and requests, KAI fractions.

use std::collections::{BTreeSet, HashSet};

use serde_json::{Map, Value};

use super::fields::*;
use super::quantity::*;
use super::tally::*;
use super::*;

/// The requests of a ResourceClaimSpec at `path` (`devices.requests`).
pub(super) fn claim_requests(
    tally: &mut Tally,
    claim_spec: &Map<String, Value>,
    path: &str,
    prefix: &str,
) -> Result<(), CountError> {
    let Some(devices) = opt_object(claim_spec, "devices", path)? else {
        return Ok(());
    };
    let devices_path = join(path, "devices");
    for (i, request) in opt_list(devices, "requests", &devices_path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("{devices_path}.requests[{i}]");
        let request = object_at(request, &path)?;
        let name = opt_str(request, "name", &path)?.map_or_else(|| format!("#{i}"), str::to_string);
        let g = request_gpus(tally.ctx, request, &path)?;
        tally.add(g, format!("{prefix}request {name} {}", gpus_text(g)));
    }
    Ok(())
}

pub(super) fn request_gpus(
    ctx: &Ctx,
    request: &Map<String, Value>,
    path: &str,
) -> Result<f64, CountError> {
    if let Some(exactly) = opt_object(request, "exactly", path)? {
        return device_request_gpus(ctx, exactly, &join(path, "exactly"));
    }
    if let Some(alternatives) = opt_list(request, "firstAvailable", path)? {
        let mut largest: f64 = 0.0;
        for (i, alternative) in alternatives.iter().enumerate() {
            let path = format!("{path}.firstAvailable[{i}]");
            let alternative = object_at(alternative, &path)?;
            largest = largest.max(device_request_gpus(ctx, alternative, &path)?);
        }
        return Ok(largest);
    }
    // v1beta1: the request itself names the class.
    device_request_gpus(ctx, request, path)
}

/// One exact device request (v1 `exactly`, a `firstAvailable` entry, or a v1beta1 request).
pub(super) fn device_request_gpus(
    ctx: &Ctx,
    request: &Map<String, Value>,
    path: &str,
) -> Result<f64, CountError> {
    let Some(class) = opt_str(request, "deviceClassName", path)? else {
        return Ok(0.0);
    };
    if !ctx.resources.is_gpu_class(class) || opt_bool(request, "adminAccess", path)? == Some(true) {
        return Ok(0.0);
    }
    match opt_str(request, "allocationMode", path)?.unwrap_or("ExactCount") {
        "ExactCount" => Ok(opt_count(request, "count", path)?.unwrap_or(1) as f64),
        "All" => Ok(ctx.resources.dra_all_gpus),
        other => Err(problem(
            &join(path, "allocationMode"),
            format!(
                "expected ExactCount or All, found {}",
                found(&Value::from(other))
            ),
        )),
    }
}

pub(super) fn pod_gpus(
    ctx: &Ctx,
    spec: &Value,
    path: &str,
    extra: f64,
) -> Result<(f64, Vec<String>), CountError> {
    let pod = pod_gpus_detailed(ctx, spec, path, extra)?;
    Ok((pod.gpus, pod.unresolved_templates))
}

/// One pod spec's count. Named ResourceClaims are shared by every pod that names them, so
/// they are reported apart from `gpus` (per pod) and added once per object.
pub(super) struct PodCount {
    pub(super) gpus: f64,
    pub(super) unresolved_templates: Vec<String>,
    pub(super) named_claims: Vec<(String, f64)>,
    pub(super) unresolved_claims: Vec<String>,
    pub(super) device_grants: Vec<DeviceGrant>,
}

pub(super) fn pod_gpus_detailed(
    ctx: &Ctx,
    spec: &Value,
    path: &str,
    extra: f64,
) -> Result<PodCount, CountError> {
    let mut out = PodCount {
        gpus: extra,
        unresolved_templates: Vec::new(),
        named_claims: Vec::new(),
        unresolved_claims: Vec::new(),
        device_grants: Vec::new(),
    };
    if spec.is_null() {
        return Ok(out);
    }
    let spec = object_at(spec, path)?;
    out.device_grants = super::devices::pod_device_grants(ctx, spec, path)?;
    let mut main = extra;
    for (i, c) in opt_list(spec, "containers", path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        main += container_gpus(ctx, c, &format!("{path}.containers[{i}]"))?;
    }
    let mut sidecars = 0.0;
    let mut init_peak: f64 = 0.0;
    for (i, c) in opt_list(spec, "initContainers", path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let c_path = format!("{path}.initContainers[{i}]");
        let g = container_gpus(ctx, c, &c_path)?;
        let restartable =
            opt_str(object_at(c, &c_path)?, "restartPolicy", &c_path)? == Some("Always");
        if restartable {
            sidecars += g;
            init_peak = init_peak.max(sidecars);
        } else {
            init_peak = init_peak.max(sidecars + g);
        }
    }
    let mut gpus = (main + sidecars).max(init_peak);
    let mut seen_templates: HashSet<&str> = HashSet::new();
    let mut seen_claims: HashSet<&str> = HashSet::new();
    for (i, claim) in opt_list(spec, "resourceClaims", path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let c_path = format!("{path}.resourceClaims[{i}]");
        let claim = object_at(claim, &c_path)?;
        let source = opt_object(claim, "source", &c_path)?;
        let source_path = join(&c_path, "source");
        let mut template = opt_str(claim, "resourceClaimTemplateName", &c_path)?;
        let mut named = opt_str(claim, "resourceClaimName", &c_path)?;
        if let Some(source) = source {
            if template.is_none() {
                template = opt_str(source, "resourceClaimTemplateName", &source_path)?;
            }
            if named.is_none() {
                named = opt_str(source, "resourceClaimName", &source_path)?;
            }
        }
        if let Some(name) = template {
            match ctx
                .templates
                .gpus(ctx.namespace, name)
                .filter(|g| g.is_finite() && *g >= 0.0)
            {
                Some(g) => gpus += g,
                None if seen_templates.insert(name) => {
                    out.unresolved_templates.push(name.to_string())
                }
                None => {}
            }
        } else if let Some(name) = named {
            if !seen_claims.insert(name) {
                continue;
            }
            match ctx
                .templates
                .claim_gpus(ctx.namespace, name)
                .filter(|g| g.is_finite() && *g >= 0.0)
            {
                Some(g) => out.named_claims.push((name.to_string(), g)),
                None => out.unresolved_claims.push(name.to_string()),
            }
        }
    }
    out.gpus = gpus;
    Ok(out)
}

pub(super) fn container_gpus(ctx: &Ctx, container: &Value, path: &str) -> Result<f64, CountError> {
    let container = object_at(container, path)?;
    match opt_object(container, "resources", path)? {
        Some(res) => resources_gpus(ctx, res, &join(path, "resources")),
        None => Ok(0.0),
    }
}

/// GPUs of a ResourceRequirements (`limits`, `requests`) at `path`.
pub(super) fn resources_gpus(
    ctx: &Ctx,
    res: &Map<String, Value>,
    path: &str,
) -> Result<f64, CountError> {
    let limits = opt_object(res, "limits", path)?;
    let requests = opt_object(res, "requests", path)?;
    let names: BTreeSet<&String> = limits
        .into_iter()
        .chain(requests)
        .flat_map(|m| m.keys())
        .collect();
    let mut gpus = 0.0;
    for name in names {
        let Some(share) = ctx.resources.share_of(name) else {
            continue;
        };
        let mut units: f64 = 0.0;
        for (map, field) in [(limits, "limits"), (requests, "requests")] {
            if let Some(v) = map.and_then(|m| m.get(name.as_str())) {
                units = units.max(device_count(v, &keyed(&join(path, field), name))?);
            }
        }
        gpus += units * share;
    }
    Ok(gpus)
}

/// GPUs a pod (template) at `path` asks for through the KAI scheduler's sharing
/// annotations on its metadata: `gpu-fraction` × `gpu-fraction-num-devices`, or one GPU
/// for `gpu-memory`.
pub(super) fn kai_fraction(obj: &Map<String, Value>, path: &str) -> Result<f64, CountError> {
    let Some(meta) = opt_object(obj, "metadata", path)? else {
        return Ok(0.0);
    };
    let meta_path = join(path, "metadata");
    let Some(annotations) = opt_object(meta, "annotations", &meta_path)? else {
        return Ok(0.0);
    };
    let annotations_path = join(&meta_path, "annotations");
    let text = |key: &str| -> Result<Option<&str>, CountError> {
        match present(annotations, key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(problem(
                &keyed(&annotations_path, key),
                format!("expected a string, found {}", found(other)),
            )),
        }
    };
    if let Some(fraction) = text(KAI_GPU_FRACTION)? {
        let share: f64 = fraction
            .trim()
            .parse()
            .ok()
            .filter(|f: &f64| f.is_finite() && *f > 0.0 && *f <= 1.0)
            .ok_or_else(|| {
                problem(
                    &keyed(&annotations_path, KAI_GPU_FRACTION),
                    format!(
                        "expected a fraction of a GPU above 0 and at most 1, e.g. \"0.5\", found {}",
                        found(&Value::from(fraction))
                    ),
                )
            })?;
        let devices = match text(KAI_GPU_FRACTION_DEVICES)? {
            None => 1.0,
            Some(n) => n
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| {
                    problem(
                        &keyed(&annotations_path, KAI_GPU_FRACTION_DEVICES),
                        format!(
                            "expected a whole number of devices of at least 1, found {}",
                            found(&Value::from(n))
                        ),
                    )
                })? as f64,
        };
        return Ok(share * devices);
    }
    if text(KAI_GPU_MEMORY)?.is_some() {
        return Ok(1.0);
    }
    Ok(0.0)
}

impl Tally<'_> {
    /// GPUs of one pod of a pod template (`metadata` + `spec`) at `path`; keeps its labels.
    pub(super) fn pod_template(
        &mut self,
        template: Option<&Value>,
        path: &str,
    ) -> Result<f64, CountError> {
        let Some(template) = template.filter(|t| !t.is_null()) else {
            return Ok(0.0);
        };
        let template = object_at(template, path)?;
        let labels = labels_of(template, path)?;
        self.add_labels(labels);
        let g = self.pod_spec(template.get("spec"), &join(path, "spec"), 0.0)?;
        Ok(g + kai_fraction(template, path)?)
    }

    /// GPUs of one pod of a bare pod spec at `path`, plus `extra` main-container GPUs.
    pub(super) fn pod_spec(
        &mut self,
        spec: Option<&Value>,
        path: &str,
        extra: f64,
    ) -> Result<f64, CountError> {
        let pod = pod_gpus_detailed(self.ctx, spec.unwrap_or(&Value::Null), path, extra)?;
        for name in pod.unresolved_templates {
            if self.unresolved_seen.insert((false, name.clone())) {
                self.unresolved.push(name);
            }
        }
        for name in pod.unresolved_claims {
            if self.unresolved_seen.insert((true, name.clone())) {
                self.unresolved_claims.push(name);
            }
        }
        self.device_grants.extend(pod.device_grants);
        for (name, g) in pod.named_claims {
            if self.named_claims.insert(name.clone()) {
                self.named_claim_gpus += g;
                self.add(g, format!("ResourceClaim {name} {}", gpus_text(g)));
            }
        }
        Ok(pod.gpus)
    }
}
