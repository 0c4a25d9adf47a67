//! The shipped alerts and dashboard against the code that feeds them.
//!
//! `helm/gpu-reaper/files/alerts.yaml` is checked and unit-tested with the real promtool
//! (Debian package `prometheus`). Every query in it and in
//! `helm/gpu-reaper/files/dashboard.json` may only name metrics, labels and label values
//! that docs/metrics.md documents and src/ registers, and every runbook link must land on
//! a runbook section of docs/observability.md.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};

const ALERTS: &str = "helm/gpu-reaper/files/alerts.yaml";
const ALERT_TESTS: &str = "tests/alerts/alerts_test.yaml";
const DASHBOARD: &str = "helm/gpu-reaper/files/dashboard.json";
const OBSERVABILITY_MD: &str = "docs/observability.md";
const RUNBOOK_PREFIX: &str =
    "https://github.com/gpu-reaper/gpu-reaper/blob/main/docs/observability.md#";

/// Labels Prometheus itself puts on scraped series (target labels of a ServiceMonitor or
/// of the usual kubernetes_sd relabelling), which queries may group and filter by.
const TARGET_LABELS: &[&str] = &[
    "namespace",
    "pod",
    "instance",
    "job",
    "service",
    "container",
    "endpoint",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn promtool(args: &[&str]) -> Output {
    Command::new("promtool")
        .args(args)
        .current_dir(root())
        .output()
        .expect("promtool is needed: apt-get install -y prometheus (bash .ci/run does it)")
}

fn assert_success(what: &str, output: &Output) {
    assert!(
        output.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

// ---- The alert rules -------------------------------------------------------------

struct Alert {
    name: String,
    expr: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn strings(value: &serde_yaml::Value) -> BTreeMap<String, String> {
    value
        .as_mapping()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn alerts() -> Vec<Alert> {
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&read(ALERTS)).unwrap_or_else(|e| panic!("{ALERTS}: {e}"));
    let mut alerts = Vec::new();
    for group in doc["groups"].as_sequence().expect("groups: a list") {
        for rule in group["rules"].as_sequence().expect("rules: a list") {
            let Some(name) = rule["alert"].as_str() else {
                continue;
            };
            alerts.push(Alert {
                name: name.to_string(),
                expr: rule["expr"].as_str().expect("expr: a string").to_string(),
                labels: strings(&rule["labels"]),
                annotations: strings(&rule["annotations"]),
            });
        }
    }
    assert!(
        alerts.len() >= 10,
        "only {} alerts in {ALERTS}",
        alerts.len()
    );
    alerts
}

#[test]
fn promtool_accepts_the_alert_rules() {
    let output = promtool(&["check", "rules", ALERTS]);
    assert_success("promtool check rules", &output);
    // promtool read the very rules this file checks, all of them.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let expected = format!("SUCCESS: {} rules found", alerts().len());
    assert!(stdout.contains(&expected), "{stdout}");
}

#[test]
fn promtool_unit_tests_of_the_alerts_pass() {
    let output = promtool(&["test", "rules", ALERT_TESTS]);
    assert_success("promtool test rules", &output);
}

#[test]
fn every_alert_is_tested_both_firing_and_silent() {
    let doc: serde_yaml::Value = serde_yaml::from_str(&read(ALERT_TESTS)).unwrap();
    let rule_files: Vec<&str> = doc["rule_files"]
        .as_sequence()
        .expect("rule_files")
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    assert_eq!(rule_files, ["../../helm/gpu-reaper/files/alerts.yaml"]);
    let mut firing = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for group in doc["tests"].as_sequence().expect("tests: a list") {
        for case in group["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_string();
            let expected = case["exp_alerts"].as_sequence().map_or(0, Vec::len);
            if expected == 0 {
                silent.insert(name);
            } else {
                firing.insert(name);
            }
        }
    }
    for alert in alerts() {
        assert!(
            firing.contains(&alert.name),
            "{ALERT_TESTS} never shows {} firing",
            alert.name
        );
        assert!(
            silent.contains(&alert.name),
            "{ALERT_TESTS} never shows {} silent",
            alert.name
        );
    }
}

#[test]
fn every_alert_has_a_severity_a_summary_a_description_and_a_runbook() {
    let mut names = BTreeSet::new();
    for alert in alerts() {
        assert!(names.insert(alert.name.clone()), "{} twice", alert.name);
        let severity = alert.labels.get("severity").map(String::as_str);
        assert!(
            matches!(severity, Some("critical" | "warning" | "info")),
            "{}: severity {severity:?}",
            alert.name
        );
        for key in ["summary", "description", "runbook_url"] {
            let value = alert.annotations.get(key).map(|v| v.trim());
            assert!(
                value.is_some_and(|v| !v.is_empty()),
                "{}: no {key} annotation",
                alert.name
            );
        }
        assert!(
            alert.annotations["runbook_url"].starts_with(RUNBOOK_PREFIX),
            "{}: runbook_url {} is not a section of docs/observability.md",
            alert.name,
            alert.annotations["runbook_url"]
        );
    }
}

// ---- docs/observability.md ----------------------------------------------------------

/// GitHub's heading anchors: lower case, punctuation dropped, spaces become hyphens.
fn github_anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Each heading's anchor and the text under it up to the next heading (code fences skipped).
fn sections(markdown: &str) -> BTreeMap<String, String> {
    let mut sections = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut in_fence = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        }
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !in_fence && hashes > 0 && line[hashes..].starts_with(' ') {
            let anchor = github_anchor(line[hashes..].trim());
            sections.insert(anchor.clone(), String::new());
            current = Some(anchor);
        } else if let Some(anchor) = &current {
            let body = sections.get_mut(anchor).unwrap();
            body.push_str(line);
            body.push('\n');
        }
    }
    sections
}

#[test]
fn every_runbook_url_lands_on_a_runbook_section_of_observability_md() {
    let sections = sections(&read(OBSERVABILITY_MD));
    for alert in alerts() {
        let url = &alert.annotations["runbook_url"];
        let anchor = url.rsplit_once('#').map(|(_, a)| a).unwrap_or_default();
        let body = sections.get(anchor).unwrap_or_else(|| {
            panic!(
                "{}: {url} names no heading of {OBSERVABILITY_MD}",
                alert.name
            )
        });
        for part in ["**Meaning.**", "**Check.**", "**Fix.**"] {
            assert!(
                body.contains(part),
                "{OBSERVABILITY_MD}#{anchor} has no {part} paragraph"
            );
        }
    }
}

#[test]
fn links_to_observability_md_sections_resolve() {
    let text = read(OBSERVABILITY_MD);
    let sections = sections(&text);
    let mut links: Vec<(String, String)> = text
        .split("](#")
        .skip(1)
        .map(|rest| {
            let anchor = rest.split(')').next().unwrap_or_default();
            (OBSERVABILITY_MD.to_string(), anchor.to_string())
        })
        .collect();
    for path in [DASHBOARD, ALERTS] {
        for rest in read(path).split("observability.md#").skip(1) {
            let anchor: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            links.push((path.to_string(), anchor));
        }
    }
    assert!(links.len() > 20, "only {} links found", links.len());
    for (path, anchor) in links {
        assert!(
            sections.contains_key(&anchor),
            "{path} links to {OBSERVABILITY_MD}#{anchor}, which is no heading"
        );
    }
}

#[test]
fn yaml_examples_in_observability_md_parse() {
    let text = read(OBSERVABILITY_MD);
    let blocks: Vec<&str> = text
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert!(!blocks.is_empty());
    for block in blocks {
        serde_yaml::from_str::<serde_yaml::Value>(block)
            .unwrap_or_else(|e| panic!("{OBSERVABILITY_MD}: {e}\n{block}"));
    }
}

// ---- What the code exports ------------------------------------------------------------

/// One metric of docs/metrics.md: its type and its labels with the values the docs list.
struct Documented {
    kind: String,
    labels: BTreeMap<String, BTreeSet<String>>,
}

/// Reads a Labels cell such as "`action` (`ScaleToZero`, `Suspend`), `result` (`done`)":
/// code outside parentheses is a label, code inside lists that label's values.
fn documented_labels(cell: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut last: Option<String> = None;
    let mut depth = 0i32;
    for (i, part) in cell.split('`').enumerate() {
        if i % 2 == 0 {
            depth += part.matches('(').count() as i32 - part.matches(')').count() as i32;
        } else if depth == 0 {
            labels.entry(part.to_string()).or_default();
            last = Some(part.to_string());
        } else if let Some(label) = &last {
            labels
                .entry(label.clone())
                .or_default()
                .insert(part.to_string());
        }
    }
    labels
}

fn documented_metrics() -> BTreeMap<String, Documented> {
    let mut metrics = BTreeMap::new();
    for line in read("docs/metrics.md").lines() {
        if !line.starts_with("| `gpu_reaper_") {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert!(cells.len() >= 5, "docs/metrics.md: unexpected row {line}");
        metrics.insert(
            cells[1].trim_matches('`').to_string(),
            Documented {
                kind: cells[2].to_string(),
                labels: documented_labels(cells[3]),
            },
        );
    }
    assert!(
        metrics.len() >= 10,
        "only {} metrics read from docs/metrics.md",
        metrics.len()
    );
    metrics
}

fn rust_sources(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push(text);
        }
    }
}

/// Metric names and label values as src/ has them.
struct Code {
    /// Names passed to `register(` in files whose registry has the prefix `gpu_reaper`.
    registered: BTreeSet<String>,
    /// All of src/, to find label values written as string literals.
    text: String,
}

impl Code {
    fn writes(&self, value: &str) -> bool {
        self.text.contains(&format!("\"{value}\""))
    }
}

fn code() -> Code {
    let mut sources = Vec::new();
    rust_sources(&root().join("src"), &mut sources);
    let mut registered = BTreeSet::new();
    let mut all = String::new();
    for text in &sources {
        all.push_str(text);
        if !text.contains("Registry::with_prefix(\"gpu_reaper\")") {
            continue;
        }
        for call in text.split(".register(").skip(1) {
            if let Some(name) = call.trim_start().strip_prefix('"') {
                registered.insert(name.split('"').next().unwrap().to_string());
            }
        }
    }
    assert!(
        registered.len() >= 10,
        "only {} metrics registered in src/",
        registered.len()
    );
    Code {
        registered,
        text: all,
    }
}

/// The name prometheus-client gives a registered metric in the exposition.
fn exposed_name(registered: &str, kind: &str) -> String {
    match kind {
        "counter" => format!("gpu_reaper_{registered}_total"),
        _ => format!("gpu_reaper_{registered}"),
    }
}

// ---- What a query refers to -------------------------------------------------------

struct Matcher {
    label: String,
    op: String,
    value: String,
}

struct Selector {
    name: String,
    matchers: Vec<Matcher>,
}

#[derive(Default)]
struct References {
    selectors: Vec<Selector>,
    /// Labels named in by/on/without/ignoring/group_* clauses and label_values().
    labels: BTreeSet<String>,
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Index of the bracket closing the one at `open`, skipping quoted strings.
fn closing(chars: &[char], open: usize) -> usize {
    let (opener, closer) = (chars[open], if chars[open] == '(' { ')' } else { '}' });
    let mut depth = 0;
    let mut quoted = false;
    let mut i = open;
    while i < chars.len() {
        match chars[i] {
            '\\' if quoted => i += 1,
            '"' => quoted = !quoted,
            c if c == opener && !quoted => depth += 1,
            c if c == closer && !quoted => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
        i += 1;
    }
    panic!(
        "unbalanced {opener} in {}",
        chars.iter().collect::<String>()
    );
}

/// Splits on commas outside quotes.
fn split_top_level(text: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut quoted = false;
    let mut escaped = false;
    for c in text.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(String::new());
                continue;
            }
            _ => {}
        }
        parts.last_mut().unwrap().push(c);
    }
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn matcher(text: &str) -> Matcher {
    let label: String = text.chars().take_while(|c| is_ident(*c)).collect();
    let rest = text[label.len()..].trim_start();
    let op = ["=~", "!~", "!=", "="]
        .into_iter()
        .find(|op| rest.starts_with(op))
        .unwrap_or_else(|| panic!("no operator in matcher {text}"));
    let value = rest[op.len()..].trim().trim_matches('"').to_string();
    Matcher {
        label,
        op: op.to_string(),
        value,
    }
}

/// Metric selectors and grouping labels of a PromQL expression (or of a Grafana
/// `label_values(…)` query). Names inside strings, as in a `__name__` regex, count too.
fn references(expr: &str) -> References {
    let chars: Vec<char> = expr.chars().collect();
    let mut refs = References::default();
    let mut i = 0;
    while i < chars.len() {
        if !is_ident(chars[i]) || (i > 0 && is_ident(chars[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let mut next = i;
        while next < chars.len() && chars[next].is_whitespace() {
            next += 1;
        }
        let opens = |c: char| next < chars.len() && chars[next] == c;
        if word.starts_with("gpu_reaper_") {
            let mut matchers = Vec::new();
            if opens('{') {
                let end = closing(&chars, next);
                let inside: String = chars[next + 1..end].iter().collect();
                matchers = split_top_level(&inside)
                    .iter()
                    .map(|m| matcher(m))
                    .collect();
                i = end + 1;
            }
            refs.selectors.push(Selector {
                name: word,
                matchers,
            });
        } else if opens('(')
            && matches!(
                word.as_str(),
                "by" | "on" | "without" | "ignoring" | "group_left" | "group_right"
            )
        {
            let end = closing(&chars, next);
            let inside: String = chars[next + 1..end].iter().collect();
            refs.labels.extend(split_top_level(&inside));
            i = end + 1;
        } else if opens('(') && word == "label_values" {
            // The label is the last argument; the selector before it is scanned as usual.
            let end = closing(&chars, next);
            let inside: String = chars[next + 1..end].iter().collect();
            if let Some(label) = split_top_level(&inside).pop() {
                refs.labels.insert(label);
            }
        }
    }
    refs
}

/// Literal values a matcher names: `x`, or each of `a|b|c` for a regex of plain words.
/// Grafana variables and real regexes name nothing checkable.
fn literal_values(m: &Matcher) -> Vec<String> {
    if m.value.contains('$') {
        return Vec::new();
    }
    match m.op.as_str() {
        "=" | "!=" => vec![m.value.clone()],
        _ if m.value.chars().all(|c| is_ident(c) || c == '|') => {
            m.value.split('|').map(str::to_string).collect()
        }
        _ => Vec::new(),
    }
}

/// Everything in `expr` that docs/metrics.md or src/ does not back; empty when all is.
fn unbacked(expr: &str, docs: &BTreeMap<String, Documented>, code: &Code) -> Vec<String> {
    let refs = references(expr);
    let mut problems = Vec::new();
    let mut usable: BTreeSet<String> = TARGET_LABELS.iter().map(|l| l.to_string()).collect();
    for selector in &refs.selectors {
        let name = selector.name.as_str();
        // A histogram is queried through its _bucket, _sum and _count series.
        let (family, bucket) = match docs.get(name) {
            Some(d) if d.kind != "histogram" => (name, false),
            _ => match ["_bucket", "_sum", "_count"]
                .into_iter()
                .find_map(|s| Some((name.strip_suffix(s)?, s == "_bucket")))
            {
                Some((base, bucket)) if docs.get(base).is_some_and(|d| d.kind == "histogram") => {
                    (base, bucket)
                }
                _ => {
                    problems.push(format!(
                        "{name}: no series of a metric docs/metrics.md documents"
                    ));
                    continue;
                }
            },
        };
        let documented = &docs[family];
        if !code
            .registered
            .iter()
            .any(|r| exposed_name(r, &documented.kind) == family)
        {
            problems.push(format!(
                "{name}: docs/metrics.md documents {family}, but no gpu_reaper registry in src/ registers it"
            ));
        }
        let mut labels: BTreeSet<String> = documented.labels.keys().cloned().collect();
        labels.extend(TARGET_LABELS.iter().map(|l| l.to_string()));
        if bucket {
            labels.insert("le".into());
        }
        for m in &selector.matchers {
            if m.label == "__name__" {
                continue;
            }
            if !labels.contains(&m.label) {
                problems.push(format!("{name}: no label {}", m.label));
                continue;
            }
            let listed = documented.labels.get(&m.label);
            for value in literal_values(m) {
                if listed.is_some_and(|v| !v.is_empty() && !v.contains(&value)) {
                    problems.push(format!(
                        "{name}: docs/metrics.md lists no value {value} for {}",
                        m.label
                    ));
                }
                let target_label = m.label == "le" || TARGET_LABELS.contains(&m.label.as_str());
                if !target_label && !code.writes(&value) {
                    problems.push(format!(
                        "{name}: src/ never writes the value {value} (label {})",
                        m.label
                    ));
                }
            }
        }
        usable.extend(labels);
    }
    for label in &refs.labels {
        if !usable.contains(label) {
            problems.push(format!(
                "groups or matches on {label}, which no metric of the expression has"
            ));
        }
    }
    problems
}

fn assert_backed(queries: &[(String, String)]) {
    let docs = documented_metrics();
    let code = code();
    let mut problems = Vec::new();
    for (place, expr) in queries {
        for problem in unbacked(expr, &docs, &code) {
            problems.push(format!("{place}: {problem}\n    {expr}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn alert_expressions_use_only_metrics_labels_and_values_the_code_exports() {
    let queries: Vec<(String, String)> = alerts()
        .into_iter()
        .map(|a| (format!("{ALERTS} {}", a.name), a.expr))
        .collect();
    assert!(queries.iter().all(|(_, e)| e.contains("gpu_reaper_")));
    assert_backed(&queries);
}

#[test]
fn the_reference_check_rejects_what_the_code_does_not_export() {
    let docs = documented_metrics();
    let code = code();
    for bad in [
        "gpu_reaper_idle_gpus",
        "gpu_reaper_leader_total",
        "sum(rate(gpu_reaper_actions[5m]))",
        "gpu_reaper_governed_gpus_bucket",
        "gpu_reaper_evaluation_duration_seconds",
        "gpu_reaper_actions_total{result=\"error\"}",
        "gpu_reaper_actions_total{result=~\"failed|timeout\"}",
        "gpu_reaper_actions_total{policy=\"research\"}",
        "gpu_reaper_admission_decisions_total{reason=\"too_many_gpus\"}",
        "sum by (policy) (gpu_reaper_admission_decisions_total)",
        "sum by (le) (gpu_reaper_evaluation_duration_seconds_count)",
        "label_values(gpu_reaper_leader, policy)",
        "label_values({__name__=~\"gpu_reaper_leader|gpu_reaper_invented_total\"}, namespace)",
    ] {
        assert!(
            !unbacked(bad, &docs, &code).is_empty(),
            "{bad} was accepted"
        );
    }
    for good in [
        "sum by (namespace, action) (increase(gpu_reaper_actions_total{result=\"failed\"}[10m]))",
        "histogram_quantile(0.99, sum by (le) (rate(gpu_reaper_admission_duration_seconds_bucket{namespace=~\"$namespace\"}[5m])))",
        "gpu_reaper_admission_decisions_total{verdict=\"deny\", reason=\"over_budget\"}",
    ] {
        let problems = unbacked(good, &docs, &code);
        assert!(problems.is_empty(), "{good}: {problems:?}");
    }
}

// ---- The dashboard ------------------------------------------------------------------

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

/// Every panel, those inside collapsed rows included.
fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        all.push(panel);
        all.extend(panel["panels"].as_array().into_iter().flatten());
    }
    all
}

/// (where, PromQL) of every panel target.
fn panel_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for panel in panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or_default();
            let expr = target["expr"].as_str().unwrap_or_else(|| {
                panic!("{DASHBOARD}: panel {title:?} has a target without expr")
            });
            let place = format!("{DASHBOARD} panel {title:?} {}", target["refId"]);
            queries.push((place, expr.to_string()));
        }
    }
    queries
}

/// (where, query) of every query variable (Grafana's label_values() syntax).
fn variable_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
    {
        if var["type"] != "query" {
            continue;
        }
        let query = var["query"]["query"]
            .as_str()
            .or(var["query"].as_str())
            .expect("a query variable's query");
        queries.push((
            format!("{DASHBOARD} variable {}", var["name"]),
            query.to_string(),
        ));
    }
    queries
}

#[test]
fn dashboard_queries_use_only_metrics_labels_and_values_the_code_exports() {
    let d = dashboard();
    let mut queries = panel_queries(&d);
    assert!(queries.len() >= 20, "only {} panel queries", queries.len());
    queries.extend(variable_queries(&d));
    assert_backed(&queries);
}

#[test]
fn every_documented_metric_is_on_the_dashboard() {
    let d = dashboard();
    let shown: BTreeSet<String> = panel_queries(&d)
        .iter()
        .flat_map(|(_, expr)| references(expr).selectors)
        .map(|s| s.name)
        .collect();
    for (metric, documented) in documented_metrics() {
        let on_dashboard = if documented.kind == "histogram" {
            ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| shown.contains(&format!("{metric}{s}")))
        } else {
            shown.contains(&metric)
        };
        assert!(on_dashboard, "no panel shows {metric}");
    }
}

#[test]
fn dashboard_queries_are_valid_promql() {
    let d = dashboard();
    let variables: Vec<String> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, (place, expr)) in panel_queries(&d).into_iter().enumerate() {
        // Grafana's own variables, then the dashboard's (all used inside regex matchers).
        let mut promql = expr
            .replace("$__rate_interval", "5m")
            .replace("$__range", "1d")
            .replace("$__interval", "1m");
        for var in &variables {
            promql = promql.replace(&format!("${var}"), ".*");
        }
        assert!(!promql.contains('$'), "{place}: unknown variable in {expr}");
        rules.push_str(&format!(
            "      - record: dashboard_query_{n}\n        expr: {}\n",
            serde_json::to_string(&promql).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-rules.yaml");
    std::fs::write(&file, &rules).unwrap();
    let output = promtool(&["check", "rules", file.to_str().unwrap()]);
    assert_success("promtool check rules (dashboard queries)", &output);
}

#[test]
fn dashboard_is_schema_38_or_later_and_reads_prometheus_through_a_variable() {
    let d = dashboard();
    let schema = d["schemaVersion"].as_u64().expect("schemaVersion");
    assert!(schema >= 38, "schemaVersion {schema}");
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no variable {name}"))
    };
    let datasource = var("datasource");
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
    for name in ["namespace", "policy"] {
        assert_eq!(var(name)["type"], "query", "{name}");
        assert_eq!(var(name)["datasource"]["uid"], "${datasource}", "{name}");
    }
    let mut ids = BTreeSet::new();
    for panel in panels(&d) {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(
            ids.insert(panel["id"].as_u64().expect("id")),
            "{title}: id twice"
        );
        assert!(
            panel["gridPos"]["w"].as_u64().is_some(),
            "{title}: no gridPos"
        );
        match panel["type"].as_str() {
            Some("row" | "text") => continue,
            Some(_) => {}
            None => panic!("{title}: no type"),
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        assert_eq!(panel["datasource"]["type"], "prometheus", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
        }
    }
}
