//! `gpu-reaper backtest` and `gpu-reaper crd` as a user runs them: the real binary, real
//! files, errors that name the field or the file and line.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-reaper");
const T0: i64 = 1_793_577_600; // 2026-11-02T00:00:00Z

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn tmp(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpu-reaper-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn the_committed_crds_match_what_the_binary_prints() {
    let o = run(&["crd"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/crds/gpu-reaper.yaml"))
            .unwrap();
    assert!(
        stdout(&o) == committed,
        "crds/gpu-reaper.yaml is stale: run `cargo run -- crd > crds/gpu-reaper.yaml` and commit it"
    );
    assert!(committed.contains("x-kubernetes-validations"));
    let chart = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/helm/gpu-reaper/crds/gpu-reaper.yaml"
    ))
    .unwrap();
    assert!(
        chart == committed,
        "helm/gpu-reaper/crds/gpu-reaper.yaml differs: cp crds/gpu-reaper.yaml helm/gpu-reaper/crds/"
    );
    assert!(committed.contains("duration(self.action.after) >= duration(self.warn.after)"));
}

/// One workload: `pod` of Deployment `name` (via a ReplicaSet) on `gpus` GPUs, with
/// activity per minute given by `activity(minute, gpu)` (None: no sample).
fn trace(
    name: &str,
    gpus: usize,
    minutes: i64,
    activity: impl Fn(i64, usize) -> Option<f64>,
) -> String {
    let pod = format!("{name}-7d9f-abcde");
    let rs = format!("{name}-7d9f");
    let mut s = String::new();
    s.push_str("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
    for g in 0..gpus {
        for m in 0..minutes {
            if let Some(a) = activity(m, g) {
                let _ = writeln!(
                    s,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"{g}\",UUID=\"GPU-{name}-{g}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",namespace=\"team-a\",pod=\"{pod}\",container=\"main\"}} {a} {}",
                    T0 + m * 60
                );
            }
        }
    }
    for (metric, labels, value) in [
        (
            "kube_pod_owner",
            format!("owner_kind=\"ReplicaSet\",owner_name=\"{rs}\",owner_is_controller=\"true\""),
            1.0,
        ),
        ("kube_pod_created", String::new(), (T0 - 3600) as f64),
        ("kube_pod_labels", "label_app=\"llm\"".to_string(), 1.0),
        (
            "kube_pod_container_resource_requests",
            "container=\"main\",resource=\"nvidia_com_gpu\",unit=\"integer\"".into(),
            gpus as f64,
        ),
    ] {
        let _ = writeln!(s, "# TYPE {metric} gauge");
        for m in 0..minutes {
            let sep = if labels.is_empty() { "" } else { "," };
            let _ = writeln!(
                s,
                "{metric}{{namespace=\"team-a\",pod=\"{pod}\"{sep}{labels}}} {value} {}",
                T0 + m * 60
            );
        }
    }
    let _ = writeln!(s, "# TYPE kube_replicaset_owner gauge");
    let _ = writeln!(
        s,
        "kube_replicaset_owner{{namespace=\"team-a\",replicaset=\"{rs}\",owner_kind=\"Deployment\",owner_name=\"{name}\"}} 1 {T0}"
    );
    s.push_str("# EOF\n");
    s
}

const ENFORCE: &str = "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {name: t}\nspec:\n  mode: Enforce\n  warn: {after: 30m}\n  action: {type: ScaleToZero, after: 1h}\n";

/// Backtest of trace file `t` under the ENFORCE policy, as JSON.
fn enforce_json(name: &str, t: &std::path::Path) -> serde_json::Value {
    let p = tmp(&format!("{name}.yaml"), ENFORCE);
    json(&[
        "backtest",
        "--policy",
        p.to_str().unwrap(),
        "--trace",
        t.to_str().unwrap(),
        "--format",
        "json",
    ])
}

fn json(args: &[&str]) -> serde_json::Value {
    let o = run(args);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("valid JSON")
}

#[test]
fn an_idle_workload_that_comes_back_soon_after_the_action_is_a_regret() {
    // Busy 40 min (telemetry covers the window from minute 23 on), idle until minute 170,
    // busy again from 170: within 2 h of the action at minute 99.
    let t = tmp(
        "regret.om",
        &trace("llm", 2, 300, |m, _| {
            Some(if m < 40 || (170..200).contains(&m) {
                0.7
            } else {
                0.0
            })
        }),
    );
    let v = enforce_json("enforce", &t);
    let w = &v["workloads"][0];
    assert_eq!(w["kind"], "Deployment");
    assert_eq!(w["name"], "llm");
    assert_eq!(w["gpus"], 2);
    assert_eq!(
        w["warned_at"], "2026-11-02T01:09:00Z",
        "warned 30m after the last busy minute (39)"
    );
    assert_eq!(w["acted_at"], "2026-11-02T01:39:00Z", "acted 60m after it");
    assert_eq!(w["action"], "ScaleToZero");
    assert_eq!(w["regret"], true);
    // First action: reclaimed from 01:39 until activity resumed at 02:50 (71 min × 2 GPUs).
    // Second idle period (last busy 199): acted at 259, never resumed: 41 min × 2 GPUs.
    let actions = w["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 2);
    assert_eq!(actions[0]["resumed_at"], "2026-11-02T02:50:00Z");
    assert_eq!(
        (
            actions[0]["regret"].as_bool(),
            actions[1]["regret"].as_bool()
        ),
        (Some(true), Some(false))
    );
    let reclaimed = w["reclaimed_gpu_hours"].as_f64().unwrap();
    assert!(
        (reclaimed - 2.0 * (71.0 + 41.0) / 60.0).abs() < 1e-6,
        "{reclaimed}"
    );
    assert_eq!(v["summary"]["regrets"], 1);
    assert_eq!(v["summary"]["regret_rate"], 0.5);
}

/// The sweep's oracle row on spans worked out by hand: it acts `idle.window` (30m) into
/// exactly the idle spans that do not resume within the regret horizon (2h), reclaims
/// until activity resumes, and stops counting where telemetry stops for longer than the
/// window.
#[test]
fn the_sweeps_oracle_acts_a_window_into_the_spans_that_do_not_resume_within_the_horizon() {
    // Busy before 10; idle 10..310 (acted at 40, resumes 270m later: 270m); busy; idle
    // 320..380 (at 350 it resumes 30m later: not acted on); busy; idle 390..550 (acted at
    // 420, 130m later: 130m); busy; idle 560..600 (acted at 590), then no telemetry to the
    // end (660): counted to 600 only (10m). 410 minutes on 2 GPUs, 3 actions.
    let busy = |m: i64| {
        m < 10 || (310..320).contains(&m) || (380..390).contains(&m) || (550..560).contains(&m)
    };
    let t = tmp(
        "oracle.om",
        &trace("oracle", 2, 660, |m, _| {
            (m < 600).then_some(if busy(m) { 0.8 } else { 0.0 })
        }),
    );
    let p = tmp(
        "oracle.yaml",
        "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {name: t}\nspec:\n  idle: {window: 30m}\n  warn: {after: 30m}\n  action: {type: ScaleToZero, after: 1h}\n",
    );
    let o = run(&[
        "backtest",
        "--sweep",
        "--policy",
        p.to_str().unwrap(),
        "--trace",
        t.to_str().unwrap(),
        "--format",
        "csv",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let oracle: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("Oracle,"))
        .unwrap_or_else(|| panic!("no oracle row:\n{out}"))
        .split(',')
        .collect();
    assert_eq!(oracle[1], "oracle: 30m in (hindsight)");
    assert_eq!((oracle[2], oracle[3]), ("3", "0"), "{out}");
    let gpu_hours: f64 = oracle[5].parse().unwrap();
    assert!((gpu_hours - 2.0 * 410.0 / 60.0).abs() < 1e-3, "{gpu_hours}");
}

#[test]
fn an_idle_workload_that_never_comes_back_is_reclaimed_without_regret() {
    let t = tmp(
        "hung.om",
        &trace("hung", 1, 240, |m, _| Some(if m < 40 { 0.9 } else { 0.0 })),
    );
    let v = enforce_json("enforce2", &t);
    let w = &v["workloads"][0];
    assert_eq!(w["regret"], false);
    assert_eq!(w["classification"], "Idle/Unused");
    // Acted at minute 99 (last busy 39 + 60), reclaimed until the end of the trace (240).
    let reclaimed = w["reclaimed_gpu_hours"].as_f64().unwrap();
    assert!((reclaimed - 141.0 / 60.0).abs() < 1e-6, "{reclaimed}");
    // Priced at the default 2.5 USD per GPU-hour.
    assert!((w["reclaimed_usd"].as_f64().unwrap() - 2.5 * 141.0 / 60.0).abs() < 1e-6);
    assert_eq!(v["summary"]["actions"], 1);
    assert_eq!(v["summary"]["regret_rate"], 0.0);
}

#[test]
fn a_workload_whose_telemetry_stops_is_never_acted_on() {
    let t = tmp(
        "gap.om",
        &trace("gappy", 1, 240, |m, _| {
            if m < 10 {
                Some(0.9)
            } else if m < 40 {
                Some(0.0)
            } else {
                None
            }
        }),
    );
    let v = enforce_json("enforce3", &t);
    assert_eq!(v["summary"]["actions"], 0, "{v}");
    assert_eq!(v["workloads"][0]["classification"], "NoTelemetry");
}

#[test]
fn csv_and_table_carry_the_same_workloads() {
    let t = tmp("csv.om", &trace("a,b", 1, 120, |_, _| Some(0.0)));
    let csv = stdout(&run(&[
        "backtest",
        "--trace",
        t.to_str().unwrap(),
        "--format",
        "csv",
    ]));
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "namespace,kind,name,gpus,classification,idle_gpu_hours,warned_at,acted_at,action,reclaimed_gpu_hours,reclaimed_usd,regret"
    );
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("team-a,Deployment,\"a,b\",1,"),
        "{csv}"
    );
    let table = stdout(&run(&["backtest", "--trace", t.to_str().unwrap()]));
    assert!(
        table.contains("a,b") && table.contains("Reclaimed:"),
        "{table}"
    );
}

#[test]
fn a_policy_that_breaks_a_crd_rule_is_rejected_naming_the_field() {
    let p = tmp("bad.yaml", &ENFORCE.replace("after: 1h", "after: 10m"));
    let o = run(&["backtest", "--policy", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("spec.action.after") && e.contains("bad.yaml"),
        "{e}"
    );
}

#[test]
fn a_bad_trace_line_is_reported_with_file_and_line() {
    let t = tmp(
        "bad.om",
        "# TYPE DCGM_FI_DEV_FB_USED gauge\nDCGM_FI_DEV_FB_USED{UUID=\"GPU-1\"} 1 1793577600\nDCGM_FI_DEV_FB_USED{UUID=\"GPU-1\" 1\n",
    );
    let o = run(&["backtest", "--trace", t.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("bad.om:3:"), "{}", stderr(&o));
}

#[test]
fn unknown_metrics_and_backwards_timestamps_are_reported_with_their_line() {
    let t = tmp(
        "unknown.om",
        "DCGM_FI_DEV_SM_CLOCK{UUID=\"GPU-1\"} 1 1793577600\n",
    );
    let e = stderr(&run(&["backtest", "--trace", t.to_str().unwrap()]));
    assert!(
        e.contains("unknown.om:1: unknown metric DCGM_FI_DEV_SM_CLOCK"),
        "{e}"
    );
    let t = tmp(
        "back.om",
        "DCGM_FI_DEV_FB_USED{UUID=\"GPU-1\"} 1 1793577660\nDCGM_FI_DEV_FB_USED{UUID=\"GPU-1\"} 1 1793577600\n",
    );
    let e = stderr(&run(&["backtest", "--trace", t.to_str().unwrap()]));
    assert!(e.contains("back.om:2:") && e.contains("backwards"), "{e}");
}

#[test]
fn bad_flags_name_the_flag() {
    let o = run(&["backtest", "--step", "fast"]);
    assert_eq!(o.status.code(), Some(2), "refused before the command runs");
    let e = stderr(&o);
    assert!(
        e.contains("--step") && e.contains("\"fast\"") && e.contains("write e.g. 1m"),
        "{e}"
    );
    let e = stderr(&run(&["backtest", "--warmup=-1h"]));
    assert!(e.contains("--warmup") && e.contains("negative"), "{e}");
    let e = stderr(&run(&["backtest", "--prometheus-timeout", "0s"]));
    assert!(
        e.contains("--prometheus-timeout") && e.contains("longer than 0s"),
        "{e}"
    );
    let e = stderr(&run(&["backtest", "--from", "yesterday"]));
    assert!(e.contains("--from") && e.contains("RFC 3339"), "{e}");
    let e = stderr(&run(&["audit", "--to", "noon"]));
    assert!(
        e.contains("--to") && e.contains("2026-11-02T08:00:00Z"),
        "{e}"
    );
    let e = stderr(&run(&["backtest", "--trace", "/nonexistent/trace.om"]));
    assert!(e.contains("/nonexistent/trace.om"), "{e}");
}

#[test]
fn export_refuses_bad_input_with_exit_code_2_naming_the_flag() {
    for (args, flag, hint) in [
        (&["export"][..], "--prometheus-url", "is required"),
        (
            &[
                "export",
                "--prometheus-url",
                "http://127.0.0.1:9",
                "--output",
                "/nonexistent/dir/trace.om.gz",
            ][..],
            "--output",
            "/nonexistent/dir does not exist",
        ),
        (
            &[
                "export",
                "--prometheus-url",
                "http://127.0.0.1:9",
                "--output",
                "/tmp",
            ][..],
            "--output",
            "is a directory",
        ),
        (
            &[
                "export",
                "--prometheus-url",
                "http://127.0.0.1:9",
                "--from",
                "2026-11-02T08:00:00Z",
                "--to",
                "2026-11-02T00:00:00Z",
            ][..],
            "--from",
            "is not before --to",
        ),
        (&["export", "--from", "last week"][..], "--from", "RFC 3339"),
    ] {
        let o = run(args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(flag) && e.contains(hint), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{e}");
    }
}

#[test]
fn the_svg_timeline_is_written_and_marks_the_action() {
    let t = tmp(
        "svg.om",
        &trace("drawn", 1, 200, |m, _| Some(if m < 40 { 0.9 } else { 0.0 })),
    );
    let p = tmp("enforce4.yaml", ENFORCE);
    let svg = std::env::temp_dir().join(format!("gpu-reaper-{}.svg", std::process::id()));
    let o = run(&[
        "backtest",
        "--policy",
        p.to_str().unwrap(),
        "--trace",
        t.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    assert!(text.contains("team-a/Deployment drawn"));
    assert!(
        text.contains("ScaleToZero at 2026-11-02T01:39:00Z"),
        "action mark with its time"
    );
}

/// `backtest --trace path --format json` with the bundled policy, which must succeed.
fn backtest_json(path: &std::path::Path) -> serde_json::Value {
    let o = run(&[
        "backtest",
        "--trace",
        path.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}: {}", path.display(), stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn migprofiler(name: &str) -> PathBuf {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/traces"
    ))
    .join(format!(
        "migprofiler__A100-40g__{name}__dcgm_GRACT_FBUSD_1s.csv"
    ));
    assert!(
        path.is_file(),
        "{} is missing (the public fixtures live in ../shared/fixtures beside the checkout)",
        path.display()
    );
    path
}

/// The real MIGProfiler traces (`dcgmi dmon` at 1 s on an A100: two inference and two
/// fine-tuning runs of 1–7 h with pauses of a minute or two between experiments and
/// exporter gaps of up to 11 minutes) are busy work: neither gpu-reaper's bundled policy
/// nor a fixed 30-minute rule may warn or act on them.
#[test]
fn the_real_migprofiler_traces_are_busy_work_and_nothing_is_warned_or_reclaimed() {
    for name in ["finetune_moco", "finetune_vit", "infer_bsz", "infer_seq"] {
        let path = migprofiler(name);
        let v = backtest_json(&path);
        let s = &v["summary"];
        assert_eq!(s["workloads"], 1, "{name}: {s}");
        assert_eq!(s["warnings"], 0, "{name}: {s}");
        assert_eq!(s["actions"], 0, "{name}: {s}");
        assert_eq!(s["idle_gpu_hours"], 0.0, "{name}: {s}");
        assert!(s["gpu_hours"].as_f64().unwrap() > 0.8, "{name}: {s}");
        let w = &v["workloads"][0];
        assert_eq!(w["namespace"], "dmon");
        assert_eq!(w["kind"], "Pod");
    }
}

/// A real inference run followed by two hours of the same GPU holding its weights with
/// no work (the rows a `dcgmi dmon` would print): idle from the last real busy sample,
/// warned 30 minutes and reclaimed 60 minutes later, as MemoryHeld. The GPU's process is a
/// bare Pod: the bundled policy's ScaleToZero cannot apply to it (the controller would do
/// nothing), so the backtest reclaims nothing and says so; evicting it is what works.
#[test]
fn a_real_trace_with_an_idle_tail_is_warned_and_reclaimed_from_its_last_busy_sample() {
    let real = std::fs::read_to_string(migprofiler("infer_seq")).unwrap();
    let (mut last_busy, mut last) = (0i64, 0i64);
    for row in real.lines().skip(1) {
        let cells: Vec<&str> = row.split(',').collect();
        let t: i64 = cells[3].parse().unwrap();
        if cells[1].parse::<f64>().unwrap() >= 0.05 {
            last_busy = t;
        }
        last = t;
    }
    let mut text = real.clone();
    for t in (last + 1..last + 2 * 3600).step_by(5) {
        let _ = writeln!(text, "0,0.000,3392,{t}");
    }
    let path = tmp("infer_seq_idle_tail.csv", &text);
    let bundled = backtest_json(&path);
    let w = &bundled["workloads"][0];
    assert_eq!(w["kind"], "Pod");
    assert_eq!(w["unsupported"], "ScaleToZero", "{w}");
    assert!(w["actions"].as_array().unwrap().is_empty(), "{w}");
    assert_eq!(bundled["summary"]["reclaimed_gpu_hours"], 0.0);
    assert_eq!(bundled["summary"]["unsupported"], 1);
    assert!(
        w["last_reason"]
            .as_str()
            .unwrap()
            .contains("a Pod cannot be scaled to zero"),
        "{w}"
    );
    let policy = tmp(
        "evict.yaml",
        &gpu_reaper::commands::backtest::SAMPLE_POLICY.replace("type: ScaleToZero", "type: Evict"),
    );
    let o = run(&[
        "backtest",
        "--trace",
        path.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let w = &v["workloads"][0];
    // The weights stay in memory: the idle tail is MemoryHeld, about 1.5 h of it before
    // the trace ends (the half hour after the last busy sample is still in the window).
    let held = w["gpu_hours_by_class"]["Idle/MemoryHeld"]
        .as_f64()
        .unwrap_or(0.0);
    assert!((1.4..=1.6).contains(&held), "{w}");
    let at = |field: &str| {
        w[field]
            .as_str()
            .unwrap_or_else(|| panic!("{field} missing: {w}"))
            .parse::<jiff::Timestamp>()
            .unwrap()
            .as_second()
    };
    let minutes_after_busy = |t: i64| (t - last_busy) as f64 / 60.0;
    let warned = minutes_after_busy(at("warned_at"));
    let acted = minutes_after_busy(at("acted_at"));
    // One-minute steps: the idle clock starts at the minute of the last busy sample.
    assert!(
        (29.0..=31.0).contains(&warned),
        "warned {warned} min after the last busy sample"
    );
    assert!(
        (59.0..=61.0).contains(&acted),
        "acted {acted} min after the last busy sample"
    );
}
