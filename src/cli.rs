//! Command line: clap derive, every flag also readable from a `GPU_REAPER_…` environment
//! variable. Durations and times are parsed here, by clap value parsers ([`duration`],
//! [`positive_duration`], [`timestamp`], [`since`]): a bad value is refused before any
//! command runs, with clap's message naming the flag and ours saying what to write.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use jiff::{SignedDuration, Timestamp};

/// A Go-style duration (`90s`, `1m`, `2h30m`), not negative.
pub fn duration(text: &str) -> Result<SignedDuration, String> {
    let d: kube::core::Duration = text
        .parse()
        .map_err(|e| format!("{text:?} is not a duration ({e}); write e.g. 1m, 90s, 2h"))?;
    if d.is_negative() {
        return Err(format!("{text:?} must not be negative"));
    }
    let std: std::time::Duration = d.into();
    SignedDuration::try_from(std).map_err(|e| format!("{text:?}: {e}"))
}

/// A Go-style duration clap can also print, so a default written as a constant elsewhere
/// shows in `--help` as `24h` (`default_value_t`) and is parsed back by [`go_duration`].
/// Printed by [`human`](crate::engine::classify::human): whole seconds, and past an hour
/// whole minutes, which every default is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub SignedDuration);

impl std::fmt::Display for GoDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::engine::classify::human(self.0))
    }
}

/// [`duration`] as a [`GoDuration`].
pub fn go_duration(text: &str) -> Result<GoDuration, String> {
    duration(text).map(GoDuration)
}

/// A Go-style duration longer than 0s.
pub fn positive_duration(text: &str) -> Result<std::time::Duration, String> {
    let d = duration(text)?;
    if d.is_zero() {
        return Err(format!("{text:?} must be longer than 0s, e.g. 30s"));
    }
    Ok(d.unsigned_abs())
}

/// An RFC 3339 time.
pub fn timestamp(text: &str) -> Result<Timestamp, String> {
    text.parse()
        .map_err(|e| format!("{text:?} is not an RFC 3339 time ({e}), e.g. 2026-11-02T08:00:00Z"))
}

/// The start of a period: a time, or a duration back from its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    At(Timestamp),
    Ago(SignedDuration),
}

impl Since {
    /// The start, given the period's end.
    pub fn before(self, end: Timestamp) -> Timestamp {
        match self {
            Since::At(t) => t,
            Since::Ago(d) => end - d,
        }
    }
}

/// An RFC 3339 time or a Go-style duration (`24h`: that long before the end).
pub fn since(text: &str) -> Result<Since, String> {
    match text.parse::<Timestamp>() {
        Ok(t) => Ok(Since::At(t)),
        Err(_) => duration(text)
            .map(Since::Ago)
            .map_err(|e| format!("{e}, or an RFC 3339 time such as 2026-11-02T08:00:00Z")),
    }
}

/// gpu-reaper: find idle GPUs, warn their owners, reclaim what stays idle.
#[derive(Parser, Debug)]
#[command(name = "gpu-reaper", version, about, long_about = None)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "GPU_REAPER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the CustomResourceDefinitions as multi-document YAML.
    Crd,
    /// Replay recorded telemetry through a policy: what it would have warned about, what
    /// it would have reclaimed, and what it would have regretted.
    Backtest(BacktestArgs),
    /// Write the history a backtest reads from Prometheus (DCGM exporter and
    /// kube-state-metrics series) to an OpenMetrics file for `backtest --trace`.
    Export(ExportArgs),
    /// Read-only waste report of the last hours from Prometheus: idle GPU-hours by shape
    /// and namespace, dollars, top offenders. Changes nothing.
    Audit(AuditArgs),
    /// Run the budget-gate admission webhook (HTTPS): large GPU claims need an approved
    /// ReadinessAttestation and a namespace within its budget.
    Webhook(WebhookArgs),
    /// Approve or revoke a ReadinessAttestation (writes its status subresource).
    Attest(AttestArgs),
    /// Run the budget gate offline on manifests, for CI before `kubectl apply`: exit 0
    /// when every object is admitted, 1 when one is denied, 2 on bad input.
    Check(CheckArgs),
    /// Run the controller: find GPU workloads, match them to GpuPolicies, warn, then act
    /// on what stays idle (Enforce) or report what it would do (Audit).
    Controller(Box<ControllerArgs>),
    /// Put a reclaimed workload back as it was (replicas, unsuspend) and restart its idle
    /// ladder with a fresh startup grace.
    Wake(WakeArgs),
    /// Serve a live dcgm-exporter `/metrics` page from a recorded trace or activity
    /// patterns, mapped onto the cluster's pods: gpu-reaper at work on a cluster with no
    /// GPUs (the local trial, staging, tests).
    Replay(ReplayArgs),
    /// What the controller sees for one workload now and what it will do, when: its
    /// GPUs' activity, classification, policy, ladder step and the next one with its
    /// time, the resumption-risk estimate. Recomputed from Prometheus and the API server
    /// by the controller's own decision step; changes nothing.
    Explain(Box<ExplainArgs>),
}

