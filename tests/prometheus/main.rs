//! Telemetry from the real Prometheus (scripts/test runs this binary against 2.x and 3.x).

#[path = "../common/mod.rs"]
mod common;

mod prometheus;
