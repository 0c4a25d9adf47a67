//! Incremental live telemetry: every GPU's activity state kept between evaluation
//! cycles, fed from raw samples that are read once.
//!
//! Each cycle reads only the samples since the previous successful read (`FAMILY[Δs]`
//! range selectors at the end of the read: raw samples as scraped, no lookback, so an
//! exporter gap stays a gap — invariant 1), for every GPU at once and whatever the number
//! of policies. The samples are bucketed per step exactly as `backtest` buckets a trace
//! (highest value per step; memory used: the last one) and advance the same
//! [`ActivityTracker`]s, one per GPU and per distinct activity rule set of the policies
//! (signal, threshold, window, minimum coverage). Policies then take their observations
//! from memory.
//!
//! At start-up, after a gap longer than the horizon (a controller outage, a replica that
//! just became leader after a long standby) or when a policy brings a rule set no tracker
//! follows yet, the state is rebuilt from one bounded read of the horizon. A missed
//! cycle, or an outage shorter than the horizon, is one read of the gap.
//!
//! Reads tile time without overlap: (previous end, end]. The bucket holding the end is
//! not complete yet; its samples so far are kept aside and only committed to the
//! trackers once a later read moves past it, so a partial bucket is never counted twice
//! nor as a gap. An observation at `now` looks at the trackers as if that partial bucket
//! were complete. Each bucket is stamped at the end of the time it covers (a committed
//! one at its step's end, the partial one at the end of the last read): "busy" holds
//! until then and the idle clock starts there, so a cycle at any phase of the minute
//! sees a GPU busy at every scrape as busy (stamped at the bucket's start, it looked idle
//! under a 1-minute window between cycles), and an idle span is never longer than the
//! truth.
//!
//! Pure: the reads themselves are [`super::prometheus::PrometheusSource::refresh`].

use std::collections::HashMap;

use jiff::Timestamp;

use super::trace::{GpuIdentity, GpuSeries, Trace};
use crate::api::policy::Signal;

/// Observations of every GPU at one instant, keyed by (namespace, pod, GPU id); GPUs with
/// no workload have empty namespace and pod. `pod` indexes are left 0 for the caller.
pub type Observations =
    std::collections::BTreeMap<(String, String, String), crate::engine::GpuObservation>;
use crate::engine::{ActivityTracker, GpuObservation, Rules, Sample};

/// The families one read asks for, whatever the policies: the two activity signals, then
/// memory held, PCIe receive and power.
pub const FAMILIES: [&str; 5] = [
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_DEV_POWER_USAGE",
];

/// Seconds a read stays behind `now` by default: Prometheus makes a scrape's samples
/// visible when the scrape ends, stamped with its start, so the newest seconds may still
/// fill in. Reads never overlap, so a sample that became visible later than this is not
/// read (`controller --prometheus-read-lag`).
pub const READ_LAG_SECONDS: i64 = 15;

/// How the live reads are made.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadSettings {
    /// Label matchers added to every family (`{cluster="a"}`), or empty.
    pub selector: String,
    /// Seconds each read ends behind the clock.
    pub lag_seconds: i64,
    pub workload_labels: super::trace::WorkloadLabels,
}

impl Default for ReadSettings {
    fn default() -> Self {
        Self {
            selector: String::new(),
            lag_seconds: READ_LAG_SECONDS,
            workload_labels: Default::default(),
        }
    }
}

/// How far back a policy's observations need samples: the longer of its warning and
/// action delays, plus the idle window, plus ten minutes (as the per-policy queries
/// looked back) — and one more idle window before that, so that the coverage of the
/// first window is known. Without it, a rebuilt state would be blind for most of its
/// first window, the idle clock would restart after that blind spot, and a workload
/// warned before the restart would look like a new idle period and be warned again.
pub fn horizon_seconds(rules: &Rules) -> i64 {
    (rules.action_after.max(rules.warn_after) + rules.window * 2).as_secs() + 600
}

/// What an [`ActivityTracker`] depends on in a policy: policies that agree on these share
/// their trackers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct RuleSet {
    signal: u8,
    threshold: u64,
    window_seconds: i64,
    min_coverage: u64,
}

impl RuleSet {
    fn of(rules: &Rules) -> Self {
        Self {
            signal: match rules.signal {
                Signal::Auto | Signal::Unknown => 0,
                Signal::EngineActive => 1,
                Signal::GpuUtil => 2,
            },
            threshold: rules.threshold.to_bits(),
            window_seconds: rules.window.as_secs(),
            min_coverage: rules.min_coverage.to_bits(),
        }
    }
}

/// One read the state asks for: raw samples with timestamps in (`from`, `to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    pub from: i64,
    pub to: i64,
    /// The state starts over from this read (start-up, a long gap, new rule sets).
    pub rebuild: bool,
}

