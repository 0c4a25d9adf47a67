use super::*;
use crate::telemetry::trace::{ReadOptions, read_trace};

fn target(pod: &str, gpus: u32) -> PodTarget {
    PodTarget {
        namespace: "ml".into(),
        pod: pod.into(),
        container: "main".into(),
        gpus,
    }
}

#[test]
fn a_pattern_loops_and_an_open_last_segment_lasts_for_ever() {
    let looping: Pattern = "busy:2m,idle:10m".parse().unwrap();
    assert_eq!(looping.at(0.0), 0.9);
    assert_eq!(looping.at(119.0), 0.9);
    assert_eq!(looping.at(120.0), 0.0);
    assert_eq!(looping.at(719.0), 0.0);
    assert_eq!(looping.at(720.0), 0.9, "the pattern starts again");
    let settles: Pattern = "0.5:90s,idle".parse().unwrap();
    assert_eq!(settles.at(89.0), 0.5);
    assert_eq!(settles.at(1e7), 0.0);
    let idle: Pattern = "idle".parse().unwrap();
    assert_eq!(idle.at(12345.0), 0.0);
}

#[test]
fn bad_patterns_say_which_segment_and_what_to_write() {
    let e = "busy,idle".parse::<Pattern>().unwrap_err();
    assert!(
        e.contains("needs a duration") && e.contains("busy:10m"),
        "{e}"
    );
    let e = "sleepy:5m".parse::<Pattern>().unwrap_err();
    assert!(e.contains("not idle, busy or a fraction"), "{e}");
    let e = "1.5".parse::<Pattern>().unwrap_err();
    assert!(e.contains("fraction from 0 to 1"), "{e}");
    let e = "idle:soon".parse::<Pattern>().unwrap_err();
    assert!(e.contains("not a duration"), "{e}");
    let e = "idle:0s,busy".parse::<Pattern>().unwrap_err();
    assert!(e.contains("lasts no time"), "{e}");
}

#[test]
fn pod_selectors_take_a_name_or_a_prefix() {
    let exact: PodSelector = "ml/chat-0".parse().unwrap();
    assert!(exact.matches("ml", "chat-0"));
    assert!(!exact.matches("ml", "chat-01"));
    let prefix: PodSelector = "ml/chat-*".parse().unwrap();
    assert!(prefix.matches("ml", "chat-7d9-x2"));
    assert!(!prefix.matches("other", "chat-7d9-x2"));
    assert!(!prefix.matches("ml", "train-1"));
    let all: PodSelector = "ml/*".parse().unwrap();
    assert!(all.matches("ml", "anything") && !all.matches("dev", "anything"));
    for bad in ["chat", "/chat", "ml/", "ml/a/b"] {
        let e = bad.parse::<PodSelector>().unwrap_err();
        assert!(e.contains("NAMESPACE/POD"), "{bad}: {e}");
    }
}

#[test]
fn a_pattern_serves_one_series_per_gpu_with_stable_uuids() {
    let pattern: Pattern = "idle".parse().unwrap();
    let now = pattern_now(&pattern, &[target("chat-a", 2), target("chat-b", 1)], 5.0);
    assert_eq!(now.len(), 3);
    assert_eq!(now[0].values[0], Some(0.0));
    assert_ne!(now[0].uuid, now[1].uuid);
    assert_eq!(
        pattern_now(&pattern, &[target("chat-a", 2)], 900.0)[1].uuid,
        now[1].uuid,
        "a GPU keeps its UUID from scrape to scrape"
    );
}

#[test]
fn the_page_reads_back_as_the_dcgm_series_gpu_reaper_parses() {
    let pattern: Pattern = "busy:1m,idle".parse().unwrap();
    let page = render(&pattern_now(&pattern, &[target("chat-a", 2)], 0.0));
    assert!(
        page.contains("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge"),
        "{page}"
    );
    // The page, stamped, is an OpenMetrics trace the backtest reader takes.
    let stamped: String = page
        .lines()
        .map(|l| {
            if l.starts_with('#') {
                format!("{l}\n")
            } else {
                format!("{l} 1700000000\n")
            }
        })
        .collect::<String>()
        + "# EOF\n";
    let trace = read_trace(stamped.as_bytes(), "page", &ReadOptions::default()).unwrap();
    assert_eq!(trace.gpus.len(), 2);
    let g = &trace.gpus[0];
    assert_eq!(
        (g.gpu.namespace.as_str(), g.gpu.pod.as_str()),
        ("ml", "chat-a")
    );
    assert_eq!(g.gpu.model, "NVIDIA H100 80GB HBM3");
    let b = trace.first_bucket;
    assert_eq!(g.engine_active.get(b), Some(0.9));
    assert_eq!(g.gpu_util.get(b), Some(90.0));
}

#[test]
fn a_trace_is_replayed_from_its_start_looping_and_mapped_onto_live_pods() {
    let om = "\
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-1\",gpu=\"0\",modelName=\"NVIDIA A100\",Hostname=\"n1\",namespace=\"rec\",pod=\"old-pod\"} 0.8 1000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-1\",gpu=\"0\",modelName=\"NVIDIA A100\",Hostname=\"n1\",namespace=\"rec\",pod=\"old-pod\"} 0.0 1060
DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-1\",gpu=\"0\",modelName=\"NVIDIA A100\",Hostname=\"n1\",namespace=\"rec\",pod=\"old-pod\"} 0.1 1120
DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-2\",gpu=\"1\",modelName=\"NVIDIA A100\",Hostname=\"n1\",namespace=\"rec\",pod=\"unmapped\"} 0.5 1000
# EOF
";
    let trace = read_trace(om.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let replay = TraceReplay::new(&trace);
    let map = |ns: &str, pod: &str| (ns == "rec" && pod == "old-pod").then(|| target("chat-a", 1));
    let at = |s: f64| replay.now(&trace, s, map);
    assert_eq!(at(0.0).len(), 1, "the unmapped pod's GPU is left out");
    assert_eq!(at(0.0)[0].target.pod, "chat-a");
    assert_eq!(at(0.0)[0].uuid, "GPU-1");
    assert_eq!(at(59.0)[0].values[0], Some(0.800000011920929));
    assert_eq!(at(60.0)[0].values[0], Some(0.0));
    assert_eq!(
        at(150.0)[0].values[0].map(|v| (v * 10.0).round()),
        Some(1.0)
    );
    assert_eq!(
        at(180.0)[0].values[0].map(|v| (v * 10.0).round()),
        Some(8.0),
        "loops at the end"
    );
    assert_eq!(
        at(0.0)[0].values[1],
        None,
        "a field the trace lacks is not served"
    );
}
