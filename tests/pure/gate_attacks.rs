//! Attacks on the budget gate: each test is a way a team member with ordinary namespace
//! `edit` rights (and the attestation editor role) got a large GPU claim past the gate,
//! tried against the pure decision and the webhook's HTTP handler (`Router::oneshot`, no
//! network). Each failed on 31d27a2 and must keep failing to get through. The attacks
//! whose path goes through the API server itself (the scale subresource routed by the
//! chart, HPA, the ResourceQuota while the webhook is down) are also run on the real
//! control plane by tests/cluster/budget_gate.rs; the attacks on who approves and on GPUs
//! reached without asking for them, by tests/cluster/gate_attacks.rs.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpu_reaper::admission::metrics::Metrics;
use gpu_reaper::admission::review::AdmissionRequest;
use gpu_reaper::admission::server::{AppState, SnapshotCell, probe_router, router};
use gpu_reaper::admission::{Decision, Reason, Scalable, Settings, Snapshot, Verdict, admit};
use gpu_reaper::api::{GpuPolicy, ReadinessAttestation};
use gpu_reaper::gpus::{self, Counted, GpuResources};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const NOW: &str = "2026-11-10T12:00:00Z";
const FUTURE: &str = "2030-01-01T00:00:00Z";
const NS: &str = "team-a";

fn now() -> jiff::Timestamp {
    NOW.parse().unwrap()
}

fn policy_with(spec: Value) -> Arc<GpuPolicy> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1",
            "kind": "GpuPolicy",
            "metadata": {"name": "research"},
            "spec": spec,
        }))
        .unwrap(),
    )
}

/// Enforce, 8 GPUs without an attestation.
fn enforce() -> Arc<GpuPolicy> {
    policy_with(json!({"admission": {"largeClaimGpus": 8, "mode": "Enforce"}}))
}

/// Approved for its current generation, selecting `app=llama` in team-a.
fn attestation(name: &str, max_gpus: u32) -> Arc<ReadinessAttestation> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1",
            "kind": "ReadinessAttestation",
            "metadata": {"name": name, "namespace": NS, "generation": 1},
            "spec": {
                "selector": {"matchLabels": {"app": "llama"}},
                "maxGpus": max_gpus,
                "expiresAt": FUTURE,
                "evidence": {"dataThroughputGBps": 1000.0},
            },
            "status": {
                "conditions": [{"type": "Approved", "status": "True", "reason": "Approved",
                                "message": "ok", "lastTransitionTime": "2026-11-01T00:00:00Z"}],
                "approvedBy": "platform-oncall",
                "approvedGeneration": 1,
            },
        }))
        .unwrap(),
    )
}

fn snapshot(
    policies: Vec<Arc<GpuPolicy>>,
    attestations: Vec<Arc<ReadinessAttestation>>,
) -> Snapshot {
    Snapshot::build(
        policies,
        attestations,
        [(NS.to_string(), BTreeMap::new())],
        Default::default(),
    )
}

fn gpu_pod_spec(gpus: u32) -> Value {
    json!({"containers": [{"name": "main", "image": "trainer",
        "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]})
}

fn template(labels: Value, gpus: u32) -> Value {
    json!({"metadata": {"labels": labels}, "spec": gpu_pod_spec(gpus)})
}

fn request(operation: &str, object: Value, old: Option<Value>, user: &str) -> AdmissionRequest {
    let api_version = object["apiVersion"].as_str().unwrap_or("v1");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    serde_json::from_value(json!({
        "uid": "attack",
        "kind": {"group": group, "version": version, "kind": object["kind"]},
        "name": object["metadata"]["name"],
        "namespace": NS,
        "operation": operation,
        "userInfo": {"username": user},
        "object": object,
        "oldObject": old,
    }))
    .unwrap()
}

fn create(object: Value) -> AdmissionRequest {
    request("CREATE", object, None, "alice")
}

fn decide(snapshot: &Snapshot, request: &AdmissionRequest) -> Decision {
    admit(request, snapshot, &Settings::default(), now())
}

fn job(name: &str, labels: Value, parallelism: u32, gpus: u32) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"parallelism": parallelism, "template": template(labels, gpus)}})
}

fn assert_denied(d: &Decision, reason: Reason, says: &str) {
    assert_eq!(d.verdict, Verdict::Deny, "{d:?}");
    assert_eq!(d.reason, reason, "{d:?}");
    let message = d.message.as_deref().unwrap_or_default();
    assert!(message.contains(says), "{message}");
}

// --- scale paths ---------------------------------------------------------------------

/// `kubectl scale deployment/llama --replicas=N` as the API server reviews it.
fn scale(name: &str, from: u64, to: u64) -> AdmissionRequest {
    let scale = |replicas: u64| {
        json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas}, "status": {"replicas": from}})
    };
    serde_json::from_value(json!({
        "uid": "scale",
        "kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "subResource": "scale",
        "requestKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
        "name": name,
        "namespace": NS,
        "operation": "UPDATE",
        "userInfo": {"username": "alice"},
        "object": scale(to),
        "oldObject": scale(from),
    }))
    .unwrap()
}

