//! `gpu-reaper controller`: the edge. The flags become the controller's typed
//! [`Config`] (settings checked once: durations, the Prometheus selector, GPU counting,
//! the notification templates read from their file); then the multi-threaded runtime
//! runs `controller::run` until SIGTERM.

use std::ffi::OsString;

use jiff::SignedDuration;

use crate::cli::ControllerArgs;
use crate::controller::context::{Clock, Config, Settings, prometheus_selector};
use crate::notify::content::Templates;
use crate::telemetry::live::ReadSettings;
use crate::{Error, Result};

/// Runs the controller until SIGTERM (or one cycle with `--once`).
pub fn run(args: &ControllerArgs) -> Result<()> {
    let config = config(args)?;
    super::multi_thread_runtime()?.block_on(crate::controller::run::run(
        config,
        super::shutdown_signal(),
    ))
}

/// The controller's config from its flags.
pub fn config(args: &ControllerArgs) -> Result<Config> {
    Ok(Config {
        settings: settings(args)?,
        clock: args.now.map_or(Clock::Wall, Clock::Fixed),
        prometheus: super::prometheus_config(&args.prometheus)?,
        notify: super::notify_config(&args.notify),
        listen: args.listen.clone(),
        once: args.once,
    })
}

/// The controller's config from `flags` as `gpu-reaper controller` takes them (over the
/// binary's defaults, environment included): what in-process tests give
/// `Context::test`.
pub fn config_from_flags<I, T>(flags: I) -> Result<Config>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        args: ControllerArgs,
    }
    let flags = <Flags as clap::Parser>::try_parse_from(
        std::iter::once(OsString::from("controller")).chain(flags.into_iter().map(Into::into)),
    )
    .map_err(|e| Error::InvalidArgument {
        flag: "controller",
        message: e.to_string(),
    })?;
    config(&flags.args)
}

/// The settings the stages and the loop read.
fn settings(args: &ControllerArgs) -> Result<Settings> {
    let interval = args.interval;
    let scrape = args.live.scrape_interval.as_secs().max(1) as i64;
    let lease_duration =
        SignedDuration::try_from(args.lease_duration).map_err(|e| Error::InvalidArgument {
            flag: "lease-duration",
            message: e.to_string(),
        })?;
    let selector = prometheus_selector(&args.live.prometheus_selector)?;
    let gpus = super::gpu_settings(&args.gpus)?;
    let templates = match &args.notify.notify_templates {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| Error::InvalidArgument {
                flag: "notify-templates",
                message: format!("{}: {e}", path.display()),
            })?;
            Templates::from_yaml(&text, &path.display().to_string()).map_err(|e| {
                Error::InvalidArgument {
                    flag: "notify-templates",
                    message: e.to_string(),
                }
            })?
        }
        None => Templates::default(),
    };
    Ok(Settings {
        policy_selector: args.policy_selector.clone(),
        resources: gpus.resources,
        reads: ReadSettings {
            selector,
            lag_seconds: args.live.prometheus_read_lag.as_secs(),
            workload_labels: super::workload_labels(&args.prometheus),
        },
        history_backfill: args.live.history_backfill.0,
        history_labels: super::workload_labels(&args.prometheus),
        // A step shorter than the scrape interval would leave every other bucket
        // empty: coverage is counted in steps that each hold a sample.
        live_step_seconds: scrape.max(60),
        max_billing_gap: SignedDuration::try_from(interval * 2)
            .unwrap_or(SignedDuration::from_mins(2)),
        templates,
        workload_url: args.notify.workload_url.clone(),
        interval,
        identity: args
            .identity
            .clone()
            .unwrap_or_else(|| format!("gpu-reaper-{}", std::process::id())),
        lease_namespace: args.lease_namespace.clone(),
        lease_name: args.lease_name.clone(),
        lease_duration,
        gpu_quota: args.gpu_quota,
        quota_excluded_namespaces: args
            .quota_excluded_namespaces
            .iter()
            .map(|n| n.trim().to_string())
            .collect(),
    })
}
