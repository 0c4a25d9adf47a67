//! Attacks on the budget gate that go through the real control plane (the pure decision
//! and the HTTP handler are attacked in tests/pure/gate_attacks.rs). The attacks on who
//! approves (four eyes by one person acting as a ServiceAccount; an approval that followed
//! the name to a re-created object) run on it (`live_` tests): the real API server does
//! the impersonation and the delete-and-create, and calls the real webhook behind the
//! chart's Service; the people are the testenv's users `alice` (namespace `edit`) and
//! `platform-oncall` (the chart's approver role). GPUs reached without asking for them (a
//! device variable, a device hostPath) are attacked on the real control plane too, as an
//! ordinary `edit` user through the chart's own webhook configuration.

use crate::common;
use serde_json::{Value, json};

mod live {
    use std::path::PathBuf;
    use std::process::Command;

    use serde_json::{Value, json};

    use super::common::chart::{BIN, Cleanup, Gate, GatedNamespace};
    use super::common::cluster::{Cluster, Run, run_with_stdin, wait_until};

    /// One attack's stage: a namespace governed by an Enforce policy (8 GPUs without an
    /// attestation), the chart's webhook (validating and mutating) serving it, the chart's
    /// attestation roles, and two people: alice, who may `edit` the namespace (the
    /// built-in role, with its `impersonate` on the namespace's ServiceAccounts) and write
    /// attestations there; platform-oncall, an approver for the namespace.
    pub struct Stage {
        pub cluster: &'static Cluster,
        pub ns: String,
        /// The chart's attestation editor and approver ClusterRoles.
        pub editor_role: String,
        pub approver_role: String,
        pub alice: PathBuf,
        pub oncall: PathBuf,
        pub _gate: Gate,
        pub _cleanup: Cleanup,
    }

    pub fn stage(prefix: &str) -> Stage {
        let values = json!({
            "controller": {"enabled": false},
            "samplePolicy": {"enabled": false},
            "webhook": {"failurePolicy": "Fail"},
            // The shared cluster's `edit` stays as it is; alice gets the editor role by a
            // binding of her own.
            "attestationRoles": {"aggregateToEdit": false},
        });
        let g = GatedNamespace::start(prefix, &values, |policy, ns| {
            format!(
                "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {policy}}}\nspec:\n  match: {{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}}}\n  admission: {{largeClaimGpus: 8, mode: Enforce}}\n"
            )
        });
        let GatedNamespace {
            cluster,
            ns,
            objects,
            gate,
            mut cleanup,
            ..
        } = g;
        let role = |suffix: &str| -> String {
            let role = objects
                .iter()
                .find(|o| {
                    o["kind"] == "ClusterRole"
                        && o["metadata"]["name"]
                            .as_str()
                            .is_some_and(|n| n.ends_with(suffix))
                })
                .unwrap_or_else(|| panic!("the chart renders a ClusterRole *{suffix}"));
            cluster.apply(&role.to_string());
            role["metadata"]["name"].as_str().unwrap().to_string()
        };
        let editor_role = role("-attestation-editor");
        cleanup.add("clusterrole", &editor_role);
        let approver_role = role("-attestation-approver");
        cleanup.add("clusterrole", &approver_role);
        let binding = |name: &str, role: &str, subject: Value| {
            cluster.apply(
                &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": name, "namespace": ns},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [subject]})
                .to_string(),
            );
        };
        let user = |name: &str| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name});
        binding("alice-edit", "edit", user("alice"));
        binding("alice-attestations", &editor_role, user("alice"));
        binding("oncall-approves", &approver_role, user("platform-oncall"));
        Stage {
            cluster,
            alice: cluster.dir.join("alice.kubeconfig"),
            oncall: cluster.dir.join("approver.kubeconfig"),
            ns,
            editor_role,
            approver_role,
            _gate: gate,
            _cleanup: cleanup,
        }
    }

    impl Stage {
        /// kubectl as the person of `kubeconfig`.
        pub fn kubectl(&self, kubeconfig: &PathBuf, args: &[&str], stdin: Option<&str>) -> Run {
            run_with_stdin(
                Command::new(self.cluster.bin("kubectl"))
                    .arg("--kubeconfig")
                    .arg(kubeconfig)
                    .args(args),
                stdin,
            )
        }

        /// `gpu-reaper` as the person of `kubeconfig`.
        pub fn gpu_reaper(&self, kubeconfig: &PathBuf, args: &[&str]) -> Run {
            run_with_stdin(
                Command::new(BIN).args(args).env("KUBECONFIG", kubeconfig),
                None,
            )
        }

        /// The attestation `name` as stored.
        pub fn attestation(&self, name: &str) -> Value {
            self.cluster
                .get("readinessattestation", Some(&self.ns), name)
                .expect("the attestation exists")
        }

        /// Whether the stored attestation `name` is marked approved.
        pub fn approved(&self, name: &str) -> bool {
            self.attestation(name)["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Approved" && c["status"] == "True")
        }

        /// `kubectl patch --subresource status` setting Approved=True for `generation`
        /// and `uid`, as `kubeconfig` (with `as_`: impersonating that identity).
        pub fn approve_by_hand(
            &self,
            kubeconfig: &PathBuf,
            as_: Option<&str>,
            name: &str,
            by: &str,
            generation: i64,
            uid: &str,
        ) -> Run {
            let status = json!({"status": {
                "conditions": [{"type": "Approved", "status": "True", "reason": "Approved",
                    "message": "reviewed", "lastTransitionTime": "2026-11-10T00:00:00Z"}],
                "approvedBy": by, "approvedGeneration": generation, "approvedUid": uid}})
            .to_string();
            let mut args = vec![
                "patch",
                "readinessattestation",
                name,
                "-n",
                &self.ns,
                "--subresource=status",
                "--type=merge",
                "-p",
                &status,
            ];
            let as_flag = as_.map(|a| format!("--as={a}"));
            if let Some(a) = &as_flag {
                args.push(a);
            }
            self.kubectl(kubeconfig, &args, None)
        }

        /// A 16-GPU Job labelled `app=llama`, created by alice with a server dry run (no
        /// pods hold the shared nodes' GPUs): its outcome.
        pub fn claim_16_gpus(&self) -> Run {
            let job = json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "train", "namespace": self.ns, "labels": {"app": "llama"}},
                "spec": {"parallelism": 2, "template": {
                    "metadata": {"labels": {"app": "llama"}},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "train", "image": "x",
                        "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}})
            .to_string();
            self.kubectl(
                &self.alice,
                &["create", "--dry-run=server", "-f", "-"],
                Some(&job),
            )
        }

        /// Waits until alice's 16-GPU claim is refused with a sentence containing `says`
        /// (the webhook's cache follows the API server a moment later).
        pub fn claim_refused(&self, says: &str) {
            wait_until(&format!("the 16-GPU claim refused with {says:?}"), || {
                let run = self.claim_16_gpus();
                !run.ok && run.stderr.contains(says)
            });
        }

        pub fn claim_admitted(&self) {
            wait_until("the 16-GPU claim admitted", || self.claim_16_gpus().ok);
        }
    }

    pub fn attestation(ns: &str, max_gpus: u32, selector: Value) -> String {
        json!({"apiVersion": "gpureaper.io/v1alpha1", "kind": "ReadinessAttestation",
            "metadata": {"name": "llama", "namespace": ns},
            "spec": {"selector": selector, "maxGpus": max_gpus,
                     "expiresAt": "2099-01-01T00:00:00Z",
                     "evidence": {"dataThroughputGBps": 40, "notes": "loader benchmark"}}})
        .to_string()
    }
}

