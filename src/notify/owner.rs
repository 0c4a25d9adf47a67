//! PURE: who owns a workload, for warnings (docs/notifications.md#owners).
//!
//! First match wins: the workload's `gpureaper.io/owner` annotation, its pods' (the pod
//! template's), its namespace's, the policy's `warn.defaultOwner`. A value lists email
//! addresses and/or Slack member IDs, comma-separated (`ana@example.com, U024BE7LH`).
//! With nobody found, Slack warnings go to the policy's `warn.slackChannel` and email is
//! not sent (recorded as `unrouted`).

use std::collections::BTreeMap;

use crate::api::keys;

/// Where an owner was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OwnerSource {
    Workload,
    Pod,
    Namespace,
    Policy,
    #[default]
    Nobody,
}

impl OwnerSource {
    pub fn as_str(self) -> &'static str {
        match self {
            OwnerSource::Workload => "workload",
            OwnerSource::Pod => "pod",
            OwnerSource::Namespace => "namespace",
            OwnerSource::Policy => "policy",
            OwnerSource::Nobody => "nobody",
        }
    }
}

/// The resolved owner of one workload.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Owner {
    pub emails: Vec<String>,
    /// Slack member IDs (`U…`/`W…`).
    pub slack_ids: Vec<String>,
    pub source: OwnerSource,
    /// Entries of the winning value that are neither an email nor a Slack member ID.
    pub invalid: Vec<String>,
}

impl Owner {
    pub fn is_nobody(&self) -> bool {
        self.emails.is_empty() && self.slack_ids.is_empty()
    }

    /// `emails + Slack IDs (source)`, for logs, Events and the recorded owner.
    pub fn describe(&self) -> String {
        if self.is_nobody() {
            return "nobody (no gpureaper.io/owner on the workload, its pods or namespace, and no warn.defaultOwner)".into();
        }
        let mut who: Vec<&str> = self.emails.iter().map(String::as_str).collect();
        who.extend(self.slack_ids.iter().map(String::as_str));
        format!("{} (from the {})", who.join(", "), self.source.as_str())
    }
}

fn is_email(s: &str) -> bool {
    let Some((local, domain)) = s.split_once('@') else {
        return false;
    };
    !local.is_empty()
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !s.contains(char::is_whitespace)
        && !domain.contains('@')
}

fn is_slack_id(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('U' | 'W'))
        && s.len() >= 7
        && s.len() <= 15
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// Parses one annotation value.
pub fn parse(value: &str, source: OwnerSource) -> Owner {
    let mut owner = Owner {
        source,
        ..Owner::default()
    };
    for raw in value
        .split([',', ';', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let entry = raw
            .strip_prefix("mailto:")
            .or_else(|| raw.strip_prefix("slack:"))
            .unwrap_or(raw)
            .trim_start_matches('@');
        if is_email(entry) {
            owner.emails.push(entry.to_string());
        } else if is_slack_id(entry) {
            owner.slack_ids.push(entry.to_string());
        } else {
            owner.invalid.push(raw.to_string());
        }
    }
    owner
}

/// Resolves the owner from the annotations found at each level, first match wins. A level
/// whose value has no valid entry does not win (its invalid entries are kept for the
/// report), so a typo on the workload falls through to the namespace.
pub fn resolve(
    workload: &BTreeMap<String, String>,
    pods: &[&BTreeMap<String, String>],
    namespace: &BTreeMap<String, String>,
    policy_default: Option<&str>,
) -> Owner {
    let mut invalid = Vec::new();
    let mut candidates: Vec<(Option<&str>, OwnerSource)> = vec![(
        workload.get(keys::OWNER).map(String::as_str),
        OwnerSource::Workload,
    )];
    candidates.extend(
        pods.iter()
            .map(|p| (p.get(keys::OWNER).map(String::as_str), OwnerSource::Pod)),
    );
    candidates.push((
        namespace.get(keys::OWNER).map(String::as_str),
        OwnerSource::Namespace,
    ));
    candidates.push((policy_default, OwnerSource::Policy));
    for (value, source) in candidates {
        let Some(value) = value else { continue };
        let mut owner = parse(value, source);
        if owner.is_nobody() {
            invalid.append(&mut owner.invalid);
            continue;
        }
        owner.invalid.splice(0..0, invalid);
        return owner;
    }
    Owner {
        invalid,
        ..Owner::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(keys::OWNER.to_string(), value.to_string())])
    }

    #[test]
    fn emails_and_slack_ids_are_told_apart() {
        let o = parse(
            "ana@example.com, @U024BE7LH ,slack:W0123ABCD, mailto:bo@x.io, bob, U12",
            OwnerSource::Workload,
        );
        assert_eq!(o.emails, ["ana@example.com", "bo@x.io"]);
        assert_eq!(o.slack_ids, ["U024BE7LH", "W0123ABCD"]);
        assert_eq!(o.invalid, ["bob", "U12"]);
    }

    #[test]
    fn the_first_level_with_a_valid_owner_wins() {
        let empty = BTreeMap::new();
        let pod = map("U0POD0001");
        let ns = map("team@example.com");
        let o = resolve(&map("ana@example.com"), &[&pod], &ns, Some("x@y.io"));
        assert_eq!(
            (o.source, o.emails.as_slice()),
            (OwnerSource::Workload, &["ana@example.com".to_string()][..])
        );
        let o = resolve(&empty, &[&pod], &ns, None);
        assert_eq!((o.source, o.slack_ids.len()), (OwnerSource::Pod, 1));
        let o = resolve(&map("not an owner"), &[], &ns, None);
        assert_eq!(o.source, OwnerSource::Namespace);
        assert_eq!(
            o.invalid,
            ["not", "an", "owner"],
            "a typo falls through but is reported"
        );
        let o = resolve(&empty, &[], &empty, Some("oncall@example.com"));
        assert_eq!(o.source, OwnerSource::Policy);
        let o = resolve(&empty, &[], &empty, None);
        assert!(o.is_nobody() && o.source == OwnerSource::Nobody);
        assert!(o.describe().starts_with("nobody"));
    }
}
