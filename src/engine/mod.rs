//! The decision engine. PURE: no async, no IO, no clock — time is passed in.
//!
//! From a policy ([`Rules`]), a workload ([`WorkloadMeta`], its [`PodState`]s, one
//! [`GpuObservation`] per GPU it holds) and what was already done ([`LadderState`]), it
//! classifies the workload ([`classify`]) and decides the next step of the ladder
//! nothing → warn → act ([`decide`]), and prices idle GPU time ([`cost`]). One policy's
//! evaluation over all its workloads — the history feed, the decisions, the action per
//! kind, the softer inference action and `maxPerHour` — is [`evaluate_policy`]: the live
//! controller and `backtest` both call exactly it.

pub mod activity;
pub mod classify;
pub mod cost;
pub mod inference;
pub mod ladder;
pub mod model;
pub mod prewarm;
pub mod risk;
pub mod rules;
pub mod shape;
pub mod step;

pub use activity::{ActivityTracker, Sample};
pub use classify::classify;
pub use ladder::{decide, evaluate, evaluate_with, limit_actions};
pub use model::{
    Classification, Decision, GpuObservation, IdleShape, LadderState, PodPhase, PodState, Step,
    Verdict, WorkloadMeta,
};
pub use risk::{Basis, Estimate, Histories, IdleHistory, RiskParams};
pub use rules::Rules;
pub use step::{Candidate, Planned, action_for, evaluate_policy, prewarms};