/// Issue #33 (A): namespace `edit` grants `impersonate` on the namespace's
/// ServiceAccounts. alice wrote the attestation as one (`kubectl --as
/// system:serviceaccount:<ns>:builder`), so the record named the ServiceAccount, and she
/// approved it as herself: one person, counted as two pairs of eyes.
#[test]
fn live_an_editor_acting_as_a_service_account_is_not_a_second_pair_of_eyes() {
    let s = live::stage("eyes");
    let (cluster, ns) = (s.cluster, s.ns.as_str());
    // The namespace's CI bot, allowed to edit it; and a bot someone made an approver.
    for bot in ["builder", "approver-bot"] {
        cluster.kubectl(&["create", "serviceaccount", bot, "-n", ns], None);
    }
    for (i, (bot, role)) in [
        ("builder", "edit"),
        ("builder", s.editor_role.as_str()),
        ("approver-bot", s.approver_role.as_str()),
    ]
    .into_iter()
    .enumerate()
    {
        cluster.kubectl(
            &[
                "create",
                "rolebinding",
                &format!("{bot}-{i}"),
                "-n",
                ns,
                &format!("--clusterrole={role}"),
                &format!("--serviceaccount={ns}:{bot}"),
            ],
            None,
        );
    }
    // alice leads the team: she approves for her namespace too (a RoleBinding per
    // namespace, as docs/security.md shows).
    cluster.kubectl(
        &[
            "create",
            "rolebinding",
            "alice-approves",
            "-n",
            ns,
            &format!("--clusterrole={}", s.approver_role),
            "--user=alice",
        ],
        None,
    );
    let builder = format!("system:serviceaccount:{ns}:builder");

    // alice writes the spec as the builder ServiceAccount: the record names it.
    let attestation = live::attestation(ns, 64, json!({"matchLabels": {"app": "llama"}}));
    let wrote = s.kubectl(
        &s.alice,
        &["apply", "-f", "-", &format!("--as={builder}")],
        Some(&attestation),
    );
    assert!(
        wrote.ok,
        "alice writes as the ServiceAccount: {}",
        wrote.stderr
    );
    let stored = s.attestation("llama");
    assert_eq!(
        stored["metadata"]["annotations"]["gpureaper.io/spec-changed-by"],
        builder.as_str()
    );
    let uid = stored["metadata"]["uid"].as_str().unwrap().to_string();

    // Then she approves it as herself, by hand and with the CLI: refused both ways.
    let by_hand = s.approve_by_hand(&s.alice, None, "llama", "alice", 1, &uid);
    assert!(
        !by_hand.ok,
        "alice approved the spec she wrote as {builder}: {}",
        by_hand.stdout
    );
    assert!(
        by_hand
            .stderr
            .contains(&format!("was last changed by ServiceAccount {builder}")),
        "{}",
        by_hand.stderr
    );
    let target = format!("{ns}/llama");
    let cli = s.gpu_reaper(
        &s.alice,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "1",
            "--uid",
            &uid,
        ],
    );
    assert!(!cli.ok, "{}", cli.stdout);
    assert!(!s.approved("llama"), "{}", s.attestation("llama"));
    s.claim_refused("is not approved");

    // The other way round: alice writes the spec as herself and approves as a
    // ServiceAccount that holds the approver role.
    let mine = s.kubectl(
        &s.alice,
        &["apply", "-f", "-"],
        Some(&attestation.replace("loader benchmark", "loader benchmark, run 2")),
    );
    assert!(mine.ok, "{}", mine.stderr);
    assert_eq!(
        s.attestation("llama")["metadata"]["annotations"]["gpureaper.io/spec-changed-by"],
        "alice"
    );
    let as_bot = s.approve_by_hand(
        &s.alice,
        Some(&format!("system:serviceaccount:{ns}:approver-bot")),
        "llama",
        "approver-bot",
        2,
        &uid,
    );
    assert!(
        !as_bot.ok,
        "alice approved her own spec as a ServiceAccount"
    );
    assert!(
        as_bot.stderr.contains("approvals are made by people"),
        "{}",
        as_bot.stderr
    );
    assert!(!s.approved("llama"));

    // A second person approves what alice wrote as herself: admitted.
    let approve = s.gpu_reaper(
        &s.oncall,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "2",
            "--uid",
            &uid,
        ],
    );
    assert!(approve.ok, "{}", approve.stderr);
    assert_eq!(
        s.attestation("llama")["status"]["approvedBy"],
        "platform-oncall"
    );
    s.claim_admitted();
}

