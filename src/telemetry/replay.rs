//! PURE: what `gpu-reaper replay` serves — a live dcgm-exporter `/metrics` page made from
//! a recorded trace (shifted to "now", advancing with the clock at a chosen speed,
//! looping at its end) or from activity patterns (`idle`, `busy:5m,idle:30m`), with the
//! recorded pods mapped onto pods that exist in the cluster. The edge
//! (`commands::replay`) owns the clock, the HTTP server and the pod listing.
//!
//! The page is written as dcgm-exporter 3.x/4.x writes it with `--kubernetes`: one gauge
//! per GPU and field, labelled `gpu`, `UUID`, `device`, `modelName`, `Hostname` (and
//! `GPU_I_PROFILE`/`GPU_I_ID` for MIG), and the workload's `namespace`, `pod`, `container`.

use std::fmt::Write as _;

use super::trace::{Column, Trace};

/// The fields served, with their value for a busy fraction `active` (0–1) where the
/// trace has none: what a pattern serves.
const FIELDS: &[(&str, &str)] = &[
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
];

/// One segment of a pattern: this busy fraction for this long (`None`: for ever).
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub active: f32,
    pub seconds: Option<f64>,
}

/// A repeating activity pattern, e.g. `busy:2m,idle:10m` (loops) or `busy:2m,idle`
/// (idle for ever after two busy minutes). A segment is `idle` (0), `busy` (0.9) or a
/// fraction `0.35`, with an optional `:DURATION` (Go durations: `90s`, `5m`).
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern {
    pub segments: Vec<Segment>,
}

impl std::str::FromStr for Pattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.split(',').map(str::trim).collect();
        let mut segments = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let (level, duration) = match part.split_once(':') {
                Some((l, d)) => (l, Some(d)),
                None => (*part, None),
            };
            let active = match level {
                "idle" => 0.0,
                "busy" => 0.9,
                number => number
                    .parse::<f32>()
                    .ok()
                    .filter(|v| (0.0..=1.0).contains(v))
                    .ok_or_else(|| {
                        format!("{level:?} in pattern {text:?} is not idle, busy or a fraction from 0 to 1")
                    })?,
            };
            let seconds = match duration {
                Some(d) => {
                    let parsed: kube::core::Duration = d.parse().map_err(|e| {
                        format!(
                            "{d:?} in pattern {text:?} is not a duration such as 90s or 5m: {e}"
                        )
                    })?;
                    if parsed.is_negative() {
                        return Err(format!("{part:?} in pattern {text:?} is negative"));
                    }
                    let seconds: std::time::Duration = parsed.into();
                    if seconds.is_zero() {
                        return Err(format!("{part:?} in pattern {text:?} lasts no time"));
                    }
                    Some(seconds.as_secs_f64())
                }
                None if i + 1 == parts.len() => None,
                None => {
                    return Err(format!(
                        "{part:?} in pattern {text:?} needs a duration (only the last segment may last for ever), e.g. {level}:10m"
                    ));
                }
            };
            segments.push(Segment { active, seconds });
        }
        Ok(Pattern { segments })
    }
}

impl Pattern {
    /// The busy fraction `elapsed` seconds after the pattern started.
    pub fn at(&self, elapsed: f64) -> f32 {
        let period: f64 = self.segments.iter().filter_map(|s| s.seconds).sum();
        let open_ended = self.segments.last().is_some_and(|s| s.seconds.is_none());
        let mut t = if open_ended || period <= 0.0 {
            elapsed.max(0.0)
        } else {
            elapsed.max(0.0) % period
        };
        for s in &self.segments {
            match s.seconds {
                Some(d) if t >= d => t -= d,
                _ => return s.active,
            }
        }
        self.segments.last().map_or(0.0, |s| s.active)
    }
}

/// Where a recorded or patterned GPU shows up: a pod of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodTarget {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// GPUs the pod holds: a pattern serves one series per GPU.
    pub gpus: u32,
}

/// Which pods a source feeds: one pod by name, or every pod whose name starts with a
/// prefix (`ml/chat-*`: the pods of Deployment chat, whatever their names become after a
/// scale to zero and back; `ml/*`: every GPU pod of the namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSelector {
    pub namespace: String,
    pub name: String,
    pub prefix: bool,
}

impl std::str::FromStr for PodSelector {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (namespace, name) = text
            .split_once('/')
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
            .ok_or_else(|| {
                format!("{text:?} is not NAMESPACE/POD or NAMESPACE/PREFIX*, e.g. ml/chat*")
            })?;
        let (name, prefix) = match name.strip_suffix('*') {
            Some(p) => (p, true),
            None => (name, false),
        };
        Ok(PodSelector {
            namespace: namespace.into(),
            name: name.into(),
            prefix,
        })
    }
}

impl PodSelector {
    pub fn matches(&self, namespace: &str, pod: &str) -> bool {
        namespace == self.namespace
            && if self.prefix {
                pod.starts_with(&self.name)
            } else {
                pod == self.name
            }
    }
}

/// A stable fake GPU UUID for (node, index), so a pod's series keep their identity
/// across scrapes.
fn uuid_for(seed: &str, index: u32) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in seed.bytes().chain(index.to_le_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hash >> 32,
        (hash >> 16) & 0xffff,
        hash & 0xffff,
        (hash >> 48) & 0xffff,
        hash & 0xffff_ffff_ffff
    )
}

