//! The budget gate: a validating admission webhook that admits large GPU claims only with
//! an approved ReadinessAttestation and within the namespace's budget.
//!
//! Pure: `review` (AdmissionReview parsing), `count` (GPUs per object, every governed
//! kind), `decide` (`admit(request, snapshot)`), `message` (the sentences kubectl prints),
//! `attestation` (rules on attestation writes). IO at the edges: `server` (axum over
//! rustls, certificate reload), `cache` (reflectors → snapshot), `metrics`, `check`
//! (the offline CLI), `approve` (`gpu-reaper attest approve|revoke`). `quota` (pure): the
//! ResourceQuota and attestation condition the controller is to keep (G2, not wired yet).

pub mod approve;
pub mod attestation;
pub mod cache;
pub mod check;
/// Counting moved to [`crate::gpus`]; the old path stays for code written against it.
pub use crate::gpus as count;
pub mod decide;
pub mod message;
pub mod metrics;
pub mod model;
pub mod quota;
pub mod review;
pub mod server;
pub mod webhook;

pub use decide::{Decision, Reason, Settings, Snapshot, Verdict, admit};