struct Gpu {
    identity: GpuIdentity,
    /// One per rule set, in the order of `LiveTelemetry::rule_sets`; advanced through
    /// the bucket before the pending one.
    trackers: Vec<ActivityTracker>,
    /// Samples so far of the bucket holding `read_until`.
    pending: Sample,
    /// Last bucket with any sample.
    last_seen: i64,
}

/// The controller's telemetry state between cycles (see the module documentation).
pub struct LiveTelemetry {
    step: i64,
    horizon: i64,
    rule_sets: Vec<(RuleSet, Rules)>,
    gpus: HashMap<(String, String, String), Gpu>,
    /// End of the last successful read: every sample stamped at or before it is in.
    read_until: Option<i64>,
}

impl LiveTelemetry {
    /// An empty state, evaluated on steps of `step_seconds` (the trackers' resolution).
    pub fn new(step_seconds: i64) -> Self {
        Self {
            step: step_seconds.max(1),
            horizon: 0,
            rule_sets: Vec::new(),
            gpus: HashMap::new(),
            read_until: None,
        }
    }

    /// The trackers' step, seconds: reads are bucketed on it.
    pub fn step_seconds(&self) -> i64 {
        self.step
    }

    /// GPUs followed.
    pub fn gpus(&self) -> usize {
        self.gpus.len()
    }

    /// End of the last successful read (unix seconds).
    pub fn read_until(&self) -> Option<i64> {
        self.read_until
    }

    /// The read that brings the state up to `to` for `policies` (None: nothing new).
    /// Drops the trackers of rule sets no policy uses any more.
    pub fn next_read(&mut self, policies: &[Rules], to: i64) -> Option<Read> {
        let horizon = policies.iter().map(horizon_seconds).max().unwrap_or(0);
        let wanted: Vec<RuleSet> = policies.iter().map(RuleSet::of).collect();
        let known = wanted
            .iter()
            .all(|w| self.rule_sets.iter().any(|(r, _)| r == w));
        let rebuild = match self.read_until {
            None => true,
            Some(until) => !known || horizon > self.horizon || to - until > self.horizon,
        };
        if rebuild {
            return Some(Read {
                from: to - horizon,
                to,
                rebuild: true,
            });
        }
        if self.rule_sets.len() > wanted.len()
            || self.rule_sets.iter().any(|(r, _)| !wanted.contains(r))
        {
            let keep: Vec<bool> = self
                .rule_sets
                .iter()
                .map(|(r, _)| wanted.contains(r))
                .collect();
            let mut i = 0;
            self.rule_sets.retain(|_| {
                i += 1;
                keep[i - 1]
            });
            for gpu in self.gpus.values_mut() {
                let mut i = 0;
                gpu.trackers.retain(|_| {
                    i += 1;
                    keep[i - 1]
                });
            }
        }
        let until = self.read_until.expect("checked above");
        (to > until).then_some(Read {
            from: until,
            to,
            rebuild: false,
        })
    }

