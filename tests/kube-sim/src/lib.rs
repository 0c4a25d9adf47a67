//! kube-sim: an in-memory Kubernetes API server for gpu-reaper's tests (issue 3).
//!
//! It speaks the real wire protocol over HTTP(S) so that `kube::Client`, kube-runtime's
//! watchers and controllers, and kubectl all run against it unchanged. Start one with
//! [`KubeSim::start`]; see `docs/kube-sim.md` for what is implemented, approximated and
//! left out.
//!
//! Rooms: `store` (objects, resourceVersions, history, GC), `resources` (types,
//! discovery, OpenAPI stubs), `http` (connections, routing, content negotiation),
//! `read` and `write` (the verbs), `eviction` (PDB checks), `watch` (streams), `patch`
//! and `fields` (patches, managedFields, server-side apply), `objects` (metadata rules),
//! `selectors`, `table` (server-side printing), `admission` (validating webhooks),
//! `faults` (fault injection), `tls` (certificates, kubeconfig), `status` (errors).

pub mod admission;
pub mod eviction;
pub mod faults;
pub mod fields;
pub mod http;
pub mod objects;
pub mod patch;
pub mod protobuf;
pub mod rbac;
pub mod read;
pub mod resources;
pub mod schema;
pub mod selectors;
pub mod status;
pub mod store;
pub mod table;
pub mod tls;
pub mod watch;
pub mod write;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

pub use faults::Fault;
pub use status::ApiError;

/// Tunables of a simulated server.
#[derive(Debug, Clone)]
pub struct Options {
    /// Port to listen on (0: an ephemeral port).
    pub port: u16,
    /// Serve HTTPS (the default) or plain HTTP.
    pub tls: bool,
    /// How many past events a watch can resume from before it gets 410 Gone.
    pub history_limit: usize,
    /// Events buffered per watcher before a slow watcher is cut off.
    pub watch_buffer: usize,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
    /// Listen on all interfaces instead of loopback.
    pub public: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            port: 0,
            tls: true,
            history_limit: 10_000,
            watch_buffer: 100_000,
            bookmark_interval: Duration::from_secs(5),
            public: false,
        }
    }
}

/// Server-wide settings read by the request handlers.
#[derive(Debug, Clone)]
pub struct Config {
    pub bookmark_interval: Duration,
    /// Print every request to stderr (`KUBE_SIM_TRACE=1`).
    pub trace: bool,
}

/// State shared by all connections.
pub struct Shared {
    pub store: store::Store,
    pub faults: faults::Faults,
    pub config: Config,
    /// Where webhook `clientConfig.service` references are sent: (namespace, name) → base URL.
    pub service_routes: Mutex<HashMap<(String, String), String>>,
    /// Requests made by service accounts, in order (see [`rbac`]).
    pub accesses: Mutex<Vec<rbac::Access>>,
}

