//! `gpu-reaper audit`: a read-only waste report of the last hours. It replays the history
//! Prometheus holds through the engine with a warn-only copy of the policy (nothing is
//! "reclaimed", so every idle hour is counted) and sums by namespace and workload.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::api::policy::{ActionType, PolicyMode};
use crate::backtest::{self, Backtest, BacktestOptions};
use crate::cli::{AuditArgs, OutputFormat};
use crate::error::Result;
use crate::report::backtest::{fetch_trace, load_policy, time_range};
use crate::telemetry::trace::{ReadOptions, Trace};

/// Waste of one namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NamespaceWaste {
    pub namespace: String,
    pub workloads: usize,
    pub gpus: u32,
    pub gpu_hours: f64,
    /// Share of held GPU-hours classified Active.
    pub active_share: f64,
    /// Idle GPU-hours by shape (`MemoryHeld`, `Unused`, `Provisioning`, `DataStarved`).
    pub idle_gpu_hours_by_shape: BTreeMap<String, f64>,
    pub idle_gpu_hours: f64,
    /// GPU-hours without enough telemetry to judge.
    pub no_telemetry_gpu_hours: f64,
    pub idle_usd: f64,
}

/// One offender.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Offender {
    pub namespace: String,
    pub kind: String,
    pub name: String,
    pub gpus: u32,
    pub classification: String,
    pub idle_gpu_hours: f64,
    pub idle_usd: f64,
}

/// The audit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Audit {
    pub start: jiff::Timestamp,
    pub end: jiff::Timestamp,
    pub namespaces: Vec<NamespaceWaste>,
    pub top_offenders: Vec<Offender>,
    pub total: NamespaceWaste,
    pub unallocated_gpus: usize,
}

/// Runs the command and prints the report.
pub fn run(args: &AuditArgs) -> Result<()> {
    let policy = load_policy(args.policy.as_deref())?;
    let (from, to) = time_range(&args.since, None)?;
    let trace = fetch_trace(
        &args.prometheus,
        from,
        to,
        &ReadOptions {
            step_seconds: 60,
            skip_unknown_metrics: true,
            workload_labels: crate::report::backtest::workload_labels(&args.prometheus),
        },
    )?;
    let audit = audit(&policy.spec, &trace, args.top);
    print!("{}", render(&audit, args.format)?);
    Ok(())
}

/// Pure: the audit of `trace` under the idle rules and prices of `spec`.
pub fn audit(spec: &crate::api::GpuPolicySpec, trace: &Trace, top: usize) -> Audit {
    let mut warn_only = spec.clone();
    warn_only.mode = PolicyMode::Audit;
    warn_only.action.type_ = ActionType::None;
    let replay = backtest::run(
        "audit",
        &warn_only,
        trace,
        &BacktestOptions {
            regret_horizon: jiff::SignedDuration::ZERO,
            keep_timelines: false,
        },
    );
    summarise(&replay, top)
}

