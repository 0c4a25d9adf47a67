//! Status conditions: a list-map keyed on `type`, merged purely so `lastTransitionTime`
//! only moves when the status actually changes. Time is passed in.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types gpu-reaper writes on a GpuPolicy.
pub const READY: &str = "Ready";
/// Telemetry or the API are partly unavailable.
pub const DEGRADED: &str = "Degraded";

/// Sets `new` in `conditions`, replacing the entry of the same type. The transition time
/// is kept when the status did not change; `new.last_transition_time` is then ignored.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition, now: jiff::Timestamp) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            new.last_transition_time = if existing.status == new.status {
                existing.last_transition_time.clone()
            } else {
                Time(now)
            };
            *existing = new;
        }
        None => {
            new.last_transition_time = Time(now);
            conditions.push(new);
        }
    }
}

/// A condition with the given fields; `lastTransitionTime` is filled by [`set_condition`].
pub fn condition(type_: &str, status: bool, reason: &str, message: impl Into<String>) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation: None,
        last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn unchanged_status_keeps_its_transition_time() {
        let mut conds = vec![];
        set_condition(&mut conds, condition(READY, true, "Synced", "ok"), at(100));
        set_condition(
            &mut conds,
            condition(READY, true, "Synced", "still ok"),
            at(200),
        );
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_transition_time, Time(at(100)));
        assert_eq!(conds[0].message, "still ok");
    }

    #[test]
    fn changed_status_moves_the_transition_time() {
        let mut conds = vec![];
        set_condition(&mut conds, condition(READY, true, "Synced", "ok"), at(100));
        set_condition(&mut conds, condition(DEGRADED, false, "Ok", ""), at(100));
        set_condition(
            &mut conds,
            condition(READY, false, "NoTelemetry", "down"),
            at(300),
        );
        assert_eq!(conds.len(), 2);
        assert_eq!(conds[0].last_transition_time, Time(at(300)));
        assert_eq!(conds[1].last_transition_time, Time(at(100)));
    }
}