/// A running kube-sim; stops when dropped.
pub struct KubeSim {
    shared: Arc<Shared>,
    addr: SocketAddr,
    url: String,
    ca_pem: Option<String>,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    shutdown: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl KubeSim {
    /// Starts an HTTPS server on an ephemeral loopback port, in this tokio runtime.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> std::io::Result<Self> {
        // One provider for the whole process; ignore "already installed".
        let _ = rustls::crypto::ring::default_provider().install_default();
        let host = if options.public {
            "0.0.0.0"
        } else {
            "127.0.0.1"
        };
        let listener = tokio::net::TcpListener::bind((host, options.port)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            store: store::Store::new(options.history_limit, options.watch_buffer),
            faults: faults::Faults::default(),
            config: Config {
                bookmark_interval: options.bookmark_interval,
                trace: std::env::var_os("KUBE_SIM_TRACE").is_some(),
            },
            service_routes: Mutex::new(HashMap::new()),
            accesses: Mutex::new(Vec::new()),
        });
        let (tls_config, ca_pem, url) = if options.tls {
            let pki =
                tls::Pki::generate(&["localhost", "127.0.0.1"]).map_err(std::io::Error::other)?;
            let config = pki.server_config().map_err(std::io::Error::other)?;
            (
                Some(config),
                Some(pki.ca_pem.clone()),
                format!("https://127.0.0.1:{}", addr.port()),
            )
        } else {
            (None, None, format!("http://127.0.0.1:{}", addr.port()))
        };
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&url, ca_pem.as_deref()))?;
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(http::serve(
            listener,
            tls_config,
            shared.clone(),
            shutdown_rx,
        ));
        Ok(Self {
            shared,
            addr,
            url,
            ca_pem,
            _dir: dir,
            kubeconfig,
            shutdown,
            task,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// PEM of the CA that signed the serving certificate (HTTPS only).
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// A kubeconfig file (CA embedded) for kubectl's `--kubeconfig`.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Writes the kubeconfig to another path as well (the binary's `--kubeconfig-out`).
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, kubeconfig_yaml(&self.url, self.ca_pem.as_deref()))
    }

    /// A `kube::Client` that trusts this server.
    pub async fn client(&self) -> Result<kube::Client, BoxError> {
        Ok(kube::Client::try_from(self.config().await?)?)
    }

    /// The `kube::Config` behind [`KubeSim::client`], to adjust before building a
    /// client (e.g. `default_retry = false` to see 429s and 504s instead of retries).
    pub async fn config(&self) -> Result<kube::Config, BoxError> {
        let yaml = kubeconfig_yaml(&self.url, self.ca_pem.as_deref());
        config_from_kubeconfig_yaml(&yaml).await
    }

    /// Stores an object directly (no admission), keeping its `status` and a given
    /// `metadata.creationTimestamp`, creating its
    /// namespace when missing. Types come from `apiVersion` + `kind`, so seed a CRD
    /// before its custom objects. Returns the stored object.
    pub fn seed(&self, object: impl Serialize) -> Result<Value, ApiError> {
        let object =
            serde_json::to_value(object).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let api_version = object["apiVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), api_version.clone()),
        };
        let mut state = self.shared.store.lock();
        let t = state
            .types()
            .iter()
            .find(|t| t.group == group && t.kind == kind && t.versions.contains(&version))
            .cloned()
            .ok_or_else(|| {
                ApiError::new(404, "NotFound", format!("no type {kind} in {api_version}"))
            })?;
        let namespace = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let now = store::now_rfc3339();
        let ctx = objects::WriteCtx {
            t: &t,
            version: &version,
            manager: "kube-sim-seed",
            subresource: None,
            now: &now,
        };
        let status = object.get("status").cloned();
        let created = object.pointer("/metadata/creationTimestamp").cloned();
        let mut prepared = objects::prepare_create(&ctx, object, Some(&namespace), true)?;
        if let Some(status) = status {
            prepared["status"] = status;
        }
        // A seeded object may have existed for hours (what a scale run or an age check
        // needs); the API itself always stamps the time of creation.
        if let Some(created) = created.filter(Value::is_string) {
            prepared["metadata"]["creationTimestamp"] = created;
        }
        if t.namespaced && state.get("", "namespaces", "", &namespace).is_none() {
            let ns_type = state
                .find_type("", "namespaces")
                .cloned()
                .ok_or_else(|| ApiError::internal("no namespaces"))?;
            let ns_ctx = objects::WriteCtx {
                t: &ns_type,
                version: "v1",
                manager: "kube-sim-seed",
                subresource: None,
                now: &now,
            };
            let ns = objects::prepare_create(
                &ns_ctx,
                json!({"metadata": {"name": namespace}}),
                None,
                true,
            )?;
            state.insert(&ns_type, ns)?;
        }
        state.insert(&t, prepared)
    }

    /// Reads an object as stored (`group` is `""` for core; `namespace` `""` for
    /// cluster-scoped types).
    pub fn get(&self, group: &str, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .store
            .lock()
            .get(group, plural, namespace, name)
            .cloned()
    }

    /// All stored objects of a type, in `namespace` when given.
    pub fn list(&self, group: &str, plural: &str, namespace: Option<&str>) -> Vec<Value> {
        self.shared
            .store
            .lock()
            .list(group, plural, namespace, None)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Waits until the object satisfies `condition` (called with `None` while it does
    /// not exist) in its current state or any later one, driven by the store's change
    /// feed rather than polling; `None` when
    /// `timeout` passes first. Returns the object as stored (or `Value::Null` if the
    /// condition held for an absent object).
    pub async fn wait_for(
        &self,
        (group, plural): (&str, &str),
        namespace: &str,
        name: &str,
        timeout: Duration,
        condition: impl Fn(Option<&Value>) -> bool,
    ) -> Option<Value> {
        let mut events = {
            let state = self.shared.store.lock();
            let current = state.get(group, plural, namespace, name);
            if condition(current) {
                return Some(current.cloned().unwrap_or(Value::Null));
            }
            state.subscribe()
        };
        let wait = async {
            loop {
                match events.recv().await {
                    Ok(event)
                        if event.group == group
                            && event.resource == plural
                            && event.namespace == namespace
                            && event.object["metadata"]["name"] == name =>
                    {
                        // Each state the object passes through is checked, not just the latest.
                        let state =
                            (event.kind != store::EventKind::Deleted).then_some(&*event.object);
                        if condition(state) {
                            return Some(state.cloned().unwrap_or(Value::Null));
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let current = self.get(group, plural, namespace, name);
                        if condition(current.as_ref()) {
                            return Some(current.unwrap_or(Value::Null));
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }

    /// The newest resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.lock().resource_version()
    }

    /// Forgets the event history: watches from any earlier resourceVersion get 410 Gone.
    pub fn compact(&self) {
        self.shared.store.lock().compact();
    }

    /// How many past events watches can resume from.
    pub fn set_history_limit(&self, events: usize) {
        self.shared.store.lock().set_history_limit(events);
    }

    /// Adds a fault rule (see [`Fault`]).
    pub fn add_fault(&self, fault: Fault) {
        self.shared.faults.add(fault);
    }

    /// How many requests each fault rule has hit, in the order they were added.
    pub fn fault_hits(&self) -> Vec<u64> {
        self.shared.faults.hits()
    }

    pub fn clear_faults(&self) {
        self.shared.faults.clear();
    }

    /// Breaks every open watch connection.
    pub fn drop_watches(&self) {
        self.shared.faults.drop_watches();
    }

    /// Every request made with a service-account token so far, allowed or refused by RBAC.
    pub fn accesses(&self) -> Vec<rbac::Access> {
        self.shared
            .accesses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sends webhooks configured with `clientConfig.service` {namespace, name} to
    /// `base_url` (an `https://host:port` URL), since there is no cluster DNS here.
    pub fn route_service(&self, namespace: &str, name: &str, base_url: &str) {
        self.shared
            .service_routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                (namespace.to_string(), name.to_string()),
                base_url.to_string(),
            );
    }

    /// Waits until a shutdown request (used by the binary).
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
    }
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.task.abort();
    }
}

/// Errors of the helpers that wrap other crates.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A `kube::Client` from kubeconfig text (also used for real clusters in tests).
pub async fn client_from_kubeconfig_yaml(yaml: &str) -> Result<kube::Client, BoxError> {
    Ok(kube::Client::try_from(
        config_from_kubeconfig_yaml(yaml).await?,
    )?)
}

async fn config_from_kubeconfig_yaml(yaml: &str) -> Result<kube::Config, BoxError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kubeconfig = kube::config::Kubeconfig::from_yaml(yaml)?;
    let options = kube::config::KubeConfigOptions::default();
    Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?)
}

fn kubeconfig_yaml(url: &str, ca_pem: Option<&str>) -> String {
    match ca_pem {
        Some(ca) => tls::kubeconfig(url, ca),
        None => format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-sim\n  cluster:\n    server: {url}\nusers:\n- name: kube-sim\n  user: {{}}\ncontexts:\n- name: kube-sim\n  context:\n    cluster: kube-sim\n    user: kube-sim\n    namespace: default\ncurrent-context: kube-sim\n"
        ),
    }
}
