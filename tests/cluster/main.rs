//! The operator against an API server: the real control plane (tests/common/cluster.rs,
//! shared by the whole run when `GPU_REAPER_TESTENV` names one, else started by this
//! binary), and kube-sim where a fault must be forced or 50,000 pods need no control
//! plane's CPU. Most suites also run the real Prometheus.

#[path = "../common/mod.rs"]
mod common;
#[path = "../../benches/support/controller_scale.rs"]
mod controller_scale;

mod actions;
mod budget_gate;
mod controller;
mod crds;
mod docs_examples;
mod faults;
mod gate_attacks;
mod helm;
mod scale;
