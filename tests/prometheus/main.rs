//! Telemetry from the real Prometheus (scripts/test runs this binary against 2.x and 3.x),
//! and from Thanos Query over two Prometheus replicas (thanos.rs).

#[path = "../common/mod.rs"]
mod common;

mod prometheus;
mod thanos;
