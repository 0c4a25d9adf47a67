//! `gpu-reaper audit`: the command's edge. Reads the history from Prometheus (and, with
//! `--kubeconfig`, the GPU workloads the API server resolves), then hands them to the pure
//! audit in `report::audit`; `--check` asks Prometheus what gpu-reaper needs.

use super::backtest::{fetch_trace, load_policy, time_range};
use crate::cli::AuditArgs;
use crate::cluster::inventory::Workload;
use crate::error::Result;
use crate::report::audit::{Check, Readiness, attribute, audit, render};
use crate::telemetry::trace::ReadOptions;

/// Runs the command and prints the report.
pub fn run(args: &AuditArgs) -> Result<()> {
    if args.check {
        let (from, to) = time_range(args.since, None)?;
        let report = super::block_on(readiness(&args.prometheus, to - from, to))??;
        print!("{}", report.render());
        return if report.ready() {
            Ok(())
        } else {
            Err(crate::Error::NotReady(report.failed()))
        };
    }
    let policy = load_policy(args.policy.as_deref())?;
    let (from, to) = time_range(args.since, args.to)?;
    let (mut trace, _) = fetch_trace(
        &args.prometheus,
        from,
        to,
        &ReadOptions {
            step_seconds: 60,
            skip_unknown_metrics: true,
            workload_labels: super::workload_labels(&args.prometheus),
        },
    )?;
    let attribution = match &args.kubeconfig {
        Some(path) => Some(attribute(
            &mut trace,
            &super::block_on(cluster_workloads(path))??,
        )),
        None => None,
    };
    let mut audit = audit(&policy.spec, &trace, args.top);
    audit.attribution = attribution;
    print!("{}", render(&audit, super::output_format(args.format))?);
    Ok(())
}

/// The GPU workloads the API server at `kubeconfig` resolves now: the same listing and
/// owner kinds as `controller --once`.
async fn cluster_workloads(kubeconfig: &std::path::Path) -> Result<Vec<Workload>> {
    let fail = |message: String| crate::Error::InvalidArgument {
        flag: "kubeconfig",
        message: format!("{}: {message}", kubeconfig.display()),
    };
    let file = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| fail(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .map_err(|e| fail(e.to_string()))?;
    let client = kube::Client::try_from(config).map_err(|source| crate::Error::Kube {
        action: "building the Kubernetes client".into(),
        source,
    })?;
    let owner_kinds =
        crate::cluster::discovery::owner_resources(&client, crate::cluster::discovery::OWNER_KINDS)
            .await;
    let (pods, owners) = crate::cluster::snapshot::gpu_pods_and_owners(
        &client,
        &crate::gpus::GpuResources::default(),
        &owner_kinds,
        jiff::Timestamp::now(),
    )
    .await?;
    Ok(crate::cluster::inventory::resolve(pods, &owners))
}

/// Asks Prometheus what gpu-reaper needs, looking back `lookback` seconds from `at`.
pub async fn readiness(
    args: &crate::cli::PrometheusArgs,
    lookback: i64,
    at: i64,
) -> Result<Readiness> {
    use crate::telemetry::prometheus::PrometheusSource;
    use prometheus_http_query::response::Data;
    let source = PrometheusSource::new(super::prometheus_config(args)?)?;
    let range = format!("{}s", lookback.max(60));
    let mut checks = Vec::new();
    // One number per query; a failed query is itself a failed check.
    let scalar = async |query: String| -> std::result::Result<f64, String> {
        match source.instant(&query, at).await {
            Ok(Data::Vector(v)) => Ok(v.first().map_or(0.0, |s| s.sample().value())),
            Ok(_) => Err(format!("`{query}` did not return a vector")),
            Err(e) => Err(e.to_string()),
        }
    };
    let count =
        |family: &str, extra: &str| format!("count(last_over_time({family}{extra}[{range}]))");

    let engine = scalar(count("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "")).await;
    if let Err(e) = &engine {
        checks.push(Check {
            what: "Prometheus answers".into(),
            ok: false,
            detail: e.clone(),
        });
        return Ok(Readiness { checks });
    }
    checks.push(Check {
        what: "Prometheus answers".into(),
        ok: true,
        detail: source_url(args),
    });
    let engine = engine.unwrap_or(0.0);
    let util = scalar(count("DCGM_FI_DEV_GPU_UTIL", ""))
        .await
        .unwrap_or(0.0);
    checks.push(Check {
        what: "DCGM exporter is scraped".into(),
        ok: engine + util > 0.0,
        detail: if engine + util > 0.0 {
            format!("{engine:.0} GPUs with GR_ENGINE_ACTIVE, {util:.0} with GPU_UTIL")
        } else {
            format!("no DCGM_FI_* GPU series in the last {range}: deploy dcgm-exporter and a ServiceMonitor/scrape job for it")
        },
    });
    let only_util = scalar(format!(
        "count(last_over_time(DCGM_FI_DEV_GPU_UTIL[{range}]) unless on(UUID) last_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE[{range}]))"
    ))
    .await
    .unwrap_or(0.0);
    checks.push(Check {
        what: "profiling metrics (GR_ENGINE_ACTIVE)".into(),
        ok: only_util == 0.0,
        detail: if only_util == 0.0 {
            "every GPU reports DCGM_FI_PROF_GR_ENGINE_ACTIVE".into()
        } else {
            format!("{only_util:.0} GPUs report only GPU_UTIL (busy whenever any kernel ran): enable DCGM_FI_PROF_GR_ENGINE_ACTIVE in the exporter's metrics CSV, where the GPU supports it")
        },
    });
    let attributed = scalar(count(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        r#"{pod!~"(.*dcgm-exporter.*)?"}"#,
    ))
    .await
    .unwrap_or(0.0)
        + scalar(count(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            r#"{exported_pod!=""}"#,
        ))
        .await
        .unwrap_or(0.0);
    checks.push(Check {
        what: "GPUs attributed to pods".into(),
        ok: attributed > 0.0,
        detail: if attributed > 0.0 {
            format!("{attributed:.0} GPU series carry a workload's pod label (native or exported_*)")
        } else {
            "no series names a workload pod: run dcgm-exporter with --kubernetes (GPU Operator default)".into()
        },
    });
    let ksm = scalar(count(
        "kube_pod_container_resource_requests",
        r#"{resource=~"nvidia_com_.*"}"#,
    ))
    .await
    .unwrap_or(0.0);
    checks.push(Check {
        what: "kube-state-metrics GPU requests".into(),
        ok: ksm > 0.0,
        detail: if ksm > 0.0 {
            format!("{ksm:.0} containers request GPUs")
        } else {
            "no kube_pod_container_resource_requests{resource=~\"nvidia_com_.*\"}: install kube-state-metrics (needed by audit and backtest without a kubeconfig)".into()
        },
    });
    Ok(Readiness { checks })
}

fn source_url(args: &crate::cli::PrometheusArgs) -> String {
    args.prometheus_url.clone().unwrap_or_default()
}
