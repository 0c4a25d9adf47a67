//! The bundled samples: the policy and trace `backtest` replays when given none, which
//! `audit` also uses for its idle rules and prices, and the rooms' tests use as a known
//! policy. Compiled in, so the binary runs with no files at hand.

use crate::api::GpuPolicy;
use crate::api::validate::{InvalidResource, parse_resource};

/// The bundled sample policy (config/samples/policy.yaml).
pub const SAMPLE_POLICY: &str = include_str!("../../config/samples/policy.yaml");
/// The bundled sample trace (config/samples/trace.om.gz, made by examples/make_sample_trace.rs).
pub const SAMPLE_TRACE_GZ: &[u8] = include_bytes!("../../config/samples/trace.om.gz");
/// How the bundled policy is named in messages about it.
pub const SAMPLE_POLICY_SOURCE: &str = "<bundled config/samples/policy.yaml>";
/// How the bundled trace is named in messages about it.
pub const SAMPLE_TRACE_SOURCE: &str = "<bundled config/samples/trace.om.gz>";

/// The bundled sample policy, parsed and checked as a file's would be.
pub fn sample_policy() -> Result<GpuPolicy, InvalidResource> {
    parse_resource::<GpuPolicy>(SAMPLE_POLICY, SAMPLE_POLICY_SOURCE)
}
