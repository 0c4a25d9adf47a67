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
/// `3g.40gb`) holds: compute slices out of 7. See [`mig_profile_share`].
pub fn mig_share(profile: &str) -> f64 {
    mig_profile_share(profile, 7.0)
}

/// Share of a physical GPU that one unit of a MIG profile holds: N / `slices_per_gpu`
/// (at most one GPU), N read from the first `<N>g` segment, so `3g.40gb` and the compute
/// instance `1c.3g.20gb` count 3 and `1g.10gb+me` counts 1.
///
/// The one rule for the budget gate (`crate::gpus`) and for pricing idle time: a
/// profile with no readable `<N>g` (or N = 0), or a `slices_per_gpu` that is not a
/// positive number, counts as a **whole GPU**. A slice is never more than its GPU, so the
/// whole GPU is the bound that never under-counts a claim at the gate nor under-prices
/// what an idle workload holds; the smallest slice would let an unknown profile through
/// as 1/7.
pub fn mig_profile_share(profile: &str, slices_per_gpu: f64) -> f64 {
    if !(slices_per_gpu.is_finite() && slices_per_gpu > 0.0) {
        return 1.0;
    }
    profile
        .split('.')
        .find_map(|segment| segment.strip_suffix('g')?.parse::<u32>().ok())
        .filter(|slices| *slices > 0)
        .map_or(1.0, |slices| (f64::from(slices) / slices_per_gpu).min(1.0))
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

    #[test]
    fn an_unreadable_mig_profile_is_a_whole_gpu_for_prices_and_for_the_budget_gate_alike() {
        use crate::gpus::{Counted, GpuResources};
        // A compute instance of a 3g slice reads as 3 slices here as at the gate.
        assert!((mig_share("1c.3g.20gb") - 3.0 / 7.0).abs() < 1e-12);
        assert!((mig_share("1g.10gb+me") - 1.0 / 7.0).abs() < 1e-12);
        for profile in ["weird", "0g.5gb", "", "g.5gb", "99g.1tb"] {
            let priced = mig_share(profile);
            let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {format!("nvidia.com/mig-{profile}"): 1}}}]}});
            let Ok(Counted::Claim(claim)) =
                crate::gpus::count(&pod, "ml", &GpuResources::default(), &())
            else {
                panic!("{profile}: not counted")
            };
            assert_eq!(priced, 1.0, "{profile}");
            assert_eq!(
                claim.gpus, priced,
                "{profile}: the gate and the price disagree"
            );
        }
        assert_eq!(mig_profile_share("3g.40gb", 0.0), 1.0);
        assert_eq!(mig_profile_share("3g.40gb", f64::NAN), 1.0);
    }
}
