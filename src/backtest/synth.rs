//! Synthetic but realistic GPU activity traces, for tests, `backtest --sweep` and
//! benchmarks: bursty request-driven inference, notebooks idle overnight, hung batch
//! jobs and crash-looping pods. Deterministic: the same [`Mix`] and seed give the same
//! bytes. Written as OpenMetrics with the DCGM exporter's and kube-state-metrics' label
//! sets, so the trace goes through the same reader as a real export.
//!
//! The parameters and the shapes they produce are documented in
//! `docs/decision-quality.md#synthetic-traces`.

use std::io::{self, Write};

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    /// Deployments serving requests: bursty, heavy-tailed idle spans, quieter at night,
    /// some going quiet for hours.
    pub inference: u32,
    /// Pods (one GPU each) per inference Deployment, serving the same traffic.
    pub replicas: u32,
    /// Notebooks used in working hours and idle overnight.
    pub notebooks: u32,
    /// Training jobs that hang at some point and never recover.
    pub hung_jobs: u32,
    /// Pods bound to a GPU that crash-loop.
    pub crash_loops: u32,
    pub hours: u32,
    pub step_seconds: u32,
    pub seed: u64,
    /// Unix second of the first sample (midnight UTC for the diurnal rhythm to start at
    /// night).
    pub start: i64,
}

impl Default for Mix {
    fn default() -> Self {
        Self {
            inference: 143,
            replicas: 1,
            notebooks: 0,
            hung_jobs: 0,
            crash_loops: 0,
            hours: 24,
            step_seconds: 60,
            seed: 1,
            start: 1_793_577_600, // 2026-11-02T00:00:00Z
        }
    }
}

/// Knobs of the inference model (documented with their effect). Each pod is one of
/// three rhythms, drawn by `rhythm_shares`: **chatty** (steady requests, idle spans of
/// about a minute), **office hours** (requests only in a daily window of 9–14 h, idle
/// overnight) and **sparse** (few requests, heavy-tailed idle spans of minutes to hours).
/// On top: rare quiet periods for every pod, and some pods retired for good mid-trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InferenceModel {
    /// Shares of chatty, office-hours and sparse pods (normalised).
    pub rhythm_shares: (f64, f64, f64),
    /// Median idle span of chatty pods, minutes: per pod, log-uniform between these.
    pub chatty_median_minutes: (f64, f64),
    /// Median idle span of sparse pods, minutes: per pod, log-uniform between these.
    pub sparse_median_minutes: (f64, f64),
    /// Log-normal spread (σ of the log) of idle spans of chatty and sparse pods.
    pub chatty_sigma: (f64, f64),
    pub sparse_sigma: (f64, f64),
    /// Mean length of a busy burst, minutes (geometric).
    pub busy_mean_minutes: f64,
    /// Per hour, the chance that a pod's traffic stops for a while ("goes quiet").
    pub quiet_per_hour: f64,
    /// Median quiet period, hours (log-normal, σ 0.8), capped at 22 h.
    pub quiet_median_hours: f64,
    /// Share of pods whose traffic stops for good at a uniform instant of the trace (a
    /// model version nobody calls any more).
    pub retired_share: f64,
}

impl Default for InferenceModel {
    fn default() -> Self {
        Self {
            rhythm_shares: (0.5, 0.25, 0.25),
            chatty_median_minutes: (0.5, 2.0),
            sparse_median_minutes: (4.0, 20.0),
            chatty_sigma: (1.0, 1.6),
            sparse_sigma: (1.6, 2.4),
            busy_mean_minutes: 2.0,
            quiet_per_hour: 0.003,
            quiet_median_hours: 4.0,
            retired_share: 0.1,
        }
    }
}

/// SplitMix64: small, fast, and good enough for test data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn uniform(&mut self, (lo, hi): (f64, f64)) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-12);
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }

    /// Geometric number of steps with the given mean (≥ 1).
    pub fn geometric(&mut self, mean: f64) -> u64 {
        let p = (1.0 / mean.max(1.0)).min(1.0);
        let u = self.unit().max(1e-12);
        ((u.ln() / (1.0 - p).max(1e-12).ln()).floor() as u64).max(1)
    }
}

