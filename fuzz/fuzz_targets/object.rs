//! Fuzzes the controller's readers of what it watches, one object at a time as a watch
//! hands it over (JSON from the API server), and of the records it keeps on workloads:
//! a GpuPolicy (`controller::policies::read`: usable, or set aside naming the field, its
//! stand-in never acting), a ReadinessAttestation (`api::read_dynamic`), any object's
//! metadata (`ObjectInfo::from_value`), a pod's GPUs (`inventory::pod_info_from_parts`),
//! and the annotations gpu-reaper writes (`gpureaper.io/notified`, `restore`, the
//! ladder's timestamps). Any panic is a bug (invariant 10). Seeds: fuzz/corpus/object
//! (the real objects of ../shared/fixtures/admission, with gpu-reaper's records added).
//! Run: `cargo +nightly fuzz run object` (see docs/testing.md).
#![no_main]

use gpu_reaper::api::ReadinessAttestation;
use gpu_reaper::api::policy::{ActionType, PolicyMode};
use gpu_reaper::cluster::actions::RestoreRecord;
use gpu_reaper::cluster::inventory::{ClaimGpus, ObjectInfo, pod_info_from_parts};
use gpu_reaper::controller::deliver::Delivery;
use gpu_reaper::controller::policies;
use gpu_reaper::engine::model::LadderState;
use gpu_reaper::gpus::GpuResources;
use kube::api::DynamicObject;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(object) = serde_json::from_slice::<DynamicObject>(data) else {
        return;
    };
    match policies::read(&object) {
        Ok(_) => {}
        Err(u) => {
            assert!(!u.problem.is_empty());
            if let Some(s) = &u.stand_in {
                assert_eq!(s.spec.mode, PolicyMode::Audit);
                assert_eq!(s.spec.action.type_, ActionType::None);
            }
        }
    }
    if let Err(e) = gpu_reaper::api::read_dynamic::<ReadinessAttestation>(&object) {
        assert!(!e.is_empty());
    }
    let Ok(value) = serde_json::to_value(&object) else {
        return;
    };
    let Some(info) = ObjectInfo::from_value(&value) else {
        return;
    };
    let now = jiff::Timestamp::UNIX_EPOCH;
    if let Some(d) = Delivery::parse(&info.annotations) {
        let _ = (d.due(now), d.notice(jiff::SignedDuration::from_mins(30), now));
        let again = std::collections::BTreeMap::from([(
            gpu_reaper::api::keys::NOTIFIED.to_string(),
            d.to_annotation(),
        )]);
        assert_eq!(Delivery::parse(&again), Some(d));
    }
    let _ = RestoreRecord::parse(&info.annotations);
    let _ = LadderState::from_annotations(&info.annotations);
    let _ = pod_info_from_parts(
        info,
        &value["spec"],
        &value["status"],
        &GpuResources::default(),
        &(),
        &ClaimGpus::new(),
        now,
    );
});