fn with_deployment(mut s: Snapshot, name: &str, per_replica: f64) -> Snapshot {
    s.add_scalable(
        ("apps".into(), "deployments".into(), NS.into(), name.into()),
        Scalable {
            per_replica,
            label_sets: vec![BTreeMap::from([("app".to_string(), name.to_string())])],
        },
    );
    s
}

#[test]
fn kubectl_scale_of_an_8_gpu_deployment_to_100_replicas_is_refused() {
    let mut s = with_deployment(snapshot(vec![enforce()], vec![]), "llama", 8.0);
    // Its one replica runs: the namespace holds 8 GPUs.
    s.add_held(NS, BTreeMap::from([("app".into(), "llama".into())]), 8.0);
    let d = decide(&s, &scale("llama", 1, 100));
    assert_eq!(d.verdict, Verdict::Deny, "{d:?}");
    assert_eq!(d.gpus, Some(800.0));
    // Scaling down, or to what it already holds, stays possible.
    assert!(decide(&s, &scale("llama", 100, 1)).allowed());
    // A deployment without GPUs scales freely.
    let s = with_deployment(s, "web", 0.0);
    assert!(decide(&s, &scale("web", 1, 100)).allowed());
}

#[test]
fn scaling_a_parent_the_gate_has_not_seen_is_refused_above_the_allowance() {
    let s = snapshot(vec![enforce()], vec![]);
    let d = decide(&s, &scale("unknown", 1, 100));
    assert_denied(
        &d,
        Reason::OpenEnded,
        "has not seen deployments team-a/unknown",
    );
}

// --- kinds that were not counted -------------------------------------------------------

#[test]
fn a_daemonset_asking_for_gpus_counts_one_pod_per_gpu_node() {
    let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "miner", "namespace": NS},
        "spec": {"template": template(json!({"app": "miner"}), 8)}});
    let mut s = snapshot(vec![enforce()], vec![]);
    // Not knowing the nodes, the gate fails closed.
    let d = decide(&s, &create(ds.clone()));
    assert_denied(
        &d,
        Reason::OpenEnded,
        "DaemonSet team-a/miner claims at least 8 GPUs",
    );
    s.gpu_nodes = Some(16);
    let d = decide(&s, &create(ds));
    assert_eq!(d.gpus, Some(128.0));
    assert_eq!(d.verdict, Verdict::Deny);
}

#[test]
fn a_replication_controller_of_100_replicas_of_8_gpus_is_refused() {
    let rc = json!({"apiVersion": "v1", "kind": "ReplicationController",
        "metadata": {"name": "old-school", "namespace": NS},
        "spec": {"replicas": 100, "template": template(json!({"app": "x"}), 8)}});
    let d = decide(&snapshot(vec![enforce()], vec![]), &create(rc));
    assert_eq!(d.gpus, Some(800.0));
    assert_denied(&d, Reason::NoAttestation, "claims 800 GPUs");
}

#[test]
fn a_cronjob_whose_runs_may_overlap_is_not_one_run() {
    let cron = |policy: &str| {
        json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "every-minute", "namespace": NS},
            "spec": {"schedule": "* * * * *", "concurrencyPolicy": policy,
                     "jobTemplate": {"spec": {"template": template(json!({"app": "c"}), 8)}}}})
    };
    let s = snapshot(vec![enforce()], vec![]);
    let d = decide(&s, &create(cron("Allow")));
    assert_denied(&d, Reason::OpenEnded, "set it to Forbid or Replace");
    // One run at a time is one run.
    assert!(decide(&s, &create(cron("Forbid"))).allowed());
}

#[test]
fn a_kind_the_gate_cannot_count_is_refused_naming_the_kind() {
    let workflow = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": "wf", "namespace": NS},
        "spec": {"templates": [{"name": "train", "container": {"image": "t",
            "resources": {"limits": {"nvidia.com/gpu": "8"}}}}]}});
    let d = decide(&snapshot(vec![enforce()], vec![]), &create(workflow));
    assert_denied(
        &d,
        Reason::OpenEnded,
        "cannot count the pods a Workflow (argoproj.io) runs",
    );
}

// --- nothing added up ------------------------------------------------------------------

#[test]
fn ten_8_gpu_jobs_are_refused_after_the_first() {
    let mut s = snapshot(vec![enforce()], vec![]);
    assert!(decide(&s, &create(job("j0", json!({}), 1, 8))).allowed());
    // The first one's pods run.
    s.add_held(NS, BTreeMap::new(), 8.0);
    let d = decide(&s, &create(job("j1", json!({}), 1, 8)));
    assert_denied(&d, Reason::OverAllowance, "already holds 8 GPUs");
}

#[test]
fn one_64_gpu_attestation_is_one_budget_for_every_workload_it_selects() {
    let mut s = snapshot(vec![enforce()], vec![attestation("llama", 64)]);
    let llama = json!({"app": "llama"});
    assert!(decide(&s, &create(job("a", llama.clone(), 8, 8))).allowed());
    s.add_held(NS, BTreeMap::from([("app".into(), "llama".into())]), 64.0);
    let d = decide(&s, &create(job("b", llama, 8, 8)));
    assert_eq!(d.verdict, Verdict::Deny, "{d:?}");
    assert!(
        d.message.as_deref().unwrap().contains("already hold"),
        "{:?}",
        d.message
    );
}