/// Activity per step (engine active, 0–1) of one inference pod.
pub fn inference_activity(
    rng: &mut Rng,
    m: &InferenceModel,
    steps: usize,
    step_s: u32,
    start: i64,
) -> Vec<f32> {
    let minutes_per_step = f64::from(step_s) / 60.0;
    let steps_per_hour = (3600 / step_s.max(1)) as usize;
    let log_uniform =
        |rng: &mut Rng, (lo, hi): (f64, f64)| (lo.ln() + (hi.ln() - lo.ln()) * rng.unit()).exp();
    let (c, o, sp) = m.rhythm_shares;
    let pick = rng.unit() * (c + o + sp).max(f64::MIN_POSITIVE);
    let (median, sigma, office) = if pick < c + o {
        let median = log_uniform(rng, m.chatty_median_minutes);
        let sigma = rng.uniform(m.chatty_sigma);
        let office = (pick >= c).then(|| {
            let open = rng.uniform((6.0, 10.0));
            (open, open + rng.uniform((9.0, 14.0)))
        });
        (median, sigma, office)
    } else {
        (
            log_uniform(rng, m.sparse_median_minutes),
            rng.uniform(m.sparse_sigma),
            None,
        )
    };
    let level = rng.uniform((0.25, 0.85)) as f32;
    let retired_at = (rng.unit() < m.retired_share).then(|| (rng.unit() * steps as f64) as usize);
    // Quiet periods: a Poisson process of `quiet_per_hour`, each lasting a log-normal time.
    let mut quiet: Vec<(usize, usize)> = Vec::new();
    for h in 0..steps.div_ceil(steps_per_hour.max(1)) {
        if rng.unit() < m.quiet_per_hour {
            let from = h * steps_per_hour + (rng.unit() * steps_per_hour as f64) as usize;
            let hours = rng.lognormal(m.quiet_median_hours, 0.8).min(22.0);
            quiet.push((from, from + (hours * steps_per_hour as f64) as usize));
        }
    }
    let hour_of =
        |k: usize| (start + k as i64 * i64::from(step_s)).rem_euclid(86_400) as f64 / 3600.0;
    let mut out = Vec::with_capacity(steps);
    while out.len() < steps {
        let k = out.len();
        if retired_at.is_some_and(|r| k >= r) {
            out.resize(steps, 0.0);
            break;
        }
        if let Some(&(_, to)) = quiet.iter().find(|(from, to)| *from <= k && k < *to) {
            out.resize(to.min(steps), 0.0);
            continue;
        }
        if let Some((open, close)) = office {
            // Outside office hours: no requests until the window opens again.
            let h = hour_of(k);
            let inside = (open..close).contains(&h) || (open..close).contains(&(h + 24.0));
            if !inside {
                let wait = (open - h).rem_euclid(24.0);
                let n = ((wait * 60.0 / minutes_per_step).ceil() as usize).max(1);
                out.resize((k + n).min(steps), 0.0);
                continue;
            }
        }
        // Busy burst.
        let busy = rng.geometric(m.busy_mean_minutes / minutes_per_step);
        for _ in 0..busy {
            if out.len() >= steps {
                break;
            }
            let jitter = rng.uniform((0.8, 1.2)) as f32;
            out.push((level * jitter).min(1.0));
        }
        // Idle span: log-normal minutes.
        let idle_minutes = rng.lognormal(median, sigma);
        let idle = (idle_minutes / minutes_per_step).round().max(1.0) as usize;
        let k = out.len();
        out.resize((k + idle).min(steps), 0.0);
    }
    out
}

/// A notebook: sessions of work in working hours (08:00–19:00 UTC) with breaks, idle
/// overnight and across the gaps between sessions.
pub fn notebook_activity(rng: &mut Rng, steps: usize, step_s: u32, start: i64) -> Vec<f32> {
    let mut out = vec![0.0f32; steps];
    let per_hour = 3600 / step_s.max(1) as usize;
    let mut k = 0;
    while k < steps {
        let hour = ((start + k as i64 * i64::from(step_s)).rem_euclid(86_400) / 3600) as u32;
        if (8..19).contains(&hour) && rng.unit() < 0.3 {
            // A cell run: 5–40 minutes of work.
            let len = (rng.uniform((5.0, 40.0)) * 60.0 / f64::from(step_s)) as usize;
            for v in out.iter_mut().skip(k).take(len) {
                *v = rng.uniform((0.3, 0.95)) as f32;
            }
            k += len.max(1);
        } else {
            k += (per_hour / 6).max(1);
        }
    }
    out
}

