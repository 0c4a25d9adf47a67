//! Table, JSON and CSV renderings of a backtest.

use std::fmt::Write;

use jiff::Timestamp;

use crate::backtest::{Backtest, CONTROLLER_BACKFILL};
use crate::engine::classify::human;

/// JSON with a stable schema (documented in docs/backtest.md).
pub fn json(b: &Backtest) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(b)
}

const CSV_HEADER: &str = "namespace,kind,name,gpus,classification,idle_gpu_hours,warned_at,acted_at,action,reclaimed_gpu_hours,reclaimed_usd,regret";

/// One row per workload, columns as the JSON `workloads[]` fields.
pub fn csv(b: &Backtest) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for w in &b.workloads {
        let fields = [
            csv_field(&w.namespace),
            csv_field(&w.kind),
            csv_field(&w.name),
            w.gpus.to_string(),
            csv_field(&w.classification),
            format!("{:.3}", w.idle_gpu_hours),
            opt_ts(w.warned_at),
            opt_ts(w.acted_at),
            w.action.map(|a| format!("{a:?}")).unwrap_or_default(),
            format!("{:.3}", w.reclaimed_gpu_hours),
            format!("{:.2}", w.reclaimed_usd),
            w.regret.to_string(),
        ];
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn opt_ts(t: Option<Timestamp>) -> String {
    t.map(|t| t.to_string()).unwrap_or_default()
}

/// A readable table and summary.
pub fn table(b: &Backtest) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Backtest of policy {} ({} mode simulated as Enforce) from {} to {}, evaluated every {}s; regret horizon {}h\n",
        b.policy,
        b.mode,
        b.start,
        b.end,
        b.step_seconds,
        b.regret_horizon_seconds as f64 / 3600.0
    );
    let headers = [
        "NAMESPACE",
        "KIND",
        "NAME",
        "GPUS",
        "CLASSIFICATION",
        "IDLE GPU-H",
        "WARNED",
        "ACTED",
        "RECLAIMED GPU-H",
        "USD",
        "REGRET",
    ];
    let hhmm = |t: Option<Timestamp>| {
        t.map(|t| t.strftime("%H:%M").to_string())
            .unwrap_or_else(|| "-".into())
    };
    let rows: Vec<[String; 11]> = b
        .workloads
        .iter()
        .map(|w| {
            [
                w.namespace.clone(),
                w.kind.clone(),
                w.name.clone(),
                w.gpus.to_string(),
                w.classification.clone(),
                format!("{:.1}", w.idle_gpu_hours),
                hhmm(w.warned_at),
                match (w.acted_at, w.action) {
                    (Some(_), Some(a)) => format!("{} {a:?}", hhmm(w.acted_at)),
                    _ => "-".into(),
                },
                format!("{:.1}", w.reclaimed_gpu_hours),
                format!("{:.0}", w.reclaimed_usd),
                if w.regret { "yes".into() } else { "-".into() },
            ]
        })
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let _ = write!(s, "{:<w$}  ", c, w = widths[i]);
        }
        s.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(headers.to_vec()));
    for r in &rows {
        let _ = writeln!(out, "{}", line(r.iter().map(String::as_str).collect()));
    }
    let s = &b.summary;
    let _ = writeln!(
        out,
        "\n{} workloads on {} GPUs ({} GPUs unallocated), {:.1} GPU-hours held.",
        s.workloads, s.governed_gpus, s.unallocated_gpus, s.gpu_hours
    );
    let _ = writeln!(
        out,
        "Idle:      {:.1} GPU-hours ({:.0} % of held)",
        s.idle_gpu_hours,
        s.idle_share * 100.0
    );
    let _ = writeln!(
        out,
        "Reclaimed: {:.1} GPU-hours ({:.0} % of held), {:.0} USD",
        s.reclaimed_gpu_hours,
        s.reclaimed_share * 100.0,
        s.reclaimed_usd
    );
    let _ = writeln!(
        out,
        "Warnings:  {}   Actions: {}   Regrets: {} ({:.0} % of actions)   Deferred by maxPerHour: {}",
        s.warnings,
        s.actions,
        s.regrets,
        s.regret_rate * 100.0,
        s.rate_limited
    );
    if s.unsupported > 0 {
        let _ = writeln!(
            out,
            "Unsupported: {} workload(s) whose kind the policy's action does not apply to (nothing reclaimed; see last_reason in --format json)",
            s.unsupported
        );
    }
    let w = &s.prewarm;
    if w.wakes > 0 {
        let _ = writeln!(
            out,
            "Pre-warm:  {} wake(s) before the predicted use: {} warm start(s), {} unused; {:.1} GPU-hours held warm before use; {} regret(s) avoided",
            w.wakes, w.warm_starts, w.unused, w.warm_gpu_hours, w.regrets_avoided
        );
    }
    out
}