/// `gpu-reaper explain`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExplainArgs {
    /// The workload: `<namespace>/<kind>/<name>` as `gpu-reaper wake` and the Events
    /// write it (e.g. `ml/Deployment/llama-chat`); `<kind>/<namespace>/<name>` is read
    /// too (a kind starts with a capital letter, a namespace cannot).
    pub workload: String,
    /// API version of the kind, needed only for a kind gpu-reaper does not know that
    /// holds no GPUs now, e.g. `example.com/v1`; when given, only that version matches.
    #[arg(long, env = "GPU_REAPER_EXPLAIN_API_VERSION")]
    pub api_version: Option<String>,
    /// Output: text for people, or JSON (field names stable; docs/controller.md).
    #[arg(long, env = "GPU_REAPER_EXPLAIN_FORMAT", value_enum, default_value_t = ExplainFormat::Text)]
    pub format: ExplainFormat,
    /// Decide as of this time (RFC 3339) instead of the wall clock, as the controller's
    /// --now does.
    #[arg(long, env = "GPU_REAPER_EXPLAIN_NOW", value_parser = timestamp)]
    pub now: Option<Timestamp>,
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
    /// The controller's live reads, as the controller is given them.
    #[command(flatten)]
    pub live: LiveReadArgs,
    /// As the controller's: only the GpuPolicies with these labels are looked at.
    #[arg(long, env = "GPU_REAPER_POLICY_SELECTOR", default_value = "")]
    pub policy_selector: String,
    /// As the controller's: its Lease's name (the Audit-mode memory is the ConfigMap
    /// `<lease-name>-audit`).
    #[arg(
        long,
        env = "GPU_REAPER_LEASE_NAME",
        default_value = "gpu-reaper-controller"
    )]
    pub lease_name: String,
    /// As the controller's: its Lease's namespace (where the Audit-mode memory is).
    #[arg(long, env = "GPU_REAPER_LEASE_NAMESPACE", default_value = "gpu-reaper")]
    pub lease_namespace: String,
    #[command(flatten)]
    pub gpus: GpuCountArgs,
}

/// `gpu-reaper explain` output.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExplainFormat {
    Text,
    Json,
}

/// `gpu-reaper replay`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplayArgs {
    /// Activity for pods of the cluster, `NAMESPACE/POD=PATTERN` or
    /// `NAMESPACE/PREFIX*=PATTERN` (repeatable), e.g. `ml/chat-*=busy:2m,idle`. A
    /// pattern is segments `idle`, `busy` or a fraction, each with `:DURATION` except
    /// the last (which then lasts for ever; otherwise the pattern loops). Every running
    /// pod that matches gets one series per GPU it requests.
    #[arg(
        long = "pattern",
        env = "GPU_REAPER_REPLAY_PATTERNS",
        value_delimiter = ';'
    )]
    pub patterns: Vec<String>,
    /// A recorded trace (OpenMetrics, `.gz` read as gzip; the `backtest --trace` format)
    /// to serve from its start, shifted to now and looping at its end.
    #[arg(long, env = "GPU_REAPER_REPLAY_TRACE")]
    pub trace: Option<std::path::PathBuf>,
    /// Where a recorded pod shows up, `REC_NAMESPACE/REC_POD=NAMESPACE/POD` or
    /// `…=NAMESPACE/PREFIX*` (repeatable). Recorded pods with no mapping keep their
    /// recorded names.
    #[arg(long = "map", env = "GPU_REAPER_REPLAY_MAP", value_delimiter = ';')]
    pub map: Vec<String>,
    /// Trace time per wall-clock second: 1 for real timing, 60 to play an hour a minute.
    #[arg(long, env = "GPU_REAPER_REPLAY_SPEED", default_value_t = 1.0, value_parser = positive_speed)]
    pub speed: f64,
    /// Address of the `/metrics` page (dcgm-exporter's port by default).
    #[arg(
        long,
        env = "GPU_REAPER_REPLAY_LISTEN",
        default_value = "127.0.0.1:9400"
    )]
    pub listen: std::net::SocketAddr,
}

