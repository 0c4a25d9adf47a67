//! A recorded trace in memory: DCGM series bucketed per GPU (one `f32` per GPU, metric and
//! step), and the pod inventory from kube-state-metrics series. Memory grows with GPUs ×
//! duration ÷ step, not with the file size: samples are reduced to buckets as they stream.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;

use super::openmetrics::{RawSample, TraceError, parse_labels, read_samples};
use crate::api::keys;
use crate::engine::cost::mig_share;

/// Metric families gpu-reaper reads from a trace.
pub const KNOWN_METRICS: &[&str] = &[
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "kube_pod_owner",
    "kube_pod_created",
    "kube_pod_labels",
    "kube_pod_annotations",
    "kube_pod_container_resource_requests",
    "kube_pod_container_status_waiting_reason",
    "kube_pod_status_phase",
    "kube_replicaset_owner",
    "kube_namespace_labels",
];

/// Most steps a trace may span: every column of every GPU holds one `f32` per step
/// between its first and last sample, so two samples centuries apart would ask for
/// gigabytes. 2^20 steps is two years at `--step 1m` (4 MiB per column).
pub const MAX_TRACE_BUCKETS: i64 = 1 << 20;

/// Timestamps accepted, unix seconds: 1970 up to where millisecond timestamps begin
/// (year 5138), so `bucket × step` never overflows downstream.
const TIMESTAMPS: std::ops::Range<f64> = 0.0..1e11;

/// Values of one metric of one GPU, one per step bucket; NaN where there was no sample.
#[derive(Debug, Clone, Default)]
pub struct Column {
    base: i64,
    values: Vec<f32>,
}

impl Column {
    /// Value at absolute bucket `b` (`timestamp / step`).
    pub fn get(&self, b: i64) -> Option<f32> {
        let i = b.checked_sub(self.base)?;
        self.values
            .get(usize::try_from(i).ok()?)
            .copied()
            .filter(|v| !v.is_nan())
    }

    fn put(&mut self, b: i64, v: f32, combine: fn(f32, f32) -> f32) {
        if self.values.is_empty() {
            self.base = b;
        } else if b < self.base {
            let shift = (self.base - b) as usize;
            self.values
                .splice(0..0, std::iter::repeat_n(f32::NAN, shift));
            self.base = b;
        }
        let i = (b - self.base) as usize;
        if i >= self.values.len() {
            self.values.resize(i + 1, f32::NAN);
        }
        let slot = &mut self.values[i];
        *slot = if slot.is_nan() { v } else { combine(*slot, v) };
    }

    /// First and last bucket with a value.
    pub fn span(&self) -> Option<(i64, i64)> {
        (!self.values.is_empty()).then(|| (self.base, self.base + self.values.len() as i64 - 1))
    }
}

/// One GPU (or MIG instance) bound to one pod, with its metric columns.
#[derive(Debug, Clone, Default)]
pub struct GpuSeries {
    /// Which GPU, and which workload pod (empty when the GPU is not allocated).
    pub gpu: GpuIdentity,
    pub engine_active: Column,
    pub gpu_util: Column,
    pub fb_used: Column,
    pub power: Column,
    pub pcie_rx: Column,
}

impl GpuSeries {
    /// Not bound to a workload: no pod label, or only the DCGM exporter's own.
    pub fn pod_unallocated(&self) -> bool {
        self.gpu.pod.is_empty() || self.gpu.pod.contains("dcgm-exporter")
    }
}

/// Phase codes stored in [`PodRecord::phase`].
pub const PHASE_RUNNING: f32 = 0.0;
pub const PHASE_PENDING: f32 = 1.0;
pub const PHASE_SUCCEEDED: f32 = 2.0;
pub const PHASE_FAILED: f32 = 3.0;