/// `backtest --sweep` as a table: one row per variant (a risk level also against the
/// fixed curve at its regret rate), then which variant beats each fixed rule. `cold`: the
/// policy learns from the idle history and the replay started with none.
pub fn sweep_table(policy: &str, points: &[crate::backtest::sweep::Point], cold: bool) -> String {
    use crate::backtest::sweep::{CurvePosition, Family};
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Sweep of policy {policy}: reclaimed GPU-hours against regret rate (maxPerHour lifted; other tools' rules act at once, without warning)\n"
    );
    let _ = writeln!(
        out,
        "{:<10} {:<36} {:>8} {:>8} {:>8} {:>14}  VS THE FIXED CURVE AT THAT REGRET RATE",
        "FAMILY", "VARIANT", "ACTIONS", "REGRETS", "REGRET", "RECLAIMED GPU-H"
    );
    for p in points {
        let versus = p.vs_fixed.as_ref().map_or(String::new(), |v| {
            let margin = v.margin_gpu_hours;
            match v.position {
                CurvePosition::Inside => format!(
                    "{margin:+.0} GPU-h ({} at that rate: {:.0})",
                    v.against, v.curve_gpu_hours
                ),
                CurvePosition::Below => format!(
                    "{margin:+.0} GPU-h, fewer regrets than every fixed duration ({}: {:.0})",
                    v.against, v.curve_gpu_hours
                ),
                CurvePosition::Above => format!(
                    "{margin:+.0} GPU-h, more regrets than every fixed duration ({}: {:.0})",
                    v.against, v.curve_gpu_hours
                ),
            }
        });
        let row = format!(
            "{:<10} {:<36} {:>8} {:>8} {:>7.1}% {:>14.1}  {versus}",
            format!("{:?}", p.family),
            p.label,
            p.actions,
            p.regrets,
            p.regret_rate * 100.0,
            p.reclaimed_gpu_hours
        );
        // Rows without a comparison end at the GPU-hours.
        let _ = writeln!(out, "{}", row.trim_end());
    }
    let _ = writeln!(out);
    let calibrated: Vec<_> = points
        .iter()
        .filter_map(|p| p.calibration.as_ref().map(|c| (p, c)))
        .collect();
    if !calibrated.is_empty() {
        let _ = writeln!(
            out,
            "Calibration: maxResumeRisk asked against the regret rate realised by the actions the estimate allowed (the rest came by idle.maxIdle whatever the estimate: at it, or before it where waiting for it was expected to regret more). Within noise: a one-sided exact binomial test, P(at least that many regrets if each allowed action regretted with the probability asked) >= {:.0} %.\n",
            crate::backtest::sweep::CALIBRATION_ALPHA * 100.0
        );
        let _ = writeln!(
            out,
            "{:<36} {:>6} {:>16} {:>9} {:>10} {:>9} {:>9} {:<22} {:>14} {:>9}",
            "VARIANT",
            "ASKED",
            "ALLOWED: REGRETS",
            "REALISED",
            "ESTIMATED",
            "UPPER 95",
            "P",
            "VERDICT",
            "BY MAXIDLE",
            "ALL: P"
        );
        for (p, c) in calibrated {
            let verdict = if c.actions == 0 {
                "no action allowed"
            } else if c.within_noise {
                "within the noise"
            } else {
                "above the promise"
            };
            let _ = writeln!(
                out,
                "{:<36} {:>5.0}% {:>16} {:>8.1}% {:>9.1}% {:>8.1}% {:>9.3} {:<22} {:>14} {:>9.3}",
                p.label,
                c.asked * 100.0,
                format!("{} of {}", c.regrets, c.actions),
                c.realised * 100.0,
                c.mean_estimated_risk * 100.0,
                c.upper_bound_95 * 100.0,
                c.p_value,
                verdict,
                format!("{} of {}", c.ceiling_regrets, c.ceiling_actions),
                c.all_p_value,
            );
        }
        let _ = writeln!(out);
    }
    let warmed: Vec<_> = points
        .iter()
        .filter_map(|p| p.prewarm.as_ref().map(|w| (p, w)))
        .collect();
    if !warmed.is_empty() {
        let _ = writeln!(
            out,
            "Pre-warm (action.preWarm): a reclaimed workload woken before its predicted use ends its reclaim there (not a regret). Warm start: busy again within the regret horizon of the wake; unused: not; warm GPU-h: held idle from the wake to the first use or the next action (the cost); regrets avoided: uses within the regret horizon of the action that found it warm.\n"
        );
        let _ = writeln!(
            out,
            "{:<36} {:>6} {:>11} {:>7} {:>12} {:>16}",
            "VARIANT", "WAKES", "WARM STARTS", "UNUSED", "WARM GPU-H", "REGRETS AVOIDED"
        );
        for (p, w) in warmed {
            let _ = writeln!(
                out,
                "{:<36} {:>6} {:>11} {:>7} {:>12.1} {:>16}",
                p.label, w.wakes, w.warm_starts, w.unused, w.warm_gpu_hours, w.regrets_avoided
            );
        }
        let _ = writeln!(out);
    }
    for (family, what) in [
        (Family::Risk, "risk levels"),
        (Family::PreWarm, "pre-warm variants"),
    ] {
        let compared: Vec<_> = points
            .iter()
            .filter(|p| p.family == family)
            .filter_map(|p| p.vs_fixed.as_ref())
            .collect();
        if compared.is_empty() {
            continue;
        }
        let above = compared
            .iter()
            .filter(|v| v.position != CurvePosition::Above && v.margin_gpu_hours > 0.0)
            .count();
        let _ = writeln!(
            out,
            "{above} of {} {what} are above the fixed curve without pre-warm (more GPU-hours at the same or a lower regret rate)",
            compared.len()
        );
    }
    for (fixed, better) in crate::backtest::sweep::risk_dominates_fixed(points) {
        let _ = match better {
            Some(r) => writeln!(
                out,
                "{fixed}: beaten by {r} (as many GPU-hours or more, regret rate no higher)"
            ),
            None => writeln!(out, "{fixed}: not beaten by any risk level"),
        };
    }
    if let Some(o) = points.iter().find(|p| p.family == Family::Oracle) {
        let _ = writeln!(
            out,
            "\n{}: acts that long into exactly the idle spans that do not resume within the regret horizon. It knows when each span ends, so nothing can follow it: it is what there is to reclaim without a regret ({:.1} GPU-hours).",
            o.label, o.reclaimed_gpu_hours
        );
    }
    if cold {
        let _ = writeln!(
            out,
            "\nnote: this is a controller installed at the trace's start, with no idle history before it: the risk levels wait (up to idle.maxIdle) until they have comparable spans. --warmup D replays one installed D later, whose start-up backfill reads back the last --history-backfill of those D ({} by default; the calendar of the risk estimate needs 3 days: 72h or more).",
            human(CONTROLLER_BACKFILL)
        );
    }
    out
}