#[test]
fn a_pod_naming_ten_8_gpu_resource_claims_counts_80_gpus() {
    let mut s = snapshot(vec![enforce()], vec![]);
    let mut claims = Vec::new();
    for i in 0..10 {
        s.claims.insert((NS.into(), format!("gpu-{i}")), 8.0);
        claims.push(json!({"name": format!("c{i}"), "resourceClaimName": format!("gpu-{i}")}));
    }
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hoarder", "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "x"}], "resourceClaims": claims}});
    let d = decide(&s, &create(pod));
    assert_eq!(d.gpus, Some(80.0));
    assert_eq!(d.verdict, Verdict::Deny);
}

#[test]
fn a_namespace_over_what_it_may_hold_still_gets_writes_that_add_no_gpus() {
    let mut s = snapshot(vec![enforce()], vec![]);
    // An attestation expired: the namespace holds 64 GPUs, more than its 8.
    s.add_held(NS, BTreeMap::new(), 64.0);
    let web = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c"}]}}}});
    assert!(decide(&s, &create(web)).allowed());
    assert_eq!(
        decide(&s, &create(job("more", json!({}), 1, 1))).verdict,
        Verdict::Deny
    );
}

#[test]
fn resource_claims_count_against_the_namespace_total() {
    let claim = |name: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}}]}}})
    };
    let mut s = snapshot(vec![enforce()], vec![]);
    assert!(decide(&s, &create(claim("first"))).allowed());
    s.add_held(NS, BTreeMap::new(), 8.0);
    assert_denied(
        &decide(&s, &create(claim("second"))),
        Reason::OverAllowance,
        "already holds 8 GPUs",
    );
}

#[test]
fn with_1_usd_left_a_4096_gpu_job_is_refused_even_when_attested() {
    let mut p = (*policy_with(json!({"admission": {
        "largeClaimGpus": 8, "mode": "Enforce", "monthlyBudgetUsd": 50000.0}})))
    .clone();
    p.status = Some(
        serde_json::from_value(json!({
            "namespaceSpend": [{"namespace": NS, "month": "2026-11", "spentUsd": 49999.0}]
        }))
        .unwrap(),
    );
    let s = snapshot(vec![Arc::new(p)], vec![attestation("llama", 100_000)]);
    let d = decide(&s, &create(job("huge", json!({"app": "llama"}), 512, 8)));
    assert_denied(&d, Reason::OverBudget, "leaving 1 USD");
    // A 1-GPU claim does not fit either: over budget, no new GPUs.
    let d = decide(&s, &create(job("tiny", json!({}), 1, 1)));
    assert_eq!(d.reason, Reason::OverBudget);
}

#[test]
fn two_claims_back_to_back_never_add_up_past_the_months_budget() {
    // 2 USD a GPU-hour, 20.5 days left in November (492 h): 984 USD a GPU to the month's
    // end. 8,000 USD pays for 8 GPUs; one 8-GPU claim would fit, and so would the first of
    // two 4-GPU claims, but not the second once the first holds its GPUs.
    let p = policy_with(json!({"cost": {"defaultHourlyUsd": 2.0},
        "admission": {"largeClaimGpus": 16, "mode": "Enforce", "monthlyBudgetUsd": 6000.0}}));
    let mut s = snapshot(vec![p], vec![]);
    let first = decide(&s, &create(job("first", json!({}), 1, 4)));
    assert!(first.allowed(), "{first:?}");
    s.add_held(NS, BTreeMap::new(), 4.0);
    let d = decide(&s, &create(job("second", json!({}), 1, 4)));
    assert_denied(
        &d,
        Reason::OverBudget,
        "and the 4 GPUs it holds now will cost about 3,936 USD more by then, leaving 2,064 USD",
    );
    // The same Job made by the CronJob controller (a run) is held to the same total.
    let mut run = job("nightly-29000000", json!({}), 1, 4);
    run["metadata"]["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "u", "controller": true}]);
    let d = decide(
        &s,
        &request(
            "CREATE",
            run,
            None,
            "system:serviceaccount:kube-system:cronjob-controller",
        ),
    );
    assert_denied(
        &d,
        Reason::OverBudget,
        "Job team-a/nightly-29000000 claims 4 GPUs",
    );
}

#[test]
fn a_cronjobs_runs_and_a_resumed_deployments_replicas_must_fit_the_namespace_total() {
    // Two 8-GPU CronJobs were each admitted against what was held then (nothing); when the
    // second one runs while the first's Job holds 8, its Job is refused, naming the
    // CronJob, instead of a trickle of pods the quota refuses.
    let mut s = snapshot(vec![enforce()], vec![]);
    s.add_held(NS, BTreeMap::new(), 8.0);
    let mut run = job("b-29000000", json!({}), 1, 8);
    run["metadata"]["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "CronJob", "name": "b", "uid": "u", "controller": true}]);
    let d = decide(
        &s,
        &request(
            "CREATE",
            run.clone(),
            None,
            "system:serviceaccount:kube-system:cronjob-controller",
        ),
    );
    assert_denied(
        &d,
        Reason::OverAllowance,
        "Job team-a/b-29000000, which CronJob b creates, claims 8 GPUs, but namespace team-a already holds 8 GPUs and may hold 8",
    );
    // The ReplicaSet a paused Deployment rolls out when it is resumed: the same.
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "serve-6d4b9", "namespace": NS, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "serve", "uid": "u", "controller": true}]},
        "spec": {"replicas": 2, "template": template(json!({"app": "serve"}), 4)}});
    let d = decide(
        &s,
        &request(
            "CREATE",
            rs.clone(),
            None,
            "system:serviceaccount:kube-system:deployment-controller",
        ),
    );
    assert_denied(&d, Reason::OverAllowance, "which Deployment serve creates");
    // With room, both go in, and an update that adds nothing is never refused.
    let free = snapshot(vec![enforce()], vec![]);
    let by = |o: &Value, user: &str| decide(&free, &request("CREATE", o.clone(), None, user));
    assert!(by(&run, "system:serviceaccount:kube-system:cronjob-controller").allowed());
    assert!(
        by(
            &rs,
            "system:serviceaccount:kube-system:deployment-controller"
        )
        .allowed()
    );
    let d = decide(
        &s,
        &request(
            "UPDATE",
            rs.clone(),
            Some(rs),
            "system:serviceaccount:kube-system:deployment-controller",
        ),
    );
    assert_eq!(d.reason, Reason::OwnedByController, "{d:?}");
}

