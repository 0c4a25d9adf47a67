//! Time in the pure tests (engine, decision quality): minutes after one fixed instant.
//! The tests on the control plane use `common::at` from a start near the wall clock.

use jiff::Timestamp;

/// The instant the pure tests count minutes from.
pub const T0: i64 = 1_800_000_000;

/// `min` minutes after [`T0`].
pub fn at(min: i64) -> Timestamp {
    Timestamp::from_second(T0 + min * 60).unwrap()
}
