//! Classification: is a workload Active, Idle (and in what shape), without telemetry,
//! too young, exempt or snoozed — with the evidence in one sentence.
//!
//! Invariants held here (DESIGN.md §4): absence of telemetry is never idleness unless the
//! policy says `TreatAsIdle` (1); nothing young, exempt or snoozed is judged (2); a
//! workload is idle only if all its GPUs are idle (3).

use jiff::{SignedDuration, Timestamp};

use super::model::{
    Classification, GpuObservation, IdleShape, LadderState, PodPhase, PodState, Verdict,
    WorkloadMeta,
};
use super::rules::Rules;
use crate::api::keys;

/// Classifies `meta` at `now` from its pods and the observations of their GPUs.
pub fn classify(
    rules: &Rules,
    meta: &WorkloadMeta,
    pods: &[PodState],
    gpus: &[GpuObservation],
    ladder: &LadderState,
    now: Timestamp,
) -> Verdict {
    let holding: Vec<(usize, &PodState)> = pods
        .iter()
        .enumerate()
        .filter(|(_, p)| !matches!(p.phase, PodPhase::Succeeded | PodPhase::Failed))
        .collect();
    let gpu_devices: u32 = holding.iter().map(|(_, p)| p.gpu_devices).sum();
    let observed_share: f64 = gpus
        .iter()
        .filter(|g| holding.iter().any(|(i, _)| *i == g.pod))
        .map(|g| g.share)
        .sum();
    let observed_count = gpus
        .iter()
        .filter(|g| holding.iter().any(|(i, _)| *i == g.pod))
        .count() as u32;
    let gpu_share = observed_share + f64::from(gpu_devices.saturating_sub(observed_count));
    let verdict = |classification, idle_since, reason: String| Verdict {
        classification,
        idle_since,
        gpu_devices,
        gpu_share,
        reason,
    };

    if meta
        .labels
        .get(keys::EXEMPT_LABEL)
        .is_some_and(|v| v == "true")
    {
        return verdict(
            Classification::Exempt,
            None,
            format!("labelled {}=true", keys::EXEMPT_LABEL),
        );
    }
    let mut snooze_note = String::new();
    if let Some(until) = ladder.snooze_until.filter(|u| *u > now) {
        if until.duration_since(now) <= rules.max_snooze {
            return verdict(
                Classification::Snoozed,
                None,
                format!("snoozed until {until}"),
            );
        }
        snooze_note = format!(
            "; {} {until} is more than exemptions.maxSnooze ({}) ahead and is ignored",
            keys::SNOOZE_UNTIL,
            human(rules.max_snooze)
        );
    }
    let age = now.duration_since(meta.created_at);
    if age < rules.startup_grace {
        return verdict(
            Classification::TooYoung,
            None,
            format!(
                "{} old, younger than idle.startupGrace ({}){snooze_note}",
                human(age),
                human(rules.startup_grace)
            ),
        );
    }
    if gpu_devices == 0 {
        return verdict(
            Classification::Active,
            None,
            format!("holds no GPUs now{snooze_note}"),
        );
    }

    // The idle clock runs only as far as the telemetry reaches (an outage, or a scrape
    // not read yet, is not idleness; invariant 1).
    let seen_until = gpus
        .iter()
        .filter_map(|g| g.data_until)
        .min()
        .map_or(now, |t| t.min(now));
    // Invariant 3: one busy GPU anywhere makes the whole workload busy.
    let busy_horizon = seen_until - rules.window;
    if let Some(g) = gpus
        .iter()
        .filter(|g| g.last_busy_at.is_some_and(|b| b > busy_horizon))
        .max_by(|a, b| {
            a.last_busy_at
                .cmp(&b.last_busy_at)
                .then_with(|| b.id.cmp(&a.id))
        })
    {
        let ago = now.duration_since(g.last_busy_at.unwrap_or(now));
        return verdict(
            Classification::Active,
            None,
            format!(
                "{} was busy {} ago (within idle.window {}){snooze_note}",
                g.id,
                human(ago),
                human(rules.window)
            ),
        );
    }

    let mut running_clock: Option<Timestamp> = None;
    let mut stuck_clock: Option<Timestamp> = None;
    let mut starting: Option<(&PodState, Timestamp)> = None;
    let mut stuck_reason: Option<&str> = None;
    let mut blind = 0u32;
    let mut running_pods = 0u32;
    let mut memory_held = false;
    let mut starved = false;
    for &(index, pod) in &holding {
        if pod.is_stuck() {
            let since = pod.stuck_since.unwrap_or(meta.created_at);
            if now.duration_since(since) < rules.provisioning_grace {
                starting = Some((pod, since));
            } else {
                stuck_clock = stuck_clock.max(Some(since));
                stuck_reason = pod.waiting_reason.as_deref().or(Some("Pending"));
            }
            continue;
        }
        running_pods += 1;
        let mut observed = 0u32;
        for g in gpus.iter().filter(|g| g.pod == index) {
            observed += 1;
            let is_blind = g.coverage <= 0.0 || g.coverage < rules.min_coverage;
            if is_blind {
                blind += 1;
                if !rules.treat_missing_as_idle {
                    continue;
                }
            }
            let mut start = g
                .last_busy_at
                .or(g.first_sample_at)
                .unwrap_or(meta.created_at);
            if !rules.treat_missing_as_idle {
                start = start.max(g.blind_until.unwrap_or(start));
            }
            running_clock = running_clock.max(Some(start));
            memory_held |= g.fb_used_mib.is_some_and(|fb| fb >= rules.memory_held_mib);
            starved |= g
                .pcie_rx_bytes_per_second
                .is_some_and(|rx| rx >= rules.data_starved_pcie);
        }
        let missing = pod.gpu_devices.saturating_sub(observed);
        blind += missing;
        if missing > 0 && rules.treat_missing_as_idle {
            running_clock = running_clock.max(Some(meta.created_at));
        }
    }

    if let Some((pod, since)) = starting {
        let why = pod.waiting_reason.as_deref().unwrap_or("Pending");
        return verdict(
            Classification::Active,
            None,
            format!(
                "a pod is starting ({why} for {}, within idle.provisioningGrace {}){snooze_note}",
                human(now.duration_since(since)),
                human(rules.provisioning_grace)
            ),
        );
    }
    if blind > 0 && !rules.treat_missing_as_idle {
        return verdict(
            Classification::NoTelemetry,
            None,
            format!(
                "{blind} of {gpu_devices} GPUs have samples for less than {:.0} % of the last {} (idle.minCoverage); missing telemetry is never idleness{snooze_note}",
                rules.min_coverage * 100.0,
                human(rules.window)
            ),
        );
    }

    let running_clock = running_clock.map(|c| c.max(meta.created_at));
    let idle_since = running_clock.max(stuck_clock).unwrap_or(meta.created_at);
    if let Some(clock) = running_clock.filter(|_| running_pods > 0) {
        let idle_for = seen_until.duration_since(clock);
        if idle_for < rules.window {
            return verdict(
                Classification::Active,
                None,
                format!(
                    "all GPUs below {:.0} % for {}, less than idle.window ({}){snooze_note}",
                    rules.threshold * 100.0,
                    human(idle_for),
                    human(rules.window)
                ),
            );
        }
    }

    let shape = if starved {
        IdleShape::DataStarved
    } else if stuck_clock.is_some() {
        IdleShape::Provisioning
    } else if memory_held {
        IdleShape::MemoryHeld
    } else {
        IdleShape::Unused
    };
    let idle_for = human(now.duration_since(idle_since));
    let reason = match shape {
        IdleShape::DataStarved => format!(
            "all {gpu_devices} GPUs below {:.0} % for {idle_for} while PCIe receive is high: waiting on data",
            rules.threshold * 100.0
        ),
        IdleShape::Provisioning => format!(
            "GPUs bound to a pod that is not running ({}) for {idle_for}",
            stuck_reason.unwrap_or("Pending")
        ),
        IdleShape::MemoryHeld => format!(
            "all {gpu_devices} GPUs below {:.0} % for {idle_for} while holding memory (model loaded, no work)",
            rules.threshold * 100.0
        ),
        IdleShape::Unused => format!(
            "all {gpu_devices} GPUs below {:.0} % for {idle_for} with memory empty (allocated, unused)",
            rules.threshold * 100.0
        ),
    };
    verdict(
        Classification::Idle(shape),
        Some(idle_since),
        format!("{reason}{snooze_note}"),
    )
}

/// `1h30m`, `45m`, `20s`: durations as people write them.
pub fn human(d: SignedDuration) -> String {
    let s = d.as_secs();
    let sign = if s < 0 { "-" } else { "" };
    let s = s.unsigned_abs();
    let (h, m, sec) = (s / 3600, (s % 3600) / 60, s % 60);
    match (h, m, sec) {
        (0, 0, sec) => format!("{sign}{sec}s"),
        (0, m, 0) => format!("{sign}{m}m"),
        (0, m, sec) => format!("{sign}{m}m{sec}s"),
        (h, 0, _) => format!("{sign}{h}h"),
        (h, m, _) => format!("{sign}{h}h{m}m"),
    }
}