fn positive_speed(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .ok_or_else(|| format!("{text:?} is not a positive number, e.g. 1 or 60"))
}

/// How the controller reads live telemetry: its flags, and `explain`'s, which decides as
/// the controller does.
#[derive(clap::Args, Debug, Clone)]
pub struct LiveReadArgs {
    /// Scrape interval of the DCGM exporter (Go duration): coverage is counted in steps
    /// of the longer of it and one minute, each of which should hold a sample.
    #[arg(long, env = "GPU_REAPER_SCRAPE_INTERVAL", default_value = "30s", value_parser = positive_duration)]
    pub scrape_interval: std::time::Duration,
    /// PromQL label matchers added to every live read of the DCGM families, e.g.
    /// `{cluster="a"}` (this cluster's series in a Thanos or Mimir holding several) or
    /// `{namespace=~"team-a-.*"}` (one shard's namespaces: docs/architecture.md,
    /// "Scaling out"). Empty: every GPU the endpoint has.
    #[arg(long, env = "GPU_REAPER_PROMETHEUS_SELECTOR", default_value = "")]
    pub prometheus_selector: String,
    /// How far behind the clock each live read ends (Go duration). Samples become
    /// visible after their timestamp (when the scrape ends; later through remote write
    /// to Thanos Receive or Mimir); reads never overlap, so a sample visible only after
    /// the read that covered its time is not read (a gap, never idleness).
    #[arg(long, env = "GPU_REAPER_PROMETHEUS_READ_LAG", default_value = "15s", value_parser = duration)]
    pub prometheus_read_lag: SignedDuration,
    /// How much activity history to replay from Prometheus when a policy is first
    /// evaluated (start-up, new leader, new policy), so the resumption-risk estimate and
    /// the request-driven-inference test start informed (Go duration; 0s: learn from the
    /// cycles alone). Only for policies that use them (`idle.maxResumeRisk`,
    /// `action.inference`, `action.preWarm`); spans older than the policy's
    /// `idle.history` are dropped.
    #[arg(long, env = "GPU_REAPER_HISTORY_BACKFILL", value_parser = go_duration,
          default_value_t = GoDuration(crate::backtest::CONTROLLER_BACKFILL))]
    pub history_backfill: GoDuration,
}

/// `gpu-reaper controller`.
#[derive(clap::Args, Debug, Clone)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
    /// Time between evaluations (Go duration).
    #[arg(long, env = "GPU_REAPER_INTERVAL", default_value = "60s", value_parser = positive_duration)]
    pub interval: std::time::Duration,
    #[command(flatten)]
    pub live: LiveReadArgs,
    /// Plain-HTTP address serving /metrics, /healthz and /readyz.
    #[arg(long, env = "GPU_REAPER_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: String,
    /// Name of the coordination.k8s.io Lease for leader election.
    #[arg(
        long,
        env = "GPU_REAPER_LEASE_NAME",
        default_value = "gpu-reaper-controller"
    )]
    pub lease_name: String,
    /// Namespace of the Lease (the controller's own).
    #[arg(long, env = "GPU_REAPER_LEASE_NAMESPACE", default_value = "gpu-reaper")]
    pub lease_namespace: String,
    /// Govern only the GpuPolicies with these labels (a label selector, e.g.
    /// `shard=a`): one controller per shard, each with its own --lease-name, splits a
    /// fleet among several controllers (docs/architecture.md, "Scaling out"). Empty:
    /// every GpuPolicy.
    #[arg(long, env = "GPU_REAPER_POLICY_SELECTOR", default_value = "")]
    pub policy_selector: String,
    /// Keep a ResourceQuota `gpu-reaper-gpus` in every namespace an Enforce admission
    /// policy governs, at the GPUs the budget gate allows there (docs/budget-gate.md,
    /// G2), so the API server refuses the pod that would cross it even while the webhook
    /// is down. `false`: the webhook alone enforces.
    #[arg(long, env = "GPU_REAPER_GPU_QUOTA", default_value_t = true, action = clap::ArgAction::Set)]
    pub gpu_quota: bool,
    /// Namespaces never given a GPU quota, comma-separated (the chart passes the
    /// webhook's excluded namespaces, its own among them).
    #[arg(
        long,
        env = "GPU_REAPER_QUOTA_EXCLUDED_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system,kube-node-lease"
    )]
    pub quota_excluded_namespaces: Vec<String>,
    /// This replica's identity in the Lease (the pod name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// How long a leader's Lease lasts without renewal (Go duration).
    #[arg(long, env = "GPU_REAPER_LEASE_DURATION", default_value = "15s", value_parser = positive_duration)]
    pub lease_duration: std::time::Duration,
    /// Evaluate once and exit (after acquiring the Lease); for scripts and tests.
    #[arg(long)]
    pub once: bool,
    /// Evaluate as of this time (RFC 3339) instead of the wall clock; with --once, for
    /// replaying history and tests.
    #[arg(long, hide = true, value_parser = timestamp)]
    pub now: Option<Timestamp>,
    #[command(flatten)]
    pub gpus: GpuCountArgs,
    #[command(flatten)]
    pub notify: NotifyArgs,
}