/// `backtest --sweep --format csv`.
pub fn sweep_csv(points: &[crate::backtest::sweep::Point]) -> String {
    let mut out = String::from(
        "family,variant,actions,regrets,regret_rate,reclaimed_gpu_hours,fixed_curve_gpu_hours,margin_gpu_hours,asked_risk,allowed_actions,allowed_regrets,realised_risk,mean_estimated_risk,upper_bound_95,p_value,within_noise,ceiling_actions,ceiling_regrets,all_p_value,all_within_noise,prewarm_wakes,prewarm_warm_starts,prewarm_unused,prewarm_warm_gpu_hours,prewarm_regrets_avoided\n",
    );
    for p in points {
        let calibration = p
            .calibration
            .as_ref()
            .map_or(",,,,,,,,,,,".to_string(), |c| {
                format!(
                    "{:.4},{},{},{:.4},{:.4},{:.4},{:.6},{},{},{},{:.6},{}",
                    c.asked,
                    c.actions,
                    c.regrets,
                    c.realised,
                    c.mean_estimated_risk,
                    c.upper_bound_95,
                    c.p_value,
                    c.within_noise,
                    c.ceiling_actions,
                    c.ceiling_regrets,
                    c.all_p_value,
                    c.all_within_noise
                )
            });
        let (curve, margin) = p
            .vs_fixed
            .as_ref()
            .map_or((String::new(), String::new()), |v| {
                (
                    format!("{:.3}", v.curve_gpu_hours),
                    format!("{:.3}", v.margin_gpu_hours),
                )
            });
        let prewarm = p.prewarm.as_ref().map_or(",,,,".to_string(), |w| {
            format!(
                "{},{},{},{:.3},{}",
                w.wakes, w.warm_starts, w.unused, w.warm_gpu_hours, w.regrets_avoided
            )
        });
        let _ = writeln!(
            out,
            "{:?},{},{},{},{:.4},{:.3},{curve},{margin},{calibration},{prewarm}",
            p.family,
            csv_field(&p.label),
            p.actions,
            p.regrets,
            p.regret_rate,
            p.reclaimed_gpu_hours
        );
    }
    out
}
