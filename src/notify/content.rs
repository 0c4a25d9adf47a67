//! PURE: what a warning says, for every channel (docs/notifications.md#templates).
//!
//! The controller fills [`Fields`] (what is idle, since when, what it costs, what happens
//! when, how to keep it); a template turns them into a subject and a plain-text body.
//! Slack builds its Block Kit message and email its HTML part from the same fields, so
//! every channel says the same thing. Templates use `{field}` placeholders; the platform
//! team can override any of them with `--notify-templates FILE` (YAML), and an unknown
//! placeholder is refused at start-up with its name.

use std::collections::BTreeMap;

use super::error::NotifyError;

/// The steps a message exists for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// The owner is warned: idle, and what will happen when.
    Warning,
    /// gpu-reaper acted: what it did and how to restore.
    Reclaimed,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Warning => "warning",
            Kind::Reclaimed => "reclaimed",
        }
    }
}

/// Every field a template may use, with its meaning (the documented set).
pub const FIELDS: &[(&str, &str)] = &[
    ("namespace", "namespace of the workload"),
    (
        "kind",
        "kind of the root workload (Deployment, Job, Notebook…)",
    ),
    ("name", "name of the root workload"),
    ("workload", "namespace/Kind/name"),
    ("policy", "the GpuPolicy that governs it"),
    ("gpus", "GPUs held (MIG slices count their share)"),
    ("model", "GPU model from DCGM, or \"GPU\""),
    ("idle_since", "last activity (RFC 3339, UTC)"),
    ("idle_for", "how long it has been idle (e.g. 3h10m)"),
    (
        "shape",
        "how it is idle: Unused, MemoryHeld, DataStarved, Provisioning",
    ),
    ("hourly_usd", "what its GPUs cost per hour"),
    ("wasted_usd", "what the idle time has cost so far"),
    (
        "action",
        "ScaleToZero, Suspend or Evict (ScaleToMinimum: request-driven inference keeps replicas)",
    ),
    (
        "action_verb",
        "what the action does in words (scale it to zero…)",
    ),
    (
        "action_at",
        "when gpu-reaper acts unless it is used or kept (RFC 3339)",
    ),
    (
        "mode_note",
        "empty in Enforce mode; says nothing will change in Audit mode",
    ),
    (
        "snooze_command",
        "the kubectl command that keeps it 4 hours",
    ),
    (
        "wake_command",
        "the command that restores it after an action",
    ),
    ("owner", "who the message is for, and where that was found"),
    ("url", "a link to the workload (--workload-url), or empty"),
    (
        "risk",
        "the resumption-risk estimate and its basis, ending in \". \" (policies with idle.maxResumeRisk), or empty",
    ),
    ("detail", "what the action did (reclaimed messages)"),
];

/// Values for the fields of [`FIELDS`].
pub type Fields = BTreeMap<&'static str, String>;

/// A subject and a body, with `{field}` placeholders.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    pub subject: String,
    pub text: String,
}

/// The templates of every kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Templates {
    pub warning: Template,
    pub reclaimed: Template,
}

impl Default for Templates {
    fn default() -> Self {
        Self {
            warning: Template {
                subject: "Idle GPUs: {workload} will be reclaimed at {action_at}".into(),
                text: "{gpus} {model} held by {kind} {name} in namespace {namespace} have been idle since {idle_since} ({idle_for}, {shape}). \
                       That has cost {wasted_usd} USD so far, {hourly_usd} USD per hour.\n\
                       gpu-reaper will {action_verb} at {action_at} unless the GPUs are used again or you keep it. {risk}{mode_note}\n\
                       To keep it for 4 hours: {snooze_command}\n\
                       Policy: {policy}. Sent to {owner}."
                    .into(),
            },
            reclaimed: Template {
                subject: "Reclaimed idle GPUs: {workload}".into(),
                text: "gpu-reaper reclaimed {gpus} {model} from {kind} {name} in namespace {namespace}, idle since {idle_since} ({idle_for}): {detail}.\n\
                       To restore it: {wake_command}\n\
                       Policy: {policy}. Sent to {owner}."
                    .into(),
            },
        }
    }
}

/// A rendered message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub subject: String,
    pub text: String,
}

fn placeholders(text: &str) -> impl Iterator<Item = &str> {
    text.split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
        .filter(|name| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
        })
}