/// A pod as kube-state-metrics recorded it.
#[derive(Debug, Clone, Default)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub created: Option<i64>,
    /// Controller owner (kind, name), if any.
    pub owner: Option<(String, String)>,
    /// Labels with their kube-state-metrics keys (`label_` stripped), plus gpu-reaper's
    /// own keys under their real names.
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// GPU devices requested, per container.
    pub gpu_requests: BTreeMap<String, u32>,
    /// Index into [`Trace::waiting_reasons`] per bucket while a container waits.
    pub waiting: Column,
    /// Phase code per bucket.
    pub phase: Column,
    /// Buckets in which any series of the pod had a sample.
    pub first_bucket: i64,
    pub last_bucket: i64,
}

impl PodRecord {
    pub fn gpu_devices(&self) -> u32 {
        self.gpu_requests.values().sum()
    }
}

/// A whole trace.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Bucket length, seconds.
    pub step_seconds: i64,
    pub gpus: Vec<GpuSeries>,
    pub pods: Vec<PodRecord>,
    /// (namespace, replicaset) → (owner kind, owner name).
    pub replicaset_owners: HashMap<(String, String), (String, String)>,
    pub namespace_labels: HashMap<String, BTreeMap<String, String>>,
    pub waiting_reasons: Vec<String>,
    /// First and last bucket of any sample.
    pub first_bucket: i64,
    pub last_bucket: i64,
    /// Samples kept (samples of skipped families are not counted).
    pub samples: u64,
}

/// Which labels name a DCGM series' workload. Unset: detected per series
/// (`exported_pod`/`exported_namespace` when present, else `pod`/`namespace`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkloadLabels {
    /// e.g. `kubernetes_pod_name` on older relabelling setups.
    pub pod: Option<String>,
    pub namespace: Option<String>,
}

/// How to read a trace.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// Override of the workload label names.
    pub workload_labels: WorkloadLabels,
    pub step_seconds: i64,
    /// Ignore metric families not in [`KNOWN_METRICS`] instead of failing.
    pub skip_unknown_metrics: bool,
}

impl Default for ReadOptions {
    /// One-minute steps, detected workload labels, unknown metric families refused.
    fn default() -> Self {
        Self {
            workload_labels: WorkloadLabels::default(),
            step_seconds: 60,
            skip_unknown_metrics: false,
        }
    }
}

enum Target {
    Gpu(usize, Metric),
    Pod(usize, PodMetric),
    Skip,
}

#[derive(Clone, Copy)]
enum Metric {
    EngineActive,
    GpuUtil,
    FbUsed,
    Power,
    PcieRx,
}

#[derive(Clone, Copy)]
enum PodMetric {
    Seen,
    Created,
    Request,
    Waiting(usize),
    Phase(f32),
}

struct SeriesState {
    target: Target,
    last_timestamp: f64,
}

/// Builds a [`Trace`] from samples fed in any series order (each series' samples in
/// increasing time): from an OpenMetrics file ([`read_trace`]) or Prometheus answers.
pub struct TraceBuilder {
    trace: Trace,
    skip_unknown_metrics: bool,
    workload_labels: WorkloadLabels,
    series: HashMap<String, SeriesState>,
    gpu_index: HashMap<(String, String, String), usize>,
    pod_index: HashMap<(String, String), usize>,
    // Samples of one series are usually contiguous: remember the last series to skip the
    // hash lookup on almost every sample.
    last_series: String,
    last_state: Option<SeriesState>,
}

impl TraceBuilder {
    pub fn new(options: &ReadOptions) -> Self {
        Self {
            trace: Trace {
                step_seconds: options.step_seconds.max(1),
                first_bucket: i64::MAX,
                last_bucket: i64::MIN,
                ..Trace::default()
            },
            skip_unknown_metrics: options.skip_unknown_metrics,
            workload_labels: options.workload_labels.clone(),
            series: HashMap::new(),
            gpu_index: HashMap::new(),
            pod_index: HashMap::new(),
            last_series: String::new(),
            last_state: None,
        }
    }

