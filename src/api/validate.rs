//! Client-side validation of GpuPolicy and ReadinessAttestation documents, for the CLI
//! (`backtest --policy`, `check`) and for tests: the same CEL rules the API server
//! enforces from the CRD, plus unknown-field detection, each error naming the field.

use std::fmt;

use kube::CustomResourceExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// One problem in a document, with the field it is about.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldProblem {
    /// Dotted path, e.g. `spec.action.after`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// A document that is not a valid resource of the expected kind.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidResource {
    /// Where the document came from (a file path or `<embedded>`).
    pub source: String,
    /// Expected kind.
    pub kind: String,
    /// Every problem found.
    pub problems: Vec<FieldProblem>,
}

impl fmt::Display for InvalidResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: not a valid {}:", self.source, self.kind)?;
        for p in &self.problems {
            write!(f, "\n  - {}: {}", p.field, p.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for InvalidResource {}

/// Parses and validates one YAML (or JSON) document as custom resource `K`: YAML syntax,
/// `apiVersion`/`kind`, field types, unknown fields, then the CRD's CEL rules with the
/// schema defaults applied.
pub fn parse_resource<K>(text: &str, source: &str) -> Result<K, InvalidResource>
where
    K: CustomResourceExt + Serialize + DeserializeOwned,
{
    let crd = K::crd();
    let kind = crd.spec.names.kind.clone();
    let fail = |problems: Vec<FieldProblem>| InvalidResource {
        source: source.to_string(),
        kind: kind.clone(),
        problems,
    };
    let one = |field: &str, message: String| {
        vec![FieldProblem {
            field: field.into(),
            message,
        }]
    };

    // The YAML parser rejects these without saying where: say where.
    if let Some(problem) = unprintable(text) {
        return Err(fail(one(
            "(document)",
            format!("not valid YAML: {problem}"),
        )));
    }
    let raw: Value = serde_yaml::from_str(text).map_err(|e| {
        // Some errors say no position (a mapping used as a key): say what to look for.
        let hint = if !e.to_string().contains(" line ") {
            " somewhere in the document: every key must be a plain string, e.g. `window: 30m`"
        } else {
            ""
        };
        fail(one("(document)", format!("not valid YAML: {e}{hint}")))
    })?;
    if !raw.is_object() {
        return Err(fail(one(
            "(document)",
            "expected a YAML mapping with apiVersion, kind, metadata and spec".into(),
        )));
    }
    let want_api = format!("{}/{}", crd.spec.group, crd.spec.versions[0].name);
    let mut problems = Vec::new();
    match raw.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v == want_api => {}
        other => problems.push(FieldProblem {
            field: "apiVersion".into(),
            message: format!("is {}, must be {want_api}", describe(other)),
        }),
    }
    match raw.get("kind").and_then(Value::as_str) {
        Some(k) if k == kind => {}
        other => problems.push(FieldProblem {
            field: "kind".into(),
            message: format!("is {}, must be {kind}", describe(other)),
        }),
    }
    if !problems.is_empty() {
        return Err(fail(problems));
    }

    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| fail(one("(schema)", e.to_string())))?
        .unwrap_or(Value::Null);
    unknown_fields(&raw, &schema, "", &mut problems);
    if !problems.is_empty() {
        return Err(fail(problems));
    }
    oversized_durations(&raw, "", &mut problems);
    if !problems.is_empty() {
        return Err(fail(problems));
    }
    let typed: K =
        serde_yaml::from_str(text).map_err(|e| fail(vec![serde_problem(&e.to_string())]))?;
    let normalised =
        serde_json::to_value(&typed).map_err(|e| fail(one("(document)", e.to_string())))?;
    if let Err(errors) = kube::core::cel::Validator::new().validate(&schema, &normalised, None) {
        for e in errors.as_slice() {
            let field = if e.field_path.is_empty() {
                "(object)".to_string()
            } else {
                e.field_path.trim_start_matches('.').to_string()
            };
            problems.push(FieldProblem {
                field,
                message: e.message.clone(),
            });
        }
        return Err(fail(problems));
    }
    Ok(typed)
}

/// The first character YAML does not allow (outside its printable set), with its line
/// and column, 1-based.
fn unprintable(text: &str) -> Option<String> {
    let allowed = |c: char| {
        matches!(c, '\t' | '\n' | '\r' | '\u{85}')
            || (' '..='~').contains(&c)
            || ('\u{a0}'..='\u{fffd}').contains(&c)
            || c >= '\u{10000}'
    };
    text.lines().enumerate().find_map(|(i, line)| {
        let (column, c) = line.chars().enumerate().find(|(_, c)| !allowed(*c))?;
        Some(format!(
            "control character U+{:04X} at line {} column {}: YAML does not allow it",
            u32::from(c),
            i + 1,
            column + 1
        ))
    })
}

