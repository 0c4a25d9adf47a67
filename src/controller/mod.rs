//! The controller: every `--interval`, by the Lease holder only, one cycle of named
//! stages behind a [`context::Context`] (the client, notifiers, telemetry source, clock,
//! metrics, leadership flag and settings; `Context::test` for in-process tests):
//!
//! - `observe` (IO): GPU pods → root workloads, policies, namespaces, the telemetry read;
//! - `housekeeping` (IO): wake requests, unfinished actions, owners' scale-ups;
//! - `quota` (IO): the GPU ResourceQuota of every namespace the budget gate governs;
//! - `policies` (PURE read, IO report): GpuPolicies read one at a time; one this
//!   gpu-reaper cannot use is set aside with an Event and Degraded, never stopping the
//!   others;
//! - `plan` (PURE): one policy's decisions over the inventory (the engine backtest
//!   replays), `maxPerHour`;
//! - `act` (IO): the plan's actions; `warn` (IO): Events, Slack and email, with
//!   `deliver` (PURE) keeping the per-channel state and `events_text` (PURE) the words
//!   of the Events;
//! - `status` (PURE compute of the whole GpuPolicy status, then one apply);
//! - `audit_memory` (IO): the Audit-mode memory ConfigMap.
//!
//! `explain` (IO, reads only) runs observe and the cycle's `judge` for one workload
//! without acting (`gpu-reaper explain`). `cycle` runs them in order; `run` is only the loop (Lease, ticks, `--once`) and the
//! wiring; `lease`, `caches` (watches), `backfill` (PURE feed of the idle-span history)
//! and `metrics` serve them.

pub mod act;
pub mod audit_memory;
pub mod backfill;
pub mod caches;
pub mod context;
pub mod cycle;
pub mod deliver;
pub mod events_text;
pub mod explain;
pub mod housekeeping;
pub mod lease;
pub mod metrics;
pub mod observe;
pub mod plan;
pub mod policies;
pub mod quota;
pub mod run;
pub mod status;
pub mod warn;