    /// Adds one sample; the error says what is wrong with it (the caller adds where).
    pub fn add(&mut self, s: &RawSample<'_>) -> Result<(), String> {
        if self.last_series != s.series {
            if let Some(state) = self.last_state.take() {
                self.series
                    .insert(std::mem::take(&mut self.last_series), state);
            }
            let state = match self.series.remove(s.series) {
                Some(state) => state,
                None => SeriesState {
                    target: classify_series(
                        s,
                        self.skip_unknown_metrics,
                        &self.workload_labels,
                        &mut self.trace,
                        &mut self.gpu_index,
                        &mut self.pod_index,
                    )?,
                    last_timestamp: f64::NEG_INFINITY,
                },
            };
            self.last_series.clear();
            self.last_series.push_str(s.series);
            self.last_state = Some(state);
        }
        let trace = &mut self.trace;
        let state = self.last_state.as_mut().expect("set above");
        if s.timestamp <= state.last_timestamp {
            return Err(format!(
                "timestamps of series {} go backwards ({} after {}): samples of a series must be in increasing time order",
                s.series, s.timestamp, state.last_timestamp
            ));
        }
        state.last_timestamp = s.timestamp;
        if matches!(state.target, Target::Skip) {
            return Ok(());
        }
        if !TIMESTAMPS.contains(&s.timestamp) {
            return Err(format!(
                "timestamp {} is not a time between 1970 and 5138 (unix seconds; milliseconds when above 1e11)",
                s.timestamp
            ));
        }
        let bucket = (s.timestamp as i64).div_euclid(trace.step_seconds);
        let (first, last) = (
            trace.first_bucket.min(bucket),
            trace.last_bucket.max(bucket),
        );
        if last - first >= MAX_TRACE_BUCKETS {
            return Err(format!(
                "the trace would span {} steps of {}s (from {} to {}); at most {MAX_TRACE_BUCKETS} steps: raise --step or cut the trace",
                last - first + 1,
                trace.step_seconds,
                jiff::Timestamp::from_second(first * trace.step_seconds)
                    .map_or_else(|_| first.to_string(), |t| t.to_string()),
                jiff::Timestamp::from_second(last * trace.step_seconds)
                    .map_or_else(|_| last.to_string(), |t| t.to_string()),
            ));
        }
        let v = s.value as f32;
        match state.target {
            Target::Skip => return Ok(()),
            Target::Gpu(i, m) => {
                let g = &mut trace.gpus[i];
                match m {
                    Metric::EngineActive => g.engine_active.put(bucket, v, f32::max),
                    Metric::GpuUtil => g.gpu_util.put(bucket, v, f32::max),
                    Metric::FbUsed => g.fb_used.put(bucket, v, |_, new| new),
                    Metric::Power => g.power.put(bucket, v, f32::max),
                    Metric::PcieRx => g.pcie_rx.put(bucket, v, f32::max),
                }
            }
            Target::Pod(i, m) => {
                let p = &mut trace.pods[i];
                p.first_bucket = p.first_bucket.min(bucket);
                p.last_bucket = p.last_bucket.max(bucket);
                match m {
                    PodMetric::Seen | PodMetric::Request => {}
                    PodMetric::Created => p.created = Some(s.value as i64),
                    PodMetric::Waiting(reason) if s.value >= 1.0 => {
                        p.waiting.put(bucket, reason as f32, |_, n| n)
                    }
                    PodMetric::Phase(code) if s.value >= 1.0 => p.phase.put(bucket, code, |_, n| n),
                    PodMetric::Waiting(_) | PodMetric::Phase(_) => {}
                }
            }
        }
        trace.first_bucket = trace.first_bucket.min(bucket);
        trace.last_bucket = trace.last_bucket.max(bucket);
        trace.samples += 1;
        Ok(())
    }

    /// The trace, or an error when no sample was added.
    pub fn finish(self, source: &str) -> Result<Trace, TraceError> {
        if self.trace.samples == 0 || self.trace.first_bucket > self.trace.last_bucket {
            return Err(TraceError {
                source: source.into(),
                line: 0,
                message: "no samples: the trace is empty".into(),
            });
        }
        let mut trace = self.trace;
        // Deterministic order whatever order the samples came in (files and Prometheus
        // answers list series differently).
        trace.gpus.sort_by(|a, b| {
            (&a.gpu.namespace, &a.gpu.pod, &a.gpu.id).cmp(&(
                &b.gpu.namespace,
                &b.gpu.pod,
                &b.gpu.id,
            ))
        });
        trace
            .pods
            .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Ok(trace)
    }
}

