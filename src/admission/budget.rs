//! G3, the monthly budget as a namespace total: the calendar (the month's key and its
//! end), the price a claim is charged at, and what the GPUs a namespace holds now commit
//! it to until the month ends. Pure; the webhook's decision and the controller's GPU
//! quota both use it, so a claim the webhook refuses for its cost is one the quota does
//! not leave room for either.
//!
//! The rule: `spent + (held + added) × price × hours left ≤ budget`. What the namespace
//! holds is taken to run until the month ends (the gate cannot know when it will be
//! freed), so claims made one after the other, or at once, never add up past the budget.

use jiff::Timestamp;

use crate::api::GpuPolicy;

/// The month of `now` as `YYYY-MM` (UTC), the key of published namespace spend.
pub fn month_of(now: Timestamp) -> String {
    now.strftime("%Y-%m").to_string()
}

/// The first instant of the month after `now` (UTC).
pub fn month_end(now: Timestamp) -> Timestamp {
    let date = now.to_zoned(jiff::tz::TimeZone::UTC).date();
    let first = date.first_of_month();
    first
        .checked_add(jiff::Span::new().months(1))
        .ok()
        .and_then(|d| d.to_zoned(jiff::tz::TimeZone::UTC).ok())
        .map_or(now, |z| z.timestamp())
}

/// Hours from `now` until `until` (0 when it has passed).
pub fn hours_until(now: Timestamp, until: Timestamp) -> f64 {
    (until.as_second() - now.as_second()).max(0) as f64 / 3600.0
}

/// The price of a GPU-hour a claim is charged at: the policy's dearest, since the gate
/// cannot know which model the pods will get.
pub fn hourly_usd(policy: &GpuPolicy) -> f64 {
    let cost = &policy.spec.cost;
    cost.by_model
        .values()
        .copied()
        .filter(|p| p.is_finite())
        .fold(cost.default_hourly_usd, f64::max)
        .max(0.0)
}

/// What `held` GPUs cost from `now` to the end of the month at `hourly` USD each.
pub fn committed_usd(held: f64, hourly: f64, now: Timestamp) -> f64 {
    held * hourly * hours_until(now, month_end(now))
}

/// The most GPUs a namespace that has `spent` of `budget` this month can hold from `now`
/// to the month's end without its cost crossing the budget; `None` when GPUs cost
/// nothing (no bound).
pub fn affordable_gpus(budget: f64, spent: f64, hourly: f64, now: Timestamp) -> Option<u64> {
    let per_gpu = hourly * hours_until(now, month_end(now));
    if per_gpu <= 0.0 || !per_gpu.is_finite() {
        return None;
    }
    let left = (budget - spent).max(0.0);
    Some((left / per_gpu + 1e-9).floor().min(u64::MAX as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_month_ends_at_the_first_instant_of_the_next() {
        assert_eq!(
            month_end(at("2026-11-10T12:00:00Z")),
            at("2026-12-01T00:00:00Z")
        );
        assert_eq!(
            month_end(at("2026-12-31T23:59:59Z")),
            at("2027-01-01T00:00:00Z")
        );
        assert_eq!(month_of(at("2026-12-31T23:59:59Z")), "2026-12");
    }

    #[test]
    fn held_gpus_commit_the_namespace_until_the_month_ends() {
        // 20 days and 12 hours left in November: 492 hours.
        let now = at("2026-11-10T12:00:00Z");
        assert_eq!(committed_usd(4.0, 2.0, now), 4.0 * 2.0 * 492.0);
        // 10,000 USD left at 2 USD per GPU-hour for 492 hours: 10 GPUs (9,840 USD).
        assert_eq!(affordable_gpus(12_000.0, 2_000.0, 2.0, now), Some(10));
        assert_eq!(affordable_gpus(1_000.0, 2_000.0, 2.0, now), Some(0));
        assert_eq!(affordable_gpus(1_000.0, 0.0, 0.0, now), None);
    }
}