/// Slack and email warnings (docs/notifications.md). A channel without its settings is off;
/// a policy that asks for it then records the failure in metrics and its status.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NotifyArgs {
    /// File holding the Slack bot token (xoxb-…), re-read on every send.
    #[arg(long, env = "GPU_REAPER_SLACK_TOKEN_FILE")]
    pub slack_token_file: Option<PathBuf>,
    /// File holding the Slack app's signing secret (verifies interactive payloads).
    #[arg(long, env = "GPU_REAPER_SLACK_SIGNING_SECRET_FILE")]
    pub slack_signing_secret_file: Option<PathBuf>,
    /// Slack Web API base URL (tests point it at a local server).
    #[arg(
        long,
        env = "GPU_REAPER_SLACK_API_URL",
        default_value = "https://slack.com/api"
    )]
    pub slack_api_url: String,
    /// Extra CA bundle (PEM) to trust for the Slack API URL.
    #[arg(long, env = "GPU_REAPER_SLACK_CA_FILE")]
    pub slack_ca_file: Option<PathBuf>,
    /// SMTP server host; email is off without it.
    #[arg(long, env = "GPU_REAPER_SMTP_HOST")]
    pub smtp_host: Option<String>,
    /// SMTP port (default: 587 for starttls, 465 for tls, 25 for none).
    #[arg(long, env = "GPU_REAPER_SMTP_PORT")]
    pub smtp_port: Option<u16>,
    /// Transport security: `starttls` (required), `tls` (implicit, SMTPS) or `none`.
    #[arg(long, env = "GPU_REAPER_SMTP_SECURITY", value_enum, default_value_t = SmtpSecurity::Starttls)]
    pub smtp_security: SmtpSecurity,
    /// Extra CA bundle (PEM) to trust for the SMTP server.
    #[arg(long, env = "GPU_REAPER_SMTP_CA_FILE")]
    pub smtp_ca_file: Option<PathBuf>,
    /// SMTP user (with --smtp-password-file).
    #[arg(long, env = "GPU_REAPER_SMTP_USER")]
    pub smtp_user: Option<String>,
    /// File holding the SMTP password, re-read on every send.
    #[arg(long, env = "GPU_REAPER_SMTP_PASSWORD_FILE")]
    pub smtp_password_file: Option<PathBuf>,
    /// From address of warning emails.
    #[arg(
        long,
        env = "GPU_REAPER_SMTP_FROM",
        default_value = "gpu-reaper <gpu-reaper@localhost>"
    )]
    pub smtp_from: String,
    /// YAML file overriding message templates (docs/notifications.md#templates).
    #[arg(long, env = "GPU_REAPER_NOTIFY_TEMPLATES")]
    pub notify_templates: Option<PathBuf>,
    /// Public URL of a dashboard for the workload, as a template with {namespace},
    /// {kind} and {name}; linked from Slack and email when set.
    #[arg(long, env = "GPU_REAPER_WORKLOAD_URL")]
    pub workload_url: Option<String>,
}

/// How the SMTP connection is secured.
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SmtpSecurity {
    #[default]
    Starttls,
    Tls,
    None,
}

