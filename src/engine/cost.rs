//! What idle GPU time costs: price by DCGM model name, MIG slices at their share.

use super::model::GpuObservation;
use super::rules::Rules;

/// USD per hour of one full GPU of `model` under the policy's prices (model names are
/// compared case-insensitively, ignoring surrounding spaces).
pub fn price_per_gpu_hour(rules: &Rules, model: &str) -> f64 {
    rules
        .price_by_model
        .get(&model.trim().to_lowercase())
        .copied()
        .unwrap_or(rules.default_hourly_usd)
}

/// Share of a physical GPU that a MIG profile (DCGM `GPU_I_PROFILE`, e.g. `1g.5gb`,
/// `3g.40gb`) holds: compute slices out of 7. Unknown profiles count as a whole GPU, so
/// nothing is under-priced.
pub fn mig_share(profile: &str) -> f64 {
    profile
        .split_once('g')
        .and_then(|(slices, _)| slices.parse::<u32>().ok())
        .filter(|s| (1..=7).contains(s))
        .map_or(1.0, |s| f64::from(s) / 7.0)
}

/// USD per hour the observed GPUs cost, plus `unobserved_devices` at the default price.
pub fn hourly_usd(rules: &Rules, gpus: &[GpuObservation], unobserved_devices: u32) -> f64 {
    gpus.iter()
        .map(|g| g.share * price_per_gpu_hour(rules, &g.model))
        .sum::<f64>()
        + f64::from(unobserved_devices) * rules.default_hourly_usd
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::policy::GpuPolicySpec;

    #[test]
    fn model_prices_match_case_insensitively_and_fall_back_to_the_default() {
        let mut spec = GpuPolicySpec::default();
        spec.cost
            .by_model
            .insert("NVIDIA H100 80GB HBM3".into(), 4.0);
        let r = Rules::from_spec(&spec);
        assert_eq!(price_per_gpu_hour(&r, " nvidia h100 80gb hbm3"), 4.0);
        assert_eq!(price_per_gpu_hour(&r, "Tesla T4"), 2.5);
    }

    #[test]
    fn mig_slices_cost_their_share_of_seven() {
        assert!((mig_share("1g.5gb") - 1.0 / 7.0).abs() < 1e-12);
        assert!((mig_share("3g.40gb") - 3.0 / 7.0).abs() < 1e-12);
        assert_eq!(mig_share("7g.80gb"), 1.0);
        assert_eq!(mig_share("weird"), 1.0);
    }
}