/// A training job busy from the start until it hangs (at 10–90 % of the trace).
pub fn hung_job_activity(rng: &mut Rng, steps: usize) -> Vec<f32> {
    let hang = (rng.uniform((0.1, 0.9)) * steps as f64) as usize;
    (0..steps)
        .map(|k| {
            if k < hang {
                rng.uniform((0.7, 0.98)) as f32
            } else {
                0.0
            }
        })
        .collect()
}

struct Workload {
    namespace: &'static str,
    pod: String,
    owner: Option<(&'static str, String)>,
    replicaset: Option<(String, String)>,
    activity: Vec<f32>,
    fb_mib: f32,
    waiting: Option<&'static str>,
}

/// Writes the trace as OpenMetrics.
pub fn write(mix: &Mix, model: &InferenceModel, out: &mut impl Write) -> io::Result<()> {
    let steps = (u64::from(mix.hours) * 3600 / u64::from(mix.step_seconds.max(1))) as usize;
    let mut rng = Rng::new(mix.seed);
    let mut workloads = Vec::new();
    for i in 0..mix.inference {
        let rs = format!("infer-{i:03}-7d9f");
        let activity = inference_activity(&mut rng, model, steps, mix.step_seconds, mix.start);
        for r in 0..mix.replicas.max(1) {
            workloads.push(Workload {
                namespace: "serving",
                pod: match r {
                    0 => format!("{rs}-x{i:03}"),
                    r => format!("{rs}-x{i:03}r{r}"),
                },
                owner: Some(("ReplicaSet", rs.clone())),
                // The ReplicaSet's owner is written once.
                replicaset: (r == 0).then(|| (rs.clone(), format!("infer-{i:03}"))),
                activity: activity.clone(),
                fb_mib: 38_000.0,
                waiting: None,
            });
        }
    }
    for i in 0..mix.notebooks {
        workloads.push(Workload {
            namespace: "research",
            pod: format!("nb-{i:03}-0"),
            owner: Some(("StatefulSet", format!("nb-{i:03}"))),
            replicaset: None,
            activity: notebook_activity(&mut rng, steps, mix.step_seconds, mix.start),
            fb_mib: 12_000.0,
            waiting: None,
        });
    }
    for i in 0..mix.hung_jobs {
        workloads.push(Workload {
            namespace: "training",
            pod: format!("train-{i:03}-0"),
            owner: Some(("Job", format!("train-{i:03}"))),
            replicaset: None,
            activity: hung_job_activity(&mut rng, steps),
            fb_mib: 70_000.0,
            waiting: None,
        });
    }
    for i in 0..mix.crash_loops {
        workloads.push(Workload {
            namespace: "training",
            pod: format!("loop-{i:03}"),
            owner: None,
            replicaset: None,
            activity: vec![0.0; steps],
            fb_mib: 0.0,
            waiting: Some("CrashLoopBackOff"),
        });
    }

    let ts = |k: usize| mix.start + (k as i64) * i64::from(mix.step_seconds);
    let gpu_labels = |i: usize, w: &Workload| {
        format!(
            "gpu=\"{}\",UUID=\"GPU-5f3c{i:08x}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"gpu-node-{}\",container=\"main\",namespace=\"{}\",pod=\"{}\"",
            i % 8,
            i / 8,
            w.namespace,
            w.pod
        )
    };
    writeln!(out, "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge")?;
    for (i, w) in workloads.iter().enumerate() {
        let labels = gpu_labels(i, w);
        for (k, a) in w.activity.iter().enumerate() {
            writeln!(
                out,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} {a} {}",
                ts(k)
            )?;
        }
    }
    writeln!(out, "# TYPE DCGM_FI_DEV_FB_USED gauge")?;
    for (i, w) in workloads.iter().enumerate() {
        let labels = gpu_labels(i, w);
        // Memory changes rarely: one sample every 5 minutes is what a 5-minute scrape keeps.
        for k in (0..steps).step_by((300 / mix.step_seconds.max(1)).max(1) as usize) {
            writeln!(
                out,
                "DCGM_FI_DEV_FB_USED{{{labels}}} {} {}",
                w.fb_mib,
                ts(k)
            )?;
        }
    }
    let every = (300 / mix.step_seconds.max(1)).max(1) as usize;
    writeln!(out, "# TYPE kube_pod_owner gauge")?;
    for w in &workloads {
        if let Some((kind, name)) = &w.owner {
            for k in (0..steps).step_by(every) {
                writeln!(
                    out,
                    "kube_pod_owner{{namespace=\"{}\",pod=\"{}\",owner_kind=\"{kind}\",owner_name=\"{name}\",owner_is_controller=\"true\"}} 1 {}",
                    w.namespace,
                    w.pod,
                    ts(k)
                )?;
            }
        }
    }
    writeln!(out, "# TYPE kube_replicaset_owner gauge")?;
    for w in &workloads {
        if let Some((rs, deployment)) = &w.replicaset {
            for k in (0..steps).step_by(every) {
                writeln!(
                    out,
                    "kube_replicaset_owner{{namespace=\"{}\",replicaset=\"{rs}\",owner_kind=\"Deployment\",owner_name=\"{deployment}\",owner_is_controller=\"true\"}} 1 {}",
                    w.namespace,
                    ts(k)
                )?;
            }
        }
    }
    writeln!(out, "# TYPE kube_pod_container_resource_requests gauge")?;
    for w in &workloads {
        for k in (0..steps).step_by(every) {
            writeln!(
                out,
                "kube_pod_container_resource_requests{{namespace=\"{}\",pod=\"{}\",container=\"main\",resource=\"nvidia_com_gpu\",unit=\"integer\"}} 1 {}",
                w.namespace,
                w.pod,
                ts(k)
            )?;
        }
    }
    writeln!(out, "# TYPE kube_pod_container_status_waiting_reason gauge")?;
    for w in &workloads {
        if let Some(reason) = w.waiting {
            for k in (0..steps).step_by(every) {
                writeln!(
                    out,
                    "kube_pod_container_status_waiting_reason{{namespace=\"{}\",pod=\"{}\",container=\"main\",reason=\"{reason}\"}} 1 {}",
                    w.namespace,
                    w.pod,
                    ts(k)
                )?;
            }
        }
    }
    writeln!(out, "# EOF")
}