/// Reads an OpenMetrics trace into memory, bucketing samples by `step_seconds`.
pub fn read_trace<R: BufRead>(
    input: R,
    source: &str,
    options: &ReadOptions,
) -> Result<Trace, TraceError> {
    let mut builder = TraceBuilder::new(options);
    read_samples(input, source, |s| builder.add(s))?;
    builder.finish(source)
}

/// Who a DCGM series is about, from its labels.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuIdentity {
    /// `GPU-<uuid>` or `GPU-<uuid>/<GPU_I_ID>`.
    pub id: String,
    pub model: String,
    pub hostname: String,
    pub mig_profile: Option<String>,
    pub share: f64,
    /// The workload's namespace and pod (empty: none).
    pub namespace: String,
    pub pod: String,
}

/// Reads a DCGM series' identity. Prometheus renames the workload's labels to
/// `exported_*` when the exporter's own target labels collide: those win when present.
/// The newest exporter spells `Hostname` as `hostname`: both are read.
pub fn gpu_identity<'a>(
    label: impl Fn(&str) -> Option<&'a str>,
    names: &WorkloadLabels,
) -> Result<GpuIdentity, String> {
    let uuid = label("UUID").ok_or("needs a non-empty `UUID` label")?;
    let instance = label("GPU_I_ID");
    let (namespace, pod) = match (&names.pod, label("exported_pod")) {
        (Some(pod_label), _) => (
            label(names.namespace.as_deref().unwrap_or("namespace")).unwrap_or_default(),
            label(pod_label).unwrap_or_default(),
        ),
        (None, Some(pod)) => (label("exported_namespace").unwrap_or_default(), pod),
        (None, None) => (
            label(names.namespace.as_deref().unwrap_or("namespace")).unwrap_or_default(),
            label("pod").unwrap_or_default(),
        ),
    };
    let mig_profile = label("GPU_I_PROFILE").map(str::to_string);
    Ok(GpuIdentity {
        id: match instance {
            Some(i) => format!("{uuid}/{i}"),
            None => uuid.to_string(),
        },
        model: label("modelName").unwrap_or("unknown").to_string(),
        hostname: label("Hostname")
            .or(label("hostname"))
            .unwrap_or_default()
            .to_string(),
        share: mig_profile.as_deref().map_or(1.0, mig_share),
        mig_profile,
        namespace: namespace.to_string(),
        pod: pod.to_string(),
    })
}

fn label<'a>(labels: &'a [(String, String)], name: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

fn require<'a>(
    labels: &'a [(String, String)],
    name: &str,
    metric: &str,
) -> Result<&'a str, String> {
    label(labels, name).ok_or_else(|| format!("{metric} needs a non-empty `{name}` label"))
}