/// Go durations too long for `std::time::Duration` (`9223372036854775807h`): kube-core's
/// parser panics on them instead of failing, so they are found and named first. Only
/// strings in full duration syntax are looked at.
pub(crate) fn oversized_durations(raw: &Value, path: &str, out: &mut Vec<FieldProblem>) {
    match raw {
        Value::Object(fields) => {
            for (key, value) in fields {
                let field = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                oversized_durations(value, &field, out);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                oversized_durations(item, &format!("{path}[{i}]"), out);
            }
        }
        Value::String(s) if duration_seconds(s).is_some_and(|secs| secs >= 1.8e19) => {
            out.push(FieldProblem {
                field: path.to_string(),
                message: format!("duration {s:?} is too long; use e.g. 30m, 2h or 720h"),
            });
        }
        _ => {}
    }
}

/// Seconds in a Go duration (`1h30m`, `-1.5h`), or None when `s` is not one.
fn duration_seconds(s: &str) -> Option<f64> {
    let mut rest = s.strip_prefix(['-', '+']).unwrap_or(s);
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += value * unit;
    }
    Some(total)
}

fn describe(v: Option<&str>) -> String {
    v.map_or_else(|| "missing".to_string(), |s| format!("{s:?}"))
}

/// serde_yaml reports `spec.idle.threshold: invalid type: … at line 7 column 16`.
fn serde_problem(msg: &str) -> FieldProblem {
    match msg.split_once(": ") {
        Some((path, rest)) if !path.contains(' ') => FieldProblem {
            field: path.to_string(),
            message: rest.to_string(),
        },
        // At the top level serde names no path: `missing field `spec``.
        _ => FieldProblem {
            field: top_level_field(msg).unwrap_or("(document)").to_string(),
            message: msg.to_string(),
        },
    }
}

/// `spec` in "missing field `spec`" or "duplicate field `spec`".
fn top_level_field(msg: &str) -> Option<&str> {
    let rest = msg
        .strip_prefix("missing field `")
        .or_else(|| msg.strip_prefix("duplicate field `"))?;
    rest.split_once('`').map(|(field, _)| field)
}