/// One series group of the page: a GPU, who holds it, and its values now (`None`: no
/// sample, the series is left out as an exporter that cannot read a field does).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuNow {
    pub uuid: String,
    pub index: u32,
    pub model: String,
    pub hostname: String,
    pub mig: Option<(String, String)>,
    pub target: PodTarget,
    /// Per field of [`FIELDS`].
    pub values: [Option<f64>; 4],
}

/// Values a pattern serves for a busy fraction: utilisation follows it, the weights stay
/// resident (an idle inference server's memory does not go), power rises with work.
fn pattern_values(active: f32) -> [Option<f64>; 4] {
    let a = f64::from(active);
    [
        Some(a),
        Some((a * 100.0).round()),
        Some(40_000.0),
        Some(70.0 + 500.0 * a),
    ]
}

/// The GPUs of `targets` under `pattern`, `elapsed` seconds after it started.
pub fn pattern_now(pattern: &Pattern, targets: &[PodTarget], elapsed: f64) -> Vec<GpuNow> {
    let values = pattern_values(pattern.at(elapsed));
    let mut out = Vec::new();
    for t in targets {
        for index in 0..t.gpus {
            out.push(GpuNow {
                uuid: uuid_for(&format!("{}/{}", t.namespace, t.pod), index),
                index,
                model: "NVIDIA H100 80GB HBM3".into(),
                hostname: "replay".into(),
                mig: None,
                target: t.clone(),
                values,
            });
        }
    }
    out
}

/// A recorded trace to replay: its allocated GPUs, each mapped to where it shows up.
#[derive(Debug, Clone)]
pub struct TraceReplay {
    pub step_seconds: i64,
    pub first_bucket: i64,
    /// Buckets in one loop.
    pub buckets: i64,
}

impl TraceReplay {
    pub fn new(trace: &Trace) -> Self {
        Self {
            step_seconds: trace.step_seconds.max(1),
            first_bucket: trace.first_bucket,
            buckets: (trace.last_bucket - trace.first_bucket + 1).max(1),
        }
    }

    /// The trace's bucket `elapsed` seconds (of trace time) into the replay, looping.
    pub fn bucket_at(&self, elapsed: f64) -> i64 {
        let offset = (elapsed.max(0.0) / self.step_seconds as f64).floor() as i64;
        self.first_bucket + offset.rem_euclid(self.buckets)
    }

    /// Every allocated GPU of `trace` at `elapsed`, on the pod `map` gives for its
    /// recorded (namespace, pod); GPUs `map` drops (`None`) are left out.
    pub fn now(
        &self,
        trace: &Trace,
        elapsed: f64,
        map: impl Fn(&str, &str) -> Option<PodTarget>,
    ) -> Vec<GpuNow> {
        let b = self.bucket_at(elapsed);
        let value = |c: &Column| c.get(b).map(f64::from);
        trace
            .gpus
            .iter()
            .filter(|g| !g.pod_unallocated())
            .filter_map(|g| {
                let target = map(&g.gpu.namespace, &g.gpu.pod)?;
                let (uuid, instance) = match g.gpu.id.split_once('/') {
                    Some((u, i)) => (u.to_string(), Some(i.to_string())),
                    None => (g.gpu.id.clone(), None),
                };
                Some(GpuNow {
                    uuid,
                    index: 0,
                    model: g.gpu.model.clone(),
                    hostname: g.gpu.hostname.clone(),
                    mig: g.gpu.mig_profile.clone().zip(instance),
                    target,
                    values: [
                        value(&g.engine_active),
                        value(&g.gpu_util),
                        value(&g.fb_used),
                        value(&g.power),
                    ],
                })
            })
            .collect()
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The `/metrics` page (Prometheus text format 0.0.4, as dcgm-exporter serves it).
pub fn render(gpus: &[GpuNow]) -> String {
    let mut page = String::new();
    for (field, (name, help)) in FIELDS.iter().enumerate() {
        if !gpus.iter().any(|g| g.values[field].is_some()) {
            continue;
        }
        let _ = writeln!(page, "# HELP {name} {help}\n# TYPE {name} gauge");
        for g in gpus {
            let Some(v) = g.values[field] else { continue };
            let mig = g
                .mig
                .as_ref()
                .map(|(profile, id)| {
                    format!(
                        ",GPU_I_PROFILE=\"{}\",GPU_I_ID=\"{}\"",
                        escape(profile),
                        escape(id)
                    )
                })
                .unwrap_or_default();
            let _ = writeln!(
                page,
                "{name}{{gpu=\"{index}\",UUID=\"{uuid}\",device=\"nvidia{index}\",modelName=\"{model}\",Hostname=\"{host}\"{mig},container=\"{container}\",namespace=\"{ns}\",pod=\"{pod}\"}} {v}",
                index = g.index,
                uuid = escape(&g.uuid),
                model = escape(&g.model),
                host = escape(&g.hostname),
                container = escape(&g.target.container),
                ns = escape(&g.target.namespace),
                pod = escape(&g.target.pod),
            );
        }
    }
    page
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;
