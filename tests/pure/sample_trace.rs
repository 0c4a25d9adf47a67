//! The bundled sample trace: real Prometheus tooling accepts it, and the default backtest
//! reaches the verdicts docs/sample-trace.md predicts for each scenario.

use std::io::Read;
use std::process::Command;

use clap::Parser;
use gpu_reaper::cli::{Cli, Command as Cmd};
use gpu_reaper::commands::backtest::{SAMPLE_TRACE_GZ, execute};
use serde_json::Value;

#[test]
fn the_bundled_trace_loads_into_a_real_prometheus_tsdb() {
    let dir = std::env::temp_dir().join(format!("gpu-reaper-promtool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(SAMPLE_TRACE_GZ)
        .read_to_end(&mut text)
        .unwrap();
    let file = dir.join("trace.om");
    std::fs::write(&file, &text).unwrap();
    let out = Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&file)
        .arg(dir.join("tsdb"))
        .output()
        .expect("promtool is needed: apt-get install -y prometheus (bash .ci/run does it)");
    assert!(
        out.status.success(),
        "promtool refused the trace:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let blocks = std::fs::read_dir(dir.join("tsdb"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().join("meta.json").exists())
        .count();
    assert!(
        blocks >= 4,
        "8 hours make at least four 2-hour blocks, got {blocks}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn default_backtest() -> Value {
    let Cmd::Backtest(args) =
        Cli::parse_from(["gpu-reaper", "backtest", "--format", "json"]).command
    else {
        unreachable!("parsed a backtest command")
    };
    serde_json::from_str(&execute(&args).expect("default backtest runs")).unwrap()
}

fn workload<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == name)
        .unwrap_or_else(|| panic!("{name} missing"))
}

fn hhmm(v: &Value) -> String {
    v.as_str()
        .map(|s| s[11..16].to_string())
        .unwrap_or_else(|| "-".into())
}

#[test]
fn busy_workloads_are_never_warned_even_with_seven_idle_gpus_of_eight() {
    let v = default_backtest();
    for name in [
        "llm-chat",
        "llama3-8b-sft",
        "distil-eval",
        "bert-large-pretrain",
        "mixtral-8x7b",
        "codegen-eval",
        "ray-dev",
        "detr-coco",
        "hp-sweep-lr",
    ] {
        let w = workload(&v, name);
        assert_eq!(w["classification"], "Active", "{name}");
        assert!(
            w["warnings"].as_array().unwrap().is_empty(),
            "{name} warned: {w}"
        );
    }
    assert_eq!(workload(&v, "llama3-8b-sft")["gpus"], 8);
}

#[test]
fn each_idle_shape_is_recognised_and_acted_on_after_a_warning() {
    let v = default_backtest();
    let cases = [
        ("vllm-qwen2-72b", "Idle/MemoryHeld", "00:52", "01:22"),
        ("ocr-t4", "Idle/MemoryHeld", "00:52", "01:22"), // GPU_UTIL fallback, no profiling metrics
        ("tokenizer-svc", "Idle/MemoryHeld", "00:52", "01:22"), // a MIG 1g.5gb instance
        ("nightly-embed-backfill", "Idle/Unused", "02:29", "02:59"),
        ("feature-etl", "Idle/Provisioning", "00:30", "01:00"), // CrashLoopBackOff
        ("llama-70b-lora", "Idle/Provisioning", "00:30", "01:00"), // Pending
        ("nb-alice", "Idle/MemoryHeld", "02:04", "02:34"),
        ("nb-bob", "Idle/MemoryHeld", "01:39", "02:09"),
        ("nb-carol", "Idle/MemoryHeld", "02:19", "02:49"),
        ("nb-dave", "Idle/MemoryHeld", "02:29", "02:59"),
    ];
    for (name, class, warned, acted) in cases {
        let w = workload(&v, name);
        assert_eq!(w["classification"], class, "{name}");
        assert_eq!(
            (hhmm(&w["warned_at"]), hhmm(&w["acted_at"])),
            (warned.to_string(), acted.to_string()),
            "{name}"
        );
        assert_eq!(w["regret"], false, "{name}");
    }
    // A MIG 1g.5gb slice reclaims a seventh of a GPU per hour.
    let mig = workload(&v, "tokenizer-svc");
    let hours = mig["reclaimed_gpu_hours"].as_f64().unwrap();
    assert!(
        (hours - (8.0 * 60.0 - 82.0) / 60.0 / 7.0).abs() < 1e-6,
        "{hours}"
    );
}

#[test]
fn data_starved_training_is_warned_but_not_reclaimed() {
    let v = default_backtest();
    let w = workload(&v, "resnet50-imagenet");
    assert_eq!(w["classification"], "Idle/DataStarved");
    assert_eq!(hhmm(&w["warned_at"]), "00:52");
    assert!(w["actions"].as_array().unwrap().is_empty());
}

#[test]
fn the_workload_that_came_back_is_the_one_regret() {
    let v = default_backtest();
    let w = workload(&v, "rag-playground");
    let actions = w["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 2, "{w}");
    assert_eq!(hhmm(&actions[0]["at"]), "01:29");
    assert_eq!(hhmm(&actions[0]["resumed_at"]), "02:45");
    assert_eq!(actions[0]["regret"], true);
    assert_eq!(actions[1]["regret"], false);
    assert_eq!(v["summary"]["regrets"], 1);
}

#[test]
fn gaps_youth_exemption_and_snoozes_hold_the_reaper_back() {
    let v = default_backtest();
    let gap = workload(&v, "embedder-staging");
    // Telemetry missing 03:00–04:30: nothing happens until coverage recovers (≈04:52).
    assert_eq!(
        (hhmm(&gap["warned_at"]), hhmm(&gap["acted_at"])),
        ("05:22".to_string(), "05:52".to_string())
    );
    for (name, class) in [("scratch-test", "TooYoung"), ("baseline-bench", "Exempt")] {
        let w = workload(&v, name);
        assert_eq!(w["classification"], class);
        assert!(
            w["warnings"].as_array().unwrap().is_empty()
                && w["actions"].as_array().unwrap().is_empty()
        );
    }
    let snoozed = workload(&v, "summarizer-dev");
    assert_eq!(
        (hhmm(&snoozed["warned_at"]), hhmm(&snoozed["acted_at"])),
        ("04:00".to_string(), "04:30".to_string())
    );
    let bursty = workload(&v, "reranker");
    assert!(
        bursty["actions"].as_array().unwrap().is_empty(),
        "short quiet spells are never acted on"
    );
}

#[test]
fn the_exporters_own_pods_are_unallocated_gpus_not_workloads() {
    let v = default_backtest();
    let names: Vec<&str> = v["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains("dcgm-exporter")),
        "{names:?}"
    );
    assert_eq!(names.len(), 26);
    // Four idle unallocated GPUs plus the power-only parent of the MIG GPU.
    assert_eq!(v["summary"]["unallocated_gpus"], 5);
    // Workloads on the node scraped with exported_* labels are found under their own names.
    assert_eq!(workload(&v, "nb-alice")["namespace"], "research");
}

/// What the README and docs/backtest.md say about the bundled sample is what the first
/// command prints: its workload and GPU counts, the GPU-hours reclaimed and held, the
/// actions and regrets; and the Jobs the sample policy "scales to zero" are suspended,
/// as the controller would, not counted for an action it cannot take.
#[test]
fn the_readme_and_backtest_docs_state_the_bundled_samples_figures() {
    let v = default_backtest();
    let s = &v["summary"];
    let n = |k: &str| s[k].as_f64().unwrap();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    for claim in [
        format!(
            "{} real-looking workloads on {} GPUs",
            s["workloads"], s["governed_gpus"]
        ),
        format!(
            "{:.1} of {:.1} GPU-hours held reclaimed ({:.0} USD) by {} actions",
            n("reclaimed_gpu_hours"),
            n("gpu_hours"),
            n("reclaimed_usd"),
            s["actions"]
        ),
    ] {
        assert!(readme.contains(&claim), "README.md should say {claim:?}");
    }
    assert_eq!(s["regrets"], 1, "the README says one regretted");
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/backtest.md")).unwrap();
    let claim = format!(
        "\"workloads\": {}, \"governed_gpus\": {}, \"unallocated_gpus\": {}",
        s["workloads"], s["governed_gpus"], s["unallocated_gpus"]
    );
    assert!(docs.contains(&claim), "docs/backtest.md should say {claim}");
    for field in ["idle_usd", "gpu_hours_by_class", "unsupported"] {
        assert!(
            docs.contains(&format!("\"{field}\"")),
            "docs/backtest.md lacks {field}"
        );
    }
    let jobs: Vec<&Value> = v["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["kind"] == "Job" && !w["actions"].as_array().unwrap().is_empty())
        .collect();
    assert!(!jobs.is_empty());
    for w in jobs {
        assert_eq!(w["action"], "Suspend", "{w}");
    }
}