/// Keys in `raw` that the CRD schema does not define are fields gpu-reaper does not know
/// (typos such as `treshold`): the API server would silently prune them, so say so here.
/// Also values outside a schema `enum` (`action: {type: Hibernate}`).
fn unknown_fields(raw: &Value, schema: &Value, path: &str, out: &mut Vec<FieldProblem>) {
    match raw {
        Value::Object(fields) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (key, value) in fields {
                    let field = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    if path.is_empty() && matches!(key.as_str(), "apiVersion" | "kind" | "metadata")
                    {
                        continue;
                    }
                    match props.get(key) {
                        Some(sub) => unknown_fields(value, sub, &field, out),
                        None => {
                            let mut names: Vec<&str> = props.keys().map(String::as_str).collect();
                            names.sort_unstable();
                            out.push(FieldProblem {
                                field,
                                message: format!(
                                    "unknown field; known fields here: {}",
                                    names.join(", ")
                                ),
                            });
                        }
                    }
                }
            } else if let Some(values) =
                schema.get("additionalProperties").filter(|v| v.is_object())
            {
                for (key, value) in fields {
                    unknown_fields(value, values, &format!("{path}.{key}"), out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    unknown_fields(item, item_schema, &format!("{path}[{i}]"), out);
                }
            }
        }
        // The Rust enums read a value they do not know as `Unknown` (so one policy from a
        // newer CRD is not fatal to the controller); a file must still name a known one.
        Value::String(value) => {
            if let Some(known) = schema.get("enum").and_then(Value::as_array) {
                let known: Vec<&str> = known.iter().filter_map(Value::as_str).collect();
                if !known.contains(&value.as_str()) {
                    out.push(FieldProblem {
                        field: path.to_string(),
                        message: super::unknown::unknown_value_message(value, &known),
                    });
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::GpuPolicy;

    const GOOD: &str = r#"
apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata: {name: research}
spec:
  mode: Enforce
  idle: {threshold: 0.05, window: 30m}
  warn: {after: 30m}
  action: {type: ScaleToZero, after: 1h}
  cost: {byModel: {"NVIDIA H100 80GB HBM3": 4.0}}
  match: {kinds: [], namespaceSelector: {matchLabels: {gpu-tier: research}}}
"#;

    fn problems(text: &str) -> Vec<FieldProblem> {
        parse_resource::<GpuPolicy>(text, "p.yaml")
            .unwrap_err()
            .problems
    }

    #[test]
    fn a_valid_policy_parses_with_defaults_filled_in() {
        let p = parse_resource::<GpuPolicy>(GOOD, "p.yaml").unwrap();
        assert_eq!(p.spec.action.max_per_hour, 20);
        assert_eq!(p.spec.idle.min_coverage, 0.8);
    }

    #[test]
    fn acting_before_warning_is_rejected_naming_action_after() {
        let p = problems(&GOOD.replace("after: 1h", "after: 10m"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].field, "spec.action.after");
        assert!(
            p[0].message.contains("at least spec.warn.after"),
            "{}",
            p[0].message
        );
    }

    #[test]
    fn a_threshold_above_one_is_rejected_naming_the_field() {
        let p = problems(&GOOD.replace("threshold: 0.05", "threshold: 5"));
        assert!(p.iter().any(|p| p.field == "spec.idle.threshold"), "{p:?}");
    }

    #[test]
    fn a_value_this_gpu_reaper_does_not_know_is_refused_naming_the_field_and_the_known_ones() {
        let p = problems(&GOOD.replace("type: ScaleToZero", "type: Hibernate"));
        assert_eq!(
            p,
            [FieldProblem {
                field: "spec.action.type".into(),
                message: "unknown value \"Hibernate\" (this gpu-reaper knows ScaleToZero, Suspend, Evict, None): upgrade gpu-reaper or change the value".into(),
            }]
        );
        let p = problems(&GOOD.replace(
            "warn: {after: 30m}",
            "warn: {after: 30m, channels: [Event, Teams]}",
        ));
        assert_eq!(p[0].field, "spec.warn.channels[1]", "{p:?}");
    }

    #[test]
    fn a_misspelt_field_is_reported_with_the_known_names() {
        let p = problems(&GOOD.replace("threshold: 0.05", "treshold: 0.05"));
        assert_eq!(p[0].field, "spec.idle.treshold");
        assert!(p[0].message.contains("threshold"));
    }

    #[test]
    fn an_unparsable_duration_is_rejected_naming_the_field() {
        let p = problems(&GOOD.replace("window: 30m", "window: 30 minutes"));
        assert!(p[0].field.starts_with("spec.idle.window"), "{p:?}");
    }

    #[test]
    fn wrong_kind_and_api_version_are_both_reported() {
        let p = problems(
            &GOOD
                .replace("kind: GpuPolicy", "kind: Policy")
                .replace("v1alpha1", "v1"),
        );
        let fields: Vec<_> = p.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["apiVersion", "kind"]);
    }

    #[test]
    fn a_control_character_is_reported_with_its_line_and_column() {
        let p = problems(&GOOD.replace("mode: Enforce", "mode: Enf\u{1}orce"));
        assert_eq!(p[0].field, "(document)");
        assert!(
            p[0].message.contains("U+0001 at line 6 column 12"),
            "{}",
            p[0].message
        );
    }

    #[test]
    fn a_missing_or_repeated_top_level_field_is_named() {
        let p = problems(&GOOD.replace("metadata: {name: research}\n", ""));
        assert_eq!(p[0].field, "metadata", "{p:?}");
        let p = problems(&GOOD.replace("spec:\n", "metadata: {name: x}\nspec:\n"));
        assert_eq!(p[0].field, "metadata", "{p:?}");
    }

    /// Found by tests/pure/fuzz_inputs.rs (2026-11-29): kube-core's duration parser panicked.
    #[test]
    fn a_duration_too_long_for_any_clock_is_rejected_naming_the_field() {
        let p = problems(&GOOD.replace("window: 30m", "window: 9223372036854775807h"));
        assert_eq!(p[0].field, "spec.idle.window", "{p:?}");
        assert!(p[0].message.contains("too long"), "{p:?}");
        assert!(
            parse_resource::<GpuPolicy>(&GOOD.replace("window: 30m}", "window: 1h30m}"), "p")
                .is_ok()
        );
    }

    #[test]
    fn a_mapping_used_as_a_key_is_an_error_that_says_what_to_look_for() {
        let p = problems("{a: 1}: 2\n");
        assert_eq!(p[0].field, "(document)");
        assert!(
            p[0].message.contains("every key must be a plain string"),
            "{p:?}"
        );
    }

    #[test]
    fn yaml_that_is_not_a_mapping_gets_a_clear_error() {
        let p = problems("- a\n- b\n");
        assert!(p[0].message.contains("mapping"));
        let p = problems("spec: [unclosed");
        assert!(p[0].message.contains("not valid YAML"));
    }
}
