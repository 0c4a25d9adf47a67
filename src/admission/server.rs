//! The HTTPS edge of the budget gate: a thin axum handler around the pure `admit`, served
//! over rustls with a certificate reloaded from its files when they change.
//!
//! Routes: `POST /validate` (AdmissionReview v1), `GET /healthz` (the process serves),
//! `GET /readyz` (caches synced), `GET /metrics` (OpenMetrics text).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;

use super::metrics::{Metrics, ResultLabels};
use super::review::{self, AdmissionResponse, ResponseStatus};
use super::{Settings, Verdict, admit};

pub use super::cache::SnapshotCell;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub snapshot: Arc<SnapshotCell>,
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
}

/// The webhook's routes, served over TLS: `/validate`, `/mutate` and the probes.
pub fn router(state: AppState) -> Router {
    let reviews = Router::new()
        .route("/validate", post(validate))
        .route("/mutate", post(mutate))
        // axum's limit would answer 413 before the handler, and the API server applies the
        // failurePolicy to a 413: under Ignore, a padded object would be admitted. The
        // handlers read the body themselves ([`read_body`]) and refuse what is larger.
        .layer(DefaultBodyLimit::disable())
        .with_state(state.clone());
    probe_router(state).merge(reviews)
}

/// The routes of the plain-HTTP probe port: `/healthz`, `/readyz` (caches synced),
/// `/metrics` ([`crate::admin`]). Never `/validate`: any pod could ask it for decisions,
/// and nothing there is authenticated.
pub fn probe_router(state: AppState) -> Router {
    let snapshot = state.snapshot.clone();
    let metrics = state.metrics.clone();
    crate::admin::router(
        Arc::new(move || match snapshot.get() {
            Some(_) => Ok(()),
            None => Err("caches not synced\n"),
        }),
        Arc::new(move || crate::admin::openmetrics(metrics.encode())),
    )
}

/// Largest AdmissionReview read. The API server refuses requests over 3 MiB and etcd
/// objects over 1.5 MiB; a review of an UPDATE carries the object twice, in JSON, which
/// can be larger than the stored form — and the API server escapes `<`, `>` and `&` as
/// six bytes each on the way, so a review can be several times the object. Reviews up to
/// 8 MiB are read and decided; a larger one is refused (its uid read from its start),
/// never answered with an error the failurePolicy would turn into an allow.
pub const MAX_BODY: usize = 8 << 20;

/// JSON nesting the reader follows (serde_json's own limit).
const MAX_DEPTH: usize = 127;

/// The body, or its first [`MAX_BODY`] bytes and `false` when it is larger.
async fn read_body(body: Body) -> (Bytes, bool) {
    use futures::StreamExt as _;
    let mut stream = body.into_data_stream();
    let mut read = Vec::new();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            break;
        };
        if read.len() + chunk.len() > MAX_BODY {
            let room = MAX_BODY - read.len();
            read.extend_from_slice(&chunk[..room]);
            return (Bytes::from(read), false);
        }
        read.extend_from_slice(&chunk);
    }
    (Bytes::from(read), true)
}

