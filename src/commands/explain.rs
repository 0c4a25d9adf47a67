//! `gpu-reaper explain <namespace>/<kind>/<name>`: the edge. The flags become a typed
//! [`Config`]; then a read-only controller [`Context`] (no notifiers, no Lease, nothing
//! written), [`controller::explain::see`] (the cycle's observe and decision step for the
//! workload's policy) and the pure page ([`report::explain`]), printed as text or JSON.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use jiff::{SignedDuration, Timestamp};

use crate::cli::{ExplainArgs, ExplainFormat};
use crate::controller;
use crate::controller::context::{Clock, Context, Notifiers, Settings, prometheus_selector};
use crate::controller::explain::Target;
use crate::controller::metrics::Metrics;
use crate::engine::classify::human;
use crate::notify::content::Templates;
use crate::report;
use crate::telemetry::live::ReadSettings;
use crate::telemetry::prometheus::{PrometheusConfig, PrometheusSource};
use crate::{Error, Result};

/// How the explanation is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// `explain`'s settings, checked once from the flags.
#[derive(Debug, Clone)]
pub struct Config {
    pub target: Target,
    pub format: Format,
    /// `--now`; None: the wall clock.
    pub now: Option<Timestamp>,
    pub prometheus: PrometheusConfig,
    /// The controller's settings that its observe and decision steps read.
    pub settings: Settings,
}

/// `<namespace>/<kind>/<name>`, or `<kind>/<namespace>/<name>` (a kind starts with a
/// capital letter; a namespace, a DNS label, cannot).
pub fn parse_target(text: &str, api_version: Option<&str>) -> Result<Target> {
    let (first, kind, name) = crate::cluster::address::parse_workload(text)?;
    let (namespace, kind) = if first.starts_with(|c: char| c.is_ascii_uppercase()) {
        (kind, first)
    } else {
        (first, kind)
    };
    Ok(Target {
        namespace,
        kind,
        name,
        api_version: api_version
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(String::from),
    })
}

impl Config {
    pub fn from_args(args: &ExplainArgs) -> Result<Self> {
        let target = parse_target(&args.workload, args.api_version.as_deref())?;
        let gpus = super::gpu_settings(&args.gpus)?;
        let labels = super::workload_labels(&args.prometheus);
        let settings = Settings {
            policy_selector: args.policy_selector.clone(),
            resources: gpus.resources,
            reads: ReadSettings {
                selector: prometheus_selector(&args.live.prometheus_selector)?,
                lag_seconds: args.live.prometheus_read_lag.as_secs(),
                workload_labels: labels.clone(),
            },
            history_backfill: args.live.history_backfill.0,
            history_labels: labels,
            // As the controller: coverage steps of the longer of the scrape and a minute.
            live_step_seconds: (args.live.scrape_interval.as_secs().max(1) as i64).max(60),
            // What follows is the loop's and the notifiers', which explain never runs.
            max_billing_gap: SignedDuration::from_mins(2),
            templates: Templates::default(),
            workload_url: None,
            interval: std::time::Duration::from_secs(60),
            identity: "gpu-reaper-explain".into(),
            lease_namespace: args.lease_namespace.clone(),
            lease_name: args.lease_name.clone(),
            lease_duration: SignedDuration::from_secs(15),
            gpu_quota: false,
            quota_excluded_namespaces: Vec::new(),
        };
        Ok(Self {
            target,
            format: match args.format {
                ExplainFormat::Text => Format::Text,
                ExplainFormat::Json => Format::Json,
            },
            now: args.now,
            prometheus: super::prometheus_config(&args.prometheus)?,
            settings,
        })
    }
}

pub fn run(args: &ExplainArgs) -> Result<()> {
    let config = Config::from_args(args)?;
    let page = super::block_on(explain(&config))??;
    print!("{page}");
    Ok(())
}

/// The page for `config`'s workload.
pub async fn explain(config: &Config) -> Result<String> {
    let client = kube::Client::try_default()
        .await
        .map_err(|source| Error::Kube {
            action: "connecting to the Kubernetes API (KUBECONFIG or in-cluster config)".into(),
            source,
        })?;
    let clock = config.now.map_or(Clock::Wall, Clock::Fixed);
    let ctx = Context {
        client,
        // Read-only: nobody is told anything.
        notifiers: Notifiers {
            always: Vec::new(),
            personal: Vec::new(),
        },
        telemetry: PrometheusSource::new(config.prometheus.clone())?,
        clock,
        metrics: Arc::new(Metrics::default()),
        leading: Arc::new(AtomicBool::new(false)),
        settings: config.settings.clone(),
        caches: None,
    };
    let seen = controller::explain::see(&ctx, &config.target, clock.now()).await?;
    let page = report::explain::build(
        &seen,
        report::explain::Sources {
            prometheus_url: config.prometheus.url.clone(),
            history_backfill: human(config.settings.history_backfill),
        },
    );
    Ok(match config.format {
        Format::Text => report::explain::text(&page),
        Format::Json => format!("{}\n", serde_json::to_string_pretty(&page)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_is_read_in_either_order() {
        let wake_order = parse_target("ml/Deployment/chat", None).unwrap();
        let kind_first = parse_target("Deployment/ml/chat", Some("apps/v1")).unwrap();
        assert_eq!(
            (
                wake_order.namespace.as_str(),
                wake_order.kind.as_str(),
                wake_order.name.as_str()
            ),
            ("ml", "Deployment", "chat")
        );
        assert_eq!(
            (kind_first.namespace.as_str(), kind_first.kind.as_str()),
            ("ml", "Deployment")
        );
        assert_eq!(kind_first.api_version.as_deref(), Some("apps/v1"));
        let e = parse_target("chat", None).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("<namespace>/<kind>/<name>"), "{e}");
    }

    #[test]
    fn a_bad_selector_is_refused_naming_its_flag() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "gpu-reaper",
            "explain",
            "ml/Deployment/chat",
            "--prometheus-url",
            "http://p:9090",
            "--prometheus-selector",
            "cluster=a",
        ])
        .unwrap();
        let crate::cli::Command::Explain(args) = cli.command else {
            panic!("explain")
        };
        let e = Config::from_args(&args).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().starts_with("--prometheus-selector"), "{e}");
        let mut args = args;
        args.prometheus.prometheus_url = None;
        args.live.prometheus_selector = String::new();
        let e = Config::from_args(&args).unwrap_err();
        assert!(e.to_string().starts_with("--prometheus-url"), "{e}");
    }
}