#[test]
fn resuming_a_suspended_job_claims_its_gpus_again() {
    let mut suspended = job("train", json!({}), 2, 8);
    suspended["spec"]["suspend"] = json!(true);
    let mut resumed = suspended.clone();
    resumed["spec"]["suspend"] = json!(false);
    let mut s = snapshot(vec![enforce()], vec![]);
    // Another workload holds the namespace's 8 GPUs; the suspended Job holds none.
    s.add_held(NS, BTreeMap::new(), 8.0);
    let d = decide(
        &s,
        &request("UPDATE", resumed.clone(), Some(suspended.clone()), "alice"),
    );
    assert_denied(&d, Reason::NoAttestation, "Job team-a/train claims 16 GPUs");
    // Kubeflow's runPolicy.suspend is the same.
    let mut pj = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "pt", "namespace": NS},
        "spec": {"runPolicy": {"suspend": true}, "pytorchReplicaSpecs": {
            "Worker": {"replicas": 1, "template": template(json!({}), 4)}}}});
    let old = pj.clone();
    pj["spec"]["runPolicy"]["suspend"] = json!(false);
    let d = decide(&s, &request("UPDATE", pj, Some(old), "alice"));
    assert_denied(&d, Reason::OverAllowance, "already holds 8 GPUs");
    // Suspending, or editing a label of a running Job, adds nothing.
    let d = decide(
        &s,
        &request("UPDATE", suspended.clone(), Some(resumed), "alice"),
    );
    assert_eq!(d.reason, Reason::NotIncreased, "{d:?}");
}

#[test]
fn resuming_a_deployment_created_paused_claims_its_gpus_at_kubectl_rollout_resume() {
    let deployment = |paused: bool| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "serve", "namespace": NS},
            "spec": {"paused": paused, "replicas": 2, "selector": {"matchLabels": {"app": "serve"}},
                "template": template(json!({"app": "serve"}), 8)}})
    };
    let mut s = snapshot(vec![enforce()], vec![]);
    s.add_held(NS, BTreeMap::new(), 8.0);
    let resume = request("UPDATE", deployment(false), Some(deployment(true)), "alice");
    // Created paused, never rolled out: it holds nothing, and resuming it claims 16 GPUs.
    assert_denied(
        &decide(&s, &resume),
        Reason::NoAttestation,
        "Deployment team-a/serve claims 16 GPUs",
    );
    // Paused after it rolled out (its ReplicaSet is cached): its pods are held already,
    // and a resume that changes nothing else adds nothing.
    s.add_scalable(
        (
            "apps".into(),
            "replicasets".into(),
            NS.into(),
            "serve-6d4b9".into(),
        ),
        Scalable {
            per_replica: 8.0,
            label_sets: vec![],
        },
    );
    assert_eq!(decide(&s, &resume).reason, Reason::NotIncreased);
}

#[test]
fn a_pods_kai_gpu_share_cannot_be_edited_away_after_admission() {
    let pod = |annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "frac", "namespace": NS, "annotations": annotations},
            "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c", "image": "x"}]}})
    };
    let s = snapshot(vec![enforce()], vec![]);
    let admitted = pod(json!({"gpu-fraction": "0.5"}));
    for edited in [
        pod(json!({})),
        pod(json!({"gpu-fraction": "0.1"})),
        pod(json!({"gpu-fraction": "0.5", "gpu-memory": "1"})),
    ] {
        let d = decide(
            &s,
            &request("UPDATE", edited, Some(admitted.clone()), "alice"),
        );
        assert_denied(
            &d,
            Reason::ShareChanged,
            "Pod team-a/frac may not change its \"gpu-",
        );
    }
    // A label edit keeps the share: admitted.
    let mut labelled = admitted.clone();
    labelled["metadata"]["labels"] = json!({"team": "a"});
    assert!(decide(&s, &request("UPDATE", labelled, Some(admitted), "alice")).allowed());
}