/// The answer to a review that could not be read: a refusal naming why, when its uid can
/// be found (fail closed: the budget gate does not admit what it cannot check); a 400
/// only when there is no uid to answer to.
fn unreadable(state: &AppState, body: &[u8], why: String, path: &str) -> Response {
    state.metrics.malformed.inc();
    let Some(uid) = review::recover_uid(body) else {
        tracing::warn!(error = %why, path, "malformed admission request");
        return (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response();
    };
    tracing::warn!(uid = %uid, error = %why, path, "unreadable admission request: refused");
    let response = AdmissionResponse {
        uid,
        allowed: false,
        status: Some(ResponseStatus {
            code: 403,
            reason: "Forbidden".into(),
            message: format!(
                "gpu-reaper's budget gate could not read this request ({why}) and refuses what it cannot check; write the object without it (a GPU workload needs neither), or ask the platform team to exempt the namespace (docs/budget-gate.md)"
            ),
        }),
        warnings: Vec::new(),
        patch_type: None,
        patch: None,
    };
    (
        [(header::CONTENT_TYPE, "application/json")],
        review::response_body(&response),
    )
        .into_response()
}

/// Why a review that did not parse could not be read, in words for the denial.
fn why_unreadable(body: &[u8], error: &review::ReviewError) -> String {
    if review::nested_deeper_than(body, MAX_DEPTH) {
        format!("it nests deeper than the {MAX_DEPTH} levels gpu-reaper reads")
    } else {
        error.to_string()
    }
}

async fn validate(State(state): State<AppState>, body: Body) -> Response {
    let started = Instant::now();
    let (body, whole) = read_body(body).await;
    if !whole {
        let why = format!(
            "the review is larger than the {} MiB gpu-reaper reads",
            MAX_BODY >> 20
        );
        return unreadable(&state, &body, why, "/validate");
    }
    let request = match review::parse(&body) {
        Ok(r) => r,
        Err(e) => return unreadable(&state, &body, why_unreadable(&body, &e), "/validate"),
    };
    let Some(snapshot) = state.snapshot.get() else {
        state.metrics.not_ready.inc();
        tracing::warn!(uid = %request.uid, "admission request before caches synced: 503, the API server applies the webhook's failurePolicy");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "gpu-reaper budget gate: caches not synced yet\n",
        )
            .into_response();
    };
    let decision = admit(&request, &snapshot, &state.settings, jiff::Timestamp::now());
    let allowed = decision.allowed();
    let response = AdmissionResponse {
        uid: request.uid.clone(),
        allowed,
        status: (!allowed).then(|| ResponseStatus {
            code: 403,
            reason: "Forbidden".into(),
            message: decision.message.clone().unwrap_or_default(),
        }),
        warnings: decision.all_warnings(),
        patch_type: None,
        patch: None,
    };
    let body = review::response_body(&response);
    state.metrics.decided(
        decision.verdict,
        decision.reason,
        started.elapsed().as_secs_f64(),
    );
    let gpus = decision.gpus.map(|g| g.to_string());
    let log = || {
        tracing::info!(
            uid = %request.uid,
            operation = ?request.operation,
            namespace = %request.namespace,
            kind = %request.kind.kind,
            name = %request.name,
            user = %request.user_info.username,
            gpus = gpus.as_deref().unwrap_or("-"),
            policy = decision.policy.as_deref().unwrap_or("-"),
            attestation = decision.attestation.as_deref().unwrap_or("-"),
            verdict = decision.verdict.as_str(),
            reason = decision.reason.as_str(),
            detail = decision.message.as_deref().unwrap_or(""),
            "admission decision"
        )
    };
    if decision.verdict == Verdict::Allow && decision.gpus.is_none() {
        // Writes that claim no GPUs are most of the traffic: keep them at debug.
        if tracing::enabled!(tracing::Level::DEBUG) {
            log();
        }
    } else {
        log();
    }
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The mutating webhook: records who changed a ReadinessAttestation's spec (G5). Needs no
/// cache, so it answers before the caches sync; it never refuses a write it can read (the
/// validating webhook does), and refuses one it cannot.
async fn mutate(State(state): State<AppState>, body: Body) -> Response {
    use base64::Engine as _;
    let (body, whole) = read_body(body).await;
    if !whole {
        let why = format!(
            "the review is larger than the {} MiB gpu-reaper reads",
            MAX_BODY >> 20
        );
        return unreadable(&state, &body, why, "/mutate");
    }
    let request = match review::parse(&body) {
        Ok(r) => r,
        Err(e) => return unreadable(&state, &body, why_unreadable(&body, &e), "/mutate"),
    };
    let patch = super::attestation::mutate(&request).map(|ops| {
        base64::engine::general_purpose::STANDARD
            .encode(serde_json::to_vec(&ops).unwrap_or_default())
    });
    let response = AdmissionResponse {
        uid: request.uid.clone(),
        allowed: true,
        status: None,
        warnings: Vec::new(),
        patch_type: patch.as_ref().map(|_| "JSONPatch".to_string()),
        patch,
    };
    (
        [(header::CONTENT_TYPE, "application/json")],
        review::response_body(&response),
    )
        .into_response()
}

/// The serving certificate, re-read from its files when they change (Secret rotation,
/// cert-manager renewal) so new connections get the new one without a restart. A pair
/// that does not load (e.g. the certificate written, the key not yet) keeps the old one.
pub struct CertReloader {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<(Vec<u8>, Arc<CertifiedKey>)>,
}

impl std::fmt::Debug for CertReloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertReloader")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish()
    }
}

