//! Load harness for the budget-gate webhook: `/validate` over TLS on loopback at fixed
//! request rates (open loop: latency is measured from when a request was due, so a
//! stalled server cannot hide its queue), then the saturation throughput (closed loop),
//! and the memory of a snapshot with 10,000 attestations.
//!
//! ```sh
//! cargo run --release --example webhook_load              # default: 500..4000 req/s
//! cargo run --release --example webhook_load -- 2000 10   # one rate, 10 s
//! ```
//!
//! The server and the load generator share the machine: on 2 cores the figures are
//! pessimistic for the server. Results go in docs/performance.md.

#[path = "../benches/support/admission_load.rs"]
mod admission_load;

use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_load::{ATTESTATIONS, review, snapshot};
use axum::body::Bytes;
use gpu_reaper::admission::Settings;
use gpu_reaper::admission::metrics::Metrics;
use gpu_reaper::admission::server::{self, AppState, CertReloader, SnapshotCell};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

const CONNECTIONS: usize = 8;

// The allocator the binary uses (src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(port: u16, connector: &tokio_rustls::TlsConnector) -> Sender {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    tcp.set_nodelay(true).unwrap();
    let tls = connector
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn post(sender: &mut Sender, body: Bytes) {
    sender.ready().await.unwrap();
    let request = hyper::Request::post("/validate")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert!(
        bytes.windows(14).any(|w| w == b"\"allowed\":true"),
        "{bytes:?}"
    );
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

/// Open loop at `rate` req/s for `seconds`; sorted latencies in µs measured from the send
/// and from the due time (the latter includes queueing behind a slow answer, and the
/// timer's up-to-1-ms lateness in waking the sender).
async fn fixed_rate(
    port: u16,
    connector: &tokio_rustls::TlsConnector,
    bodies: &Arc<Vec<Bytes>>,
    rate: f64,
    seconds: f64,
) -> (Vec<u64>, Vec<u64>) {
    let per_connection = rate / CONNECTIONS as f64;
    let interval = Duration::from_secs_f64(1.0 / per_connection);
    let total = (per_connection * seconds) as usize;
    let mut tasks = Vec::new();
    for c in 0..CONNECTIONS {
        let mut sender = connect(port, connector).await;
        let bodies = bodies.clone();
        tasks.push(tokio::spawn(async move {
            let start = Instant::now()
                + Duration::from_millis(50)
                + interval.mul_f64(c as f64 / CONNECTIONS as f64);
            let mut latencies = Vec::with_capacity(total);
            for k in 0..total {
                let due = start + interval * k as u32;
                tokio::time::sleep_until(due.into()).await;
                let sent = Instant::now();
                post(&mut sender, bodies[(c * total + k) % bodies.len()].clone()).await;
                latencies.push((
                    sent.elapsed().as_micros() as u64,
                    due.elapsed().as_micros() as u64,
                ));
            }
            latencies
        }));
    }
    let (mut sent, mut due) = (Vec::new(), Vec::new());
    for t in tasks {
        for (s, d) in t.await.unwrap() {
            sent.push(s);
            due.push(d);
        }
    }
    sent.sort_unstable();
    due.sort_unstable();
    (sent, due)
}

/// Closed loop on `connections` connections for `seconds`: requests per second.
async fn saturation(
    port: u16,
    connector: &tokio_rustls::TlsConnector,
    bodies: &Arc<Vec<Bytes>>,
    connections: usize,
    seconds: f64,
) -> f64 {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let mut sender = connect(port, connector).await;
        let bodies = bodies.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0usize;
            while Instant::now() < deadline {
                post(&mut sender, bodies[(c * 7919 + n) % bodies.len()].clone()).await;
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / seconds
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rates: Vec<f64> = match args.first() {
        Some(r) => vec![r.parse().expect("rate in req/s")],
        None => vec![500.0, 1000.0, 2000.0, 4000.0],
    };
    let seconds: f64 = args.get(1).map_or(5.0, |s| s.parse().expect("seconds"));

    let before = rss_kib();
    let snapshot = snapshot();
    let after = rss_kib();
    println!(
        "snapshot: {} attestations in {} namespaces: RSS +{:.1} MiB (process {:.1} MiB)",
        snapshot.attestation_count(),
        snapshot.namespaces.len(),
        (after.saturating_sub(before)) as f64 / 1024.0,
        after as f64 / 1024.0
    );

    // A throw-away certificate for 127.0.0.1.
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("tls.key"), key.serialize_pem()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let certs = Arc::new(CertReloader::load(&dir.path().join("tls.crt"), &dir.path().join("tls.key")).unwrap());
        let tls = server::tls_config(certs).unwrap();
        let app = server::router(AppState {
            snapshot: Arc::new(SnapshotCell::ready(snapshot)),
            settings: Arc::new(Settings::default()),
            metrics: Arc::new(Metrics::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(server::serve_tls(listener, tls, app, std::future::pending()));
        let bodies = Arc::new((0..ATTESTATIONS).map(review).collect::<Vec<_>>());
        // Warm up connections and caches.
        fixed_rate(port, &connector, &bodies, 400.0, 1.0).await;
        println!(
            "machine: {} cores ({}); {CONNECTIONS} keep-alive TLS connections; request = 16-GPU Job covered by one of {ATTESTATIONS} attestations",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|c| c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())).unwrap_or_default(),
        );
        println!("| rate (req/s) | requests | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) | p99 from due time (ms) |");
        println!("|---:|---:|---:|---:|---:|---:|---:|");
        for rate in rates {
            let (l, due) = fixed_rate(port, &connector, &bodies, rate, seconds).await;
            println!(
                "| {rate:.0} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
                l.len(),
                percentile(&l, 0.50),
                percentile(&l, 0.90),
                percentile(&l, 0.99),
                percentile(&l, 1.0),
                percentile(&due, 0.99)
            );
        }
        let throughput = saturation(port, &connector, &bodies, 16, seconds).await;
        println!("saturation (16 connections, closed loop): {throughput:.0} req/s");
        println!("process RSS after load: {:.1} MiB", rss_kib() as f64 / 1024.0);
    });
}
