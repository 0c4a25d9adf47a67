//! The real control plane the end-to-end tests run on: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and kwok GPU nodes, built from the pinned Go
//! modules in `tests/k8s` and started by `scripts/testenv`.
//!
//! Which cluster, in order:
//! - `GPU_REAPER_TESTENV=DIR`: the one `scripts/testenv up DIR` started (what
//!   `scripts/test` does once for the whole run);
//! - otherwise one per test binary, started on first use in a temporary directory and
//!   stopped when the binary exits.
//!
//! Tests share it, so each works in namespaces of its own ([`Cluster::namespace`]) and
//! names its cluster-scoped objects after itself. The one thing a test cannot keep to
//! itself is a CRD's schema: [`with_crd_change`].
#![allow(dead_code)]

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

pub struct Cluster {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
}

/// The cluster of this test run (started on first use). The calling thread uses it until
/// the thread ends (libtest runs each test on a thread of its own); while another test
/// changes a CRD's schema ([`with_crd_change`]), this waits until it is done.
pub fn cluster() -> &'static Cluster {
    enter();
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let dir = match std::env::var_os("GPU_REAPER_TESTENV") {
            Some(dir) => PathBuf::from(dir),
            None => {
                let dir =
                    std::env::temp_dir().join(format!("gpu-reaper-testenv-{}", std::process::id()));
                testenv_up(&dir, None);
                dir
            }
        };
        let kubeconfig = dir.join("kubeconfig");
        assert!(
            kubeconfig.is_file(),
            "{} is missing: start the control plane with `scripts/testenv up {}`",
            kubeconfig.display(),
            dir.display()
        );
        Cluster { dir, kubeconfig }
    })
}

/// The threads of this process using the cluster, and the one changing a CRD's schema.
/// After a CRD changes, the API server answers 429 "storage is (re)initializing" to
/// requests for its resource for a moment, and a test beside it would see the changed
/// schema: the suites of one binary run side by side, so a change waits for them.
struct Users {
    threads: Vec<ThreadId>,
    changing: Option<ThreadId>,
}

static USERS: (Mutex<Users>, Condvar) = (
    Mutex::new(Users {
        threads: Vec::new(),
        changing: None,
    }),
    Condvar::new(),
);

fn users() -> MutexGuard<'static, Users> {
    USERS.0.lock().unwrap_or_else(PoisonError::into_inner)
}