/// Issue #33 (B): between review and `attest approve --generation 1`, the attestation was
/// deleted and re-created under the same name (generation 1 again) with `maxGpus:
/// 1000000` and an empty selector, and the approval landed on the new object.
#[test]
fn live_an_approval_binds_to_the_object_reviewed_not_to_its_name() {
    let s = live::stage("uid");
    let ns = s.ns.as_str();
    let target = format!("{ns}/llama");
    let modest = live::attestation(ns, 16, json!({"matchLabels": {"app": "llama"}}));
    let wrote = s.kubectl(&s.alice, &["apply", "-f", "-"], Some(&modest));
    assert!(wrote.ok, "{}", wrote.stderr);
    // The approver reviews generation 1 of the object with this uid.
    let reviewed = s.kubectl(
        &s.oncall,
        &[
            "get",
            "readinessattestation",
            "llama",
            "-n",
            ns,
            "-o",
            "json",
        ],
        None,
    );
    assert!(reviewed.ok, "{}", reviewed.stderr);
    let reviewed: Value = serde_json::from_str(&reviewed.stdout).unwrap();
    let reviewed_uid = reviewed["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(reviewed["metadata"]["generation"], 1);

    // alice swaps it for another object of the same name, at generation 1 again.
    let deleted = s.kubectl(
        &s.alice,
        &[
            "delete",
            "readinessattestation",
            "llama",
            "-n",
            ns,
            "--wait=true",
        ],
        None,
    );
    assert!(deleted.ok, "{}", deleted.stderr);
    let greedy = live::attestation(ns, 1_000_000, json!({}));
    let swapped = s.kubectl(&s.alice, &["create", "-f", "-"], Some(&greedy));
    assert!(swapped.ok, "{}", swapped.stderr);
    let current = s.attestation("llama");
    assert_eq!(current["metadata"]["generation"], 1);
    let current_uid = current["metadata"]["uid"].as_str().unwrap().to_string();
    assert_ne!(current_uid, reviewed_uid);

    // The approval of what was reviewed does not land on the new object: neither by the
    // CLI nor by hand.
    let cli = s.gpu_reaper(
        &s.oncall,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "1",
            "--uid",
            &reviewed_uid,
        ],
    );
    assert!(!cli.ok, "{}", cli.stdout);
    let by_hand = s.approve_by_hand(
        &s.oncall,
        None,
        "llama",
        "platform-oncall",
        1,
        &reviewed_uid,
    );
    assert!(
        !by_hand.ok,
        "the approval of {reviewed_uid} landed on {current_uid}"
    );
    assert!(
        by_hand.stderr.contains(&format!(
            "status.approvedUid {reviewed_uid} must equal metadata.uid {current_uid}"
        )),
        "{}",
        by_hand.stderr
    );
    assert!(!s.approved("llama"), "{}", s.attestation("llama"));
    s.claim_refused("is not approved");

    // `attest approve` shows the object's uid with the spec, and approving what it shows
    // records that uid.
    let review = s.gpu_reaper(&s.oncall, &["attest", "approve", &target]);
    assert!(!review.ok);
    assert!(
        review
            .stderr
            .contains(&format!("--generation 1 --uid {current_uid}")),
        "{}",
        review.stderr
    );
    let approve = s.gpu_reaper(
        &s.oncall,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "1",
            "--uid",
            &current_uid,
        ],
    );
    assert!(approve.ok, "{}", approve.stderr);
    assert_eq!(
        s.attestation("llama")["status"]["approvedUid"],
        current_uid.as_str()
    );
}