impl Templates {
    /// Overrides from YAML (`warning: {subject, text}`, `reclaimed: …`; either may be
    /// left out). Errors name the template and the unknown field.
    pub fn from_yaml(text: &str, source: &str) -> Result<Self, NotifyError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            warning: Option<Template>,
            reclaimed: Option<Template>,
        }
        let file: File = serde_yaml::from_str(text).map_err(|e| NotifyError::TemplatesFile {
            file: source.to_string(),
            source: e,
        })?;
        let mut templates = Self::default();
        if let Some(t) = file.warning {
            templates.warning = t;
        }
        if let Some(t) = file.reclaimed {
            templates.reclaimed = t;
        }
        templates.check(source)?;
        Ok(templates)
    }

    /// Every placeholder names a known field.
    pub fn check(&self, source: &str) -> Result<(), NotifyError> {
        for (kind, t) in [("warning", &self.warning), ("reclaimed", &self.reclaimed)] {
            for (part, text) in [("subject", &t.subject), ("text", &t.text)] {
                if let Some(unknown) =
                    placeholders(text).find(|p| !FIELDS.iter().any(|(f, _)| f == p))
                {
                    let known: Vec<&str> = FIELDS.iter().map(|(f, _)| *f).collect();
                    return Err(NotifyError::UnknownField {
                        file: source.to_string(),
                        template: format!("{kind}.{part}"),
                        field: unknown.to_string(),
                        known: known.join(", "),
                    });
                }
            }
        }
        Ok(())
    }

    pub fn get(&self, kind: Kind) -> &Template {
        match kind {
            Kind::Warning => &self.warning,
            Kind::Reclaimed => &self.reclaimed,
        }
    }

    /// Fills the template of `kind`; a field without a value renders empty, and blank
    /// lines left by empty fields are dropped.
    pub fn render(&self, kind: Kind, fields: &Fields) -> Rendered {
        let t = self.get(kind);
        Rendered {
            subject: fill(&t.subject, fields).trim().to_string(),
            text: fill(&t.text, fields)
                .lines()
                .map(str::trim_end)
                .filter(|l| !l.trim().is_empty())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

fn fill(template: &str, fields: &Fields) -> String {
    let mut out = String::with_capacity(template.len() + 128);
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find('}') {
            Some(end) if FIELDS.iter().any(|(f, _)| *f == &after[..end]) => {
                out.push_str(fields.get(&after[..end]).map_or("", String::as_str));
                rest = &after[end + 1..];
            }
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Escapes text for HTML bodies.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What an action does, in words.
pub fn action_verb(action: &str) -> &'static str {
    match action {
        "ScaleToZero" => "scale it to zero",
        "Suspend" => "suspend it (it can be requeued)",
        "Evict" => "evict its pods",
        _ => "only warn (the policy takes no action)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> Fields {
        Fields::from([
            ("workload", "ml/Deployment/chat".to_string()),
            ("gpus", "2".to_string()),
            ("model", "NVIDIA H100 80GB HBM3".to_string()),
            ("kind", "Deployment".to_string()),
            ("name", "chat".to_string()),
            ("namespace", "ml".to_string()),
            ("action_at", "2026-11-29T22:00:00Z".to_string()),
        ])
    }

    #[test]
    fn the_default_warning_fills_its_fields_and_drops_empty_lines() {
        let r = Templates::default().render(Kind::Warning, &fields());
        assert_eq!(
            r.subject,
            "Idle GPUs: ml/Deployment/chat will be reclaimed at 2026-11-29T22:00:00Z"
        );
        assert!(
            r.text
                .starts_with("2 NVIDIA H100 80GB HBM3 held by Deployment chat in namespace ml")
        );
        assert!(!r.text.contains('{'), "{}", r.text);
    }

    #[test]
    fn the_default_warning_states_the_resumption_risk_when_there_is_one() {
        let plain = Templates::default().render(Kind::Warning, &fields());
        let mut with = fields();
        with.insert(
            "risk",
            "idle 3h10m; this workload's idle spans longer than 3h10m ended within 2h in 2 of 40 cases (5 %). ".into(),
        );
        let r = Templates::default().render(Kind::Warning, &with);
        assert!(
            r.text
                .contains("or you keep it. idle 3h10m; this workload's idle spans longer than 3h10m ended within 2h in 2 of 40 cases (5 %)."),
            "{}",
            r.text
        );
        assert!(!plain.text.contains("idle spans"), "{}", plain.text);
    }

    #[test]
    fn overrides_are_checked_and_unknown_fields_named() {
        let t = Templates::from_yaml(
            "warning:\n  subject: \"{name} idle\"\n  text: \"{gpus} GPUs {json:like}\"\n",
            "t.yaml",
        )
        .unwrap();
        assert_eq!(t.render(Kind::Warning, &fields()).subject, "chat idle");
        assert_eq!(
            t.render(Kind::Warning, &fields()).text,
            "2 GPUs {json:like}"
        );
        assert_eq!(t.reclaimed, Templates::default().reclaimed);
        let err = Templates::from_yaml("reclaimed:\n  subject: \"{nmae}\"\n  text: x\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("t.yaml: reclaimed.subject uses {nmae}, which is not a field; use one of namespace, kind"), "{err}");
        let err = Templates::from_yaml("warnings: {}\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `warnings`"), "{err}");
    }

    #[test]
    fn durations_and_html_read_well() {
        assert_eq!(
            html_escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