/// `gpu-reaper wake`.
#[derive(clap::Args, Debug, Clone)]
pub struct WakeArgs {
    /// `<namespace>/<kind>/<name>`, e.g. `ml/Deployment/llama-chat`.
    pub workload: String,
    /// API version of the kind when it is not a built-in one (Deployment, StatefulSet,
    /// ReplicaSet, Job, Pod), e.g. `kubeflow.org/v1`.
    #[arg(long)]
    pub api_version: Option<String>,
}

/// Which resources count as GPUs (webhook and check).
#[derive(clap::Args, Debug, Clone)]
pub struct GpuCountArgs {
    /// Extended resources counted as whole GPUs (repeat or comma-separate).
    #[arg(long = "gpu-resource", env = "GPU_REAPER_GPU_RESOURCES", value_delimiter = ',',
          default_values_t = crate::gpus::GpuResources::default().whole)]
    pub gpu_resources: Vec<String>,
    /// DRA device classes whose devices are GPUs (repeat or comma-separate).
    #[arg(long = "gpu-device-class", env = "GPU_REAPER_GPU_DEVICE_CLASSES", value_delimiter = ',',
          default_values_t = crate::gpus::GpuResources::default().device_classes)]
    pub gpu_device_classes: Vec<String>,
    /// MIG compute slices per physical GPU: `nvidia.com/mig-<N>g.*` counts N/this.
    #[arg(long, env = "GPU_REAPER_MIG_SLICES_PER_GPU", default_value_t = 7.0)]
    pub mig_slices_per_gpu: f64,
    /// GPUs a DRA request with `allocationMode: All` counts as.
    #[arg(long, env = "GPU_REAPER_DRA_ALL_GPUS", default_value_t = 8.0)]
    pub dra_all_gpus: f64,
    /// Usernames whose writes of controller-owned objects (pods of a gated ReplicaSet,
    /// Jobs of a gated CronJob, …) are not asked for an attestation again; they are still
    /// held to the namespace's total and budget (repeat or comma-separate).
    /// Default: kube-controller-manager's identities; add operators that create pods or
    /// workloads for a gated owner, e.g. system:serviceaccount:ray-system:kuberay-operator.
    #[arg(long = "trusted-controller", env = "GPU_REAPER_TRUSTED_CONTROLLERS", value_delimiter = ',',
          default_values_t = crate::admission::settings::DEFAULT_TRUSTED_CONTROLLERS.map(String::from).to_vec())]
    pub trusted_controllers: Vec<String>,
}

/// `gpu-reaper webhook`.
#[derive(clap::Args, Debug, Clone)]
pub struct WebhookArgs {
    /// HTTPS address serving /validate, /healthz, /readyz and /metrics.
    #[arg(
        long,
        env = "GPU_REAPER_WEBHOOK_LISTEN",
        default_value = "0.0.0.0:8443"
    )]
    pub listen: String,
    /// Plain-HTTP address serving /healthz, /readyz and /metrics for probes and scrapes;
    /// empty disables it.
    #[arg(
        long,
        env = "GPU_REAPER_WEBHOOK_PROBE_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub probe_listen: String,
    /// Serving certificate chain (PEM), re-read when it changes.
    #[arg(
        long,
        env = "GPU_REAPER_WEBHOOK_TLS_CERT",
        default_value = "/tls/tls.crt"
    )]
    pub tls_cert: PathBuf,
    /// Serving private key (PEM), re-read when it changes.
    #[arg(
        long,
        env = "GPU_REAPER_WEBHOOK_TLS_KEY",
        default_value = "/tls/tls.key"
    )]
    pub tls_key: PathBuf,
    /// How often the certificate files are checked for a change (Go duration).
    #[arg(
        long,
        env = "GPU_REAPER_WEBHOOK_TLS_RELOAD_INTERVAL",
        default_value = "10s",
        value_parser = positive_duration
    )]
    pub tls_reload_interval: std::time::Duration,
    /// Most time between a change in the cluster and the decisions seeing it (Go duration).
    #[arg(
        long,
        env = "GPU_REAPER_WEBHOOK_CACHE_DEBOUNCE",
        default_value = "100ms",
        value_parser = positive_duration
    )]
    pub cache_debounce: std::time::Duration,
    #[command(flatten)]
    pub gpus: GpuCountArgs,
}

