//! One evaluation of every policy, the stages in order:
//!
//! ```text
//! observe::cluster (IO) → policies::report (IO) → housekeeping (IO) → quota (IO)
//!   → observe::telemetry (IO)
//!   → observe::backfill (IO), once for all the policies evaluated for the first time,
//!     when the telemetry read worked (start_histories: one read of Prometheus, piece by
//!     piece, feeds them all)
//!   per policy: plan (PURE)
//!               → warn / act (IO) per judged workload
//!               → pre-warm (PURE choice, IO wake) of reclaimed workloads (action.preWarm)
//!               → status (PURE compute, one apply)
//! → audit_memory::save (IO), when the Audit memory changed
//! ```
//!
//! A policy this gpu-reaper cannot use is set aside by observe and reported (Event,
//! Degraded, metric); the others go on, and its stand-in keeps what it governs from
//! them. When the telemetry read fails every policy is marked Degraded and nothing is judged
//! (invariant 1); the next read covers the gap. [`evaluate`] is what the loop runs each
//! tick while leading, and what in-process tests run through `Context::test`.

use std::collections::HashMap;
use std::time::Instant;

use jiff::{SignedDuration, Timestamp};

use super::context::{Context, Judged, Memory};
use super::metrics::PolicyLabels;
use super::observe::{self, Observed};
use super::plan::{self, PolicyPlan, by_pod};
use super::status::{self, Found};
use super::warn::{self, Sent};
use super::{act, audit_memory, housekeeping, policies};
use crate::Result;
use crate::api::GpuPolicy;
use crate::api::policy::PolicyMode;
use crate::cluster::inventory::Workload;
use crate::engine::model::{GpuObservation, Step};
use crate::engine::{Histories, Rules};

/// What the per-policy evaluations of one cycle share.
struct Cycle<'a> {
    now: Timestamp,
    seen: &'a Observed,
    all: Vec<&'a GpuPolicy>,
    /// Why the telemetry read failed, when it did.
    telemetry_failed: Option<String>,
    sent: Sent,
}

/// One cycle at `now`; the Audit memory saved when it changed (even when the cycle
/// failed part-way: what it warned about was said).
#[tracing::instrument(name = "cycle", skip_all, fields(%now))]
pub async fn evaluate(ctx: &Context, memory: &mut Memory, now: Timestamp) -> Result<()> {
    let started = Instant::now();
    let before = memory.audit.clone();
    // Everything the cycle observed (every GPU pod, workload, owner and observation:
    // ≈ 20 MiB at 10,000 GPUs) is freed when `cycle` returns, before the cycle is
    // counted: what reads the process' memory after an evaluation (a dashboard, the
    // scale harness) sees the level between cycles, not a cycle half torn down.
    let result = cycle(ctx, memory, now).await;
    if result.is_ok() {
        ctx.metrics.cycle.observe(started.elapsed().as_secs_f64());
    }
    if memory.audit != before {
        audit_memory::save(ctx, &memory.audit, now).await;
    }
    result
}

async fn cycle(ctx: &Context, memory: &mut Memory, now: Timestamp) -> Result<()> {
    let seen = observe::cluster(ctx, now).await?;
    policies::report(ctx, &mut memory.unreadable_reported, &seen.unusable, now).await;
    housekeeping::run(ctx, &seen.owners, &seen.workloads, now).await;
    memory
        .quotas
        .keep(
            &ctx.client,
            &seen.policies,
            &seen.namespaces,
            &ctx.settings.resources,
            now,
        )
        .await;
    tracing::info!(
        workloads = seen.workloads.len(),
        gpus = seen.workloads.iter().map(|w| w.gpus).sum::<f64>(),
        policies = seen.policies.len(),
        unusable_policies = seen.unusable.len(),
        %now,
        "evaluating"
    );
    let rules_of: Vec<Rules> = seen
        .policies
        .iter()
        .map(|p| Rules::from_spec(&p.spec))
        .collect();
    let telemetry = observe::telemetry(ctx, &mut memory.live, &rules_of, now).await;
    if telemetry.is_ok() {
        let policies: Vec<(&GpuPolicy, &Rules)> = seen.policies.iter().zip(&rules_of).collect();
        start_histories(ctx, memory, &seen.workloads, &policies, now).await;
    }
    let mut cycle = Cycle {
        now,
        seen: &seen,
        // Policies set aside still choose: what they govern no other policy judges.
        all: seen
            .policies
            .iter()
            .chain(seen.unusable.iter().filter_map(|u| u.stand_in.as_ref()))
            .collect(),
        telemetry_failed: telemetry.err().map(|e| e.to_string()),
        sent: Sent::default(),
    };
    for (policy, rules) in seen.policies.iter().zip(&rules_of) {
        evaluate_policy(ctx, memory, &mut cycle, policy, rules).await;
    }
    memory.last_evaluation = Some(now);
    Ok(())
}

