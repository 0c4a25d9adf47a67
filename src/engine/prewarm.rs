//! Pre-warm (`action.preWarm`): when a workload gpu-reaper reclaimed is usually busy
//! again, learnt from its own idle spans, so that it can be woken `before` then and its
//! first user does not wait for a cold start. PURE: the spans come from the policy's
//! idle-span history ([`super::risk`]), time is passed in.
//!
//! The rhythm is the workload's own: at `now`, the predicted use is `now + before`; on
//! the past days of the same kind (Monday–Friday, or Saturday–Sunday, UTC) in the
//! history, did a long pause (at least `action.after`, what could have been reclaimed)
//! end within the hour before that time of day? When it did on at least `minDays` of
//! them, and on most of the days of that kind on which a long pause ended at all, the
//! workload is woken now. Nothing known, nothing done (DESIGN.md invariant 13): no span
//! in progress, no rhythm, or a pause that began (or a reclaim that came) after the
//! usual time had already begun — the usual use did not come today, and a workload
//! reclaimed again after a pre-warm nobody used is not woken again for the same hour.

use jiff::{SignedDuration, Timestamp};

use super::classify::human;
use super::risk::IdleHistory;

/// What a policy's `action.preWarm` asks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreWarmRules {
    /// How long before the predicted use to wake.
    pub before: SignedDuration,
    /// Matching past days needed.
    pub min_days: u32,
}

/// A past day's use counts for a time of day when it came within this long before it.
pub const WINDOW: SignedDuration = SignedDuration::from_hours(1);

const DAY: i64 = 86_400;

/// A pre-warm due now, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct PreWarm {
    /// When the workload is usually busy again today (the median time of day of the
    /// matching days' uses).
    pub expected_at: Timestamp,
    /// Past days of this kind on which a long pause ended in the hour before this time.
    pub days: u32,
    /// Past days of this kind on which a long pause ended at all.
    pub of_days: u32,
    pub weekday: bool,
    /// "usually busy again at 08:05 UTC on weekdays (…): woken 15m before".
    pub reason: String,
}

/// Monday–Friday (UTC) for the day of `secs` (Unix seconds). 1970-01-01 was a Thursday.
fn is_weekday(secs: i64) -> bool {
    let weekday = (secs.div_euclid(DAY) + 4).rem_euclid(7); // 0: Sunday
    (1..=5).contains(&weekday)
}