/// `gpu-reaper attest`.
#[derive(clap::Args, Debug, Clone)]
pub struct AttestArgs {
    #[command(subcommand)]
    pub action: AttestAction,
}

#[derive(Subcommand, Debug, Clone)]
pub enum AttestAction {
    /// Approve the attestation's current spec (binds to its metadata.generation).
    Approve(AttestTarget),
    /// Withdraw approval: large claims it covered are refused again.
    Revoke(AttestTarget),
}

#[derive(clap::Args, Debug, Clone)]
pub struct AttestTarget {
    /// `<namespace>/<name>` of the ReadinessAttestation.
    pub attestation: String,
    /// Who approves (recorded in status.approvedBy). Default: the identity the API server
    /// authenticates (`kubectl auth whoami`), else the kubeconfig's user entry. The
    /// webhook's four-eyes rule compares the authenticated identity whatever this says.
    #[arg(long, env = "GPU_REAPER_APPROVER")]
    pub approver: Option<String>,
    /// Why (recorded in the Approved condition's message).
    #[arg(long)]
    pub message: Option<String>,
    /// The `metadata.generation` of the spec you reviewed (`gpu-reaper attest approve`
    /// prints it with the spec). Required to approve: the approval is refused if the spec
    /// has changed since, so it never covers a spec nobody saw.
    #[arg(long)]
    pub generation: Option<i64>,
    /// The `metadata.uid` of the attestation you reviewed (printed with the spec, and by
    /// `kubectl get ra NAME -o yaml`). Required to approve: an attestation deleted and
    /// created again under the same name is another object, and is refused.
    #[arg(long)]
    pub uid: Option<String>,
}

/// `gpu-reaper check`.
#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    /// Manifests to check (YAML or JSON, several documents per file and `kind: List`
    /// allowed, as `kubectl get -o yaml` writes; `-` reads stdin). All of them are judged
    /// as one apply: each claim counts against the namespace's totals with the ones
    /// before it.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
    /// GpuPolicy files or directories of them.
    #[arg(long = "policies", required = true)]
    pub policies: Vec<PathBuf>,
    /// ReadinessAttestation files or directories of them (with their status, as
    /// `kubectl get -o yaml` prints them).
    #[arg(long = "attestations")]
    pub attestations: Vec<PathBuf>,
    /// Namespace of objects that name none.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Labels of namespaces, `ns:key=value` (repeatable), for policies' namespaceSelector.
    /// Namespace objects in the manifests or policy files are read too.
    #[arg(long = "namespace-label")]
    pub namespace_labels: Vec<String>,
    /// Decide as of this time (RFC 3339) instead of now.
    #[arg(long, value_parser = timestamp)]
    pub now: Option<Timestamp>,
    /// Nodes that offer GPUs, for DaemonSets (one pod on each). Absent: a DaemonSet that
    /// asks for GPUs is an open-ended claim.
    #[arg(long)]
    pub gpu_nodes: Option<u64>,
    /// Output: one line per object, or JSON.
    #[arg(short = 'o', long, value_enum, default_value_t = CheckOutput::Text)]
    pub output: CheckOutput,
    #[command(flatten)]
    pub gpus: GpuCountArgs,
}

/// `gpu-reaper check` output.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckOutput {
    Text,
    Json,
}