/// Lengths (in steps) of the maximal runs of activity below `threshold`.
pub fn idle_spans(activity: &[f32], threshold: f32) -> Vec<usize> {
    let mut spans = Vec::new();
    let mut run = 0;
    for &a in activity {
        if a < threshold {
            run += 1;
        } else if run > 0 {
            spans.push(run);
            run = 0;
        }
    }
    if run > 0 {
        spans.push(run);
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quantile(v: &mut [usize], q: f64) -> usize {
        v.sort_unstable();
        v[((v.len() - 1) as f64 * q) as usize]
    }

    #[test]
    fn inference_idle_spans_are_bursty_and_heavy_tailed_like_the_production_trace() {
        // The production trace: median idle span 1 minute, p90 13 minutes, longest
        // 22 hours, ~16,000 spans over 143 pods in 22.8 h.
        let m = InferenceModel::default();
        let mut rng = Rng::new(7);
        let mut spans = Vec::new();
        for _ in 0..143 {
            let a = inference_activity(&mut rng, &m, 24 * 60, 60, Mix::default().start);
            assert_eq!(a.len(), 24 * 60);
            spans.extend(idle_spans(&a, 0.05));
        }
        let n = spans.len();
        let (p50, p90) = (quantile(&mut spans, 0.5), quantile(&mut spans, 0.9));
        let longest = *spans.iter().max().unwrap();
        assert!((5_000..40_000).contains(&n), "{n} spans");
        assert!((1..=4).contains(&p50), "median {p50} min");
        assert!((6..=40).contains(&p90), "p90 {p90} min");
        assert!(longest >= 6 * 60, "longest {longest} min");
    }

    #[test]
    fn the_same_seed_gives_the_same_trace_and_another_seed_another() {
        let mix = Mix {
            inference: 3,
            notebooks: 1,
            hung_jobs: 1,
            crash_loops: 1,
            hours: 2,
            ..Mix::default()
        };
        let bytes = |mix: &Mix| {
            let mut v = Vec::new();
            write(mix, &InferenceModel::default(), &mut v).unwrap();
            v
        };
        assert_eq!(bytes(&mix), bytes(&mix));
        assert_ne!(
            bytes(&mix),
            bytes(&Mix {
                seed: 2,
                ..mix.clone()
            })
        );
    }

    #[test]
    fn a_hung_job_never_recovers() {
        let a = hung_job_activity(&mut Rng::new(3), 1000);
        let first_idle = a.iter().position(|v| *v < 0.05).unwrap();
        assert!(a[first_idle..].iter().all(|v| *v == 0.0));
        assert!(first_idle >= 100);
    }
}
