//! The tests that need no server: the engine's invariants, single decisions, the
//! admission handler (`Router::oneshot`) and its attacks, the CLI on files, the fuzz
//! twins, the docs' resource examples, the shipped alerts and the sample trace (promtool).
//! One binary, so one link step; with `cargo test --lib` the fast tier a contributor runs
//! while working: `cargo test --locked --lib --test pure`.

#[path = "../common/time.rs"]
mod time;

mod admission;
mod backtest_cli;
mod check_cli;
mod decision_quality;
mod docs_examples;
mod engine;
mod fuzz_inputs;
mod gate_attacks;
mod observability;
mod sample_trace;