/// Where Prometheus is and how to talk to it.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PrometheusArgs {
    /// Prometheus (or Thanos/Mimir query) base URL.
    #[arg(long, env = "GPU_REAPER_PROMETHEUS_URL")]
    pub prometheus_url: Option<String>,
    /// Bearer token file, re-read on every request.
    #[arg(long, env = "GPU_REAPER_PROMETHEUS_BEARER_TOKEN_FILE")]
    pub prometheus_bearer_token_file: Option<PathBuf>,
    /// Basic-auth user for Prometheus (with --prometheus-basic-auth-password-file).
    #[arg(
        long,
        env = "GPU_REAPER_PROMETHEUS_BASIC_AUTH_USER",
        requires = "prometheus_basic_auth_password_file"
    )]
    pub prometheus_basic_auth_user: Option<String>,
    /// File holding the basic-auth password, re-read on every request.
    #[arg(
        long,
        env = "GPU_REAPER_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE",
        requires = "prometheus_basic_auth_user"
    )]
    pub prometheus_basic_auth_password_file: Option<PathBuf>,
    /// Extra CA bundle (PEM) to trust for Prometheus.
    #[arg(long, env = "GPU_REAPER_PROMETHEUS_CA_FILE")]
    pub prometheus_ca_file: Option<PathBuf>,
    /// Client certificate (PEM chain) for a Prometheus that requires mutual TLS.
    #[arg(
        long,
        env = "GPU_REAPER_PROMETHEUS_CLIENT_CERT_FILE",
        requires = "prometheus_client_key_file"
    )]
    pub prometheus_client_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --prometheus-client-cert-file.
    #[arg(
        long,
        env = "GPU_REAPER_PROMETHEUS_CLIENT_KEY_FILE",
        requires = "prometheus_client_cert_file"
    )]
    pub prometheus_client_key_file: Option<PathBuf>,
    /// Accept any certificate from Prometheus. For testing only: anyone on the network
    /// path can then answer in its place. Prefer --prometheus-ca-file.
    #[arg(
        long,
        env = "GPU_REAPER_PROMETHEUS_INSECURE_SKIP_TLS_VERIFY",
        conflicts_with = "prometheus_ca_file"
    )]
    pub prometheus_insecure_skip_tls_verify: bool,
    /// Per-request timeout (Go duration).
    #[arg(long, default_value = "30s", env = "GPU_REAPER_PROMETHEUS_TIMEOUT", value_parser = positive_duration)]
    pub prometheus_timeout: std::time::Duration,
    /// Length of history pulled per query (Go duration); shorter keeps answers small.
    #[arg(long, default_value = "2h", env = "GPU_REAPER_PROMETHEUS_CHUNK", value_parser = positive_duration)]
    pub prometheus_chunk: std::time::Duration,
    /// Largest Prometheus answer accepted, bytes.
    #[arg(long, default_value_t = 256 << 20, env = "GPU_REAPER_PROMETHEUS_MAX_RESPONSE_BYTES")]
    pub prometheus_max_response_bytes: usize,
    /// Label naming a DCGM series' pod (default: `exported_pod` when present, else `pod`).
    #[arg(long, env = "GPU_REAPER_DCGM_POD_LABEL")]
    pub dcgm_pod_label: Option<String>,
    /// Label naming a DCGM series' namespace (default: matches the pod label's convention).
    #[arg(long, env = "GPU_REAPER_DCGM_NAMESPACE_LABEL")]
    pub dcgm_namespace_label: Option<String>,
    /// Retries of a failed query (connection errors, 429, 5xx).
    #[arg(long, default_value_t = 2, env = "GPU_REAPER_PROMETHEUS_RETRIES")]
    pub prometheus_retries: u32,
}

/// `gpu-reaper audit`.
#[derive(clap::Args, Debug, Clone)]
pub struct AuditArgs {
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
    /// How far back to look (Go duration), or a start time (RFC 3339).
    #[arg(long, default_value = "24h", env = "GPU_REAPER_SINCE", value_parser = since)]
    pub since: Since,
    /// End of the audited period (RFC 3339); default now.
    #[arg(long, env = "GPU_REAPER_TO", value_parser = timestamp)]
    pub to: Option<Timestamp>,
    /// Attribute GPU-hours to workloads as this cluster's API server resolves them
    /// (owner chains through Deployments, Jobs, Notebooks, RayClusters, …), not from
    /// kube-state-metrics alone. Read-only: lists pods and their owners.
    #[arg(long, env = "GPU_REAPER_AUDIT_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Idle rules and prices from this GpuPolicy (default: the bundled sample's).
    #[arg(long, env = "GPU_REAPER_POLICY")]
    pub policy: Option<PathBuf>,
    /// Instead of the report, check that the cluster's telemetry is ready for
    /// gpu-reaper and say what is missing.
    #[arg(long)]
    pub check: bool,
    /// How many top offenders to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table, env = "GPU_REAPER_FORMAT")]
    pub format: OutputFormat,
}