// --- GPUs reached without asking for them (issue #33, item 5) --------------------------

/// An ordinary user of `namespaces`: a ServiceAccount of the first, bound to the built-in
/// `edit` ClusterRole in each, acting with a real token.
fn edit_user(
    cluster: &common::cluster::Cluster,
    namespaces: &[&str],
    dir: &std::path::Path,
) -> std::path::PathBuf {
    cluster.kubectl(
        &["create", "serviceaccount", "dev", "-n", namespaces[0]],
        None,
    );
    for ns in namespaces {
        cluster.kubectl(
            &[
                "create",
                "rolebinding",
                "dev-edit",
                "-n",
                ns,
                "--clusterrole=edit",
                &format!("--serviceaccount={}:dev", namespaces[0]),
            ],
            None,
        );
    }
    common::chart::service_account_kubeconfig(cluster, dir, namespaces[0], "dev")
}

/// A Deployment of `replicas` pods that set NVIDIA_VISIBLE_DEVICES=all and request no GPU.
fn peeking_deployment(ns: &str, replicas: u32) -> String {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "peek", "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "peek"}},
            "template": {"metadata": {"labels": {"app": "peek"}},
                "spec": {"containers": [{"name": "main", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}}})
    .to_string()
}

/// With the NVIDIA container toolkit's default configuration, 12 pods that set
/// NVIDIA_VISIBLE_DEVICES=all on 8-GPU nodes reached 96 GPUs that nothing counted. In a
/// governed namespace `kubectl apply` now refuses them, and a pod mounting /dev/nvidia0,
/// with one sentence; the namespace next door, which no policy governs, and a pod that
/// asks for its GPU are not affected.
#[test]
fn gpus_reached_through_nvidia_visible_devices_or_a_device_host_path_are_refused_at_apply() {
    use common::chart::{Cleanup, Gate, render};
    use common::cluster::{cluster, unique, wait_until};

    let cluster = cluster();
    cluster.install_crds();
    let mut cleanup = Cleanup::new(cluster);
    let system = cluster.namespace("devices-sys", &[]);
    cleanup.add("namespace", &system);
    let governed = cluster.namespace("devices", &[]);
    cleanup.add("namespace", &governed);
    let free = cluster.namespace("devices-free", &[]);
    cleanup.add("namespace", &free);
    let policy = format!("research-{governed}");
    cluster.apply(&format!(
        "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {policy}}}\nspec:\n  match: {{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {governed}}}}}}}\n  admission: {{largeClaimGpus: 8, mode: Enforce}}\n"
    ));
    cleanup.add("gpupolicy", &policy);
    let release = format!("devices-{}", unique());
    let values = json!({"controller": {"enabled": false}, "samplePolicy": {"enabled": false},
        "webhook": {"failurePolicy": "Fail"}});
    let objects = render(cluster, &release, &system, &values, &[]).expect("helm template");
    let gate = Gate::start(cluster, &objects, &[&governed, &free], &cluster.kubeconfig);
    cleanup.add("validatingwebhookconfiguration", &gate.vwc_name);
    gate.wait_called(&governed);
    gate.wait_called(&free);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = edit_user(cluster, &[&governed, &free], dir.path());
    let dev = |args: &[&str], stdin: &str| {
        common::cluster::run_with_stdin(
            std::process::Command::new(cluster.bin("kubectl"))
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(args),
            Some(stdin),
        )
    };
    // The RoleBinding reaches the authorizer's cache a moment after it is created.
    wait_until("the edit user may create deployments", || {
        dev(
            &["auth", "can-i", "create", "deployments", "-n", &governed],
            "",
        )
        .stdout
        .trim()
            == "yes"
    });

    // 12 replicas that see every GPU of their nodes, counted by nothing: refused.
    let applied = dev(&["apply", "-f", "-"], &peeking_deployment(&governed, 12));
    assert!(!applied.ok, "admitted: {}", applied.stdout);
    let sentence = format!(
        "Deployment {governed}/peek asks for GPU devices through NVIDIA_VISIBLE_DEVICES=all in container \"main\" of its pods without requesting nvidia.com/gpu: request the GPUs as resources (limits: nvidia.com/gpu: N) so they are counted, or remove the variable; cluster admins should also set accept-nvidia-visible-devices-envvar-when-unprivileged = false in the NVIDIA container toolkit (docs/security.md)."
    );
    assert!(
        applied
            .stderr
            .contains("admission webhook \"budget-gate.gpureaper.io\" denied the request")
            && applied.stderr.contains(&sentence),
        "{}",
        applied.stderr
    );
    assert!(cluster.get("deployment", Some(&governed), "peek").is_none());

    // A bare pod mounting a GPU's device node from the host: refused.
    let host_path = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "node-gpu", "namespace": governed},
        "spec": {"volumes": [{"name": "gpu", "hostPath": {"path": "/dev/nvidia0", "type": "CharDevice"}}],
            "containers": [{"name": "main", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                "volumeMounts": [{"name": "gpu", "mountPath": "/dev/nvidia0"}]}]}})
    .to_string();
    let applied = dev(&["apply", "-f", "-"], &host_path);
    assert!(!applied.ok, "admitted: {}", applied.stdout);
    assert!(
        applied.stderr.contains(&format!(
            "Pod {governed}/node-gpu asks for GPU devices through hostPath volume \"gpu\" (/dev/nvidia0) in container \"main\" without requesting nvidia.com/gpu: request the GPUs as resources (limits: nvidia.com/gpu: N) so they are counted, or remove the volume"
        )),
        "{}",
        applied.stderr
    );
    assert!(cluster.get("pod", Some(&governed), "node-gpu").is_none());

    // The variable in a bare pod's init container reaches the gate through the chart's
    // matchConditions too.
    let init = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "init-peek", "namespace": governed},
        "spec": {"initContainers": [{"name": "warmup", "image": "busybox",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1,2,3"}]}],
            "containers": [{"name": "main", "image": "busybox"}]}})
    .to_string();
    let applied = dev(&["apply", "-f", "-"], &init);
    assert!(
        !applied.ok
            && applied
                .stderr
                .contains("NVIDIA_VISIBLE_DEVICES=0,1,2,3 in init container \"warmup\""),
        "{} {}",
        applied.stdout,
        applied.stderr
    );

    // A pod that asks for its GPU is counted and admitted, as before.
    let counted = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "counted", "namespace": governed},
        "spec": {"containers": [{"name": "main", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    .to_string();
    let applied = dev(&["apply", "-f", "-"], &counted);
    assert!(applied.ok, "{}", applied.stderr);

    // A namespace no admission policy governs is not affected.
    let applied = dev(&["apply", "-f", "-"], &peeking_deployment(&free, 1));
    assert!(applied.ok, "{}", applied.stderr);
    assert!(
        applied.stderr.is_empty(),
        "no warning either: {}",
        applied.stderr
    );
    cluster.kubectl(
        &["delete", "deployment", "peek", "-n", &free, "--wait=false"],
        None,
    );
    cluster.kubectl(
        &["delete", "pod", "counted", "-n", &governed, "--wait=false"],
        None,
    );
}

// --- the namespace's total where pieces meet, on the live cluster ----------------------

/// The chart's gate (its default failure policies) on the real control plane, governing
/// one namespace under `admission` rules, and an ordinary `edit` user of it.
struct LiveGate {
    cluster: &'static common::cluster::Cluster,
    ns: String,
    gate: common::chart::Gate,
    kubeconfig: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _cleanup: common::chart::Cleanup,
}

impl LiveGate {
    fn start(prefix: &str, policy_spec: &str) -> Self {
        // The chart's own failure policies: workloads Ignore, GPU pods and claims Fail.
        let values = json!({"controller": {"enabled": false}, "samplePolicy": {"enabled": false}});
        let g = common::chart::GatedNamespace::start(prefix, &values, |policy, ns| {
            format!(
                "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {policy}}}\nspec:\n  match: {{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}}}\n{policy_spec}"
            )
        });
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = edit_user(g.cluster, &[&g.ns], dir.path());
        let live = LiveGate {
            cluster: g.cluster,
            ns: g.ns,
            gate: g.gate,
            kubeconfig,
            _dir: dir,
            _cleanup: g.cleanup,
        };
        common::cluster::wait_until("the edit user may create deployments", || {
            live.dev(
                &["auth", "can-i", "create", "deployments", "-n", &live.ns],
                "",
            )
            .stdout
            .trim()
                == "yes"
        });
        live
    }

    /// kubectl as the `edit` user.
    fn dev(&self, args: &[&str], stdin: &str) -> common::cluster::Run {
        common::cluster::run_with_stdin(
            std::process::Command::new(self.cluster.bin("kubectl"))
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args),
            Some(stdin),
        )
    }

    fn apply(&self, manifest: &str) -> common::cluster::Run {
        self.dev(&["apply", "-f", "-"], manifest)
    }

    /// Waits until the gate's caches hold what the namespace runs: a server-side dry run
    /// of `manifest` is refused.
    fn wait_refused(&self, what: &str, manifest: &str) {
        common::cluster::wait_until(what, || {
            !self
                .dev(&["apply", "--dry-run=server", "-f", "-"], manifest)
                .ok
        });
    }

    fn pods(&self, selector: &str) -> usize {
        self.cluster
            .list("pods", &self.ns, Some(selector))
            .into_iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count()
    }

    /// Waits (up to `patience`) for an Event in the namespace whose message contains every
    /// one of `says`.
    fn wait_event(&self, what: &str, says: &[&str], patience: std::time::Duration) -> String {
        let deadline = std::time::Instant::now() + patience;
        loop {
            let events = self.cluster.list("events", &self.ns, None);
            if let Some(found) = events
                .iter()
                .filter_map(|e| e["message"].as_str())
                .find(|m| says.iter().all(|s| m.contains(s)))
            {
                return found.to_string();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}; the namespace's events: {events:#?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
}

/// A Deployment of `replicas` pods, each with `quantity` of `resource`.
fn live_deployment(ns: &str, name: &str, resource: &str, quantity: &str) -> String {
    let limits = if resource.is_empty() {
        json!({})
    } else {
        json!({resource: quantity})
    };
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.3",
                    "resources": {"limits": limits}}]}}}})
    .to_string()
}

