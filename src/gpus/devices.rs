//! GPU devices a pod can reach without a counted request: the routes around the device
//! plugin that the node's container runtime honours, read from the pod spec alone.
//!
//! Pure, like the rest of the room. A route is reported only for a container that does
//! not itself request a GPU resource of the vendor the route reaches (a container that
//! does is counted; see docs/security.md for what its variable can still widen). What the
//! spec cannot show is not seen: `envFrom` (a ConfigMap or Secret may carry the
//! variable), the image's own `ENV` (NVIDIA's CUDA images set
//! `NVIDIA_VISIBLE_DEVICES=all`), a runtime's defaults. Those are closed on the nodes, by
//! the toolkit settings docs/security.md names.

use std::fmt;

use serde_json::{Map, Value};

use super::fields::*;
use super::quantity::device_count;
use super::tally::Ctx;
use super::*;

/// Variables a container runtime hook reads to inject GPUs into any container that sets
/// them: NVIDIA's container toolkit (`NVIDIA_VISIBLE_DEVICES`, honoured for unprivileged
/// containers unless `accept-nvidia-visible-devices-envvar-when-unprivileged = false`)
/// and AMD's container toolkit's `amd-container-runtime` (`AMD_VISIBLE_DEVICES`). The
/// filters the libraries read inside a container (`CUDA_VISIBLE_DEVICES`,
/// `HIP_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`, Intel's `ZE_AFFINITY_MASK`) only narrow
/// what the container already has, so they are not routes.
pub const DEVICE_VARIABLES: [(&str, Vendor); 2] = [
    ("NVIDIA_VISIBLE_DEVICES", Vendor::Nvidia),
    ("AMD_VISIBLE_DEVICES", Vendor::Amd),
];

/// Values of a device variable that inject no device: NVIDIA's `void` (nothing),
/// `none` (the driver, no device) and empty; AMD's runtime reads the same words.
pub const NO_DEVICE_VALUES: [&str; 3] = ["", "void", "none"];

/// Where NVIDIA's toolkit reads a device list from mount destinations when
/// `accept-nvidia-visible-devices-as-volume-mounts = true` (the device plugin's
/// `volume-mounts` strategy): a mount the pod spec writes there is a request for the
/// devices it names (`…/all`: every GPU).
pub const NVIDIA_DEVICE_MOUNT_DIRS: [&str; 2] = [
    "/var/run/nvidia-container-devices",
    "/run/nvidia-container-devices",
];

/// Whose devices a route reaches, for the resource the denial tells the team to request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Nvidia,
    Amd,
    AwsNeuron,
    /// Any vendor's: `/dev/dri` (AMD and Intel), `/dev/accel*` (Gaudi, TPU), all of
    /// `/dev`, a privileged container.
    Any,
}

impl Vendor {
    /// The resource to request, as the denial names it.
    pub fn resource(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia.com/gpu",
            Vendor::Amd => "amd.com/gpu",
            Vendor::AwsNeuron => "aws.amazon.com/neuron",
            Vendor::Any => "a GPU resource",
        }
    }

    /// Whether a counted GPU resource named `resource` is this vendor's.
    fn covers(self, resource: &str) -> bool {
        match self {
            Vendor::Nvidia => resource.starts_with("nvidia.com/"),
            Vendor::Amd => resource.starts_with("amd.com/"),
            Vendor::AwsNeuron => resource.starts_with("aws.amazon.com/"),
            Vendor::Any => true,
        }
    }
}

/// How a container reaches devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// A device variable with a value that injects devices; `None`: set through
    /// `valueFrom` (a ConfigMap, Secret or field), unknown here, so taken as a grant.
    Variable { name: String, value: Option<String> },
    /// A hostPath volume of a device node (or of a directory holding them) mounted into
    /// the container.
    HostPath { volume: String, path: String },
    /// A mount at NVIDIA's device-list directory ([`NVIDIA_DEVICE_MOUNT_DIRS`]).
    DeviceListMount { path: String },
    /// `securityContext.privileged: true`: every device node of the host.
    Privileged,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Route::Variable {
                name,
                value: Some(value),
            } => write!(f, "{name}={value}"),
            Route::Variable { name, value: None } => {
                write!(f, "{name} (set through valueFrom)")
            }
            Route::HostPath { volume, path } => write!(f, "hostPath volume {volume:?} ({path})"),
            Route::DeviceListMount { path } => write!(f, "a volume mounted at {path}"),
            Route::Privileged => write!(f, "securityContext.privileged"),
        }
    }
}

