//! Telemetry from the real Prometheus server (Debian package `prometheus`), backfilled
//! with `promtool tsdb create-blocks-from openmetrics`, and from misbehaving fakes.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_gpu-reaper");

use crate::common;

use common::{free_port, prometheus_with};

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("binary runs")
}

fn json_of(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

pub(crate) fn sample_trace_text() -> Vec<u8> {
    let gz = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/samples/trace.om.gz"
    ))
    .unwrap();
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut text)
        .unwrap();
    text
}

/// `backtest --format json` over the sample trace's 8 hours read from Prometheus at `url`.
fn backtest_sample_over(url: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "backtest",
        "--prometheus-url",
        url,
        "--from",
        "2026-11-02T00:00:00Z",
        "--to",
        "2026-11-02T08:00:00Z",
        "--format",
        "json",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn backtest_over_prometheus_history_equals_backtest_over_the_recorded_file() {
    // The sample trace covers idle notebooks, a busy 8-GPU job with seven idle GPUs, an
    // exporter gap, a GPU_UTIL-only T4, MIG instances and exported_* labels.
    let text = sample_trace_text();
    let prom = prometheus_with("sample", &text);
    let file = std::env::temp_dir().join(format!("gpu-reaper-sample-{}.om", std::process::id()));
    std::fs::write(&file, &text).unwrap();
    let from_file = json_of(&run(&[
        "backtest",
        "--trace",
        file.to_str().unwrap(),
        "--format",
        "json",
    ]));
    let from_prom = json_of(&backtest_sample_over(&prom.url, &[]));
    let _ = std::fs::remove_file(&file);
    assert_eq!(from_prom["summary"], from_file["summary"]);
    let (a, b) = (
        from_prom["workloads"].as_array().unwrap(),
        from_file["workloads"].as_array().unwrap(),
    );
    assert_eq!(a.len(), b.len());
    for (p, f) in a.iter().zip(b) {
        assert_eq!(p, f, "{} differs", f["name"]);
    }
    assert_eq!(from_prom["summary"]["workloads"], 26);
}

/// `export` writes exactly what `backtest --prometheus-url` reads: replayed with
/// `backtest --trace`, the file gives the very same report, and promtool backfills it.
#[test]
fn an_exported_trace_backtests_exactly_as_the_prometheus_it_came_from() {
    let prom = prometheus_with("export", &sample_trace_text());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("day.om.gz");
    let o = run(&[
        "export",
        "--prometheus-url",
        &prom.url,
        "--from",
        "2026-11-02T00:00:00Z",
        "--to",
        "2026-11-02T08:00:00Z",
        "--output",
        file.to_str().unwrap(),
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{e}");
    assert!(e.starts_with("exported ") && e.contains("day.om.gz"), "{e}");
    let gz = std::fs::read(&file).unwrap();
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip, as the name says");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no partial file left beside it"
    );

    let from_file = json_of(&run(&[
        "backtest",
        "--trace",
        file.to_str().unwrap(),
        "--format",
        "json",
    ]));
    let from_prom = json_of(&backtest_sample_over(&prom.url, &[]));
    assert_eq!(from_prom["summary"]["workloads"], 26);
    assert_eq!(from_file["summary"], from_prom["summary"]);
    for (f, p) in from_file["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .zip(from_prom["workloads"].as_array().unwrap())
    {
        assert_eq!(f, p, "{} differs", p["name"]);
    }
    assert_eq!(from_file, from_prom, "and the whole report");

    // The text is OpenMetrics promtool accepts, and plain on standard output.
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut text)
        .unwrap();
    assert!(text.ends_with(b"\n# EOF\n"));
    let plain = dir.path().join("day.om");
    std::fs::write(&plain, &text).unwrap();
    let promtool = std::env::var("GPU_REAPER_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let backfill = Command::new(promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&plain)
        .arg(dir.path().join("blocks"))
        .output()
        .unwrap();
    assert!(
        backfill.status.success(),
        "{}",
        String::from_utf8_lossy(&backfill.stderr)
    );
    let o = run(&[
        "export",
        "--prometheus-url",
        &prom.url,
        "--from",
        "2026-11-02T00:00:00Z",
        "--to",
        "2026-11-02T08:00:00Z",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, text, "standard output holds the same text");
}

/// DCGM series without kube-state-metrics (and, later, an exporter without its pod
/// mapping): export and backtest both say which series and labels are missing and what
/// to install, with exit code 2, instead of "0 workloads on 0 GPUs"; export writes
/// nothing.
#[test]
fn export_and_backtest_name_the_missing_kube_state_metrics_and_pod_labels() {
    let t0 = 1_793_577_600;
    let om = common::Dcgm::new(t0)
        .gpu("ml", "train-0", 0, "NVIDIA L4", 0..=59, |_| Some(0.0))
        .gpu(
            "gpu-operator",
            "nvidia-dcgm-exporter-abcde",
            0,
            "NVIDIA L4",
            120..=179,
            |_| Some(0.0),
        )
        .finish();
    let prom = prometheus_with("export-missing", &om);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.om");
    let range = |from_minute: i64| {
        let at = |m: i64| {
            jiff::Timestamp::from_second(t0 + m * 60)
                .unwrap()
                .to_string()
        };
        (at(from_minute), at(from_minute + 60))
    };
    let both = |from: &str, to: &str| {
        let export = run(&[
            "export",
            "--prometheus-url",
            &prom.url,
            "--from",
            from,
            "--to",
            to,
            "--output",
            file.to_str().unwrap(),
        ]);
        let backtest = run(&[
            "backtest",
            "--prometheus-url",
            &prom.url,
            "--from",
            from,
            "--to",
            to,
        ]);
        [export, backtest].map(|o| {
            assert_eq!(
                o.status.code(),
                Some(2),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(o.stdout.is_empty());
            String::from_utf8_lossy(&o.stderr).into_owned()
        })
    };

    let (from, to) = range(0);
    for e in both(&from, &to) {
        assert!(
            e.contains(&format!("{} between {from} and {to} lacks", prom.url)),
            "{e}"
        );
        assert!(
            e.contains(
                "no kube-state-metrics series (kube_pod_owner, kube_pod_container_resource_requests"
            ) && e.contains("install kube-state-metrics"),
            "{e}"
        );
        assert!(!e.contains("DCGM"), "the DCGM series are fine: {e}");
    }

    let (from, to) = range(120);
    for e in both(&from, &to) {
        assert!(
            e.contains("none of the 1 DCGM series names a workload's pod: 1 carry only the exporter's own pod (nvidia-dcgm-exporter-abcde)")
                && e.contains("--kubernetes"),
            "{e}"
        );
        assert!(e.contains("no kube-state-metrics series"), "{e}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "export wrote nothing"
    );
}

#[test]
fn audit_reports_idle_hours_by_shape_and_namespace_from_prometheus() {
    let prom = prometheus_with("audit", &sample_trace_text());
    // The trace is in the past: audit looks back from now, so ask for enough history.
    let since = hours_since_sample_start();
    let v = json_of(&run(&[
        "audit",
        "--prometheus-url",
        &prom.url,
        "--since",
        &since,
        "--format",
        "json",
    ]));
    let total = &v["total"];
    assert_eq!(total["workloads"], 26);
    let shapes = &total["idle_gpu_hours_by_shape"];
    for shape in ["MemoryHeld", "Unused", "Provisioning", "DataStarved"] {
        assert!(
            shapes[shape].as_f64().unwrap_or(0.0) > 0.0,
            "{shape} missing in {shapes}"
        );
    }
    // Audit never reclaims: the hung batch job is idle from 02:00 to the end (≈5.5 h × 2 GPUs).
    let top: Vec<&str> = v["top_offenders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert!(
        top.contains(&"nightly-embed-backfill") && top.contains(&"vllm-qwen2-72b"),
        "{top:?}"
    );
    assert!(
        !top.contains(&"llm-chat"),
        "busy workloads are no offenders: {top:?}"
    );
    let training = v["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["namespace"] == "training")
        .unwrap();
    assert!(
        training["active_share"].as_f64().unwrap() > 0.5,
        "{training}"
    );
}

/// A trace with `gpus` GPUs (4 per pod) for `minutes`, all idle with memory held.
fn many_gpus(gpus: usize, minutes: i64) -> String {
    use std::fmt::Write as _;
    let t0 = 1_793_577_600i64;
    let mut s = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
    for g in 0..gpus {
        for m in 0..minutes {
            let _ = writeln!(
                s,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"{}\",UUID=\"GPU-{g:06}\",modelName=\"NVIDIA L4\",Hostname=\"n{}\",namespace=\"bulk\",pod=\"p-{}\"}} 0 {}",
                g % 4,
                g / 4,
                g / 4,
                t0 + m * 60
            );
        }
    }
    s.push_str("# TYPE kube_pod_container_resource_requests gauge\n");
    for p in 0..gpus.div_ceil(4) {
        for m in 0..minutes {
            let _ = writeln!(
                s,
                "kube_pod_container_resource_requests{{namespace=\"bulk\",pod=\"p-{p}\",container=\"c\",resource=\"nvidia_com_gpu\",unit=\"integer\"}} 4 {}",
                t0 + m * 60
            );
        }
    }
    s.push_str("# EOF\n");
    s
}

#[test]
fn thousands_of_gpu_series_come_back_in_one_answer() {
    let prom = prometheus_with("bulk", many_gpus(2000, 40).as_bytes());
    let v = json_of(&run(&[
        "backtest",
        "--prometheus-url",
        &prom.url,
        "--from",
        "2026-11-02T00:00:00Z",
        "--to",
        "2026-11-02T01:00:00Z",
        "--prometheus-chunk",
        "2h",
        "--format",
        "json",
    ]));
    assert_eq!(v["summary"]["governed_gpus"], 2000);
    assert_eq!(v["summary"]["workloads"], 500);
}

/// A fake Prometheus: reads each request's head and answers `answer(head)` after `delay`.
fn fake_answering(
    answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static,
    delay: Duration,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let answer = std::sync::Arc::new(answer);
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    request.extend_from_slice(&buf[..n]);
                    if n == 0 || request.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                std::thread::sleep(delay);
                let _ = stream.write_all(&answer(&String::from_utf8_lossy(&request)));
            });
        }
    });
    url
}

/// A fake Prometheus that answers every request with `response` after `delay`.
fn fake(response: Vec<u8>, delay: Duration) -> String {
    fake_answering(move |_| response.clone(), delay)
}

/// A fake that answers an empty success only to requests whose head contains `credential`,
/// and a 401 with `rejection` to the others.
fn fake_requiring(credential: &'static str, rejection: &'static str) -> String {
    fake_answering(
        move |head| {
            if head.contains(credential) {
                http(
                    "200 OK",
                    br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
                )
            } else {
                let body = format!(
                    r#"{{"status":"error","errorType":"unauthorized","error":"{rejection}"}}"#
                );
                http("401 Unauthorized", body.as_bytes())
            }
        },
        Duration::ZERO,
    )
}

fn http(status: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!("HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).into_bytes();
    r.extend_from_slice(body);
    r
}

fn failing(url: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "backtest",
        "--prometheus-url",
        url,
        "--from",
        "1h",
        "--prometheus-retries",
        "0",
    ];
    args.extend_from_slice(extra);
    let o = run(&args);
    assert_eq!(
        o.status.code(),
        Some(1),
        "must fail: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(
        o.stdout.is_empty(),
        "nothing is reported when telemetry failed"
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn prometheus_down_is_a_clear_error_naming_the_url_and_query() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let e = failing(&url, &[]);
    assert!(
        e.contains(&format!("Prometheus at {url}")) && e.contains("DCGM_FI_PROF_GR_ENGINE_ACTIVE["),
        "{e}"
    );
    assert!(e.to_lowercase().contains("connect"), "{e}");
}

#[test]
fn an_error_answer_is_reported_with_prometheus_own_words() {
    let url = fake(
        http(
            "400 Bad Request",
            br#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#,
        ),
        Duration::ZERO,
    );
    let e = failing(&url, &[]);
    assert!(
        e.contains("bad_data") && e.contains("parse error at char 3"),
        "{e}"
    );
}

#[test]
fn a_garbage_answer_is_reported_not_parsed() {
    let url = fake(
        http("200 OK", b"<html>login required</html>"),
        Duration::ZERO,
    );
    let e = failing(&url, &[]);
    assert!(
        e.contains("not a Prometheus API answer") && e.contains("<html>login"),
        "{e}"
    );
}

#[test]
fn a_slow_prometheus_times_out() {
    let url = fake(http("200 OK", b"{}"), Duration::from_secs(10));
    let e = failing(&url, &["--prometheus-timeout", "1s"]);
    assert!(
        e.to_lowercase().contains("timed out") || e.to_lowercase().contains("timeout"),
        "{e}"
    );
}

#[test]
fn a_huge_answer_is_refused_past_the_cap() {
    let body = format!(
        r#"{{"status":"success","data":{{"resultType":"matrix","result":[{}]}}}}"#,
        "{\"metric\":{},\"values\":[]},".repeat(20_000) + "{\"metric\":{},\"values\":[]}"
    );
    let url = fake(http("200 OK", body.as_bytes()), Duration::ZERO);
    let e = failing(&url, &["--prometheus-max-response-bytes", "10000"]);
    assert!(e.contains("larger than 10000 bytes"), "{e}");
}

/// Transient failures are retried `--prometheus-retries` times, with backoff; an answer
/// that retrying cannot mend (a 400) is not retried at all.
#[test]
fn transient_failures_are_retried_as_often_as_asked_and_a_bad_request_never() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    // Answers `status` to the first `failures` requests, an empty success after.
    let flaky = |status: &'static str, failures: usize| {
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        let url = fake_answering(
            move |_| {
                if counter.fetch_add(1, Ordering::SeqCst) < failures {
                    http(
                        status,
                        br#"{"status":"error","errorType":"x","error":"not now"}"#,
                    )
                } else {
                    http(
                        "200 OK",
                        br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
                    )
                }
            },
            Duration::ZERO,
        );
        (url, seen)
    };
    let backtest = |url: &str, retries: &str| {
        let o = run(&[
            "backtest",
            "--prometheus-url",
            url,
            "--from",
            "1h",
            "--prometheus-retries",
            retries,
        ]);
        assert_eq!(o.status.code(), Some(1), "no samples either way");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    // Two 503s, two retries: every query is answered in the end.
    let (url, seen) = flaky("503 Service Unavailable", 2);
    let e = backtest(&url, "2");
    assert!(e.contains("no samples between"), "{e}");
    assert!(
        seen.load(Ordering::SeqCst) > 2,
        "the first query was sent 3 times"
    );
    // One retry is not enough for two failures.
    let (url, _) = flaky("503 Service Unavailable", 2);
    let e = backtest(&url, "1");
    assert!(
        e.contains("not now") && !e.contains("no samples between"),
        "{e}"
    );
    // A 400 is the query's fault: one request, no retry.
    let (url, seen) = flaky("400 Bad Request", 1);
    let e = backtest(&url, "2");
    assert!(e.contains("not now"), "{e}");
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "a bad request is not retried"
    );
}

#[test]
fn the_bearer_token_file_is_sent_with_every_query() {
    // Only the current token is accepted.
    let url = fake_requiring("authorization: Bearer rotated-2", "bad token");
    let token = std::env::temp_dir().join(format!("gpu-reaper-token-{}", std::process::id()));
    std::fs::write(&token, "rotated-1\n").unwrap();
    let e = failing(
        &url,
        &["--prometheus-bearer-token-file", token.to_str().unwrap()],
    );
    assert!(e.contains("unauthorized"), "{e}");
    std::fs::write(&token, "rotated-2\n").unwrap();
    // Authorised now: every query answers, with no samples at all.
    let e = failing(
        &url,
        &["--prometheus-bearer-token-file", token.to_str().unwrap()],
    );
    assert!(e.contains("no samples between"), "{e}");
    let _ = std::fs::remove_file(&token);
}

#[test]
fn basic_auth_credentials_come_from_the_password_file() {
    // base64("reaper:s3cret")
    let url = fake_requiring("Basic cmVhcGVyOnMzY3JldA==", "who are you");
    let password = std::env::temp_dir().join(format!("gpu-reaper-password-{}", std::process::id()));
    std::fs::write(&password, "s3cret\n").unwrap();
    let e = failing(
        &url,
        &[
            "--prometheus-basic-auth-user",
            "reaper",
            "--prometheus-basic-auth-password-file",
            password.to_str().unwrap(),
        ],
    );
    assert!(e.contains("no samples between"), "authorised, empty: {e}");
    let e = failing(
        &url,
        &[
            "--prometheus-basic-auth-user",
            "intruder",
            "--prometheus-basic-auth-password-file",
            password.to_str().unwrap(),
        ],
    );
    assert!(e.contains("who are you"), "{e}");
    let _ = std::fs::remove_file(&password);
}

/// bcrypt of `password`, as Prometheus' `basic_auth_users` wants it (Python's crypt on
/// glibc/libxcrypt; Go's bcrypt accepts the `$2b$` prefix).
fn bcrypt(password: &str) -> String {
    let o = Command::new("python3")
        .args([
            "-W",
            "ignore",
            "-c",
            "import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))",
            password,
        ])
        .output()
        .expect("python3 runs");
    let hash = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(hash.starts_with("$2"), "no bcrypt hash: {o:?}");
    hash
}

/// The real server behind TLS with a private CA, demanding a client certificate and basic
/// auth (`--web.config.file`): each missing piece is refused with an error that says
/// which flag supplies it, nothing is reported, and with all of them the history read
/// over HTTPS is the recorded file's, exactly.
#[test]
fn prometheus_behind_tls_with_a_private_ca_client_certificates_and_basic_auth() {
    use common::pki::Ca;
    let server_ca = Ca::new("prometheus serving CA");
    let server = server_ca.leaf(&["127.0.0.1", "localhost"], "prometheus");
    let client_ca = Ca::new("prometheus client CA");
    let client = client_ca.leaf(&[], "gpu-reaper");
    let stranger = Ca::new("someone else").leaf(&[], "gpu-reaper");
    let web = format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server-key.pem\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client-ca.pem\nbasic_auth_users:\n  reaper: {}\n",
        bcrypt("s3cret")
    );
    let text = sample_trace_text();
    let prom = common::prometheus_serving(
        "tls",
        &text,
        &[
            ("web.yml", &web),
            ("server.pem", &server.cert_pem),
            ("server-key.pem", &server.key_pem),
            ("client-ca.pem", &client_ca.pem),
        ],
    );
    assert!(prom.url.starts_with("https://"), "{}", prom.url);
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (ca, cert, key) = (
        file("ca.pem", &server_ca.pem),
        file("client.pem", &client.cert_pem),
        file("client-key.pem", &client.key_pem),
    );
    let (stranger_cert, stranger_key) = (
        file("stranger.pem", &stranger.cert_pem),
        file("stranger-key.pem", &stranger.key_pem),
    );
    let (password, wrong) = (file("password", "s3cret\n"), file("wrong", "guess\n"));
    let backtest = |extra: &[&str]| {
        backtest_sample_over(&prom.url, &[&["--prometheus-retries", "0"], extra].concat())
    };
    let refused = |extra: &[&str], expect: &[&str]| {
        let o = backtest(extra);
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(1), "must fail: {e}");
        assert!(o.stdout.is_empty(), "nothing is reported: {e}");
        for want in expect {
            assert!(e.contains(want), "{want:?} not in: {e}");
        }
    };
    let auth = [
        "--prometheus-basic-auth-user",
        "reaper",
        "--prometheus-basic-auth-password-file",
    ];
    // The server's CA is unknown to this process: say which flag trusts it.
    refused(&[], &[&prom.url, "--prometheus-ca-file"]);
    // Trusted, but no client certificate.
    refused(&["--prometheus-ca-file", &ca], &["client certificate"]);
    // A client certificate from a CA the server does not trust.
    refused(
        &[
            "--prometheus-ca-file",
            &ca,
            "--prometheus-client-cert-file",
            &stranger_cert,
            "--prometheus-client-key-file",
            &stranger_key,
        ],
        &["refused this client's certificate"],
    );
    let tls = [
        "--prometheus-ca-file",
        &ca,
        "--prometheus-client-cert-file",
        &cert,
        "--prometheus-client-key-file",
        &key,
    ];
    // TLS passes; the password is wrong.
    refused(
        &[&tls[..], &auth[..], &[&wrong]].concat(),
        &["401", "--prometheus-basic-auth-password-file"],
    );
    // Everything right: the same backtest as over the file.
    let over_tls = json_of(&backtest(&[&tls[..], &auth[..], &[&password]].concat()));
    let path = file("sample.om", std::str::from_utf8(&text).unwrap());
    let from_file = json_of(&run(&["backtest", "--trace", &path, "--format", "json"]));
    assert_eq!(over_tls["workloads"], from_file["workloads"]);
    assert_eq!(over_tls["summary"], from_file["summary"]);
    assert_eq!(from_file["summary"]["workloads"], 26);
    // Skipping verification is possible (for testing only) and still needs the rest.
    let skip = json_of(&backtest(
        &[
            &[
                "--prometheus-insecure-skip-tls-verify",
                "--prometheus-client-cert-file",
                &cert,
                "--prometheus-client-key-file",
                &key,
            ][..],
            &auth[..],
            &[&password],
        ]
        .concat(),
    ));
    assert_eq!(skip["workloads"], from_file["workloads"]);
}

