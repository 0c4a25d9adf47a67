//! The budget gate: a validating admission webhook that admits large GPU claims only with
//! an approved ReadinessAttestation and within the namespace's budget.
//!
//! Pure: `review` (AdmissionReview parsing), `model` (what the gate answers), `snapshot`
//! (what the caches hold, indexed), `settings` (how GPUs are counted, whom to trust),
//! `policy` (which GpuPolicy governs a namespace), `checks` (whether an attestation
//! counts and covers a claim), `decide` (`admit(request, snapshot)`; GPUs are counted by
//! [`crate::gpus`]), `message` (the sentences kubectl prints), `attestation` (rules on
//! attestation writes), `approval` (the rules of `gpu-reaper attest approve|revoke`),
//! `quota` (the ResourceQuota and attestation condition the controller keeps, G2), `fold`
//! (watched objects → what the snapshot keeps of them). IO: `server` (axum over rustls,
//! certificate reload), `cache` (the watches feeding the folds, the published snapshot),
//! `metrics`. The commands that
//! run them (`webhook`, `check`, `attest`) are in `src/commands/`.

pub mod approval;
pub mod attestation;
pub mod budget;
pub mod cache;
pub mod checks;
pub mod decide;
pub mod fold;
pub mod message;
pub mod metrics;
pub mod model;
pub mod policy;
pub mod quota;
pub mod review;
pub mod server;
pub mod settings;
pub mod snapshot;

pub use decide::admit;
pub use model::{Check, Decision, Reason, Verdict};
pub use settings::Settings;
pub use snapshot::{Held, Scalable, ScaleTarget, Snapshot};