fn summarise(b: &Backtest, top: usize) -> Audit {
    let mut by_ns: BTreeMap<&str, NamespaceWaste> = BTreeMap::new();
    let mut total = NamespaceWaste {
        namespace: "(all)".into(),
        ..NamespaceWaste::default()
    };
    for w in &b.workloads {
        for ns in [
            by_ns.entry(&w.namespace).or_insert_with(|| NamespaceWaste {
                namespace: w.namespace.clone(),
                ..NamespaceWaste::default()
            }),
            &mut total,
        ] {
            ns.workloads += 1;
            ns.gpus += w.gpus;
            ns.idle_gpu_hours += w.idle_gpu_hours;
            ns.idle_usd += w.idle_usd;
            for (class, hours) in &w.gpu_hours_by_class {
                ns.gpu_hours += hours;
                if let Some(shape) = class.strip_prefix("Idle/") {
                    *ns.idle_gpu_hours_by_shape
                        .entry(shape.to_string())
                        .or_default() += hours;
                } else if class == "Active" {
                    ns.active_share += hours; // hours for now; divided below
                } else if class == "NoTelemetry" {
                    ns.no_telemetry_gpu_hours += hours;
                }
            }
        }
    }
    let mut namespaces: Vec<NamespaceWaste> = by_ns.into_values().collect();
    for ns in namespaces.iter_mut().chain(std::iter::once(&mut total)) {
        ns.active_share = if ns.gpu_hours > 0.0 {
            ns.active_share / ns.gpu_hours
        } else {
            0.0
        };
    }
    namespaces.sort_by(|a, b| {
        b.idle_usd
            .total_cmp(&a.idle_usd)
            .then_with(|| a.namespace.cmp(&b.namespace))
    });
    let mut offenders: Vec<Offender> = b
        .workloads
        .iter()
        .filter(|w| w.idle_gpu_hours > 0.0)
        .map(|w| Offender {
            namespace: w.namespace.clone(),
            kind: w.kind.clone(),
            name: w.name.clone(),
            gpus: w.gpus,
            classification: w.classification.clone(),
            idle_gpu_hours: w.idle_gpu_hours,
            idle_usd: w.idle_usd,
        })
        .collect();
    offenders.sort_by(|a, b| {
        b.idle_usd
            .total_cmp(&a.idle_usd)
            .then_with(|| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
    });
    offenders.truncate(top);
    Audit {
        start: b.start,
        end: b.end,
        namespaces,
        top_offenders: offenders,
        total,
        unallocated_gpus: b.summary.unallocated_gpus,
    }
}

/// Table, JSON or CSV (one row per namespace).
pub fn render(a: &Audit, format: OutputFormat) -> Result<String> {
    const SHAPES: [&str; 4] = ["MemoryHeld", "Unused", "Provisioning", "DataStarved"];
    let shape =
        |ns: &NamespaceWaste, s: &str| ns.idle_gpu_hours_by_shape.get(s).copied().unwrap_or(0.0);
    Ok(match format {
        OutputFormat::Json => serde_json::to_string_pretty(a)? + "\n",
        OutputFormat::Csv => {
            let mut out = String::from(
                "namespace,workloads,gpus,gpu_hours,active_share,idle_gpu_hours,memory_held,unused,provisioning,data_starved,no_telemetry_gpu_hours,idle_usd\n",
            );
            for ns in a.namespaces.iter().chain(std::iter::once(&a.total)) {
                let _ = writeln!(
                    out,
                    "{},{},{},{:.3},{:.4},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.2}",
                    ns.namespace,
                    ns.workloads,
                    ns.gpus,
                    ns.gpu_hours,
                    ns.active_share,
                    ns.idle_gpu_hours,
                    shape(ns, SHAPES[0]),
                    shape(ns, SHAPES[1]),
                    shape(ns, SHAPES[2]),
                    shape(ns, SHAPES[3]),
                    ns.no_telemetry_gpu_hours,
                    ns.idle_usd
                );
            }
            out
        }
        OutputFormat::Table => {
            let mut out = String::new();
            let _ = writeln!(
                out,
                "GPU waste from {} to {} (read-only audit)\n",
                a.start, a.end
            );
            let _ = writeln!(
                out,
                "{:<16} {:>9} {:>5} {:>9} {:>7} {:>9} {:>11} {:>7} {:>12} {:>11} {:>9}",
                "NAMESPACE",
                "WORKLOADS",
                "GPUS",
                "GPU-H",
                "ACTIVE",
                "IDLE GPU-H",
                "MEMORY-HELD",
                "UNUSED",
                "PROVISIONING",
                "DATA-STARVED",
                "IDLE USD"
            );
            for ns in a.namespaces.iter().chain(std::iter::once(&a.total)) {
                let _ = writeln!(
                    out,
                    "{:<16} {:>9} {:>5} {:>9.1} {:>6.0}% {:>10.1} {:>11.1} {:>7.1} {:>12.1} {:>12.1} {:>9.0}",
                    ns.namespace,
                    ns.workloads,
                    ns.gpus,
                    ns.gpu_hours,
                    ns.active_share * 100.0,
                    ns.idle_gpu_hours,
                    shape(ns, SHAPES[0]),
                    shape(ns, SHAPES[1]),
                    shape(ns, SHAPES[2]),
                    shape(ns, SHAPES[3]),
                    ns.idle_usd
                );
            }
            let _ = writeln!(out, "\nTop offenders by idle dollars:");
            for (i, o) in a.top_offenders.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "{:>2}. {}/{} {} — {} GPU, {}, {:.1} idle GPU-hours, {:.0} USD",
                    i + 1,
                    o.namespace,
                    o.kind,
                    o.name,
                    o.gpus,
                    o.classification,
                    o.idle_gpu_hours,
                    o.idle_usd
                );
            }
            if a.unallocated_gpus > 0 {
                let _ = writeln!(
                    out,
                    "\n{} GPUs reported by DCGM had no workload (unallocated capacity).",
                    a.unallocated_gpus
                );
            }
            out
        }
    })
}