/// One container that reaches GPU devices without requesting them as resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceGrant {
    /// `container "main"`, `init container "setup"`, `ephemeral container "debugger"`.
    pub container: String,
    /// JSON path of the container, e.g. `spec.template.spec.containers[0]`.
    pub path: String,
    pub route: Route,
    pub vendor: Vendor,
}

/// Which vendor's devices a hostPath at `path` exposes, if any. The path is taken
/// lexically (repeated and trailing slashes, `.` and `..` resolved; the API server
/// refuses `..` in a hostPath anyway): the root and `/dev` hold every device node;
/// `/dev/char` holds links to them by number.
pub fn device_path_vendor(path: &str) -> Option<Vendor> {
    let path = normalized(path);
    let under = |dir: &str| path == dir || path.starts_with(&format!("{dir}/"));
    if path == "/" || path == "/dev" || under("/dev/char") {
        return Some(Vendor::Any);
    }
    if path.starts_with("/dev/nvidia") {
        return Some(Vendor::Nvidia);
    }
    if under("/dev/kfd") {
        return Some(Vendor::Amd);
    }
    if path.starts_with("/dev/neuron") {
        return Some(Vendor::AwsNeuron);
    }
    if under("/dev/dri") || path.starts_with("/dev/accel") {
        return Some(Vendor::Any);
    }
    None
}

