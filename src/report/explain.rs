//! `gpu-reaper explain`'s page, PURE: what the controller sees for one workload
//! ([`crate::controller::explain::Seen`]) as an [`Explanation`] (the JSON, field names
//! stable) and as text for people. No decision is taken here: the step, its reason and
//! `nextStepAt` are the controller's own decision, copied.

use std::fmt::Write as _;

use jiff::{SignedDuration, Timestamp};
use serde::Serialize;

use crate::api::keys;
use crate::api::policy::{ActionType, PolicyMode};
use crate::controller::explain::Seen;
use crate::engine::classify::human;
use crate::engine::inference::Softer;
use crate::engine::model::Step;
use crate::engine::risk::{Basis, Estimate};

/// Where the explanation was computed from (the command's settings).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sources {
    pub prometheus_url: String,
    /// `--history-backfill`: the activity replayed into the idle-span history.
    pub history_backfill: String,
}

/// Everything `explain` says about one workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The instant the decision was taken at (`--now`, or the wall clock).
    pub at: Timestamp,
    pub workload: WorkloadPart,
    pub policy: PolicyPart,
    /// Its GPUs as the policy observes them over its idle window.
    pub gpus: Vec<GpuPart>,
    /// Null when it holds no GPUs now (nothing is judged).
    pub decision: Option<DecisionPart>,
    pub state: StatePart,
    pub sources: Sources,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadPart {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub created_at: Timestamp,
    /// GPUs held now (MIG slices as fractions).
    pub gpus: f64,
    pub pods: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyPart {
    pub name: String,
    pub mode: String,
    pub priority: i32,
    /// Policies that match it too and are outranked.
    pub outranked: Vec<String>,
    pub signal: String,
    pub threshold: f64,
    pub window: String,
    pub min_coverage: f64,
    pub warn_after: String,
    pub action_after: String,
    /// The policy's action.
    pub action: String,
    /// What it becomes for this kind (a Job is suspended, not scaled).
    pub action_for_kind: String,
    pub max_resume_risk: Option<f64>,
    pub max_idle: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuPart {
    pub pod: String,
    pub id: String,
    pub model: String,
    pub share: f64,
    /// Share of the idle window with samples (0–1).
    pub coverage: f64,
    /// Last sample at or above the threshold.
    pub last_busy_at: Option<Timestamp>,
    /// Last time coverage was below `idle.minCoverage` (the idle clock does not run
    /// through it).
    pub blind_until: Option<Timestamp>,
    pub fb_used_mib: Option<f64>,
    pub power_watts: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionPart {
    /// `Active`, `Idle/MemoryHeld`, `NoTelemetry`, `TooYoung`, `Exempt`, `Snoozed`, …
    pub classification: String,
    pub classification_reason: String,
    pub idle_since: Option<Timestamp>,
    /// This cycle's step: `Nothing`, `Warn`, `Act`, `WouldAct`, `RateLimited`.
    pub step: String,
    /// The action of an `Act`, `WouldAct` or `RateLimited` step.
    pub step_action: Option<String>,
    pub reason: String,
    /// The step that comes next if nothing changes: `Warn`, `Act` or `WouldAct`.
    pub next_step: Option<String>,
    /// When it is due (the controller takes it at its first cycle at or after this).
    pub next_step_at: Option<Timestamp>,
    /// Request-driven inference: the replicas kept instead of zero, and why.
    pub softer: Option<String>,
    /// The policy's action is not possible on this kind: why.
    pub unsupported: Option<String>,
    pub hourly_usd: f64,
    pub risk: Option<RiskPart>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RiskPart {
    /// Probability of activity within the horizon (0–1), the prior included.
    pub risk: f64,
    /// `idle.maxResumeRisk`.
    pub limit: Option<f64>,
    pub idle_for: String,
    pub horizon: String,
    /// Past spans longer than `idleFor` that then ended within the horizon…
    pub resumed: u32,
    /// …of the spans longer than `idleFor` (the cases at risk).
    pub longer: u32,
    pub product_limit: f64,
    /// Whose spans: `own`, `rhythm`, `peers`.
    pub basis: String,
    /// With the own spans: the peers' cases they were blended with.
    pub blend: Option<BlendPart>,
    pub sentence: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlendPart {
    pub resumed: u32,
    pub longer: u32,
    pub product_limit: f64,
    pub basis: String,
}

/// The ladder state and opt-outs, as the annotations and labels say.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatePart {
    /// Where an exemption comes from: `workload` (its label) or `namespace`.
    pub exempt: Option<String>,
    pub snooze_until: Option<String>,
    pub warned_at: Option<String>,
    pub reaped_at: Option<String>,
    pub reaped_action: Option<String>,
    pub woken_at: Option<String>,
    pub owner: Option<String>,
    /// Audit mode: the controller's own memory (its ConfigMap), not annotations.
    pub audit_warned_at: Option<Timestamp>,
    pub audit_would_act_at: Option<Timestamp>,
}

fn step_name(step: Step) -> (&'static str, Option<ActionType>) {
    match step {
        Step::Nothing => ("Nothing", None),
        Step::Warn => ("Warn", None),
        Step::Act(a) => ("Act", Some(a)),
        Step::WouldAct(a) => ("WouldAct", Some(a)),
        Step::RateLimited(a) => ("RateLimited", Some(a)),
    }
}

fn basis_name(basis: Basis) -> String {
    match basis {
        Basis::Own => "own".into(),
        Basis::Rhythm(shape, rhythm, _, _) => {
            format!("rhythm ({}, {})", shape.as_str(), rhythm.words())
        }
        Basis::Peers(shape, _) => format!("peers ({})", shape.as_str()),
        Basis::Calendar(days, _) => format!("calendar ({:?})", days.class).to_lowercase(),
    }
}

fn risk_part(e: &Estimate, limit: Option<f64>) -> RiskPart {
    RiskPart {
        risk: e.risk(),
        limit,
        idle_for: human(e.idle_for),
        horizon: human(e.horizon),
        resumed: e.resumed,
        longer: e.longer,
        product_limit: e.product_limit,
        basis: basis_name(e.basis),
        blend: e.blend.as_ref().map(|b| BlendPart {
            resumed: b.resumed,
            longer: b.longer,
            product_limit: b.product_limit,
            basis: basis_name(b.basis),
        }),
        sentence: e.sentence(),
    }
}

fn duration_text(d: &kube::core::Duration) -> String {
    human(crate::engine::rules::dur(d))
}

/// The explanation of what `seen` holds.
pub fn build(seen: &Seen, sources: Sources) -> Explanation {
    let root = &seen.root;
    let spec = &seen.policy.spec;
    let annotation = |k: &str| root.annotations.get(k).cloned();
    let exempt = if root.labels.get(keys::EXEMPT_LABEL).map(String::as_str) == Some("true") {
        Some("workload".to_string())
    } else if seen.namespace_exempt {
        Some("namespace".to_string())
    } else {
        None
    };
    let enforce = spec.mode == PolicyMode::Enforce;
    let decision = seen.planned.as_ref().map(|p| {
        let d = &p.decision;
        let (step, step_action) = step_name(d.step);
        let warned = p
            .warned_at
            .is_some_and(|w| d.verdict.idle_since.is_none_or(|since| w >= since));
        // What comes next: after a warning (now or before), the action; else the warning.
        let next_step = d.next_step_at.map(|_| {
            if d.step == Step::Warn || warned {
                if enforce { "Act" } else { "WouldAct" }
            } else {
                "Warn"
            }
            .to_string()
        });
        DecisionPart {
            classification: d.verdict.classification.as_str().to_string(),
            classification_reason: d.verdict.reason.clone(),
            idle_since: d.verdict.idle_since,
            step: step.to_string(),
            step_action: step_action.map(|a| format!("{a:?}")),
            reason: d.reason.clone(),
            next_step,
            next_step_at: d.next_step_at,
            softer: match &p.softer {
                Softer::No => None,
                Softer::Keep { keep, why } => {
                    Some(format!("scaled down to {keep} replica(s), not zero: {why}"))
                }
                Softer::AtMinimum { keep, why } => Some(format!(
                    "already at {keep} replica(s) or fewer: nothing to reclaim ({why})"
                )),
            },
            unsupported: p.unsupported.map(|a| {
                format!(
                    "{a:?} is not possible on a {}: nothing is done (the reason says why)",
                    root.kind
                )
            }),
            hourly_usd: d.hourly_usd,
            risk: d
                .estimate
                .as_ref()
                .map(|e| risk_part(e, spec.idle.max_resume_risk)),
        }
    });
    Explanation {
        at: seen.at,
        workload: WorkloadPart {
            api_version: root.api_version.clone(),
            kind: root.kind.clone(),
            namespace: root.namespace.clone(),
            name: root.name.clone(),
            created_at: root.created_at,
            gpus: seen.workload.as_ref().map_or(0.0, |w| w.gpus),
            pods: seen
                .workload
                .iter()
                .flat_map(|w| w.pods.iter().map(|p| p.meta.name.clone()))
                .collect(),
        },
        policy: PolicyPart {
            name: seen.policy.metadata.name.clone().unwrap_or_default(),
            mode: format!("{:?}", spec.mode),
            priority: spec.priority,
            outranked: seen.outranked.clone(),
            signal: format!("{:?}", spec.idle.signal),
            threshold: spec.idle.threshold,
            window: duration_text(&spec.idle.window),
            min_coverage: spec.idle.min_coverage,
            warn_after: duration_text(&spec.warn.after),
            action_after: duration_text(&spec.action.after),
            action: format!("{:?}", spec.action.type_),
            action_for_kind: format!("{:?}", seen.action),
            max_resume_risk: spec.idle.max_resume_risk,
            max_idle: spec.idle.max_idle.as_ref().map(duration_text),
        },
        gpus: seen
            .gpus
            .iter()
            .map(|(pod, g)| GpuPart {
                pod: pod.clone(),
                id: g.id.clone(),
                model: g.model.clone(),
                share: g.share,
                coverage: g.coverage,
                last_busy_at: g.last_busy_at,
                blind_until: g.blind_until,
                fb_used_mib: g.fb_used_mib,
                power_watts: g.power_watts,
            })
            .collect(),
        decision,
        state: StatePart {
            exempt,
            snooze_until: annotation(keys::SNOOZE_UNTIL),
            warned_at: annotation(keys::WARNED_AT),
            reaped_at: annotation(keys::REAPED_AT),
            reaped_action: annotation(keys::REAPED_ACTION),
            woken_at: annotation(keys::WOKEN_AT),
            owner: annotation(keys::OWNER),
            audit_warned_at: seen.audit_warned_at,
            audit_would_act_at: seen.audit_would_act_at,
        },
        sources,
    }
}

/// `at`, and how long from `now` ("in 20m", "5m ago", "now").
fn when(at: Timestamp, now: Timestamp) -> String {
    let d = at.duration_since(now);
    if d == SignedDuration::ZERO {
        format!("{at} (now)")
    } else if d > SignedDuration::ZERO {
        format!("{at} (in {})", human(d))
    } else {
        format!("{at} ({} ago)", human(-d))
    }
}

fn percent(x: f64) -> String {
    format!("{:.0} %", x * 100.0)
}

fn or_dash(x: Option<String>) -> String {
    x.unwrap_or_else(|| "-".into())
}

/// The explanation for people.
pub fn text(e: &Explanation) -> String {
    let mut out = String::new();
    let w = &e.workload;
    let p = &e.policy;
    let _ = writeln!(
        out,
        "{}/{}/{} ({}), as of {}",
        w.namespace, w.kind, w.name, w.api_version, e.at
    );
    let _ = writeln!(
        out,
        "  holds       {} GPU(s) in {} pod(s){}; created {}",
        w.gpus,
        w.pods.len(),
        if w.pods.is_empty() {
            String::new()
        } else {
            format!(" ({})", w.pods.join(", "))
        },
        w.created_at
    );
    let _ = writeln!(
        out,
        "  policy      {} ({}, priority {}){}",
        p.name,
        p.mode,
        p.priority,
        if p.outranked.is_empty() {
            String::new()
        } else {
            format!("; also matched, outranked: {}", p.outranked.join(", "))
        }
    );
    let _ = writeln!(
        out,
        "  rules       busy at activity >= {} ({} signal) over a {} window, coverage >= {}; warn after {}, {} after {}{}",
        p.threshold,
        p.signal,
        p.window,
        p.min_coverage,
        p.warn_after,
        if p.action_for_kind == p.action {
            p.action.clone()
        } else {
            format!(
                "{} (the policy's {} for a {})",
                p.action_for_kind, p.action, w.kind
            )
        },
        p.action_after,
        match (p.max_resume_risk, &p.max_idle) {
            (Some(r), m) => format!(
                "; held while the resumption risk is above {}{}",
                percent(r),
                m.as_ref()
                    .map(|m| format!(" (until idle {m})"))
                    .unwrap_or_default()
            ),
            _ => String::new(),
        }
    );
    if !e.gpus.is_empty() {
        let _ = writeln!(out, "  GPUs");
        for g in &e.gpus {
            let _ = writeln!(
                out,
                "    {} {} ({}{}): coverage {}, last busy {}{}",
                g.pod,
                g.id,
                if g.model.is_empty() { "?" } else { &g.model },
                if (g.share - 1.0).abs() > 1e-9 {
                    format!(", share {:.3}", g.share)
                } else {
                    String::new()
                },
                percent(g.coverage),
                g.last_busy_at
                    .map(|t| when(t, e.at))
                    .unwrap_or_else(|| "not in what was read".into()),
                g.blind_until
                    .map(|t| format!(", unobserved until {t}"))
                    .unwrap_or_default()
            );
        }
    }
    match &e.decision {
        Some(d) => {
            let _ = writeln!(
                out,
                "  class       {}{}: {}",
                d.classification,
                d.idle_since
                    .map(|t| format!(" since {t}"))
                    .unwrap_or_default(),
                d.classification_reason
            );
            let _ = writeln!(
                out,
                "  this cycle  {}{}: {}",
                d.step,
                d.step_action
                    .as_ref()
                    .map(|a| format!(" ({a})"))
                    .unwrap_or_default(),
                d.reason
            );
            let _ = match (&d.next_step, d.next_step_at) {
                (Some(next), Some(at)) => {
                    writeln!(out, "  next        {next} at {}", when(at, e.at))
                }
                _ if d.classification == "Active" => writeln!(
                    out,
                    "  next        nothing scheduled while it is busy (the ladder starts once every GPU is idle for {})",
                    p.window
                ),
                _ => writeln!(out, "  next        nothing scheduled"),
            };
            if let Some(s) = &d.softer {
                let _ = writeln!(out, "  inference   {s}");
            }
            if let Some(u) = &d.unsupported {
                let _ = writeln!(out, "  unsupported {u}");
            }
            match &d.risk {
                Some(r) => {
                    let _ = writeln!(
                        out,
                        "  risk        {}{}: {} of {} longer spans resumed within {} (product-limit {}, basis {}{})",
                        percent(r.risk),
                        r.limit
                            .map(|l| format!(" (limit {})", percent(l)))
                            .unwrap_or_default(),
                        r.resumed,
                        r.longer,
                        r.horizon,
                        percent(r.product_limit),
                        r.basis,
                        r.blend
                            .as_ref()
                            .map(|b| format!(
                                "; blended with {} of {} of {}",
                                b.resumed, b.longer, b.basis
                            ))
                            .unwrap_or_default()
                    );
                    let _ = writeln!(out, "              {}", r.sentence);
                }
                None => {
                    let _ = writeln!(
                        out,
                        "  risk        {}",
                        if p.max_resume_risk.is_some() {
                            "not estimated (asked only once idle past warn.after and the window)"
                        } else {
                            "not used (the policy has no idle.maxResumeRisk)"
                        }
                    );
                }
            }
            let _ = writeln!(out, "  cost        {:.2} USD/h", d.hourly_usd);
        }
        None => {
            let _ = writeln!(
                out,
                "  judged      no: it holds no GPUs now, so the controller does nothing to it{}",
                if e.state.reaped_at.is_some() {
                    format!(
                        " (reclaimed; `gpu-reaper wake {}/{}/{}` brings it back)",
                        w.namespace, w.kind, w.name
                    )
                } else {
                    String::new()
                }
            );
        }
    }
    let s = &e.state;
    let _ = writeln!(
        out,
        "  state       exempt {}, snooze-until {}, warned-at {}, reaped-at {}{}, woken-at {}, owner {}",
        or_dash(s.exempt.clone()),
        or_dash(s.snooze_until.clone()),
        or_dash(s.warned_at.clone()),
        or_dash(s.reaped_at.clone()),
        s.reaped_action
            .as_ref()
            .map(|a| format!(" ({a})"))
            .unwrap_or_default(),
        or_dash(s.woken_at.clone()),
        or_dash(s.owner.clone()),
    );
    if s.audit_warned_at.is_some() || s.audit_would_act_at.is_some() {
        let _ = writeln!(
            out,
            "  audit       warned at {}, would have acted at {} (the controller's Audit memory)",
            or_dash(s.audit_warned_at.map(|t| t.to_string())),
            or_dash(s.audit_would_act_at.map(|t| t.to_string())),
        );
    }
    let _ = writeln!(
        out,
        "  computed    now, from Prometheus ({}) and the API server, with {} of activity history replayed (--history-backfill), as a controller starting at this instant decides",
        e.sources.prometheus_url, e.sources.history_backfill
    );
    out
}

#[cfg(test)]
#[path = "explain_tests.rs"]
mod tests;