fn classify_series(
    s: &RawSample<'_>,
    skip_unknown_metrics: bool,
    workload_labels: &WorkloadLabels,
    trace: &mut Trace,
    gpu_index: &mut HashMap<(String, String, String), usize>,
    pod_index: &mut HashMap<(String, String), usize>,
) -> Result<Target, String> {
    let metric = match s.metric {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => Some(Metric::EngineActive),
        "DCGM_FI_DEV_GPU_UTIL" => Some(Metric::GpuUtil),
        "DCGM_FI_DEV_FB_USED" => Some(Metric::FbUsed),
        "DCGM_FI_DEV_POWER_USAGE" => Some(Metric::Power),
        "DCGM_FI_PROF_PCIE_RX_BYTES" => Some(Metric::PcieRx),
        _ => None,
    };
    if !KNOWN_METRICS.contains(&s.metric) {
        return if skip_unknown_metrics {
            Ok(Target::Skip)
        } else {
            Err(format!(
                "unknown metric {}: backtest reads {}; pass --skip-unknown-metrics to ignore other families",
                s.metric,
                KNOWN_METRICS.join(", ")
            ))
        };
    }
    let labels = parse_labels(s.labels)?;
    if let Some(m) = metric {
        let gpu = gpu_identity(|name| label(&labels, name), workload_labels)
            .map_err(|e| format!("{}: {e}", s.metric))?;
        let key = (gpu.id.clone(), gpu.namespace.clone(), gpu.pod.clone());
        let index = *gpu_index.entry(key).or_insert_with(|| {
            trace.gpus.push(GpuSeries {
                gpu,
                ..GpuSeries::default()
            });
            trace.gpus.len() - 1
        });
        return Ok(Target::Gpu(index, m));
    }
    match s.metric {
        "kube_replicaset_owner" => {
            let ns = require(&labels, "namespace", s.metric)?;
            let rs = require(&labels, "replicaset", s.metric)?;
            if let (Some(kind), Some(name)) =
                (label(&labels, "owner_kind"), label(&labels, "owner_name"))
                && kind != "<none>"
            {
                {
                    trace
                        .replicaset_owners
                        .insert((ns.into(), rs.into()), (kind.into(), name.into()));
                }
            }
            Ok(Target::Skip)
        }
        "kube_namespace_labels" => {
            let ns = require(&labels, "namespace", s.metric)?;
            let entry = trace.namespace_labels.entry(ns.to_string()).or_default();
            for (k, v) in &labels {
                if let Some(key) = k.strip_prefix("label_") {
                    entry.insert(key.to_string(), v.clone());
                }
            }
            Ok(Target::Skip)
        }
        _ => {
            let ns = require(&labels, "namespace", s.metric)?;
            let pod = require(&labels, "pod", s.metric)?;
            let index = *pod_index.entry((ns.into(), pod.into())).or_insert_with(|| {
                trace.pods.push(PodRecord {
                    namespace: ns.into(),
                    name: pod.into(),
                    first_bucket: i64::MAX,
                    last_bucket: i64::MIN,
                    ..PodRecord::default()
                });
                trace.pods.len() - 1
            });
            let record = &mut trace.pods[index];
            let target = match s.metric {
                "kube_pod_owner" => {
                    if let (Some(kind), Some(name)) =
                        (label(&labels, "owner_kind"), label(&labels, "owner_name"))
                        && kind != "<none>"
                        && label(&labels, "owner_is_controller") != Some("false")
                    {
                        record.owner = Some((kind.into(), name.into()));
                    }
                    PodMetric::Seen
                }
                "kube_pod_created" => PodMetric::Created,
                "kube_pod_labels" => {
                    copy_prefixed(&labels, "label_", &mut record.labels, &[keys::EXEMPT_LABEL]);
                    PodMetric::Seen
                }
                "kube_pod_annotations" => {
                    copy_prefixed(
                        &labels,
                        "annotation_",
                        &mut record.annotations,
                        &[
                            keys::SNOOZE_UNTIL,
                            keys::OWNER,
                            keys::WARNED_AT,
                            keys::REAPED_AT,
                        ],
                    );
                    PodMetric::Seen
                }
                "kube_pod_container_resource_requests" => {
                    let resource = label(&labels, "resource").unwrap_or_default();
                    if resource == "nvidia_com_gpu" || resource.starts_with("nvidia_com_mig_") {
                        let container = label(&labels, "container").unwrap_or_default().to_string();
                        let count = s.value.max(0.0).round() as u32;
                        let slot = record.gpu_requests.entry(container).or_default();
                        *slot = (*slot).max(count);
                        PodMetric::Request
                    } else {
                        PodMetric::Seen
                    }
                }
                "kube_pod_container_status_waiting_reason" => {
                    let reason = label(&labels, "reason").unwrap_or("Waiting");
                    let i = match trace.waiting_reasons.iter().position(|r| r == reason) {
                        Some(i) => i,
                        None => {
                            trace.waiting_reasons.push(reason.to_string());
                            trace.waiting_reasons.len() - 1
                        }
                    };
                    PodMetric::Waiting(i)
                }
                "kube_pod_status_phase" => PodMetric::Phase(match label(&labels, "phase") {
                    Some("Pending") => PHASE_PENDING,
                    Some("Succeeded") => PHASE_SUCCEEDED,
                    Some("Failed") => PHASE_FAILED,
                    _ => PHASE_RUNNING,
                }),
                _ => PodMetric::Seen,
            };
            Ok(Target::Pod(index, target))
        }
    }
}