/// Whether `history`, of a workload reclaimed at `reaped_at`, says it is usually busy
/// again within `rules.before` of `now`; `min_pause`: the shortest pause that counts
/// (what could have been reclaimed); `lookback`: how far back its spans go.
pub fn predict(
    rules: &PreWarmRules,
    min_pause: SignedDuration,
    lookback: SignedDuration,
    history: &IdleHistory,
    reaped_at: Timestamp,
    now: Timestamp,
) -> Option<PreWarm> {
    let since = history.open_since()?;
    let target = (now + rules.before).as_second();
    let window = WINDOW.as_secs();
    let window_start = target - window;
    if since.as_second() >= window_start || reaped_at.as_second() >= window_start {
        return None;
    }
    let weekday = is_weekday(target);
    // The ends of its long pauses that resumed: few (a handful a day at most).
    let ends: Vec<i64> = history
        .finished()
        .filter(|&(_, length, resumed)| resumed && length >= min_pause.as_secs())
        .map(|(ended, ..)| ended)
        .collect();
    let days_back = (lookback.as_secs() / DAY).max(1);
    let (mut days, mut of_days) = (0u32, 0u32);
    let mut offsets = Vec::new();
    for k in 1..=days_back {
        let at = target - k * DAY;
        if is_weekday(at) != weekday {
            continue;
        }
        let day = at.div_euclid(DAY);
        if !ends.iter().any(|e| e.div_euclid(DAY) == day) {
            continue;
        }
        of_days += 1;
        if let Some(e) = ends.iter().find(|&&e| e > at - window && e <= at) {
            days += 1;
            offsets.push(e - (at - window));
        }
    }
    if days < rules.min_days.max(2) || 2 * days <= of_days {
        return None;
    }
    offsets.sort_unstable();
    let expected = window_start + offsets[offsets.len() / 2];
    let expected_at = Timestamp::from_second(expected).ok()?;
    let from = Timestamp::from_second(window_start).ok()?;
    let to = Timestamp::from_second(target).ok()?;
    let kind = if weekday { "weekdays" } else { "weekend days" };
    let reason = format!(
        "usually busy again at {} UTC on {kind}: on {days} of the {of_days} past {kind} on which a pause of {} or more ended, one ended between {} and {} UTC; woken {} before",
        expected_at.strftime("%H:%M"),
        human(min_pause),
        from.strftime("%H:%M"),
        to.strftime("%H:%M"),
        human(rules.before),
    );
    Some(PreWarm {
        expected_at,
        days,
        of_days,
        weekday,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::risk::{Histories, RiskParams};

    const KEY: &str = "w";

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn histories() -> Histories<&'static str> {
        Histories::new(RiskParams {
            horizon: SignedDuration::from_hours(2),
            lookback: SignedDuration::from_hours(24 * 14),
            min_spans: 10,
        })
    }

    /// Busy 08:00–18:00 UTC on each given day of December 2026 (the 7th is a Monday),
    /// then idle from 18:00 of the last one.
    fn office_hours(days: &[u32], start: &str) -> Histories<&'static str> {
        let mut h = histories();
        for d in days {
            busy_between(
                &mut h,
                &format!("2026-12-{d:02}T{start}:00Z"),
                &format!("2026-12-{d:02}T18:00:00Z"),
            );
        }
        h
    }

    /// Busy from `from` to `to`: the pause before `from` ends there.
    fn busy_between(h: &mut Histories<&'static str>, from: &str, to: &str) {
        h.busy(&KEY, at(from), SignedDuration::from_mins(1));
        h.busy(&KEY, at(to), SignedDuration::from_hours(24));
    }

    fn rules() -> PreWarmRules {
        PreWarmRules {
            before: SignedDuration::from_mins(15),
            min_days: 3,
        }
    }

    fn predict_at(h: &Histories<&'static str>, reaped: &str, now: &str) -> Option<PreWarm> {
        predict(
            &rules(),
            SignedDuration::from_hours(1),
            SignedDuration::from_hours(24 * 14),
            h.get(&KEY).unwrap(),
            at(reaped),
            at(now),
        )
    }

    #[test]
    fn a_weekday_morning_rhythm_wakes_a_reclaimed_server_before_eight() {
        // Monday 7th to Friday 11th, and Monday 14th: busy from 08:00.
        let h = office_hours(&[7, 8, 9, 10, 11, 14], "08:00");
        // Reclaimed Monday 19:00; on Tuesday at 07:40 08:00 is not within the hour
        // before 07:55; at 07:45 it is 15 minutes ahead.
        let reaped = "2026-12-14T19:00:00Z";
        assert_eq!(predict_at(&h, reaped, "2026-12-15T06:30:00Z"), None);
        assert_eq!(predict_at(&h, reaped, "2026-12-15T07:44:00Z"), None);
        let p = predict_at(&h, reaped, "2026-12-15T07:45:00Z").unwrap();
        assert_eq!(p.expected_at, at("2026-12-15T08:00:00Z"));
        assert!(p.weekday);
        // The pauses that ended on Tuesday 8th to Monday 14th: 5 weekdays.
        assert_eq!((p.days, p.of_days), (5, 5));
        assert_eq!(
            p.reason,
            "usually busy again at 08:00 UTC on weekdays: on 5 of the 5 past weekdays on which a pause of 1h or more ended, one ended between 07:00 and 08:00 UTC; woken 15m before"
        );
    }

    #[test]
    fn no_rhythm_no_history_or_a_late_reclaim_is_no_pre_warm() {
        // Two days of rhythm are not three.
        let h = office_hours(&[10, 11], "08:00");
        assert_eq!(
            predict_at(&h, "2026-12-11T19:00:00Z", "2026-12-14T07:45:00Z"),
            None
        );
        // Busy again at a different hour every day: no majority.
        let mut h = histories();
        for (d, hour) in [(7, 3), (8, 8), (9, 13), (10, 17), (11, 22), (14, 8)] {
            busy_between(
                &mut h,
                &format!("2026-12-{d:02}T{hour:02}:00:00Z"),
                &format!("2026-12-{d:02}T{:02}:30:00Z", hour + 1),
            );
        }
        assert_eq!(
            predict_at(&h, "2026-12-14T09:00:00Z", "2026-12-15T07:45:00Z"),
            None
        );
        // A workload it knows nothing about (invariant 13).
        let empty = histories();
        assert!(empty.get(&KEY).is_none());
        // Reclaimed after the usual time had begun (a pre-warm nobody used): not again.
        let h = office_hours(&[7, 8, 9, 10, 11, 14], "08:00");
        assert!(predict_at(&h, "2026-12-14T19:00:00Z", "2026-12-15T07:45:00Z").is_some());
        assert_eq!(
            predict_at(&h, "2026-12-15T07:10:00Z", "2026-12-15T07:45:00Z"),
            None
        );
    }

    #[test]
    fn a_pre_warm_policy_has_its_idle_history_backfilled_at_start_up() {
        let mut spec = crate::api::policy::GpuPolicySpec::default();
        assert!(!spec.uses_idle_history());
        spec.action.pre_warm = Some(crate::api::policy::PreWarm {
            before: kube::core::Duration::from(std::time::Duration::from_secs(900)),
            min_days: 3,
        });
        assert!(spec.uses_idle_history());
    }

    #[test]
    fn a_weekend_is_judged_by_weekends_only() {
        // Weekdays from 08:00, and nothing on Saturday 12th and Sunday 13th.
        let h = office_hours(&[7, 8, 9, 10, 11, 14], "08:00");
        // Saturday 19th 07:45: no weekend day had a pause end.
        assert_eq!(
            predict_at(&h, "2026-12-14T19:00:00Z", "2026-12-19T07:45:00Z"),
            None
        );
    }
}