/// `path` with `.`, `..`, repeated and trailing slashes resolved (lexically, from `/`).
fn normalized(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

/// The device routes of one pod spec (`spec` at `path`): its containers, init containers
/// and ephemeral containers, each judged on its own requests.
pub(super) fn pod_device_grants(
    ctx: &Ctx,
    spec: &Map<String, Value>,
    path: &str,
) -> Result<Vec<DeviceGrant>, CountError> {
    // hostPath volumes of device paths, by volume name.
    let mut device_volumes: Vec<(&str, &str, Vendor)> = Vec::new();
    for (i, volume) in opt_list(spec, "volumes", path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let v_path = format!("{path}.volumes[{i}]");
        let volume = object_at(volume, &v_path)?;
        let Some(host) = opt_object(volume, "hostPath", &v_path)? else {
            continue;
        };
        let host_path = opt_str(host, "path", &join(&v_path, "hostPath"))?.unwrap_or_default();
        if let Some(vendor) = device_path_vendor(host_path) {
            let name = opt_str(volume, "name", &v_path)?.unwrap_or_default();
            device_volumes.push((name, host_path, vendor));
        }
    }
    let mut grants = Vec::new();
    for (key, what) in [
        ("containers", "container"),
        ("initContainers", "init container"),
        ("ephemeralContainers", "ephemeral container"),
    ] {
        for (i, c) in opt_list(spec, key, path)?.into_iter().flatten().enumerate() {
            let c_path = format!("{path}.{key}[{i}]");
            let c = object_at(c, &c_path)?;
            let label = match opt_str(c, "name", &c_path)? {
                Some(name) => format!("{what} {name:?}"),
                None => format!("{what} #{i}"),
            };
            for (route, vendor) in container_routes(c, &c_path, &device_volumes)? {
                if !requests_vendor(ctx, c, &c_path, "resources", vendor)? {
                    grants.push(DeviceGrant {
                        container: label.clone(),
                        path: c_path.clone(),
                        route,
                        vendor,
                    });
                }
            }
        }
    }
    Ok(grants)
}

/// The device routes of a container outside a pod spec (a KServe framework shorthand, a
/// TrainJob's trainer, whose requests are under `resources_key`): its variables only.
pub(super) fn loose_container_grants(
    ctx: &Ctx,
    container: &Map<String, Value>,
    path: &str,
    label: &str,
    resources_key: &str,
) -> Result<Vec<DeviceGrant>, CountError> {
    let mut grants = Vec::new();
    for (route, vendor) in variable_routes(container, path)? {
        if !requests_vendor(ctx, container, path, resources_key, vendor)? {
            grants.push(DeviceGrant {
                container: label.to_string(),
                path: path.to_string(),
                route,
                vendor,
            });
        }
    }
    Ok(grants)
}

fn container_routes(
    c: &Map<String, Value>,
    path: &str,
    device_volumes: &[(&str, &str, Vendor)],
) -> Result<Vec<(Route, Vendor)>, CountError> {
    let mut routes = variable_routes(c, path)?;
    for (i, mount) in opt_list(c, "volumeMounts", path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let m_path = format!("{path}.volumeMounts[{i}]");
        let mount = object_at(mount, &m_path)?;
        let name = opt_str(mount, "name", &m_path)?.unwrap_or_default();
        if let Some((volume, host_path, vendor)) =
            device_volumes.iter().find(|(v, _, _)| *v == name)
        {
            routes.push((
                Route::HostPath {
                    volume: volume.to_string(),
                    path: host_path.to_string(),
                },
                *vendor,
            ));
        }
        let mount_path = normalized(opt_str(mount, "mountPath", &m_path)?.unwrap_or_default());
        if NVIDIA_DEVICE_MOUNT_DIRS
            .iter()
            .any(|dir| mount_path == *dir || mount_path.starts_with(&format!("{dir}/")))
        {
            routes.push((Route::DeviceListMount { path: mount_path }, Vendor::Nvidia));
        }
    }
    if let Some(security) = opt_object(c, "securityContext", path)?
        && opt_bool(security, "privileged", &join(path, "securityContext"))? == Some(true)
    {
        routes.push((Route::Privileged, Vendor::Any));
    }
    Ok(routes)
}

/// The device variables `env` sets to a value that injects devices.
fn variable_routes(c: &Map<String, Value>, path: &str) -> Result<Vec<(Route, Vendor)>, CountError> {
    let mut routes = Vec::new();
    for (i, var) in opt_list(c, "env", path)?.into_iter().flatten().enumerate() {
        let v_path = format!("{path}.env[{i}]");
        let var = object_at(var, &v_path)?;
        let name = opt_str(var, "name", &v_path)?.unwrap_or_default();
        let Some((_, vendor)) = DEVICE_VARIABLES.iter().find(|(n, _)| *n == name) else {
            continue;
        };
        let value = opt_str(var, "value", &v_path)?;
        let from = opt_object(var, "valueFrom", &v_path)?.is_some();
        let route = match (value, from) {
            // The API server refuses both; a value that cannot be known is a grant.
            (_, true) => Route::Variable {
                name: name.to_string(),
                value: None,
            },
            (Some(value), false) if !NO_DEVICE_VALUES.contains(&value) => Route::Variable {
                name: name.to_string(),
                value: Some(value.to_string()),
            },
            _ => continue,
        };
        routes.push((route, *vendor));
    }
    Ok(routes)
}

/// Whether the container requests (or limits) at least one unit of a counted GPU resource
/// of `vendor` in its `resources_key` (`resources`).
fn requests_vendor(
    ctx: &Ctx,
    c: &Map<String, Value>,
    path: &str,
    resources_key: &str,
    vendor: Vendor,
) -> Result<bool, CountError> {
    let Some(resources) = opt_object(c, resources_key, path)? else {
        return Ok(false);
    };
    let r_path = join(path, resources_key);
    for field in ["limits", "requests"] {
        let Some(map) = opt_object(resources, field, &r_path)? else {
            continue;
        };
        for (name, quantity) in map {
            if ctx.resources.share_of(name).is_some()
                && vendor.covers(name)
                && device_count(quantity, &keyed(&join(&r_path, field), name))? > 0.0
            {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn grants(object: &Value) -> Vec<DeviceGrant> {
        match count(object, "team-a", &GpuResources::default(), &()) {
            Ok(Counted::Claim(claim)) => claim.device_grants,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    fn pod(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": spec})
    }

    fn with_env(name: &str, value: &str) -> Value {
        pod(json!({"containers": [{"name": "main", "image": "cuda",
            "env": [{"name": name, "value": value}]}]}))
    }

    #[test]
    fn nvidia_visible_devices_all_without_a_gpu_request_reaches_the_gpus() {
        let found = grants(&with_env("NVIDIA_VISIBLE_DEVICES", "all"));
        assert_eq!(
            found,
            vec![DeviceGrant {
                container: "container \"main\"".into(),
                path: "spec.containers[0]".into(),
                route: Route::Variable {
                    name: "NVIDIA_VISIBLE_DEVICES".into(),
                    value: Some("all".into()),
                },
                vendor: Vendor::Nvidia,
            }]
        );
        assert_eq!(
            found[0].route.to_string(),
            "NVIDIA_VISIBLE_DEVICES=all",
            "as the denial prints it"
        );
        // Any list of devices is a grant too.
        assert_eq!(grants(&with_env("NVIDIA_VISIBLE_DEVICES", "0,1")).len(), 1);
        assert_eq!(grants(&with_env("AMD_VISIBLE_DEVICES", "all")).len(), 1);
    }

    #[test]
    fn void_none_and_empty_inject_nothing_and_filters_are_not_routes() {
        for value in ["", "void", "none"] {
            assert!(grants(&with_env("NVIDIA_VISIBLE_DEVICES", value)).is_empty());
        }
        for filter in [
            "CUDA_VISIBLE_DEVICES",
            "HIP_VISIBLE_DEVICES",
            "ROCR_VISIBLE_DEVICES",
            "ZE_AFFINITY_MASK",
        ] {
            assert!(grants(&with_env(filter, "0,1,2,3")).is_empty(), "{filter}");
        }
    }

    #[test]
    fn a_variable_set_through_value_from_is_taken_as_a_grant() {
        let p = pod(
            json!({"containers": [{"name": "main", "env": [{"name": "NVIDIA_VISIBLE_DEVICES",
            "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "which"}}}]}]}),
        );
        let found = grants(&p);
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].route.to_string(),
            "NVIDIA_VISIBLE_DEVICES (set through valueFrom)"
        );
    }

    #[test]
    fn a_container_that_requests_its_vendors_gpus_is_counted_not_reported() {
        let p = pod(json!({"containers": [{"name": "main",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}));
        assert!(grants(&p).is_empty());
        // A MIG slice is NVIDIA's too.
        let p = pod(json!({"containers": [{"name": "main",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}));
        assert!(grants(&p).is_empty());
        // Another vendor's GPUs, or zero of them, do not cover NVIDIA's.
        for limits in [json!({"amd.com/gpu": "1"}), json!({"nvidia.com/gpu": "0"})] {
            let p = pod(json!({"containers": [{"name": "main",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                "resources": {"limits": limits}}]}));
            assert_eq!(grants(&p).len(), 1, "{limits}");
        }
    }

    #[test]
    fn each_container_is_judged_on_its_own_requests() {
        // A sidecar that sets the variable next to a main container that asks for one GPU
        // sees them all, counted as one.
        let p = pod(json!({
            "initContainers": [{"name": "sidecar", "restartPolicy": "Always",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}],
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "ephemeralContainers": [{"name": "debugger",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}));
        let found = grants(&p);
        let containers: Vec<&str> = found.iter().map(|g| g.container.as_str()).collect();
        assert_eq!(
            containers,
            [
                "init container \"sidecar\"",
                "ephemeral container \"debugger\""
            ]
        );
    }

    #[test]
    fn device_host_paths_mounted_into_a_container_are_routes() {
        let p = pod(json!({
            "volumes": [{"name": "gpu0", "hostPath": {"path": "/dev/nvidia0"}},
                        {"name": "logs", "hostPath": {"path": "/var/log"}},
                        {"name": "unused", "hostPath": {"path": "/dev/kfd"}}],
            "containers": [{"name": "main", "volumeMounts": [
                {"name": "gpu0", "mountPath": "/dev/nvidia0"},
                {"name": "logs", "mountPath": "/logs"}]}]}));
        let found = grants(&p);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            found[0].route.to_string(),
            "hostPath volume \"gpu0\" (/dev/nvidia0)"
        );
        assert_eq!(found[0].vendor, Vendor::Nvidia);
    }

    #[test]
    fn the_device_paths_of_every_vendor_and_the_directories_holding_them_are_seen() {
        for (path, vendor) in [
            ("/dev/nvidia0", Some(Vendor::Nvidia)),
            ("/dev/nvidiactl", Some(Vendor::Nvidia)),
            ("/dev/nvidia-caps/nvidia-cap1", Some(Vendor::Nvidia)),
            ("/dev/kfd", Some(Vendor::Amd)),
            ("/dev/dri", Some(Vendor::Any)),
            ("/dev/dri/renderD128", Some(Vendor::Any)),
            ("/dev/accel/accel0", Some(Vendor::Any)),
            ("/dev/accel0", Some(Vendor::Any)),
            ("/dev/neuron0", Some(Vendor::AwsNeuron)),
            ("/dev", Some(Vendor::Any)),
            ("/dev/", Some(Vendor::Any)),
            ("//dev//nvidia0", Some(Vendor::Nvidia)),
            ("/dev/./dri/", Some(Vendor::Any)),
            ("/dev/char", Some(Vendor::Any)),
            ("/", Some(Vendor::Any)),
            ("/dev/null", None),
            ("/dev/shm", None),
            ("/dev/drip", None),
            ("/var/lib/nvidia", None),
        ] {
            assert_eq!(device_path_vendor(path), vendor, "{path}");
        }
    }

    #[test]
    fn a_mount_at_nvidias_device_list_directory_is_a_route() {
        let p = pod(json!({"volumes": [{"name": "e", "emptyDir": {}}],
            "containers": [{"name": "main", "volumeMounts": [
                {"name": "e", "mountPath": "/var/run/nvidia-container-devices/all"}]}]}));
        let found = grants(&p);
        assert_eq!(
            found[0].route.to_string(),
            "a volume mounted at /var/run/nvidia-container-devices/all"
        );
    }

    #[test]
    fn a_privileged_container_without_a_gpu_request_is_a_route() {
        let p = pod(json!({"containers": [{"name": "main",
            "securityContext": {"privileged": true}}]}));
        assert_eq!(grants(&p)[0].route, Route::Privileged);
        let p = pod(json!({"containers": [{"name": "main",
            "securityContext": {"privileged": true},
            "resources": {"limits": {"amd.com/gpu": "1"}}}]}));
        assert!(grants(&p).is_empty());
    }

    #[test]
    fn every_kinds_pod_templates_are_walked() {
        let env = json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]);
        let template = json!({"spec": {"containers": [{"name": "main", "env": env}]}});
        for (api_version, kind, spec) in [
            (
                "apps/v1",
                "Deployment",
                json!({"replicas": 12, "template": template}),
            ),
            ("apps/v1", "StatefulSet", json!({"template": template})),
            ("apps/v1", "DaemonSet", json!({"template": template})),
            ("apps/v1", "ReplicaSet", json!({"template": template})),
            ("batch/v1", "Job", json!({"template": template})),
            (
                "batch/v1",
                "CronJob",
                json!({"jobTemplate": {"spec": {"template": template}}}),
            ),
            (
                "kubeflow.org/v1",
                "PyTorchJob",
                json!({"pytorchReplicaSpecs": {"Worker": {"template": template}}}),
            ),
            (
                "ray.io/v1",
                "RayCluster",
                json!({"headGroupSpec": {"template": template}}),
            ),
            (
                "serving.kserve.io/v1beta1",
                "InferenceService",
                json!({"predictor": {"model": {"modelFormat": {"name": "x"}, "env": env}}}),
            ),
            (
                "trainer.kubeflow.org/v1alpha1",
                "TrainJob",
                json!({"trainer": {"env": env}}),
            ),
        ] {
            let object = json!({"apiVersion": api_version, "kind": kind,
                "metadata": {"name": "x"}, "spec": spec});
            assert_eq!(grants(&object).len(), 1, "{kind}");
        }
    }

    #[test]
    fn a_trainer_that_requests_gpus_per_node_is_counted() {
        let object = json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "x"}, "spec": {"trainer": {
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}}}}});
        assert!(grants(&object).is_empty());
    }
}