/// One policy: plan, then warn and act on what it judged, then its status.
#[tracing::instrument(
    name = "policy",
    skip_all,
    fields(policy = policy.metadata.name.as_deref().unwrap_or_default())
)]
async fn evaluate_policy(
    ctx: &Context,
    memory: &mut Memory,
    cycle: &mut Cycle<'_>,
    policy: &GpuPolicy,
    rules: &Rules,
) {
    let now = cycle.now;
    let name = policy.metadata.name.clone().unwrap_or_default();
    if let Some(e) = &cycle.telemetry_failed {
        tracing::warn!(policy = %name, error = %e, "telemetry failed: nothing this policy governs is judged this cycle");
        ctx.metrics
            .telemetry_errors
            .get_or_create(&PolicyLabels {
                policy: name.clone(),
            })
            .inc();
        let found = Found::TelemetryFailed(e.clone());
        let problems = cycle.sent.problems.get(&name);
        status::write(
            ctx,
            &mut memory.delivery_outcome,
            policy,
            &found,
            problems,
            now,
        )
        .await;
        return;
    }
    let seen = cycle.seen;
    let observations = memory.live.observe(rules);
    let grouped = by_pod(&observations);
    let plan = judge(ctx, memory, seen, &cycle.all, policy, rules, &grouped, now).await;
    for p in &plan.planned {
        let w = &seen.workloads[p.workload];
        let d = &p.decision;
        tracing::info!(
            policy = %name,
            workload = %w.root.key(),
            gpus = w.gpus,
            observed_gpus = d.verdict.gpu_devices,
            classification = d.verdict.classification.as_str(),
            step = ?d.step,
            reason = %d.reason,
            "decision"
        );
        let judged = Judged {
            policy,
            workload: w,
            decision: d,
            softer: &p.softer,
            model: model_of(w, &grouped),
        };
        if policy.spec.mode == PolicyMode::Enforce && d.step != Step::Warn {
            warn::retry(ctx, &mut cycle.sent, &judged, now).await;
        }
        match d.step {
            Step::Nothing | Step::RateLimited(_) => {}
            Step::Warn => warn::warn(ctx, &mut memory.audit, &mut cycle.sent, &judged, now).await,
            Step::WouldAct(action) => {
                act::would_act(ctx, &mut memory.audit, &judged, action, now).await
            }
            Step::Act(action) => act::act(ctx, &mut cycle.sent, &judged, action, now).await,
        }
    }
    // `action.preWarm`: reclaimed workloads usually busy again soon are woken, through
    // the `gpureaper.io/wake` path (Enforce only: Audit reclaims nothing).
    if policy.spec.mode == PolicyMode::Enforce
        && rules.pre_warm.is_some()
        && ctx.is_leading()
        && let Some(history) = memory.histories.get(&name)
    {
        for (root, pre_warm) in plan::prewarms_due(
            policy,
            &cycle.all,
            &seen.owners,
            &seen.workloads,
            &seen.namespaces,
            history,
            now,
        ) {
            housekeeping::prewarm(ctx, root, &pre_warm, now).await;
        }
    }
    let reclaimed = plan::reclaimed_holdings(policy, &cycle.all, &seen.owners, &seen.namespaces);
    let evaluation = status::evaluation(&plan, &seen.workloads, reclaimed);
    let labels = PolicyLabels {
        policy: name.clone(),
    };
    ctx.metrics
        .governed_gpus
        .get_or_create(&labels)
        .set(plan.gpus.round() as i64);
    ctx.metrics
        .idle_workloads
        .get_or_create(&labels)
        .set(evaluation.counts.idle as i64);
    let found = Found::Evaluated(evaluation);
    let problems = cycle.sent.problems.get(&name);
    status::write(
        ctx,
        &mut memory.delivery_outcome,
        policy,
        &found,
        problems,
        now,
    )
    .await;
}