fn hours_since_sample_start() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    format!("{}h", (now - 1_793_577_600) / 3600 + 1)
}

#[test]
fn audit_check_says_what_the_cluster_lacks() {
    let prom = prometheus_with("check", &sample_trace_text());
    let since = hours_since_sample_start();
    let o = run(&[
        "audit",
        "--check",
        "--prometheus-url",
        &prom.url,
        "--since",
        &since,
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(1),
        "the T4 lacks profiling metrics: {out}"
    );
    assert!(
        out.contains("[ok] DCGM exporter is scraped: 61 GPUs with GR_ENGINE_ACTIVE"),
        "{out}"
    );
    assert!(
        out.contains("[!!] profiling metrics (GR_ENGINE_ACTIVE): 1 GPUs report only GPU_UTIL"),
        "{out}"
    );
    assert!(out.contains("[ok] GPUs attributed to pods"), "{out}");
    assert!(
        out.contains("[ok] kube-state-metrics GPU requests"),
        "{out}"
    );

    // An exporter without --kubernetes and no kube-state-metrics.
    let bare = "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\nDCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-1\",gpu=\"0\",pod=\"nvidia-dcgm-exporter-abcde\",namespace=\"gpu-operator\"} 0 1793577600\n# EOF\n";
    let prom = prometheus_with("check-bare", bare.as_bytes());
    let o = run(&[
        "audit",
        "--check",
        "--prometheus-url",
        &prom.url,
        "--since",
        &since,
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("[!!] GPUs attributed to pods") && out.contains("--kubernetes"),
        "{out}"
    );
    assert!(
        out.contains("[!!] kube-state-metrics GPU requests"),
        "{out}"
    );
    assert!(out.contains("[ok] profiling metrics"), "{out}");

    let down = format!("http://127.0.0.1:{}", free_port());
    let o = run(&[
        "audit",
        "--check",
        "--prometheus-url",
        &down,
        "--prometheus-retries",
        "0",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("[!!] Prometheus answers") && out.contains(&down),
        "{out}"
    );
    assert_eq!(o.status.code(), Some(1));
}

/// The controller's incremental reads against the real server: a start-up read, two
/// one-minute reads, a 78-minute gap read once, a 90-minute one (through embedder-staging's
/// exporter gap), then a gap longer than the horizon (rebuilt). At each, every GPU's
/// observation equals that of a state fed once with the recorded file's samples over
/// the same span — so the range reads return exactly the samples in (from, to], no
/// lookback filling a gap. With `--prometheus-selector`, only the selected GPUs, with the
/// same observations.
#[test]
fn incremental_reads_see_exactly_the_recorded_samples_and_a_selector_narrows_them() {
    use gpu_reaper::api::policy::GpuPolicySpec;
    use gpu_reaper::engine::Rules;
    use gpu_reaper::telemetry::live::{LiveTelemetry, Read, ReadSettings};
    use gpu_reaper::telemetry::openmetrics::{RawSample, read_samples};
    use gpu_reaper::telemetry::prometheus::{PrometheusConfig, PrometheusSource};
    use gpu_reaper::telemetry::trace::{ReadOptions, TraceBuilder};

    let text = sample_trace_text();
    let prom = prometheus_with("incremental", &text);
    let mut samples = Vec::new();
    read_samples(&text[..], "sample", |s| {
        samples.push((
            s.metric.to_string(),
            s.series.to_string(),
            s.labels.to_string(),
            s.value,
            s.timestamp,
        ));
        Ok(())
    })
    .unwrap();
    let recorded = |from: i64, to: i64| {
        let mut b = TraceBuilder::new(&ReadOptions {
            skip_unknown_metrics: true,
            ..ReadOptions::default()
        });
        for (metric, series, labels, value, timestamp) in &samples {
            let live_family = gpu_reaper::telemetry::live::FAMILIES.contains(&metric.as_str());
            if live_family && *timestamp > from as f64 && *timestamp <= to as f64 {
                b.add(&RawSample {
                    metric,
                    series,
                    labels,
                    value: *value,
                    timestamp: *timestamp,
                    line: 0,
                })
                .unwrap();
            }
        }
        b.finish("file").ok()
    };
    let rules = Rules::from_spec(&GpuPolicySpec::default());
    let policies = std::slice::from_ref(&rules);
    let source = PrometheusSource::new(PrometheusConfig {
        url: prom.url.clone(),
        ..PrometheusConfig::default()
    })
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let settings = ReadSettings::default();
    let t0 = 1_793_577_600i64;
    let mut live = LiveTelemetry::new(60);
    let mut start = None;
    let mut reads = Vec::new();
    for minute in [140, 141, 142, 220, 310, 479] {
        let now = t0 + minute * 60 + 17;
        let read = runtime
            .block_on(source.refresh(&mut live, policies, &settings, now))
            .unwrap();
        reads.push((read.queries, read.rebuilt));
        if read.rebuilt {
            start = Some(now - settings.lag_seconds - read.seconds_read);
        }
        let from = start.unwrap();
        let to = now - settings.lag_seconds;
        let mut from_file = LiveTelemetry::new(60);
        from_file.apply(
            Read {
                from,
                to,
                rebuild: true,
            },
            policies,
            recorded(from, to).as_ref(),
        );
        let (a, b) = (live.observe(&rules), from_file.observe(&rules));
        assert!(a.len() >= 50, "{} GPUs at minute {minute}", a.len());
        assert_eq!(a, b, "at minute {minute}");
    }
    // One query per family for each gap (all under the 2 h `--prometheus-chunk`), two
    // for the rebuilds (the 130-minute horizon of the default policy), at the start and
    // after the 169-minute gap only.
    assert_eq!(
        reads,
        vec![
            (10, true),
            (5, false),
            (5, false),
            (5, false),
            (5, false),
            (10, true)
        ]
    );

    // A selector on the series' own labels (here about half of the GPUs by UUID; in a
    // fleet, `{cluster="a"}`).
    let all = live.observe(&rules);
    let mut narrowed = LiveTelemetry::new(60);
    let selected = ReadSettings {
        selector: r#"{UUID=~"GPU-[0-7].*"}"#.into(),
        ..ReadSettings::default()
    };
    let now = t0 + 479 * 60 + 17;
    runtime
        .block_on(source.refresh(&mut narrowed, policies, &selected, now))
        .unwrap();
    let only: std::collections::BTreeMap<_, _> = all
        .into_iter()
        .filter(|(k, _)| ('0'..='7').contains(&k.2.chars().nth(4).unwrap_or('x')))
        .collect();
    assert!(
        !only.is_empty() && only.len() < live.gpus(),
        "{}",
        only.len()
    );
    assert_eq!(narrowed.observe(&rules), only);
}

/// The controller's start-up backfill reads its range from the real Prometheus one piece
/// (one `--prometheus-chunk`) at a time and feeds each piece before reading the next;
/// the idle-span history it builds is the one the recorded file gives fed at once —
/// samples exactly on a piece's boundary, the exporter gap and the empty pieces before
/// the trace included.
#[test]
fn the_backfill_read_in_pieces_builds_the_history_the_recorded_file_builds() {
    use gpu_reaper::cluster::inventory::{pod_info, resolve};
    use gpu_reaper::controller::backfill::{FAMILIES, Stream, feed, pieces};
    use gpu_reaper::engine::{Histories, Rules};
    use gpu_reaper::gpus::GpuResources;
    use gpu_reaper::telemetry::prometheus::{PrometheusConfig, PrometheusSource};
    use gpu_reaper::telemetry::trace::{ReadOptions, read_trace};
    use jiff::{SignedDuration, Timestamp};

    let text = sample_trace_text();
    let prom = prometheus_with("pieces", &text);
    let options = ReadOptions {
        skip_unknown_metrics: true,
        ..ReadOptions::default()
    };
    let file = read_trace(&text[..], "sample", &options).unwrap();
    let now: Timestamp = "2026-11-02T08:00:30Z".parse().unwrap();
    let mut pods: Vec<(&str, &str)> = file
        .gpus
        .iter()
        .map(|g| (g.gpu.namespace.as_str(), g.gpu.pod.as_str()))
        .filter(|(_, pod)| !pod.is_empty())
        .collect();
    pods.dedup();
    let workloads = resolve(
        pods.iter()
            .map(|(ns, name)| {
                let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": ns, "creationTimestamp": "2026-11-01T00:00:00Z"},
                    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                    "status": {"phase": "Running"}});
                pod_info(&pod, &GpuResources::default(), now).unwrap()
            })
            .collect(),
        &std::collections::HashMap::new(),
    );
    let policy = gpu_reaper::api::validate::parse_resource::<gpu_reaper::api::GpuPolicy>(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/samples/inference-risk.yaml"
        ))
        .unwrap(),
        "inference-risk.yaml",
    )
    .unwrap();
    let rules = Rules::from_spec(&policy.spec);
    let described = |h: &Histories<_>| {
        let mut out = vec![format!("{} spans", h.spans())];
        for w in &workloads {
            let i = h.get(&w.root.key());
            out.push(format!(
                "{}: {:?} open since {:?}",
                w.root.key(),
                i.map(|i| i.finished().collect::<Vec<_>>()),
                i.and_then(|i| i.open_since())
            ));
        }
        out
    };
    let mut whole = Histories::new(rules.risk);
    feed(&mut whole, &file, &workloads, &rules, now);
    assert!(whole.spans() >= 10, "{:#?}", described(&whole));

    let chunk = std::time::Duration::from_secs(30 * 60);
    let source = PrometheusSource::new(PrometheusConfig {
        url: prom.url.clone(),
        chunk,
        ..PrometheusConfig::default()
    })
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut pieced = Histories::new(rules.risk);
    let mut stream = Stream::new(&workloads);
    let mut empty = 0;
    let range = pieces(
        now - SignedDuration::from_hours(24),
        now,
        SignedDuration::try_from(chunk).unwrap(),
    );
    for &(from, until) in &range {
        let piece = runtime
            .block_on(source.fetch_families(
                from.as_second(),
                until.as_second(),
                &FAMILIES,
                &options,
            ))
            .unwrap();
        match piece {
            Some(trace) => stream.piece(&trace, from, until).feed(&mut pieced, &rules),
            None => empty += 1,
        }
    }
    assert_eq!(range.len(), 49);
    assert_eq!(empty, 32, "the 16 hours before the trace");
    assert_eq!(described(&pieced), described(&whole));
}
