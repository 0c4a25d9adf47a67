//! Fuzzes the OpenMetrics trace reader `backtest --trace` uses: line parsing, labels, and
//! the trace builder (DCGM series per GPU, kube-state-metrics pods). Any panic, or memory
//! out of proportion to the input, is a bug (invariant 10). Seeds: fuzz/corpus/trace
//! (the DCGM scrapes of ../shared/fixtures, slices of the bundled sample trace and of the
//! MIGProfiler traces). Run: `cargo +nightly fuzz run trace` (see docs/testing.md).
#![no_main]

use gpu_reaper::telemetry::trace::{ReadOptions, read_trace};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &[u8]| {
    let lines = text.split(|b| *b == b'\n').count() as u64;
    let options = ReadOptions {
        workload_labels: Default::default(),
        step_seconds: 60,
        skip_unknown_metrics: true,
    };
    match read_trace(text, "<fuzz>", &options) {
        // Every kept sample came from its own line.
        Ok(trace) => assert!(trace.samples <= lines),
        Err(e) => {
            assert!(!e.message.is_empty());
            assert!(e.line <= lines, "{e}");
        }
    }
});