    /// Takes in what `read` (from [`Self::next_read`] with the same `policies`) returned:
    /// `trace` holds the samples in (`read.from`, `read.to`], bucketed on this state's
    /// step (None: there were none — every GPU followed then has a gap).
    pub fn apply(&mut self, read: Read, policies: &[Rules], trace: Option<&Trace>) {
        if read.rebuild || self.read_until.is_none() {
            self.gpus.clear();
            self.rule_sets.clear();
            for rules in policies {
                let set = RuleSet::of(rules);
                if !self.rule_sets.iter().any(|(r, _)| *r == set) {
                    self.rule_sets.push((set, rules.clone()));
                }
            }
            self.horizon = policies.iter().map(horizon_seconds).max().unwrap_or(0);
            self.read_until = Some(read.from);
        }
        let from = self.read_until.unwrap_or(read.from);
        if read.to <= from {
            return;
        }
        let step = self.step;
        let (first, last) = (from.div_euclid(step), read.to.div_euclid(step));
        let mut series: HashMap<(&str, &str, &str), &GpuSeries> = HashMap::new();
        if let Some(trace) = trace {
            for g in &trace.gpus {
                let id = &g.gpu;
                series.insert((&id.namespace, &id.pod, &id.id), g);
                if !self
                    .gpus
                    .contains_key(&(id.namespace.clone(), id.pod.clone(), id.id.clone()))
                {
                    let trackers = self
                        .rule_sets
                        .iter()
                        .map(|(_, rules)| {
                            ActivityTracker::new(rules, jiff::SignedDuration::from_secs(step))
                        })
                        .collect();
                    self.gpus.insert(
                        (id.namespace.clone(), id.pod.clone(), id.id.clone()),
                        Gpu {
                            identity: id.clone(),
                            trackers,
                            pending: Sample::default(),
                            last_seen: first,
                        },
                    );
                }
            }
        }
        for (key, gpu) in &mut self.gpus {
            let samples = series
                .get(&(key.0.as_str(), key.1.as_str(), key.2.as_str()))
                .copied();
            // Replaced only when a label changed: a derived `clone_from` allocates every
            // string anew, and 10,000 GPUs' identities reallocated each cycle among the
            // cycle's short-lived data kept part of the allocator's pages resident.
            if let Some(s) = samples
                && gpu.identity != s.gpu
            {
                gpu.identity.clone_from(&s.gpu);
            }
            for bucket in first..=last {
                let mut sample = if bucket == first {
                    gpu.pending
                } else {
                    Sample::default()
                };
                if let Some(s) = samples {
                    merge(&mut sample, s, bucket);
                }
                if sample != Sample::default() {
                    gpu.last_seen = bucket;
                }
                if bucket == last {
                    gpu.pending = sample;
                } else {
                    // Stamped at the end of the time the bucket covers: its samples may be
                    // from any moment of it, so "busy" holds until its end and the idle
                    // clock starts there — later than the truth by less than a step, never
                    // earlier (with a 1-minute window, stamping at the bucket's start made a
                    // GPU busy at every scrape look idle between cycles).
                    let at = at(bucket + 1, step);
                    let seen = (sample != Sample::default()).then_some(&sample);
                    for (tracker, (_, rules)) in gpu.trackers.iter_mut().zip(&self.rule_sets) {
                        tracker.advance(at, seen, rules);
                    }
                }
            }
        }
        // A GPU silent for the whole horizon is gone (its pod ended, or the exporter with
        // it): a read of the horizon would not list it either.
        let oldest = last - self.horizon.div_euclid(step);
        self.gpus.retain(|_, g| g.last_seen >= oldest);
        self.read_until = Some(read.to);
    }

    /// Every GPU's observation under `rules` (a policy passed to the last
    /// [`Self::next_read`]; another gets none), at the end of the last read.
    pub fn observe(&self, rules: &Rules) -> Observations {
        let mut out = Observations::new();
        let set = RuleSet::of(rules);
        let Some(index) = self.rule_sets.iter().position(|(r, _)| *r == set) else {
            return out;
        };
        let rules = &self.rule_sets[index].1;
        // The partial bucket holds samples up to the end of the last read: stamped there
        // (see `apply` for why the end, not the start).
        let pending_at = self.read_until.and_then(|t| Timestamp::from_second(t).ok());
        // Without a sample in the partial bucket yet, the telemetry reaches the end of the
        // last committed bucket, not the end of the read.
        let committed_until = self
            .read_until
            .and_then(|t| Timestamp::from_second(t.div_euclid(self.step) * self.step).ok());
        for (key, gpu) in &self.gpus {
            let mut obs = GpuObservation {
                id: gpu.identity.id.clone(),
                model: gpu.identity.model.clone(),
                share: gpu.identity.share,
                ..GpuObservation::default()
            };
            let tracker = &gpu.trackers[index];
            match pending_at {
                // The partial bucket counts as if complete, without being committed.
                Some(at) if gpu.pending != Sample::default() => {
                    let mut peek = tracker.clone();
                    peek.advance(at, Some(&gpu.pending), rules);
                    peek.fill(&mut obs);
                    obs.data_until = Some(at);
                }
                _ => {
                    tracker.fill(&mut obs);
                    obs.data_until = committed_until;
                }
            }
            out.insert(key.clone(), obs);
        }
        out
    }
}

fn at(bucket: i64, step: i64) -> Timestamp {
    Timestamp::from_second(bucket.saturating_mul(step)).unwrap_or(Timestamp::MIN)
}

/// Adds `series`' values at `bucket` to `sample`, as a trace combines samples of one
/// bucket: the highest value, the last for memory used.
fn merge(sample: &mut Sample, series: &GpuSeries, bucket: i64) {
    let high = |old: Option<f64>, new: Option<f32>| match (old, new.map(f64::from)) {
        (Some(o), Some(n)) => Some(o.max(n)),
        (o, n) => n.or(o),
    };
    sample.engine_active = high(sample.engine_active, series.engine_active.get(bucket));
    sample.gpu_util_percent = high(sample.gpu_util_percent, series.gpu_util.get(bucket));
    sample.pcie_rx_bytes_per_second =
        high(sample.pcie_rx_bytes_per_second, series.pcie_rx.get(bucket));
    sample.power_watts = high(sample.power_watts, series.power.get(bucket));
    sample.fb_used_mib = series
        .fb_used
        .get(bucket)
        .map(f64::from)
        .or(sample.fb_used_mib);
}

#[cfg(test)]
#[path = "live_tests.rs"]
mod tests;