fn wait(guard: MutexGuard<'static, Users>) -> MutexGuard<'static, Users> {
    USERS.1.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// Its thread's use of the cluster, ended with the thread.
struct Using(ThreadId);

impl Drop for Using {
    fn drop(&mut self) {
        users().threads.retain(|thread| *thread != self.0);
        USERS.1.notify_all();
    }
}

thread_local! {
    static USING: OnceCell<Using> = const { OnceCell::new() };
}

/// Counts this thread as using the cluster, once no other thread is changing a CRD. A
/// thread counted already goes on (a change waits for it to end; waiting here for the
/// change would wait for ever).
fn enter() {
    let me = std::thread::current().id();
    let mut users = users();
    while users.changing.is_some_and(|thread| thread != me) && !users.threads.contains(&me) {
        users = wait(users);
    }
    if !users.threads.contains(&me) {
        users.threads.push(me);
        drop(users);
        USING.with(|using| {
            let _ = using.set(Using(me));
        });
    }
}

/// Runs `change` (a change of a CRD's schema, put back before it returns) while no other
/// thread of this process uses the cluster (so before the test's own tasks ask for it);
/// tests asking for it meanwhile wait.
pub fn with_crd_change<T>(change: impl FnOnce() -> T) -> T {
    struct Done {
        me: ThreadId,
        was_using: bool,
    }
    impl Drop for Done {
        fn drop(&mut self) {
            let mut users = users();
            users.changing = None;
            if self.was_using && !users.threads.contains(&self.me) {
                users.threads.push(self.me);
            }
            USERS.1.notify_all();
        }
    }
    let me = std::thread::current().id();
    let mut users = users();
    // While it waits for another change, this thread does not hold the cluster (two tests
    // changing CRDs would otherwise wait for each other for ever); it holds it again after.
    let was_using = users.threads.contains(&me);
    users.threads.retain(|thread| *thread != me);
    USERS.1.notify_all();
    while users.changing.is_some() {
        users = wait(users);
    }
    users.changing = Some(me);
    let _done = Done { me, was_using };
    while users.threads.iter().any(|thread| *thread != me) {
        users = wait(users);
    }
    drop(users);
    change()
}

/// `scripts/testenv up DIR`, stopped when this process exits; `gpu_nodes` 8-GPU nodes
/// (default 12).
fn testenv_up(dir: &Path, gpu_nodes: Option<u32>) {
    let mut command = Command::new(Path::new(ROOT).join("scripts/testenv"));
    command
        .arg("up")
        .arg(dir)
        .args(["--owner-pid", &std::process::id().to_string()])
        .stdout(Stdio::null());
    if let Some(n) = gpu_nodes {
        command.env("GPU_REAPER_TESTENV_GPU_NODES", n.to_string());
    }
    let out = command
        .output()
        .expect("scripts/testenv runs (needs bash, Go, openssl, curl)");
    assert!(
        out.status.success(),
        "scripts/testenv up {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a command printed, and whether it succeeded.
#[derive(Debug)]
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(out: Output) -> Self {
        Run {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Cluster {
    /// A tool built with the control plane: kubectl, helm, kwok, prometheus3, kueue.
    pub fn bin(&self, tool: &str) -> PathBuf {
        self.dir.join("bin").join(tool)
    }

    /// `kubectl` against this cluster (the pinned build, cluster-admin).
    pub fn kubectl_command(&self) -> Command {
        let mut command = Command::new(self.bin("kubectl"));
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("kubectl-cache"));
        command
    }

    /// Runs kubectl with `stdin`; its output whatever the outcome.
    pub fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Run {
        run_with_stdin(self.kubectl_command().args(args), stdin)
    }

    /// Runs kubectl and requires success; its stdout.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let run = self.try_kubectl(args, stdin);
        assert!(run.ok, "kubectl {args:?} failed: {}", run.stderr);
        run.stdout
    }

    /// `kubectl apply -f -` of a YAML or JSON document.
    pub fn apply(&self, document: &str) -> String {
        self.kubectl(&["apply", "-f", "-"], Some(document))
    }

    /// An object as JSON (`kubectl get -o json`), or None when it does not exist.
    pub fn get(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<serde_json::Value> {
        let mut args = vec!["get", kind, name, "-o", "json"];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        let run = self.try_kubectl(&args, None);
        if !run.ok {
            assert!(
                run.stderr.contains("NotFound") || run.stderr.contains("not found"),
                "kubectl {args:?}: {}",
                run.stderr
            );
            return None;
        }
        Some(serde_json::from_str(&run.stdout).expect("kubectl prints JSON"))
    }

    /// Objects of `kind` in `namespace` (`kubectl get -o json`), optionally by label.
    pub fn list(
        &self,
        kind: &str,
        namespace: &str,
        selector: Option<&str>,
    ) -> Vec<serde_json::Value> {
        let mut args = vec!["get", kind, "-n", namespace, "-o", "json"];
        if let Some(s) = selector {
            args.extend(["-l", s]);
        }
        let out = self.kubectl(&args, None);
        let list: serde_json::Value = serde_json::from_str(&out).expect("kubectl prints JSON");
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// A new namespace `{prefix}-{n}` with `labels`, ready for pods (its default service
    /// account exists). Each test works in namespaces of its own.
    pub fn namespace(&self, prefix: &str, labels: &[(&str, &str)]) -> String {
        let name = format!("{prefix}-{}", unique());
        let mut doc =
            format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n");
        doc.push_str(&format!("    gpureaper.io/test: {prefix}\n"));
        for (k, v) in labels {
            doc.push_str(&format!("    {k}: \"{v}\"\n"));
        }
        self.apply(&doc);
        wait_until(&format!("the default service account of {name}"), || {
            self.try_kubectl(&["get", "serviceaccount", "default", "-n", &name], None)
                .ok
        });
        name
    }

    /// The project's CRDs, applied once per cluster (server-side, so re-applying them from
    /// several test binaries is harmless) and established.
    pub fn install_crds(&self) {
        static DONE: OnceLock<()> = OnceLock::new();
        DONE.get_or_init(|| {
            let crds = Path::new(ROOT).join("crds/gpu-reaper.yaml");
            self.kubectl(
                &[
                    "apply",
                    "--server-side",
                    "--force-conflicts",
                    "-f",
                    crds.to_str().unwrap(),
                ],
                None,
            );
            self.wait_established(&[
                "gpupolicies.gpureaper.io",
                "readinessattestations.gpureaper.io",
            ]);
            // The OpenAPI document (what `kubectl explain` and server-side apply read) is
            // published a moment after the CRD is Established.
            for kind in ["gpupolicy", "readinessattestation"] {
                wait_until(&format!("the OpenAPI schema of {kind}"), || {
                    self.try_kubectl(&["explain", &format!("{kind}.spec")], None)
                        .ok
                });
            }
        });
    }

    /// Waits until every CRD of `names` is Established. Polls the condition itself:
    /// `kubectl wait --for=condition=Established` fails at once ("<nil> is of the type
    /// <nil>") while the CRD's status is not yet written, which a loaded machine shows.
    pub fn wait_established(&self, names: &[&str]) {
        for name in names {
            wait_until(&format!("crd/{name} to be Established"), || {
                self.try_kubectl(
                    &[
                        "get",
                        "crd",
                        name,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
                    ],
                    None,
                )
                .stdout
                .trim()
                    == "True"
            });
        }
    }

    /// A kube::Client for this cluster (cluster-admin).
    pub async fn client(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// Pods of `namespace` with `selector` that are Running, once there are `count`.
    pub fn running_pods(
        &self,
        namespace: &str,
        selector: &str,
        count: usize,
    ) -> Vec<serde_json::Value> {
        let mut pods = Vec::new();
        wait_until(
            &format!("{count} running pods {selector} in {namespace}"),
            || {
                pods = self
                    .list("pods", namespace, Some(selector))
                    .into_iter()
                    .filter(|p| {
                        p["status"]["phase"] == "Running"
                            && p["metadata"]["deletionTimestamp"].is_null()
                    })
                    .collect();
                pods.len() == count
            },
        );
        pods
    }
}

/// Runs `command` with `stdin` (or none).
pub fn run_with_stdin(command: &mut Command, stdin: Option<&str>) -> Run {
    use std::io::Write;
    let mut child = command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{command:?} runs: {e}"));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap().into()
}

/// A short name part unique within this test run.
pub fn unique() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}{}",
        std::process::id() % 100_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// How long a test waits for the cluster to get somewhere (a safety net for a hung run,
/// never a timing claim: the machines are shared and slow).
pub const PATIENCE: Duration = Duration::from_secs(120);

/// Polls `done` until it holds; fails the test naming `what` after [`PATIENCE`].
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A control plane of a test's own, not the run's shared one: for a test that stops and
/// restarts its parts (kube-apiserver, etcd). `scripts/testenv up` in a temporary
/// directory with `gpu_nodes` 8-GPU nodes; stopped when dropped (and when the test
/// process exits).
pub struct OwnCluster {
    pub cluster: Cluster,
}

impl OwnCluster {
    pub fn up(name: &str, gpu_nodes: u32) -> OwnCluster {
        let dir = std::env::temp_dir().join(format!("gpu-reaper-{name}-{}", std::process::id()));
        testenv_up(&dir, Some(gpu_nodes));
        OwnCluster {
            cluster: Cluster {
                kubeconfig: dir.join("kubeconfig"),
                dir,
            },
        }
    }

    /// `scripts/testenv restart DIR COMPONENT SECONDS`: stops one part of the control
    /// plane, leaves it down `seconds`, starts it again (and, for kube-apiserver, waits
    /// until it is ready).
    pub fn restart(&self, component: &str, seconds: u32) {
        let out = Command::new(Path::new(ROOT).join("scripts/testenv"))
            .arg("restart")
            .arg(&self.cluster.dir)
            .args([component, &seconds.to_string()])
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/testenv restart {component}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = Command::new(Path::new(ROOT).join("scripts/testenv"))
            .arg("down")
            .arg(&self.cluster.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.cluster.dir);
    }
}