/// Copies `prefix*` labels into `out` under their kube-state-metrics keys, and gpu-reaper's
/// own keys (`known`) also under their real names so the engine finds them.
fn copy_prefixed(
    labels: &[(String, String)],
    prefix: &str,
    out: &mut BTreeMap<String, String>,
    known: &[&str],
) {
    for (k, v) in labels {
        if let Some(key) = k.strip_prefix(prefix) {
            out.insert(key.to_string(), v.clone());
            if let Some(real) = known.iter().find(|real| keys::ksm_sanitize(real) == key) {
                out.insert((*real).to_string(), v.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Trace, TraceError> {
        read_trace(
            text.as_bytes(),
            "t.om",
            &ReadOptions {
                step_seconds: 60,
                skip_unknown_metrics: false,
                workload_labels: Default::default(),
            },
        )
    }

    #[test]
    fn the_exported_pod_label_wins_over_the_exporters_own_pod_label() {
        let t = read(concat!(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-1\",modelName=\"NVIDIA L4\",pod=\"nvidia-dcgm-exporter-x\",namespace=\"gpu-operator\",exported_pod=\"vllm-0\",exported_namespace=\"inference\"} 0.5 1700000000\n",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-2\",modelName=\"NVIDIA L4\",pod=\"train-0\",namespace=\"research\"} 0.1 1700000000\n",
        ))
        .unwrap();
        assert_eq!(
            (t.gpus[0].gpu.namespace.as_str(), t.gpus[0].gpu.pod.as_str()),
            ("inference", "vllm-0")
        );
        assert_eq!(
            (t.gpus[1].gpu.namespace.as_str(), t.gpus[1].gpu.pod.as_str()),
            ("research", "train-0")
        );
    }

    #[test]
    fn workload_label_names_can_be_overridden() {
        let text = "DCGM_FI_DEV_FB_USED{UUID=\"GPU-1\",kubernetes_pod_name=\"train-0\",kubernetes_namespace=\"ml\",pod=\"exporter\"} 1 1700000000\n";
        let options = ReadOptions {
            workload_labels: WorkloadLabels {
                pod: Some("kubernetes_pod_name".into()),
                namespace: Some("kubernetes_namespace".into()),
            },
            step_seconds: 60,
            skip_unknown_metrics: false,
        };
        let t = read_trace(text.as_bytes(), "t.om", &options).unwrap();
        assert_eq!(
            (t.gpus[0].gpu.namespace.as_str(), t.gpus[0].gpu.pod.as_str()),
            ("ml", "train-0")
        );
        let t = read(text).unwrap();
        assert_eq!(
            t.gpus[0].gpu.pod, "exporter",
            "auto-detection without the override"
        );
    }

    #[test]
    fn mig_instances_are_separate_gpus_with_their_share() {
        let t = read(concat!(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-a\",GPU_I_ID=\"13\",GPU_I_PROFILE=\"1g.5gb\",pod=\"p\",namespace=\"n\"} 0 1700000000\n",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-a\",GPU_I_ID=\"5\",GPU_I_PROFILE=\"3g.20gb\",pod=\"q\",namespace=\"n\"} 0 1700000000\n",
        ))
        .unwrap();
        assert_eq!(t.gpus.len(), 2);
        assert_eq!(t.gpus[0].gpu.id, "GPU-a/13");
        assert!((t.gpus[1].gpu.share - 3.0 / 7.0).abs() < 1e-9);
    }

    #[test]
    fn timestamps_going_backwards_in_a_series_are_an_error_with_the_line() {
        let e = read("DCGM_FI_DEV_FB_USED{UUID=\"GPU-1\"} 1 1700000060\nDCGM_FI_DEV_FB_USED{UUID=\"GPU-1\"} 1 1700000000\n")
            .unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("go backwards"), "{e}");
    }

    #[test]
    fn an_unknown_metric_is_an_error_unless_skipped() {
        let text = "DCGM_FI_DEV_SM_CLOCK{UUID=\"GPU-1\"} 1410 1700000000\nDCGM_FI_DEV_FB_USED{UUID=\"GPU-1\"} 1 1700000000\n";
        let e = read(text).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("t.om:1: unknown metric DCGM_FI_DEV_SM_CLOCK"),
            "{e}"
        );
        let t = read_trace(
            text.as_bytes(),
            "t.om",
            &ReadOptions {
                step_seconds: 60,
                skip_unknown_metrics: true,
                workload_labels: Default::default(),
            },
        )
        .unwrap();
        assert_eq!(t.gpus.len(), 1);
    }

    #[test]
    fn a_dcgm_series_without_uuid_is_rejected() {
        let e = read("DCGM_FI_DEV_FB_USED{gpu=\"0\"} 1 1700000000\n").unwrap_err();
        assert!(
            e.message
                .contains("DCGM_FI_DEV_FB_USED: needs a non-empty `UUID` label"),
            "{e}"
        );
    }

    #[test]
    fn ksm_series_build_the_pod_inventory() {
        let t = read(concat!(
            "kube_pod_owner{namespace=\"ml\",pod=\"web-abc-1\",owner_kind=\"ReplicaSet\",owner_name=\"web-abc\",owner_is_controller=\"true\"} 1 1700000000\n",
            "kube_replicaset_owner{namespace=\"ml\",replicaset=\"web-abc\",owner_kind=\"Deployment\",owner_name=\"web\"} 1 1700000000\n",
            "kube_pod_labels{namespace=\"ml\",pod=\"web-abc-1\",label_gpureaper_io_exempt=\"true\"} 1 1700000000\n",
            "kube_pod_container_resource_requests{namespace=\"ml\",pod=\"web-abc-1\",container=\"c\",resource=\"nvidia_com_gpu\",unit=\"integer\"} 2 1700000000\n",
            "kube_pod_container_status_waiting_reason{namespace=\"ml\",pod=\"web-abc-1\",container=\"c\",reason=\"CrashLoopBackOff\"} 1 1700000060\n",
        ))
        .unwrap();
        let p = &t.pods[0];
        assert_eq!(p.owner, Some(("ReplicaSet".into(), "web-abc".into())));
        assert_eq!(p.gpu_devices(), 2);
        assert_eq!(
            p.labels.get(keys::EXEMPT_LABEL).map(String::as_str),
            Some("true")
        );
        assert_eq!(p.waiting.get(1_700_000_060 / 60), Some(0.0));
        assert_eq!(t.waiting_reasons, ["CrashLoopBackOff"]);
        assert_eq!(
            t.replicaset_owners[&("ml".to_string(), "web-abc".to_string())].1,
            "web"
        );
    }

    #[test]
    fn real_dcgm_exporter_scrapes_need_timestamps() {
        // The fixtures are live /metrics scrapes: no timestamps, so backtest refuses them
        // with a line-numbered message rather than guessing a time.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures/dcgm");
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| {
            panic!("{dir}: {e} (the public fixtures live beside the checkout)")
        });
        for entry in entries
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "prom"))
        {
            let text = std::fs::read_to_string(entry.path()).unwrap();
            let e = read_trace(
                text.as_bytes(),
                "f",
                &ReadOptions {
                    step_seconds: 60,
                    skip_unknown_metrics: true,
                    workload_labels: Default::default(),
                },
            )
            .unwrap_err();
            assert!(
                e.message.contains("no timestamp"),
                "{}: {e}",
                entry.path().display()
            );
        }
    }
}
