//! Label selectors (`matchLabels` and `matchExpressions`), evaluated purely.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `labels` satisfy `selector`. An empty selector matches everything. Unknown
/// operators match nothing, so a typo never widens a policy.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    matches_with(selector, labels, |k| k.to_string())
}

/// As [`matches`], with selector keys mapped by `key` first — e.g. to the sanitised names
/// kube-state-metrics gives labels.
pub fn matches_with(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
    key: impl Fn(&str) -> String,
) -> bool {
    let equal = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(&key(k)).is_some_and(|have| have == v));
    let expressions = selector.match_expressions.iter().flatten().all(|e| {
        let have = labels.get(&key(&e.key));
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => have.is_some_and(|h| values.contains(h)),
            "NotIn" => have.is_none_or(|h| !values.contains(h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    });
    equal && expressions
}

/// A JSON object of strings (an object's `metadata.labels` or `metadata.annotations`) as
/// a map; entries whose value is not a string are skipped, a missing object is empty.
pub fn string_map(value: &serde_json::Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn match_labels_and_expressions_must_all_hold() {
        let sel = LabelSelector {
            match_labels: Some([("tier".to_string(), "research".to_string())].into()),
            match_expressions: Some(vec![
                expr("team", "In", &["a", "b"]),
                expr("legacy", "DoesNotExist", &[]),
            ]),
        };
        assert!(matches(
            &sel,
            &labels(&[("tier", "research"), ("team", "a")])
        ));
        assert!(!matches(
            &sel,
            &labels(&[("tier", "research"), ("team", "c")])
        ));
        assert!(!matches(
            &sel,
            &labels(&[("tier", "research"), ("team", "a"), ("legacy", "1")])
        ));
        assert!(matches(&LabelSelector::default(), &labels(&[])));
    }

    #[test]
    fn an_unknown_operator_matches_nothing() {
        let sel = LabelSelector {
            match_expressions: Some(vec![expr("a", "Like", &["x"])]),
            ..Default::default()
        };
        assert!(!matches(&sel, &labels(&[("a", "x")])));
    }
}