/// Why the serving certificate could not be loaded: each names the file, and keeps the
/// error underneath as its source.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot read {what} {}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a PEM certificate chain", path.display())]
    NotPemChain {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{}: no CERTIFICATE block found", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: not a PEM private key", path.display())]
    NotPemKey {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{} and {} do not form a usable pair", cert.display(), key.display())]
    NotAPair {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("the TLS settings were refused")]
    Config(#[source] rustls::Error),
    #[error("the certificate in use could not be locked (a reload panicked)")]
    Poisoned,
}

fn load_pair(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, CertifiedKey), CertError> {
    let read = |what, path: &Path| {
        std::fs::read(path).map_err(|source| CertError::Read {
            what,
            path: path.to_path_buf(),
            source,
        })
    };
    let cert_pem = read("certificate", cert_path)?;
    let key_pem = read("key", key_path)?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| CertError::NotPemChain {
            path: cert_path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(CertError::NoCertificate {
            path: cert_path.to_path_buf(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| CertError::NotPemKey {
        path: key_path.to_path_buf(),
        source,
    })?;
    let provider = rustls::crypto::ring::default_provider();
    let certified =
        CertifiedKey::from_der(certs, key, &provider).map_err(|source| CertError::NotAPair {
            cert: cert_path.to_path_buf(),
            key: key_path.to_path_buf(),
            source,
        })?;
    let mut fingerprint = cert_pem;
    fingerprint.extend_from_slice(&key_pem);
    Ok((fingerprint, certified))
}

impl CertReloader {
    /// Loads the pair once; an error names the file and what is wrong with it.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, CertError> {
        let (fingerprint, key) = load_pair(cert_path, key_path)?;
        Ok(Self {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            current: RwLock::new((fingerprint, Arc::new(key))),
        })
    }

    /// Re-reads the files; `Ok(true)` when a new pair was installed.
    pub fn reload(&self) -> Result<bool, CertError> {
        let (fingerprint, key) = load_pair(&self.cert_path, &self.key_path)?;
        let mut current = self.current.write().map_err(|_| CertError::Poisoned)?;
        if current.0 == fingerprint {
            return Ok(false);
        }
        *current = (fingerprint, Arc::new(key));
        Ok(true)
    }

    /// Polls the files every `every` until the process ends.
    pub async fn watch(self: Arc<Self>, every: Duration, metrics: Arc<Metrics>) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let this = self.clone();
            let result = tokio::task::spawn_blocking(move || this.reload()).await;
            match result {
                Ok(Ok(true)) => {
                    metrics
                        .tls_reloads
                        .get_or_create(&ResultLabels { result: "ok" })
                        .inc();
                    tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    metrics
                        .tls_reloads
                        .get_or_create(&ResultLabels { result: "error" })
                        .inc();
                    tracing::warn!(error = %crate::error::chain(&e), "serving certificate not reloaded; still serving the previous one");
                }
                Err(e) => tracing::warn!(error = %e, "certificate reload task failed"),
            }
        }
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.1.clone())
    }
}

/// A rustls server config that serves whatever `certs` holds, HTTP/1.1 only.
pub fn tls_config(certs: Arc<CertReloader>) -> Result<Arc<rustls::ServerConfig>, CertError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(CertError::Config)?
        .with_no_client_auth()
        .with_cert_resolver(certs);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `app` over TLS on `listener` until `shutdown` completes. A failed handshake or a
/// broken connection affects only that connection.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
            let service = TowerToHyperService::new(app);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(tls), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_wrong_certificate_names_the_file_and_keeps_the_cause() {
        let dir = std::env::temp_dir().join(format!("gpu-reaper-cert-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let e = CertReloader::load(&cert, &key).unwrap_err();
        assert!(
            matches!(
                e,
                CertError::Read {
                    what: "certificate",
                    ..
                }
            ),
            "{e:?}"
        );
        let io = std::error::Error::source(&e)
            .expect("the io error is kept")
            .to_string();
        let shown = crate::Error::from(e).to_string();
        assert!(
            shown.contains(&cert.display().to_string()) && shown.contains(&io),
            "{shown}"
        );
        std::fs::write(&cert, "not pem").unwrap();
        std::fs::write(&key, "not pem").unwrap();
        let e = CertReloader::load(&cert, &key).unwrap_err();
        assert!(matches!(e, CertError::NoCertificate { .. }), "{e:?}");
        assert_eq!(crate::Error::from(e).exit_code(), 2, "the user's fix");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
