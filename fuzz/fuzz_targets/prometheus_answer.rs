//! Fuzzes what gpu-reaper does with a Prometheus `/api/v1/query` answer body: the
//! envelope, then an instant vector keyed by GPU (the live cycle) or a range vector fed
//! to the trace builder (`audit`, `backtest --prometheus-url`). Any panic is a bug
//! (invariant 10). Seeds: fuzz/corpus/prometheus_answer (the real answers of
//! ../shared/fixtures/dcgm and their range-vector form). Run:
//! `cargo +nightly fuzz run prometheus_answer` (see docs/testing.md).
#![no_main]

use gpu_reaper::telemetry::prometheus::{add_matrix, parse_answer, vector_by_gpu};
use gpu_reaper::telemetry::trace::{ReadOptions, TraceBuilder};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let data = match parse_answer(200, body) {
        Ok(data) => data,
        Err((message, _)) => {
            assert!(message.starts_with("HTTP 200 OK: "), "{message}");
            return;
        }
    };
    if let Err(message) = vector_by_gpu(data.clone(), &Default::default()) {
        assert!(!message.is_empty());
    }
    let mut builder = TraceBuilder::new(&ReadOptions {
        workload_labels: Default::default(),
        step_seconds: 60,
        skip_unknown_metrics: true,
    });
    match add_matrix(&mut builder, "DCGM_FI_DEV_GPU_UTIL", data) {
        Ok(()) => {
            let _ = builder.finish("<fuzz>");
        }
        Err(message) => assert!(!message.is_empty()),
    }
});