/// `gpu-reaper backtest`.
#[derive(clap::Args, Debug, Clone)]
pub struct BacktestArgs {
    /// GpuPolicy YAML. Default: the bundled sample policy (config/samples/policy.yaml).
    #[arg(long, env = "GPU_REAPER_POLICY")]
    pub policy: Option<PathBuf>,
    /// OpenMetrics text with timestamps (optionally .gz): DCGM exporter and
    /// kube-state-metrics series. Default: the bundled sample trace.
    #[arg(long, env = "GPU_REAPER_TRACE", conflicts_with = "prometheus_url")]
    pub trace: Option<PathBuf>,
    /// Pull the history from Prometheus instead of a file.
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
    /// Start of the history pulled from Prometheus: RFC 3339, or a Go duration before --to.
    #[arg(long, default_value = "24h", env = "GPU_REAPER_FROM", value_parser = since)]
    pub from: Since,
    /// End of the history pulled from Prometheus: RFC 3339 (default: now).
    #[arg(long, env = "GPU_REAPER_TO", value_parser = timestamp)]
    pub to: Option<Timestamp>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table, env = "GPU_REAPER_FORMAT")]
    pub format: OutputFormat,
    /// Also draw a timeline per workload into this SVG file.
    #[arg(long, env = "GPU_REAPER_SVG")]
    pub svg: Option<PathBuf>,
    /// Evaluation step, as the controller's `--interval` (Go duration).
    #[arg(long, default_value = "1m", env = "GPU_REAPER_STEP", value_parser = duration)]
    pub step: SignedDuration,
    /// An action is a regret if activity resumes within this long (Go duration).
    #[arg(long, default_value = "2h", env = "GPU_REAPER_REGRET_HORIZON", value_parser = duration)]
    pub regret_horizon: SignedDuration,
    /// Skip metric families gpu-reaper does not read instead of failing on them.
    #[arg(long, env = "GPU_REAPER_SKIP_UNKNOWN_METRICS")]
    pub skip_unknown_metrics: bool,
    /// Let the first part of the trace only teach the idle history, as the controller's
    /// --history-backfill does at start-up: nothing is warned, acted on or counted in it
    /// (with --sweep: for every variant). Go duration, e.g. 24h.
    #[arg(long, default_value = "0s", env = "GPU_REAPER_WARMUP", value_parser = duration)]
    pub warmup: SignedDuration,
    /// With --warmup: how much of its end the start-up backfill reads, as the
    /// controller's --history-backfill (e.g. 24h: an install that reads one day back).
    #[arg(long, env = "GPU_REAPER_HISTORY_BACKFILL", value_parser = go_duration,
          default_value_t = GoDuration(crate::backtest::CONTROLLER_BACKFILL))]
    pub history_backfill: GoDuration,
    /// Replay the policy over a range of fixed idle durations and resumption-risk levels,
    /// beside other tools' fixed rules, and report reclaimed GPU-hours against regret rate
    /// for each (with --svg: the frontier chart).
    #[arg(long, env = "GPU_REAPER_SWEEP")]
    pub sweep: bool,
    /// With --sweep: run every risk level at each of these `idle.maxIdle` ceilings instead
    /// of the policy's own, e.g. `4h,5h,6h,8h` (each at least the policy's action.after).
    /// Where the gate knows nothing it waits until maxIdle: on a cold start the ceiling is
    /// the policy's real fixed rule.
    #[arg(long, env = "GPU_REAPER_MAX_IDLE", value_delimiter = ',', value_parser = duration, requires = "sweep")]
    pub max_idle: Vec<SignedDuration>,
    /// Generate a synthetic trace instead of reading one, e.g.
    /// `inference=143,hours=24,seed=1` (keys: inference, replicas, notebooks, hungJobs,
    /// crashLoops, hours, seed). See docs/decision-quality.md.
    #[arg(long, env = "GPU_REAPER_SYNTHETIC", conflicts_with_all = ["trace", "prometheus_url"])]
    pub synthetic: Option<String>,
}

/// `gpu-reaper export`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExportArgs {
    /// Where to read the history.
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
    /// Start of the history: RFC 3339, or a Go duration before --to (168h: a week).
    #[arg(long, default_value = "24h", env = "GPU_REAPER_FROM", value_parser = since)]
    pub from: Since,
    /// End of the history: RFC 3339 (default: now).
    #[arg(long, env = "GPU_REAPER_TO", value_parser = timestamp)]
    pub to: Option<Timestamp>,
    /// File to write, gzip when its name ends in `.gz`; written whole or not at all.
    /// Default: standard output (plain text).
    #[arg(long, short, env = "GPU_REAPER_OUTPUT")]
    pub output: Option<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Table,
    Json,
    Csv,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
