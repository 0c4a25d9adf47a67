//! The controller: every `--interval`, observe (GPU pods → root workloads, policies,
//! telemetry) → plan (pure, the engine backtest replays) → act (scale, suspend, evict,
//! warn) → status, by the Lease holder only; and the GPU ResourceQuota of every namespace the
//! budget gate governs (`quota`).

pub mod backfill;
pub mod caches;
pub mod deliver;
pub mod lease;
pub mod plan;
pub mod quota;
pub mod run;