/// A ResourceQuota bounds each GPU resource on its own, so with the webhook down one
/// namespace held 8 AMD + 8 NVIDIA GPUs + MIG slices worth 4 against an allowance of 8.
/// With the gate up the sum is refused at `kubectl apply`; with the gate down (the
/// webhook process stopped, its configuration registered, the chart's default failure
/// policies) workloads still go in but no GPU pod is created, and pods without GPUs are
/// not held up.
#[test]
fn live_gpu_resources_add_up_to_one_total_and_with_the_gate_down_no_gpu_pod_starts() {
    let mut g = LiveGate::start("sum", "  admission: {largeClaimGpus: 8, mode: Enforce}\n");
    let ns = g.ns.clone();
    let amd = live_deployment(&ns, "amd", "amd.com/gpu", "8");
    let applied = g.apply(&amd);
    assert!(applied.ok, "{}", applied.stderr);
    common::cluster::wait_until("the AMD pod", || g.pods("app=amd") == 1);
    let nvidia = live_deployment(&ns, "nvidia", "nvidia.com/gpu", "8");
    g.wait_refused("the gate counts the AMD pod", &nvidia);
    for (name, manifest, gpus) in [
        ("nvidia", nvidia.clone(), "8"),
        (
            "mig",
            live_deployment(&ns, "mig", "nvidia.com/mig-1g.10gb", "28"),
            "4",
        ),
    ] {
        let applied = g.apply(&manifest);
        assert!(!applied.ok, "{name} admitted: {}", applied.stdout);
        assert!(
            applied.stderr.contains(&format!(
                "Deployment {ns}/{name} claims {gpus} GPUs, but namespace {ns} already holds 8 GPUs"
            )),
            "{}",
            applied.stderr
        );
    }

    g.gate.stop();
    let applied = g.apply(&nvidia);
    assert!(applied.ok, "workloads are not held up: {}", applied.stderr);
    let refusal = g.wait_event(
        "the ReplicaSet's pods refused while the gate is down",
        &["failed calling webhook", "pods.budget-gate.gpureaper.io"],
        common::cluster::PATIENCE,
    );
    assert_eq!(g.pods("app=nvidia"), 0, "{refusal}");
    let cpu = live_deployment(&ns, "web", "", "");
    let applied = g.apply(&cpu);
    assert!(applied.ok, "{}", applied.stderr);
    common::cluster::wait_until("the pod without GPUs", || g.pods("app=web") == 1);
    assert_eq!(g.pods("app=nvidia"), 0);
}