// --- the team picks the policy ---------------------------------------------------------

#[test]
fn labels_and_kinds_the_team_writes_do_not_pick_the_gate() {
    // The gate's policy lists kinds; a higher-priority reaper policy without admission
    // rules selects a label the team can set.
    let gate = policy_with(json!({
        "match": {"kinds": ["Job"]},
        "admission": {"largeClaimGpus": 8, "mode": "Enforce"}}));
    let mut escape = (*policy_with(json!({
        "priority": 100,
        "match": {"workloadSelector": {"matchLabels": {"gate": "off"}}}})))
    .clone();
    escape.metadata.name = Some("escape".into());
    let s = snapshot(vec![gate, Arc::new(escape)], vec![]);
    let labelled = job("labelled", json!({"gate": "off"}), 2, 8);
    assert_eq!(decide(&s, &create(labelled)).verdict, Verdict::Deny);
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "other-kind", "namespace": NS},
        "spec": {"replicas": 2, "template": template(json!({}), 8)}});
    assert_eq!(decide(&s, &create(deployment)).verdict, Verdict::Deny);
}

#[test]
fn only_listed_controllers_may_create_owned_pods_unchecked() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": NS, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
        "spec": gpu_pod_spec(64)});
    // An approved 64-GPU attestation (for other labels) leaves the namespace room.
    let s = snapshot(vec![enforce()], vec![attestation("room", 64)]);
    // Any ServiceAccount of another namespace (an operator the team can drive, a token a
    // team holds elsewhere) is a `system:` identity, not a listed controller.
    for user in [
        "system:serviceaccount:tools:deployer",
        "system:node:worker-1",
        "system:admin",
    ] {
        let d = decide(&s, &request("CREATE", pod.clone(), None, user));
        assert_eq!(d.verdict, Verdict::Deny, "{user}: {d:?}");
    }
    let d = decide(
        &s,
        &request(
            "CREATE",
            pod,
            None,
            "system:serviceaccount:kube-system:replicaset-controller",
        ),
    );
    assert_eq!(d.reason, Reason::OwnedByController);
    assert!(d.allowed());
}

// --- the chart counted less than the binary -------------------------------------------

fn pod_with(resource: &str, quantity: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NS},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {resource: quantity}}}]}})
}

fn gpus_of(object: &Value) -> f64 {
    match gpus::count(object, NS, &GpuResources::default(), &()).unwrap() {
        Counted::Claim(c) => c.gpus,
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_vendors_gpus_and_shares_are_counted() {
    for (resource, quantity, gpus) in [
        ("amd.com/gpu", "128", 128.0),
        ("nvidia.com/gpu.shared", "16", 16.0),
        ("gpu.intel.com/xe", "16", 16.0),
        ("habana.ai/gaudi", "16", 16.0),
        ("aws.amazon.com/neuron", "16", 16.0),
        ("google.com/tpu", "16", 16.0),
        ("nvidia.com/mig-7g.80gb", "64", 64.0),
    ] {
        assert_eq!(gpus_of(&pod_with(resource, quantity)), gpus, "{resource}");
    }
    // Intel's shares of a device are not devices.
    assert_eq!(gpus_of(&pod_with("gpu.intel.com/millicores", "500")), 0.0);
    // KAI's gpu-fraction is a fraction of a GPU per pod.
    let mut kai = pod_with("cpu", "1");
    kai["metadata"]["annotations"] = json!({"gpu-fraction": "0.5"});
    assert_eq!(gpus_of(&kai), 0.5);
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d", "namespace": NS},
        "spec": {"replicas": 40, "template": {"metadata": {"annotations": {"gpu-fraction": "0.5"}},
            "spec": {"containers": [{"name": "c"}]}}}});
    assert_eq!(gpus_of(&deployment), 20.0);
}

#[test]
fn the_chart_counts_the_same_gpu_resources_as_the_binary() {
    let values = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/helm/gpu-reaper/values.yaml"
    ))
    .unwrap();
    let values: Value = serde_yaml::from_str(&values).unwrap();
    let chart: Vec<&str> = values["gpu"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(chart, gpus::DEFAULT_GPU_RESOURCES.to_vec());
    let classes: Vec<&str> = values["gpu"]["deviceClasses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(classes, gpus::DEFAULT_GPU_DEVICE_CLASSES.to_vec());
}

// --- inputs that failed open -----------------------------------------------------------

#[test]
fn the_crds_bound_every_integer_the_gate_reads() {
    let crds =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/crds/gpu-reaper.yaml"))
            .unwrap();
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&crds)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let schema = |kind: &str| {
        docs.iter()
            .find(|d| d["spec"]["names"]["kind"] == kind)
            .unwrap()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            .clone()
    };
    let attestation = schema("ReadinessAttestation");
    let max_gpus = &attestation["properties"]["spec"]["properties"]["maxGpus"];
    assert!(max_gpus["maximum"].as_f64().is_some(), "{max_gpus}");
    let policy = schema("GpuPolicy");
    let admission = &policy["properties"]["spec"]["properties"]["admission"]["properties"];
    for field in ["largeClaimGpus", "unattestedGpus"] {
        assert!(
            admission[field]["maximum"].as_f64().is_some(),
            "{field}: {}",
            admission[field]
        );
    }
}

