//! The controller at a small scale, with the harness of `examples/controller_scale.rs`:
//! 500 pods (100 holding a GPU, in Deployments, Jobs, StatefulSets and bare pods, the
//! rest CPU-only) in kube-sim, the Prometheus stub, and the real binary running its loop.
//! What it checks are counts, never times: queries per cycle do not depend on the cycle,
//! the first cycle writes twice on exactly the workloads it warns, and the later cycles, with
//! nothing changed, write on no workload and send no Event.

use std::path::Path;
use std::time::Duration;

use crate::controller_scale::{self, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_workloads_get_no_writes_after_the_first_cycle() {
    let mut scenario = Scenario::new(500, 100);
    // Long enough that a cycle never starts before the harness has read the last one.
    scenario.interval = Duration::from_secs(5);
    scenario.cycles = 3;
    // A cycle of 5 queries then takes over 100 ms: each is seen on its own by the
    // harness' 50 ms poll, whatever the load (counts, not times, are asserted).
    scenario.query_delay = Duration::from_millis(20);
    let m = controller_scale::run(
        Path::new(env!("CARGO_BIN_EXE_gpu-reaper")),
        &scenario,
        &|line| eprintln!("{line}"),
    )
    .await
    .expect("the harness runs");
    assert!(
        m.warnings.is_empty(),
        "the controller warned: {:#?}",
        m.warnings
    );
    assert!(m.unknown_queries.is_empty(), "{:#?}", m.unknown_queries);
    assert!(m.idle_workloads > 0 && m.idle_workloads < m.gpu_workloads);

    // One read per cycle of the samples since the previous one, one query per DCGM
    // family (`telemetry::live::FAMILIES`), all ending at the same instant, whatever the
    // number of pods (and of policies).
    assert!(
        m.queries_by_instant.len() >= m.cycles.len(),
        "{:?}",
        m.queries_by_instant
    );
    assert!(
        m.queries_by_instant.iter().all(|&n| n == 5),
        "queries per evaluation instant: {:?}",
        m.queries_by_instant
    );
    for (i, c) in m.cycles.iter().enumerate() {
        assert_eq!(
            c.calls.status_writes,
            1,
            "one status apply per policy, cycle {}",
            i + 1
        );
    }

    // Cycle 1 warns every idle workload: two writes (the warning with its delivery
    // record, then the Event's result in it) and one Event each, and nothing else.
    let first = &m.cycles[0].calls;
    assert_eq!(
        first.workload_writes,
        2 * m.idle_workloads,
        "{:#?}",
        first.workload_write_list
    );
    assert_eq!(first.event_writes, m.idle_workloads);

    // Nothing changed since: no workload is written, no Event is sent.
    for (i, c) in m.cycles.iter().enumerate().skip(1) {
        assert!(
            c.calls.workload_write_list.is_empty(),
            "cycle {} wrote on unchanged workloads: {:#?}",
            i + 1,
            c.calls.workload_write_list
        );
        assert_eq!(c.calls.event_writes, 0, "cycle {}", i + 1);
    }
}
