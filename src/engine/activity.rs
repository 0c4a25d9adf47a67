//! Per-GPU activity, tracked incrementally from samples in time order: when the GPU was
//! last busy, how much of the idle window has data, and since when it has been observed
//! without gaps. O(1) per step, so `backtest` can replay months of 30 s samples.

use jiff::{SignedDuration, Timestamp};

use super::model::GpuObservation;
use super::rules::Rules;

/// One step's worth of DCGM readings for one GPU (or MIG instance).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// DCGM_FI_PROF_GR_ENGINE_ACTIVE, 0–1.
    pub engine_active: Option<f64>,
    /// DCGM_FI_DEV_GPU_UTIL, 0–100 (absent on MIG instances).
    pub gpu_util_percent: Option<f64>,
    /// DCGM_FI_DEV_FB_USED, MiB.
    pub fb_used_mib: Option<f64>,
    /// DCGM_FI_PROF_PCIE_RX_BYTES, bytes/s.
    pub pcie_rx_bytes_per_second: Option<f64>,
    /// DCGM_FI_DEV_POWER_USAGE, W.
    pub power_watts: Option<f64>,
}

/// Incremental activity state of one GPU under one policy.
#[derive(Debug, Clone)]
pub struct ActivityTracker {
    /// Whether each of the last `window / step` steps had an activity sample.
    covered_ring: Vec<bool>,
    ring_pos: usize,
    covered: usize,
    first_sample_at: Option<Timestamp>,
    last_busy_at: Option<Timestamp>,
    blind_until: Option<Timestamp>,
    fb_used_mib: Option<f64>,
    pcie_rx_bytes_per_second: Option<f64>,
    power_watts: Option<f64>,
}

impl ActivityTracker {
    /// A tracker for evaluation every `step` under `rules` (window length from the policy).
    pub fn new(rules: &Rules, step: SignedDuration) -> Self {
        let step_s = step.as_secs().max(1);
        let window_steps = (rules.window.as_secs().max(1) + step_s - 1) / step_s;
        Self {
            covered_ring: vec![false; window_steps.max(1) as usize],
            ring_pos: 0,
            covered: 0,
            first_sample_at: None,
            last_busy_at: None,
            blind_until: None,
            fb_used_mib: None,
            pcie_rx_bytes_per_second: None,
            power_watts: None,
        }
    }

    /// Advances one step to `at`, with the sample seen during the step (`None`: a gap).
    pub fn advance(&mut self, at: Timestamp, sample: Option<&Sample>, rules: &Rules) {
        let activity = sample.and_then(|s| rules.activity(s.engine_active, s.gpu_util_percent));
        let has = activity.is_some_and(f64::is_finite);
        let slot = &mut self.covered_ring[self.ring_pos];
        if *slot {
            self.covered -= 1;
        }
        *slot = has;
        if has {
            self.covered += 1;
        }
        self.ring_pos = (self.ring_pos + 1) % self.covered_ring.len();

        if let Some(a) = activity.filter(|a| a.is_finite()) {
            self.first_sample_at.get_or_insert(at);
            if a >= rules.threshold {
                self.last_busy_at = Some(at);
            }
        }
        if let Some(s) = sample {
            self.fb_used_mib = s.fb_used_mib.or(self.fb_used_mib);
            self.pcie_rx_bytes_per_second =
                s.pcie_rx_bytes_per_second.or(self.pcie_rx_bytes_per_second);
            self.power_watts = s.power_watts.or(self.power_watts);
        }
        if self.covered == 0 || self.coverage() < rules.min_coverage {
            self.blind_until = Some(at);
        }
    }

    /// Share of the window with samples.
    pub fn coverage(&self) -> f64 {
        self.covered as f64 / self.covered_ring.len() as f64
    }

    /// Last step with activity at or above threshold.
    pub fn last_busy_at(&self) -> Option<Timestamp> {
        self.last_busy_at
    }

    /// Writes the current state into `obs` (identity fields are left alone).
    pub fn fill(&self, obs: &mut GpuObservation) {
        obs.coverage = self.coverage();
        obs.first_sample_at = self.first_sample_at;
        obs.last_busy_at = self.last_busy_at;
        obs.blind_until = self.blind_until;
        obs.fb_used_mib = self.fb_used_mib;
        obs.pcie_rx_bytes_per_second = self.pcie_rx_bytes_per_second;
        obs.power_watts = self.power_watts;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::policy::GpuPolicySpec;

    fn rules() -> Rules {
        Rules::from_spec(&GpuPolicySpec::default())
    }

    fn t(min: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + min * 60).unwrap()
    }

    fn active(a: f64) -> Sample {
        Sample {
            engine_active: Some(a),
            ..Sample::default()
        }
    }

    #[test]
    fn a_full_window_of_samples_has_full_coverage_and_no_blind_spot_after_it() {
        let r = rules();
        let mut tr = ActivityTracker::new(&r, SignedDuration::from_mins(1));
        for m in 0..60 {
            tr.advance(t(m), Some(&active(0.0)), &r);
        }
        assert_eq!(tr.coverage(), 1.0);
        let mut o = GpuObservation::default();
        tr.fill(&mut o);
        // Coverage reached 80 % of the 30-step window at step 23 (index 23 → 24 samples).
        assert_eq!(o.blind_until, Some(t(22)));
        assert_eq!(o.last_busy_at, None);
        assert_eq!(o.first_sample_at, Some(t(0)));
    }

    #[test]
    fn a_gap_longer_than_the_tolerated_share_moves_the_blind_mark() {
        let r = rules();
        let mut tr = ActivityTracker::new(&r, SignedDuration::from_mins(1));
        for m in 0..40 {
            tr.advance(t(m), Some(&active(0.0)), &r);
        }
        for m in 40..50 {
            tr.advance(t(m), None, &r);
        }
        assert!(tr.coverage() < 0.8);
        let mut o = GpuObservation::default();
        tr.fill(&mut o);
        assert_eq!(o.blind_until, Some(t(49)));
    }

    #[test]
    fn gpu_util_is_the_fallback_when_the_profiling_metric_is_absent() {
        let r = rules();
        let mut tr = ActivityTracker::new(&r, SignedDuration::from_mins(1));
        tr.advance(
            t(0),
            Some(&Sample {
                gpu_util_percent: Some(91.0),
                ..Sample::default()
            }),
            &r,
        );
        assert_eq!(tr.last_busy_at(), Some(t(0)));
    }

    #[test]
    fn memory_and_power_alone_do_not_count_as_activity_samples() {
        let r = rules();
        let mut tr = ActivityTracker::new(&r, SignedDuration::from_mins(1));
        tr.advance(
            t(0),
            Some(&Sample {
                fb_used_mib: Some(70_000.0),
                ..Sample::default()
            }),
            &r,
        );
        assert_eq!(tr.coverage(), 0.0);
        let mut o = GpuObservation::default();
        tr.fill(&mut o);
        assert_eq!(o.fb_used_mib, Some(70_000.0));
        assert_eq!(o.first_sample_at, None);
    }
}
