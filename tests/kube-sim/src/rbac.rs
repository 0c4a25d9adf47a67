//! RBAC authorization for service-account callers, as kube-apiserver's RBAC authorizer
//! decides it.
//!
//! A request that carries `Authorization: Bearer system:serviceaccount:<ns>:<name>` is made
//! as that service account (kube-sim has no token review: the token *is* the user name),
//! and is checked against the Roles, ClusterRoles, RoleBindings and ClusterRoleBindings
//! stored in the server. Any other caller is the cluster admin, so existing tests and
//! kubectl keep working unchanged. Every service-account request is recorded
//! ([`Access`]) so a test can list what a component really called and what was refused.
//!
//! Covered: verbs from the HTTP method (get/list/watch/create/update/patch/delete/
//! deletecollection), `resource/subresource`, `*` wildcards, `resourceNames`, Role and
//! ClusterRole bindings, non-resource discovery paths (allowed to every service account,
//! like the `system:discovery` role). Not covered: aggregation rules, impersonation,
//! groups other than the service account's own.

use serde_json::Value;

use crate::store::State;

/// One request made by a service account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// `system:serviceaccount:<namespace>:<name>`.
    pub user: String,
    pub verb: String,
    pub group: String,
    /// `plural` or `plural/subresource`.
    pub resource: String,
    /// Empty for cluster-scoped requests and all-namespace lists.
    pub namespace: String,
    pub name: String,
    pub allowed: bool,
}

/// The service account a bearer token names, if it names one.
pub fn service_account(authorization: &str) -> Option<(String, String)> {
    let token = authorization.strip_prefix("Bearer ")?.trim();
    let rest = token.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty()).then(|| (ns.to_string(), name.to_string()))
}

/// The RBAC verb of a request.
pub fn verb(method: &str, has_name: bool, is_watch: bool) -> &'static str {
    match (method, has_name) {
        ("GET", _) if is_watch => "watch",
        ("GET", true) | ("HEAD", true) => "get",
        ("GET", false) | ("HEAD", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

/// Whether the service account `ns/name` may make the request described by `access`.
pub fn allowed(state: &State, ns: &str, name: &str, access: &Access) -> bool {
    let bound = |binding: &Value| {
        binding
            .get("subjects")
            .and_then(Value::as_array)
            .is_some_and(|subjects| {
                subjects.iter().any(|s| {
                    s.get("kind").and_then(Value::as_str) == Some("ServiceAccount")
                        && s.get("name").and_then(Value::as_str) == Some(name)
                        && s.get("namespace").and_then(Value::as_str) == Some(ns)
                })
            })
    };
    let role_rules = |binding: &Value, binding_ns: &str| -> Vec<Value> {
        let role_ref = binding.get("roleRef");
        let kind = role_ref.and_then(|r| r.get("kind")).and_then(Value::as_str);
        let role_name = role_ref
            .and_then(|r| r.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let role = match kind {
            Some("ClusterRole") => {
                state.get("rbac.authorization.k8s.io", "clusterroles", "", role_name)
            }
            Some("Role") => state.get("rbac.authorization.k8s.io", "roles", binding_ns, role_name),
            _ => None,
        };
        role.and_then(|r| r.get("rules"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mut rules: Vec<Value> = Vec::new();
    for (_, binding) in state.list(
        "rbac.authorization.k8s.io",
        "clusterrolebindings",
        None,
        None,
    ) {
        if bound(binding) {
            rules.extend(role_rules(binding, ""));
        }
    }
    if !access.namespace.is_empty() {
        for (_, binding) in state.list(
            "rbac.authorization.k8s.io",
            "rolebindings",
            Some(&access.namespace),
            None,
        ) {
            if bound(binding) {
                rules.extend(role_rules(binding, &access.namespace));
            }
        }
    }
    rules.iter().any(|rule| rule_allows(rule, access))
}

fn strings<'a>(rule: &'a Value, field: &str) -> Vec<&'a str> {
    rule.get(field)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn rule_allows(rule: &Value, access: &Access) -> bool {
    let verbs = strings(rule, "verbs");
    if !verbs.iter().any(|v| *v == "*" || *v == access.verb) {
        return false;
    }
    let groups = strings(rule, "apiGroups");
    if !groups.iter().any(|g| *g == "*" || *g == access.group) {
        return false;
    }
    let resources = strings(rule, "resources");
    let (plural, sub) = match access.resource.split_once('/') {
        Some((p, s)) => (p, Some(s)),
        None => (access.resource.as_str(), None),
    };
    let resource_ok = resources.iter().any(|r| {
        *r == "*"
            || *r == access.resource
            || sub.is_some_and(|s| r.strip_prefix("*/") == Some(s))
            || (sub.is_none() && *r == plural)
    });
    if !resource_ok {
        return false;
    }
    let names = strings(rule, "resourceNames");
    names.is_empty() || (!access.name.is_empty() && names.contains(&access.name.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn access(verb: &str, group: &str, resource: &str, name: &str) -> Access {
        Access {
            user: "system:serviceaccount:ns:sa".into(),
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            namespace: "ns".into(),
            name: name.into(),
            allowed: false,
        }
    }

    #[test]
    fn rules_match_like_the_rbac_authorizer() {
        let rule = json!({"apiGroups": ["apps"], "resources": ["deployments", "deployments/scale"], "verbs": ["get", "patch"]});
        assert!(rule_allows(
            &rule,
            &access("patch", "apps", "deployments/scale", "d")
        ));
        assert!(rule_allows(
            &rule,
            &access("get", "apps", "deployments", "d")
        ));
        assert!(!rule_allows(
            &rule,
            &access("list", "apps", "deployments", "")
        ));
        assert!(!rule_allows(
            &rule,
            &access("patch", "apps", "deployments/status", "d")
        ));
        assert!(!rule_allows(&rule, &access("get", "", "deployments", "d")));
        let star = json!({"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["*"]});
        assert!(rule_allows(
            &star,
            &access("update", "x.io", "things/scale", "t")
        ));
        assert!(!rule_allows(
            &star,
            &access("update", "x.io", "things", "t")
        ));
        let named = json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["l"], "verbs": ["get", "update"]});
        assert!(rule_allows(
            &named,
            &access("get", "coordination.k8s.io", "leases", "l")
        ));
        assert!(!rule_allows(
            &named,
            &access("get", "coordination.k8s.io", "leases", "m")
        ));
    }

    #[test]
    fn only_service_account_tokens_name_a_user() {
        assert_eq!(
            service_account("Bearer system:serviceaccount:gr:ctl"),
            Some(("gr".into(), "ctl".into()))
        );
        assert_eq!(service_account("Bearer abc"), None);
        assert_eq!(service_account(""), None);
        assert_eq!(verb("GET", false, true), "watch");
        assert_eq!(verb("DELETE", false, false), "deletecollection");
    }
}