fn app(snapshot: Snapshot) -> axum::Router {
    router(AppState {
        snapshot: Arc::new(SnapshotCell::ready(snapshot)),
        settings: Arc::new(Settings::default()),
        metrics: Arc::new(Metrics::new()),
    })
}

async fn post(app: &axum::Router, path: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
    let request = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body.to_vec())
}

fn review(request: &AdmissionRequest) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}))
    .unwrap()
}

#[tokio::test]
async fn an_update_padded_to_1_3_mb_that_raises_the_gpus_is_denied_not_answered_413() {
    // A Job padded with a 1.3 MB annotation (legal in etcd): the review carries it twice.
    let padding = "x".repeat(1_300_000);
    let mut old = job("padded", json!({}), 1, 8);
    old["metadata"]["annotations"] = json!({"padding": padding});
    let mut new = old.clone();
    new["spec"]["parallelism"] = json!(100);
    let body = review(&request("UPDATE", new, Some(old), "alice"));
    assert!(body.len() > 2 << 20, "{} bytes", body.len());
    let (status, body) = post(&app(snapshot(vec![enforce()], vec![])), "/validate", body).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&body[..200.min(body.len())])
    );
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["allowed"], false, "{v}");
}

/// What the API server sends, as text: `request` with `uid` first, `object` inline.
fn raw_review(uid: &str, object: &str) -> Vec<u8> {
    format!(
        r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"{uid}","kind":{{"group":"ray.io","version":"v1","kind":"RayCluster"}},"resource":{{"group":"ray.io","version":"v1","resource":"rayclusters"}},"namespace":"team-a","operation":"CREATE","userInfo":{{"username":"alice"}},"object":{object}}}}}"#
    )
    .into_bytes()
}

/// The answer the API server reads: (uid, allowed, message).
fn answer(status: StatusCode, body: &[u8]) -> (String, bool, String) {
    assert_eq!(
        status,
        StatusCode::OK,
        "an error the failurePolicy would turn into an allow: {}",
        String::from_utf8_lossy(&body[..300.min(body.len())])
    );
    let v: Value = serde_json::from_slice(body).unwrap();
    let r = &v["response"];
    (
        r["uid"].as_str().unwrap_or("").to_string(),
        r["allowed"].as_bool().unwrap(),
        r["status"]["message"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test]
async fn an_object_nested_deeper_than_the_json_reader_follows_is_refused_not_answered_400() {
    // Legal for the API server (CRD fields that preserve unknown fields), deeper than
    // serde_json's 128 levels.
    let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
    let object = format!(
        r#"{{"apiVersion":"ray.io/v1","kind":"RayCluster","metadata":{{"name":"deep","namespace":"team-a"}},"spec":{{"x":{deep}}}}}"#
    );
    let app = app(snapshot(vec![enforce()], vec![]));
    for path in ["/validate", "/mutate"] {
        let (status, body) = post(&app, path, raw_review("deep-1", &object)).await;
        let (uid, allowed, message) = answer(status, &body);
        assert_eq!(uid, "deep-1", "{path}");
        assert!(!allowed, "{path}: {message}");
        assert!(
            message.contains("nests deeper than the 127 levels"),
            "{path}: {message}"
        );
    }
}

#[tokio::test]
async fn a_review_the_api_server_made_larger_than_the_reader_reads_is_refused_not_answered_413() {
    // 2.5 MB of `<` in an annotation: within the API server's 3 MiB, and escaped as
    // \u003c on the way to the webhook, six bytes each: a 15 MB review.
    let escaped = "\\u003c".repeat(2_500_000);
    let object = format!(
        r#"{{"apiVersion":"ray.io/v1","kind":"RayCluster","metadata":{{"name":"big","namespace":"team-a","annotations":{{"a":"{escaped}"}}}},"spec":{{}}}}"#
    );
    let body = raw_review("big-1", &object);
    assert!(body.len() > 8 << 20, "{} bytes", body.len());
    let (status, body) = post(&app(snapshot(vec![enforce()], vec![])), "/validate", body).await;
    let (uid, allowed, message) = answer(status, &body);
    assert_eq!(uid, "big-1");
    assert!(!allowed, "{message}");
    assert!(message.contains("larger than the 8 MiB"), "{message}");
}

#[tokio::test]
async fn a_review_with_a_field_of_the_wrong_type_is_refused_and_one_without_a_uid_is_a_400() {
    let app = app(snapshot(vec![enforce()], vec![]));
    let body = br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"typed-1","operation":7}}"#;
    let (status, body) = post(&app, "/validate", body.to_vec()).await;
    let (uid, allowed, _) = answer(status, &body);
    assert_eq!((uid.as_str(), allowed), ("typed-1", false));
    // Nothing to answer to: only an error is possible (the API server never sends this).
    let (status, _) = post(&app, "/validate", b"{\"request\":{}}".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn validate_is_not_served_on_the_plain_http_probe_port() {
    let probes = probe_router(AppState {
        snapshot: Arc::new(SnapshotCell::ready(snapshot(vec![enforce()], vec![]))),
        settings: Arc::new(Settings::default()),
        metrics: Arc::new(Metrics::new()),
    });
    let body = review(&create(job("j", json!({}), 1, 1)));
    let (status, _) = post(&probes, "/validate", body).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let request = Request::builder()
        .uri("/readyz")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        probes.oneshot(request).await.unwrap().status(),
        StatusCode::OK
    );
}

#[test]
fn a_1_6_mb_pytorchjob_of_thousands_of_roles_is_counted_with_every_label_set_once() {
    // Thousands of replica roles, each with its own labels and a GPU: the count must stay
    // linear (the quadratic de-duplication took 16 s, past the webhook's 3 s timeout:
    // failurePolicy Ignore admitted it). benches/admission.rs measures the time.
    let mut roles = serde_json::Map::new();
    for i in 0..6000 {
        roles.insert(
            format!("Role{i:05}"),
            json!({"replicas": 1, "template": template(
                json!({"app": "llama", "role": format!("r{i}"), "pad": "p".repeat(150)}), 1)}),
        );
    }
    let job = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "big", "namespace": NS},
        "spec": {"pytorchReplicaSpecs": roles}});
    let size = serde_json::to_vec(&job).unwrap().len();
    assert!(size > 1_500_000, "{size} bytes");
    let Counted::Claim(c) = gpus::count(&job, NS, &GpuResources::default(), &()).unwrap() else {
        panic!()
    };
    assert_eq!(c.gpus, 6000.0);
    assert_eq!(c.label_sets.len(), 6001);
    let d = decide(&snapshot(vec![enforce()], vec![]), &create(job));
    assert_eq!(d.verdict, Verdict::Deny);
}