/// Found by the `object` fuzz target (2026-12-04): a GpuPolicy stored under an older CRD
/// without the CEL rules on durations, with `idle.window` too long for any clock — any
/// policy, even one governing nothing — made kube-core's parser panic in the gate's policy
/// reader, so the gate stopped seeing every change after it: the namespace's total was
/// no longer kept. Now the policy is skipped (counted, logged) and the gate goes on
/// refusing.
#[test]
fn live_a_policy_with_a_duration_past_any_clock_is_skipped_and_the_gate_goes_on() {
    let bad = format!("clock-{}", common::cluster::unique());
    let _delete = common::scenario::DeletePolicy(common::cluster::cluster(), bad.clone());
    common::cluster::cluster().install_crds();
    common::scenario::apply_under_crd(
        common::cluster::cluster(),
        &common::scenario::older_policy_crd(),
        &format!(
            "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {bad}}}\nspec:\n  match: {{namespaceSelector: {{matchLabels: {{gpureaper.io/none: x}}}}}}\n  idle: {{window: 3{}0m}}\n",
            "1".repeat(110)
        ),
    );
    let g = LiveGate::start("clock", "  admission: {largeClaimGpus: 8, mode: Enforce}\n");
    let ns = g.ns.clone();
    common::cluster::wait_until("the gate to skip the unreadable policy", || {
        g.gate
            .metric("gpu_reaper_admission_unreadable_objects_total{resource=\"gpupolicies\"}")
            .is_some_and(|n| n >= 1.0)
    });
    // Still keeping the namespace's total: 8 GPUs in, the next 8 refused.
    let first = live_deployment(&ns, "first", "nvidia.com/gpu", "8");
    let applied = g.apply(&first);
    assert!(applied.ok, "{}", applied.stderr);
    common::cluster::wait_until("the first pod", || g.pods("app=first") == 1);
    let second = live_deployment(&ns, "second", "nvidia.com/gpu", "8");
    g.wait_refused("the gate counts the first pod", &second);
    let applied = g.apply(&second);
    assert!(!applied.ok, "admitted: {}", applied.stdout);
    assert!(
        applied
            .stderr
            .contains(&format!("namespace {ns} already holds 8 GPUs")),
        "{}",
        applied.stderr
    );
}