/// Starts the idle-span history of each of `policies` that has none in memory (start-up,
/// new leader, new policy, or a change of its estimate's settings, which starts them
/// over), replaying recent history into those that use it ([`observe::backfill`]): all
/// together, one read of Prometheus for them all.
async fn start_histories(
    ctx: &Context,
    memory: &mut Memory,
    workloads: &[Workload],
    policies: &[(&GpuPolicy, &Rules)],
    now: Timestamp,
) {
    let mut fresh: Vec<(&str, &Rules, bool, Histories<_>)> = policies
        .iter()
        .filter_map(|(policy, rules)| {
            let name = policy.metadata.name.as_deref().unwrap_or_default();
            memory
                .histories
                .get(name)
                .is_none_or(|h| h.params() != rules.risk)
                .then(|| {
                    let replayed = policy.spec.uses_idle_history();
                    (name, *rules, replayed, Histories::new(rules.risk))
                })
        })
        .collect();
    let mut replayed: Vec<observe::Backfill<'_>> = fresh
        .iter_mut()
        .filter(|(_, _, replayed, _)| *replayed)
        .map(|(name, rules, _, history)| observe::Backfill {
            name,
            rules,
            history,
        })
        .collect();
    observe::backfill(ctx, &mut replayed, workloads, now).await;
    for (name, _, _, history) in fresh {
        memory.histories.insert(name.to_string(), history);
    }
}

/// One policy's plan at `now`, from what the cycle observed: its idle-span history
/// (replayed from Prometheus the first time the policy is evaluated,
/// `--history-backfill`: [`start_histories`], which the cycle runs for every policy first), the
/// span resolution (the time since the previous evaluation), the actions of the last hour
/// on workloads whose pods are gone, then [`plan::plan_with`] (pure). What the cycle warns
/// and acts on, and what `gpu-reaper explain` shows: there is no second copy of this step.
#[allow(clippy::too_many_arguments)]
pub async fn judge(
    ctx: &Context,
    memory: &mut Memory,
    seen: &Observed,
    all: &[&GpuPolicy],
    policy: &GpuPolicy,
    rules: &Rules,
    grouped: &HashMap<(&str, &str), Vec<&GpuObservation>>,
    now: Timestamp,
) -> PolicyPlan {
    let name = policy.metadata.name.clone().unwrap_or_default();
    start_histories(ctx, memory, &seen.workloads, &[(policy, rules)], now).await;
    let history = memory.histories.get_mut(&name).expect("started above");
    let resolution = memory
        .last_evaluation
        .map_or(SignedDuration::from_mins(1), |t| now.duration_since(t))
        .clamp(SignedDuration::from_secs(1), SignedDuration::from_hours(1));
    let acted_without_pods = plan::acted_last_hour_without_pods(
        policy,
        all,
        &seen.owners,
        &seen.workloads,
        &seen.namespaces,
        now,
    );
    plan::plan_with(
        policy,
        all,
        &seen.workloads,
        &seen.namespaces,
        grouped,
        &memory.audit,
        history,
        resolution,
        now,
        acted_without_pods,
    )
}

/// The DCGM model name of a workload's GPUs (the first observed), or empty.
fn model_of(w: &Workload, grouped: &HashMap<(&str, &str), Vec<&GpuObservation>>) -> String {
    w.pods
        .iter()
        .filter_map(|p| grouped.get(&(p.meta.namespace.as_str(), p.meta.name.as_str())))
        .flatten()
        .map(|o| o.model.clone())
        .find(|m| !m.is_empty())
        .unwrap_or_default()
}