// --- approvals of what nobody saw ------------------------------------------------------

fn attestation_object(annotations: Value, status: Option<Value>) -> Value {
    let mut v = json!({"apiVersion": "gpureaper.io/v1alpha1", "kind": "ReadinessAttestation",
        "metadata": {"name": "llama", "namespace": NS, "generation": 2, "annotations": annotations},
        "spec": {"selector": {"matchLabels": {"app": "llama"}}, "maxGpus": 64, "expiresAt": FUTURE}});
    if let Some(s) = status {
        v["status"] = s;
    }
    v
}

fn approval(by: &str) -> Value {
    json!({"conditions": [{"type": "Approved", "status": "True", "reason": "Approved",
            "message": "ok", "lastTransitionTime": "2026-11-10T00:00:00Z"}],
        "approvedBy": by, "approvedGeneration": 2})
}

fn status_write(object: Value, old: Value, user: &str) -> AdmissionRequest {
    let mut r = request("UPDATE", object, Some(old), user);
    r.sub_resource = Some("status".into());
    r
}

#[test]
fn the_person_who_last_changed_the_spec_cannot_approve_it() {
    let s = snapshot(vec![enforce()], vec![]);
    let edited = attestation_object(json!({"gpureaper.io/spec-changed-by": "alice"}), None);
    let approved = attestation_object(
        json!({"gpureaper.io/spec-changed-by": "alice"}),
        Some(approval("alice")),
    );
    let d = decide(&s, &status_write(approved.clone(), edited.clone(), "alice"));
    assert_denied(
        &d,
        Reason::SelfApproval,
        "was last changed by alice, who may not approve it",
    );
    // Naming someone else in approvedBy does not help.
    let mut other = approved.clone();
    other["status"] = approval("bob");
    assert_eq!(
        decide(&s, &status_write(other, edited.clone(), "alice")).verdict,
        Verdict::Deny
    );
    // Another approver may.
    let mut by_bob = approved;
    by_bob["status"] = approval("bob");
    assert!(decide(&s, &status_write(by_bob, edited, "bob")).allowed());
}

#[test]
fn an_attestation_that_does_not_record_who_changed_its_spec_cannot_be_approved() {
    let s = snapshot(vec![enforce()], vec![]);
    let edited = attestation_object(json!({}), None);
    let approved = attestation_object(json!({}), Some(approval("bob")));
    let d = decide(&s, &status_write(approved, edited, "bob"));
    assert_denied(
        &d,
        Reason::AttestationInvalid,
        "does not record who last changed its spec",
    );
}

#[test]
fn a_spec_change_must_name_its_author_and_the_record_cannot_be_forged() {
    let s = snapshot(vec![enforce()], vec![]);
    let old = attestation_object(json!({"gpureaper.io/spec-changed-by": "alice"}), None);
    // Mallory widens the spec and leaves alice's name, so that she can approve it.
    let mut widened = old.clone();
    widened["spec"]["maxGpus"] = json!(100000);
    widened["spec"]["selector"] = json!({});
    let d = decide(
        &s,
        &request("UPDATE", widened.clone(), Some(old.clone()), "mallory"),
    );
    assert_eq!(d.verdict, Verdict::Deny, "{d:?}");
    // Nor can the record be edited without a spec change.
    let mut forged = old.clone();
    forged["metadata"]["annotations"] = json!({"gpureaper.io/spec-changed-by": "nobody"});
    let d = decide(&s, &request("UPDATE", forged, Some(old.clone()), "mallory"));
    assert_eq!(d.verdict, Verdict::Deny, "{d:?}");
    // Erasing the record goes in, but then nobody can approve it (see the test above).
    let mut erased = widened.clone();
    erased["metadata"]["annotations"] = json!({});
    let d = decide(&s, &request("UPDATE", erased, Some(old.clone()), "mallory"));
    assert!(d.allowed(), "{d:?}");
    assert!(d.warnings[0].contains("cannot be approved"), "{d:?}");
    // With the record the mutating webhook writes, the edit goes in.
    widened["metadata"]["annotations"] = json!({"gpureaper.io/spec-changed-by": "mallory"});
    assert!(decide(&s, &request("UPDATE", widened, Some(old), "mallory")).allowed());
}