/// What the namespace holds changes after admission: a KAI pod's `gpu-fraction` removed,
/// a suspended Job resumed, a CronJob admitted when the namespace had room running when
/// it has none. Each is refused with one sentence (at `kubectl apply`, or on the CronJob
/// as its run is created), not left to a trickle of quota refusals, and nothing more is
/// held.
#[test]
fn live_kai_shares_resumed_jobs_and_cronjob_runs_are_held_to_the_namespace_total() {
    let g = LiveGate::start("later", "  admission: {largeClaimGpus: 8, mode: Enforce}\n");
    let ns = g.ns.clone();
    // A CronJob whose first run is two to three minutes away, admitted while the
    // namespace holds nothing.
    let at = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(150);
    let at = at.to_zoned(jiff::tz::TimeZone::UTC);
    let nightly = json!({"apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": ns},
        "spec": {"schedule": format!("{} {} * * *", at.minute(), at.hour()), "timeZone": "Etc/UTC",
            "concurrencyPolicy": "Forbid",
            "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "trainer",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}}});
    let applied = g.apply(&nightly.to_string());
    assert!(applied.ok, "{}", applied.stderr);
    // A suspended 8-GPU Job: it holds nothing yet.
    let later = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "later", "namespace": ns},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "trainer",
                "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}});
    let applied = g.apply(&later.to_string());
    assert!(applied.ok, "{}", applied.stderr);
    // Half a GPU through KAI, and a 7-GPU server: 7.5 of 8.
    let frac = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "frac", "namespace": ns, "annotations": {"gpu-fraction": "0.5"}},
        "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "main", "image": "x"}]}});
    let applied = g.apply(&frac.to_string());
    assert!(applied.ok, "{}", applied.stderr);
    let applied = g.apply(&live_deployment(&ns, "serve", "nvidia.com/gpu", "7"));
    assert!(applied.ok, "{}", applied.stderr);
    common::cluster::wait_until("the server's pod", || g.pods("app=serve") == 1);
    g.wait_refused(
        "the gate counts the server and the KAI pod",
        &live_deployment(&ns, "one", "nvidia.com/gpu", "1"),
    );

    // The share cannot be edited away.
    let edited = g.dev(&["annotate", "pod", "frac", "-n", &ns, "gpu-fraction-"], "");
    assert!(!edited.ok, "{}", edited.stdout);
    assert!(
        edited.stderr.contains(&format!(
            "Pod {ns}/frac may not change its \"gpu-fraction\" annotation after it is created"
        )),
        "{}",
        edited.stderr
    );
    // Resuming the Job claims its 8 GPUs again.
    let resumed = g.dev(
        &[
            "patch",
            "job",
            "later",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"suspend":false}}"#,
        ],
        "",
    );
    assert!(!resumed.ok, "{}", resumed.stdout);
    assert!(
        resumed
            .stderr
            .contains(&format!("denied the request: Job {ns}/later claims 8 GPUs")),
        "{}",
        resumed.stderr
    );
    // The CronJob's run (at most 150 s after it was created) is refused on the CronJob,
    // with the sentence.
    let refusal = g.wait_event(
        "the CronJob's run refused",
        &[
            "which CronJob nightly creates, claims 8 GPUs",
            &format!("namespace {ns} already holds 7.50 GPUs"),
        ],
        std::time::Duration::from_secs(150) + common::cluster::PATIENCE,
    );
    assert!(
        g.cluster.list("jobs", &ns, None).len() == 1,
        "only the suspended Job: {refusal}"
    );
    assert_eq!(g.pods("app=serve") + g.pods("job-name=later"), 1);
}

