//! The resource-type registry and the discovery documents built from it.
//!
//! Built-in types are a fixed table (the ones gpu-reaper touches); custom types are
//! derived from stored `CustomResourceDefinition` objects whenever one changes, so a
//! CRD's group, versions, scope, names and subresources come from the CRD itself.
//! Pure data: no IO, no locking (the store owns the registry).

use serde_json::{Value, json};

/// Paths of a scale subresource, in the CRD's `.spec.replicas` JSON-path form.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

/// One `additionalPrinterColumns` entry of a CRD.
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub kind: String,
    pub json_path: String,
    /// Columns above 0 are shown by `kubectl get -o wide` only.
    pub priority: i64,
}

/// One served resource type (all of its versions).
#[derive(Debug, Clone)]
pub struct ResourceType {
    /// API group, `""` for the core group.
    pub group: String,
    /// Served versions; the first is the preferred and storage version.
    pub versions: Vec<String>,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub status: bool,
    pub scale: Option<ScalePaths>,
    /// Extra `kubectl get` columns (CRDs only).
    pub printer_columns: Vec<PrinterColumn>,
    /// Name of the CRD that defines the type; `None` for built-ins.
    pub crd: Option<String>,
}

impl ResourceType {
    pub fn storage_version(&self) -> &str {
        &self.versions[0]
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    pub fn is(&self, group: &str, plural: &str) -> bool {
        self.group == group && self.plural == plural
    }
}

// One row of the built-in table: positional arguments keep the table readable.
#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short_names: &[&str],
    status: bool,
    scale: bool,
) -> ResourceType {
    ResourceType {
        group: group.into(),
        versions: vec![version.into()],
        plural: plural.into(),
        singular: kind.to_lowercase(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        namespaced,
        short_names: short_names.iter().map(|s| s.to_string()).collect(),
        categories: if matches!(
            plural,
            "pods"
                | "services"
                | "deployments"
                | "statefulsets"
                | "replicasets"
                | "daemonsets"
                | "jobs"
                | "cronjobs"
        ) {
            vec!["all".into()]
        } else {
            vec![]
        },
        status,
        scale: scale.then(|| ScalePaths {
            spec_replicas: ".spec.replicas".into(),
            status_replicas: ".status.replicas".into(),
            label_selector: None,
        }),
        printer_columns: Vec::new(),
        crd: None,
    }
}

/// The built-in types served from start-up.
pub fn builtins() -> Vec<ResourceType> {
    vec![
        builtin("", "v1", "pods", "Pod", true, &["po"], true, false),
        builtin(
            "",
            "v1",
            "namespaces",
            "Namespace",
            false,
            &["ns"],
            true,
            false,
        ),
        builtin("", "v1", "nodes", "Node", false, &["no"], true, false),
        builtin("", "v1", "events", "Event", true, &["ev"], false, false),
        builtin("", "v1", "services", "Service", true, &["svc"], true, false),
        builtin(
            "",
            "v1",
            "resourcequotas",
            "ResourceQuota",
            true,
            &["quota"],
            true,
            false,
        ),
        builtin("", "v1", "secrets", "Secret", true, &[], false, false),
        builtin(
            "",
            "v1",
            "configmaps",
            "ConfigMap",
            true,
            &["cm"],
            false,
            false,
        ),
        builtin(
            "",
            "v1",
            "serviceaccounts",
            "ServiceAccount",
            true,
            &["sa"],
            false,
            false,
        ),
        builtin(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            true,
            &["deploy"],
            true,
            true,
        ),
        builtin(
            "apps",
            "v1",
            "statefulsets",
            "StatefulSet",
            true,
            &["sts"],
            true,
            true,
        ),
        builtin(
            "apps",
            "v1",
            "replicasets",
            "ReplicaSet",
            true,
            &["rs"],
            true,
            true,
        ),
        builtin(
            "apps",
            "v1",
            "daemonsets",
            "DaemonSet",
            true,
            &["ds"],
            true,
            false,
        ),
        builtin("batch", "v1", "jobs", "Job", true, &[], true, false),
        builtin(
            "batch",
            "v1",
            "cronjobs",
            "CronJob",
            true,
            &["cj"],
            true,
            false,
        ),
        builtin(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
            &["pdb"],
            true,
            false,
        ),
        builtin(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
            &[],
            false,
            false,
        ),
        builtin(
            "events.k8s.io",
            "v1",
            "events",
            "Event",
            true,
            &["ev"],
            false,
            false,
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
            false,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "roles",
            "Role",
            true,
            &[],
            false,
            false,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
            &[],
            false,
            false,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "ClusterRole",
            false,
            &[],
            false,
            false,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            &[],
            false,
            false,
        ),
        builtin(
            "networking.k8s.io",
            "v1",
            "networkpolicies",
            "NetworkPolicy",
            true,
            &["netpol"],
            false,
            false,
        ),
        builtin(
            "scheduling.k8s.io",
            "v1",
            "priorityclasses",
            "PriorityClass",
            false,
            &["pc"],
            false,
            false,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            false,
            &[],
            false,
            false,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            false,
            &[],
            false,
            false,
        ),
        builtin(
            "resource.k8s.io",
            "v1",
            "resourceclaims",
            "ResourceClaim",
            true,
            &[],
            true,
            false,
        ),
        builtin(
            "resource.k8s.io",
            "v1",
            "resourceclaimtemplates",
            "ResourceClaimTemplate",
            true,
            &[],
            false,
            false,
        ),
        builtin(
            "resource.k8s.io",
            "v1",
            "deviceclasses",
            "DeviceClass",
            false,
            &[],
            false,
            false,
        ),
        builtin(
            "resource.k8s.io",
            "v1",
            "resourceslices",
            "ResourceSlice",
            false,
            &[],
            false,
            false,
        ),
    ]
}

/// Reads the served types out of a CustomResourceDefinition object.
/// Returns `None` when the CRD lacks the fields a type needs (it is then not served).
pub fn from_crd(crd: &Value) -> Option<ResourceType> {
    let spec = crd.get("spec")?;
    let names = spec.get("names")?;
    let served: Vec<&Value> = spec
        .get("versions")?
        .as_array()?
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(true))
        .collect();
    // The storage version first: objects are kept in it.
    let mut versions: Vec<String> = Vec::new();
    for v in &served {
        let name = v.get("name")?.as_str()?.to_string();
        if v.get("storage").and_then(Value::as_bool).unwrap_or(false) {
            versions.insert(0, name);
        } else {
            versions.push(name);
        }
    }
    if versions.is_empty() {
        return None;
    }
    let storage = served
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(versions[0].as_str()))?;
    let subresources = storage.get("subresources");
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let kind = names.get("kind")?.as_str()?.to_string();
    Some(ResourceType {
        group: spec.get("group")?.as_str()?.to_string(),
        versions,
        plural: names.get("plural")?.as_str()?.to_string(),
        singular: names
            .get("singular")
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or_else(|| kind.to_lowercase()),
        list_kind: names
            .get("listKind")
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or_else(|| format!("{kind}List")),
        kind,
        namespaced: spec.get("scope").and_then(Value::as_str) != Some("Cluster"),
        short_names: strings(names.get("shortNames")),
        categories: strings(names.get("categories")),
        status: subresources.and_then(|s| s.get("status")).is_some(),
        scale: subresources
            .and_then(|s| s.get("scale"))
            .map(|scale| ScalePaths {
                spec_replicas: scale
                    .get("specReplicasPath")
                    .and_then(Value::as_str)
                    .unwrap_or(".spec.replicas")
                    .into(),
                status_replicas: scale
                    .get("statusReplicasPath")
                    .and_then(Value::as_str)
                    .unwrap_or(".status.replicas")
                    .into(),
                label_selector: scale
                    .get("labelSelectorPath")
                    .and_then(Value::as_str)
                    .map(String::from),
            }),
        printer_columns: storage
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|columns| {
                columns
                    .iter()
                    .filter_map(|c| {
                        Some(PrinterColumn {
                            name: c.get("name")?.as_str()?.to_string(),
                            kind: c
                                .get("type")
                                .and_then(Value::as_str)
                                .unwrap_or("string")
                                .to_string(),
                            json_path: c.get("jsonPath")?.as_str()?.to_string(),
                            priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default(),
        crd: crd
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .map(String::from),
    })
}

/// The status a CRD gets once its names are accepted: `Established` and `NamesAccepted`.
pub fn crd_status(crd: &Value, now: &str) -> Value {
    let condition = |kind: &str, reason: &str, message: &str| json!({"type": kind, "status": "True", "lastTransitionTime": now, "reason": reason, "message": message});
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage").and_then(Value::as_bool).unwrap_or(false))
                .filter_map(|v| v.get("name").cloned())
                .collect()
        })
        .unwrap_or_default();
    json!({
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or(json!({})),
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "storedVersions": stored,
    })
}

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/api` (core group versions).
pub fn core_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    })
}

/// `/apis` (every non-core group with its versions).
pub fn group_list(types: &[ResourceType]) -> Value {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for t in types.iter().filter(|t| !t.group.is_empty()) {
        let entry = match groups.iter_mut().find(|(g, _)| *g == t.group) {
            Some(entry) => entry,
            None => {
                groups.push((t.group.clone(), Vec::new()));
                groups.last_mut().expect("just pushed")
            }
        };
        for v in &t.versions {
            if !entry.1.contains(v) {
                entry.1.push(v.clone());
            }
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(name, versions)| {
            let gv = |v: &String| json!({"groupVersion": format!("{name}/{v}"), "version": v});
            json!({
                "name": name,
                "versions": versions.iter().map(gv).collect::<Vec<_>>(),
                "preferredVersion": gv(&versions[0]),
            })
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>` (one group), or `None` when nothing is served in it.
pub fn group(types: &[ResourceType], group: &str) -> Option<Value> {
    group_list(types)["groups"]
        .as_array()?
        .iter()
        .find(|g| g["name"] == group)
        .map(|g| {
            let mut g = g.clone();
            g["kind"] = json!("APIGroup");
            g["apiVersion"] = json!("v1");
            g
        })
}

/// `/api/v1` or `/apis/<group>/<version>`, or `None` when the group version is not served.
pub fn resource_list(types: &[ResourceType], group: &str, version: &str) -> Option<Value> {
    let served: Vec<&ResourceType> = types
        .iter()
        .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
        .collect();
    if served.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for t in served {
        let mut main = json!({
            "name": t.plural,
            "singularName": t.singular,
            "namespaced": t.namespaced,
            "kind": t.kind,
            "verbs": VERBS,
        });
        if !t.short_names.is_empty() {
            main["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            main["categories"] = json!(t.categories);
        }
        resources.push(main);
        if t.status {
            resources.push(json!({
                "name": format!("{}/status", t.plural), "singularName": "",
                "namespaced": t.namespaced, "kind": t.kind, "verbs": ["get", "patch", "update"],
            }));
        }
        if t.scale.is_some() {
            resources.push(json!({
                "name": format!("{}/scale", t.plural), "singularName": "",
                "namespaced": t.namespaced, "group": "autoscaling", "version": "v1",
                "kind": "Scale", "verbs": ["get", "patch", "update"],
            }));
        }
        if t.is("", "pods") {
            resources.push(json!({
                "name": "pods/eviction", "singularName": "", "namespaced": true,
                "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: one entry per served group version. The documents behind them are
/// stubs (see [`openapi_group_version`]); no schemas are published.
pub fn openapi_root(types: &[ResourceType]) -> Value {
    let mut paths = serde_json::Map::new();
    for t in types {
        for v in &t.versions {
            let path = gv_path(&t.group, v);
            paths.insert(
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}")}),
            );
        }
    }
    json!({"paths": paths})
}

/// `/openapi/v3/<api|apis/group>/<version>`: a stub with one PATCH operation per kind,
/// tagged with its GroupVersionKind and the `fieldValidation` parameter. That is what
/// kubectl looks for to choose server-side field validation instead of downloading
/// schemas; there are no schemas, so kubectl does no client-side validation.
pub fn openapi_group_version(types: &[ResourceType], group: &str, version: &str) -> Option<Value> {
    let served: Vec<&ResourceType> = types
        .iter()
        .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
        .collect();
    if served.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for t in served {
        let scope = if t.namespaced {
            "namespaces/{namespace}/"
        } else {
            ""
        };
        let path = format!("/{}/{scope}{}/{{name}}", gv_path(group, version), t.plural);
        let operation = json!({
            "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": t.kind},
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            ],
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(path, json!({"patch": operation}));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (kube-sim)", "version": "v1.34.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