#[test]
fn a_spec_a_service_account_last_changed_is_approved_by_nobody() {
    // alice may edit team-a, so she may act as its ServiceAccounts (`kubectl --as`); the
    // request names only the ServiceAccount, so nobody can be shown to be someone else.
    let s = snapshot(vec![enforce()], vec![]);
    let builder = "system:serviceaccount:team-a:builder";
    let edited = attestation_object(json!({"gpureaper.io/spec-changed-by": builder}), None);
    for approver in [
        "alice",
        "platform-oncall",
        "system:serviceaccount:ci:deployer",
    ] {
        let approved = attestation_object(
            json!({"gpureaper.io/spec-changed-by": builder}),
            Some(approval(approver)),
        );
        let d = decide(&s, &status_write(approved, edited.clone(), approver));
        assert_denied(
            &d,
            Reason::SelfApproval,
            &format!(
                "was last changed by ServiceAccount {builder}, which anyone who may edit namespace team-a can act as"
            ),
        );
    }
}

#[test]
fn a_service_account_is_not_a_second_pair_of_eyes() {
    // alice wrote the spec as herself and approves as a ServiceAccount with the approver
    // role, which she may impersonate.
    let s = snapshot(vec![enforce()], vec![]);
    let edited = attestation_object(json!({"gpureaper.io/spec-changed-by": "alice"}), None);
    let bot = "system:serviceaccount:team-a:approver-bot";
    let approved = attestation_object(
        json!({"gpureaper.io/spec-changed-by": "alice"}),
        Some(approval("approver-bot")),
    );
    let d = decide(&s, &status_write(approved, edited, bot));
    assert_denied(&d, Reason::SelfApproval, "approvals are made by people");
}

#[test]
fn an_approval_names_the_object_it_binds_to() {
    let s = snapshot(vec![enforce()], vec![]);
    let with_uid = |status: Option<Value>| {
        let mut v = attestation_object(json!({"gpureaper.io/spec-changed-by": "alice"}), status);
        v["metadata"]["uid"] = json!("u-2");
        v
    };
    let edited = with_uid(None);
    let approved_as = |uid: Option<&str>| {
        let mut status = approval("bob");
        if let Some(uid) = uid {
            status["approvedUid"] = json!(uid);
        }
        with_uid(Some(status))
    };
    // The approval of u-1 (deleted and created again since, as u-2).
    let d = decide(
        &s,
        &status_write(approved_as(Some("u-1")), edited.clone(), "bob"),
    );
    assert_denied(
        &d,
        Reason::AttestationInvalid,
        "status.approvedUid u-1 must equal metadata.uid u-2",
    );
    let d = decide(&s, &status_write(approved_as(None), edited.clone(), "bob"));
    assert_denied(
        &d,
        Reason::AttestationInvalid,
        "status.approvedUid (unset) must equal metadata.uid u-2",
    );
    assert!(decide(&s, &status_write(approved_as(Some("u-2")), edited, "bob")).allowed());
}

#[test]
fn an_approval_of_another_object_of_the_same_name_covers_nothing() {
    let approved_as = |uid: &str| {
        let mut a = (*attestation("llama", 64)).clone();
        a.metadata.uid = Some("u-2".into());
        a.status.as_mut().unwrap().approved_uid = Some(uid.into());
        Arc::new(a)
    };
    let claim = create(job("train", json!({"app": "llama"}), 2, 8));
    let other = approved_as("u-1");
    let d = decide(&snapshot(vec![enforce()], vec![other.clone()]), &claim);
    assert_denied(
        &d,
        Reason::StaleApproval,
        "was approved as another object of that name (uid u-1), not this one (uid u-2)",
    );
    // Nor does it count toward what the namespace may hold (G1, and the quota).
    assert!(!gpu_reaper::admission::checks::standing(&other, now()));
    let this = approved_as("u-2");
    assert!(gpu_reaper::admission::checks::standing(&this, now()));
    assert!(decide(&snapshot(vec![enforce()], vec![this.clone()]), &claim).allowed());
}

#[tokio::test]
async fn the_mutating_webhook_records_who_changed_the_spec() {
    use base64::Engine as _;
    let old = attestation_object(json!({"gpureaper.io/spec-changed-by": "alice"}), None);
    let mut new = old.clone();
    new["spec"]["maxGpus"] = json!(128);
    let r = request("UPDATE", new, Some(old), "mallory");
    let (status, body) = post(&app(snapshot(vec![], vec![])), "/mutate", review(&r)).await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(v["response"]["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(v["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/metadata/annotations/gpureaper.io~1spec-changed-by", "value": "mallory"}])
    );
}