/// G3 was checked per claim: one 8-GPU claim was refused as over the month's budget, two
/// 4-GPU claims back to back were admitted (178 % of it). What the namespace holds now
/// counts until the month ends.
#[test]
fn live_two_claims_back_to_back_never_cross_the_months_budget() {
    let now = jiff::Timestamp::now();
    let hours_left = gpu_reaper::admission::budget::hours_until(
        now,
        gpu_reaper::admission::budget::month_end(now),
    );
    // 1 USD a GPU-hour: the budget pays for 6.5 GPUs from now to the month's end.
    let budget = (6.5 * hours_left).round();
    let g = LiveGate::start(
        "budget",
        &format!(
            "  cost: {{defaultHourlyUsd: 1}}\n  admission: {{largeClaimGpus: 8, mode: Enforce, monthlyBudgetUsd: {budget}}}\n"
        ),
    );
    let ns = g.ns.clone();
    let first = live_deployment(&ns, "first", "nvidia.com/gpu", "4");
    let applied = g.apply(&first);
    assert!(applied.ok, "{}", applied.stderr);
    common::cluster::wait_until("the first claim's pod", || g.pods("app=first") == 1);
    let second = live_deployment(&ns, "second", "nvidia.com/gpu", "4");
    g.wait_refused("the gate counts the first claim", &second);
    let applied = g.apply(&second);
    assert!(!applied.ok, "{}", applied.stdout);
    assert!(
        applied.stderr.contains(&format!(
            "Deployment {ns}/second claims 4 GPUs, which would cost about"
        )) && applied
            .stderr
            .contains("and the 4 GPUs it holds now will cost about"),
        "{}",
        applied.stderr
    );
    assert_eq!(g.pods("app=second"), 0);
}

/// A ResourceClaimTemplate created after the workload that names it was counted as
/// nothing: the workload was admitted with a warning, and the claims the template made
/// later were a listed controller's writes, never checked. Now the template is counted
/// as a claim when it is created, and each claim the ResourceClaim controller makes from
/// it is held to the namespace's total. (The controller's own request is made here with
/// its identity, `kubectl --as`, so the test does not depend on when its retries run.)
#[test]
fn live_a_claim_template_created_after_its_workload_is_counted_when_its_claims_are_made() {
    let g = LiveGate::start("late", "  admission: {largeClaimGpus: 8, mode: Enforce}\n");
    let ns = g.ns.clone();
    let applied = g.apply(&live_deployment(&ns, "serve", "nvidia.com/gpu", "8"));
    assert!(applied.ok, "{}", applied.stderr);
    common::cluster::wait_until("the server's pod", || g.pods("app=serve") == 1);
    g.wait_refused(
        "the gate counts the server",
        &live_deployment(&ns, "one", "nvidia.com/gpu", "1"),
    );
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "late", "namespace": ns},
        "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight"}],
            "containers": [{"name": "main", "image": "trainer", "resources": {"claims": [{"name": "gpus"}]}}]}});
    let applied = g.apply(&pod.to_string());
    assert!(applied.ok, "{}", applied.stderr);
    assert!(
        applied.stderr.contains("ResourceClaimTemplate eight"),
        "a warning names the unknown template: {}",
        applied.stderr
    );
    let devices = json!({"requests": [{"name": "gpus",
        "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 8}}]});
    let template = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "eight", "namespace": ns},
        "spec": {"spec": {"devices": devices}}});
    let applied = g.apply(&template.to_string());
    assert!(!applied.ok, "{}", applied.stdout);
    assert!(
        applied.stderr.contains(&format!(
            "ResourceClaimTemplate {ns}/eight claims 8 GPUs, but namespace {ns} already holds 8 GPUs"
        )),
        "{}",
        applied.stderr
    );
    // The claim the ResourceClaim controller makes for the pod from such a template.
    let uid = g.cluster.get("pod", Some(&ns), "late").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"generateName": "late-gpus-", "namespace": ns,
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "late", "uid": uid,
                "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"devices": devices}});
    let made = g.cluster.try_kubectl(
        &[
            "--as=system:serviceaccount:kube-system:resource-claim-controller",
            "create",
            "-f",
            "-",
        ],
        Some(&claim.to_string()),
    );
    assert!(!made.ok, "{}", made.stdout);
    assert!(
        made.stderr.contains("pods.budget-gate.gpureaper.io")
            && made.stderr.contains(&format!(
                ", which Pod late creates, claims 8 GPUs, but namespace {ns} already holds 8 GPUs and may hold 8"
            )),
        "{}",
        made.stderr
    );
    assert!(g.cluster.list("resourceclaims", &ns, None).is_empty());
}
