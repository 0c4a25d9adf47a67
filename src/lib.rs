//! gpu-reaper: a Kubernetes operator that reclaims idle GPUs and gates large GPU claims
//! behind readiness attestations. See `docs/architecture.md` for the rooms and data flow.

#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod api;
pub mod backtest;
pub mod cli;
pub mod cluster;
pub mod commands;
pub mod controller;
pub mod engine;
pub mod error;
pub mod gpus;
pub mod http;
pub mod logging;
pub mod notify;
pub mod report;
pub mod telemetry;

pub use error::{Error, Result};
