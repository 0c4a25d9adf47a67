//! Fuzzes GpuPolicy validation as `backtest --policy` and `check` run it: YAML (or JSON),
//! apiVersion/kind, unknown fields against the CRD schema, types, the CRD's CEL rules,
//! then the engine's resolved rules. Any panic is a bug (invariant 10); every problem
//! names a field. Seeds: fuzz/corpus/policy (config/samples, every GpuPolicy in docs/,
//! the chart's sample policy). Run: `cargo +nightly fuzz run policy` (see docs/testing.md).
#![no_main]

use gpu_reaper::api::GpuPolicy;
use gpu_reaper::api::validate::parse_resource;
use gpu_reaper::engine::Rules;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_resource::<GpuPolicy>(text, "<fuzz>") {
        Ok(policy) => {
            let _ = Rules::from_spec(&policy.spec);
        }
        Err(e) => {
            assert!(!e.problems.is_empty());
            for p in &e.problems {
                assert!(!p.field.is_empty() && !p.message.is_empty(), "{e}");
            }
        }
    }
});
