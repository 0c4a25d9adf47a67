//! The Prometheus HTTP source: any PromQL API (Prometheus, Thanos, Mimir). Pulls raw
//! samples of the families gpu-reaper reads with range-vector instant queries
//! (`FAMILY[chunk]` evaluated at the chunk's end): unlike `query_range`, these return the
//! samples as scraped, without the 5-minute lookback that would paper over exporter gaps
//! — a gap must stay a gap (invariant 1).
//!
//! IO lives here and only here; what comes back goes through the same [`TraceBuilder`]
//! as an OpenMetrics file.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use prometheus_http_query::response::Data;
use serde::Deserialize;

use crate::telemetry::coverage::Coverage;
use crate::telemetry::openmetrics::RawSample;
use crate::telemetry::trace::{KNOWN_METRICS, ReadOptions, Trace, TraceBuilder, WorkloadLabels};

/// How to reach Prometheus.
#[derive(Debug, Clone)]
pub struct PrometheusConfig {
    /// Base URL, e.g. `http://prometheus.monitoring:9090` (Thanos/Mimir: their query URL).
    pub url: String,
    /// Bearer token file, re-read on every request (projected tokens rotate).
    pub bearer_token_file: Option<PathBuf>,
    /// Basic auth: user and a file holding the password (re-read on every request).
    pub basic_auth: Option<(String, PathBuf)>,
    /// PEM bundle of extra CAs to trust.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain and private key (PEM) for servers that require mutual TLS.
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// Accept any server certificate (testing only: anyone on the path can then answer).
    pub insecure_skip_tls_verify: bool,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Retries of a failed request (connection errors, 429, 5xx), with backoff and jitter.
    pub retries: u32,
    /// Largest answer accepted, bytes.
    pub max_response_bytes: usize,
    /// Length of one range-vector query; shorter chunks mean smaller answers.
    pub chunk: Duration,
}

impl Default for PrometheusConfig {
    fn default() -> Self {
        Self {
            url: "http://localhost:9090".into(),
            bearer_token_file: None,
            basic_auth: None,
            ca_file: None,
            client_identity: None,
            insecure_skip_tls_verify: false,
            timeout: Duration::from_secs(30),
            retries: 2,
            max_response_bytes: 256 << 20,
            chunk: Duration::from_secs(2 * 3600),
        }
    }
}

/// A query that failed, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("Prometheus at {url}: query `{query}` failed: {message}")]
pub struct PrometheusError {
    pub url: String,
    pub query: String,
    pub message: String,
}

/// A configured Prometheus client.
pub struct PrometheusSource {
    client: prometheus_http_query::Client,
    config: PrometheusConfig,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    status: String,
    data: Option<Data>,
    error_type: Option<String>,
    error: Option<String>,
}

impl PrometheusSource {
    /// Builds the HTTP client (TLS with the process' rustls provider and any extra CA).
    pub fn new(config: PrometheusConfig) -> Result<Self, PrometheusError> {
        let fail = |message: String| PrometheusError {
            url: config.url.clone(),
            query: String::new(),
            message,
        };
        let mut builder = crate::http::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout);
        if let Some(ca) = &config.ca_file {
            builder = crate::http::trust_ca(builder, ca, "--prometheus-ca-file").map_err(fail)?;
        }
        if let Some((cert, key)) = &config.client_identity {
            builder = crate::http::client_identity(
                builder,
                (cert, "--prometheus-client-cert-file"),
                (key, "--prometheus-client-key-file"),
            )
            .map_err(fail)?;
        }
        if config.insecure_skip_tls_verify {
            builder = builder.tls_danger_accept_invalid_certs(true);
        }
        let http = builder
            .build()
            .map_err(|e| fail(format!("cannot build the HTTP client: {e}")))?;
        let client = prometheus_http_query::Client::from(http, &config.url)
            .map_err(|e| fail(format!("--prometheus-url is not a usable URL: {e}")))?;
        Ok(Self { client, config })
    }

    /// Evaluates `query` at `time` (unix seconds), retrying transient failures.
    pub async fn instant(&self, query: &str, time: i64) -> Result<Data, PrometheusError> {
        self.instant_with(query, time, parse_answer).await
    }

    /// Evaluates `query` at `at` (unix seconds) as an instant vector keyed by GPU
    /// (`names`: the workload label override); a series without a GPU identity is an
    /// error, not retried.
    pub async fn instant_vector(
        &self,
        query: &str,
        at: i64,
        names: &WorkloadLabels,
    ) -> Result<GpuVector, PrometheusError> {
        let fail = |message: String| PrometheusError {
            url: self.config.url.clone(),
            query: query.to_string(),
            message,
        };
        // The answer's errors (retried when transient) come first.
        self.instant_with(query, at, |status, body| parse_vector(status, body, names))
            .await?
            .map_err(fail)
    }

    /// As [`Self::instant`], reading the answer's body with `parse`.
    async fn instant_with<T>(
        &self,
        query: &str,
        time: i64,
        parse: impl Fn(u16, &[u8]) -> Result<T, (String, bool)>,
    ) -> Result<T, PrometheusError> {
        let fail = |message: String| PrometheusError {
            url: self.config.url.clone(),
            query: query.to_string(),
            message,
        };
        // Transient failures (connection errors, 429, 5xx) are retried up to
        // `--prometheus-retries` times, 400 ms, 800 ms, … apart with jitter.
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(400))
            .with_factor(2.0)
            .with_max_delay(Duration::from_secs(30))
            .with_max_times(self.config.retries as usize)
            .with_jitter();
        (|| async {
            self.instant_once(query, time)
                .await
                .and_then(|(status, body)| parse(status, &body))
        })
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(|(_, transient)| *transient)
        .notify(|(message, _), wait| {
            tracing::warn!(query, error = %message, ?wait, "Prometheus query failed; retrying");
        })
        .await
        .map_err(|(message, _)| fail(message))
    }

    /// One attempt: the answer's HTTP status and body. The flag says whether retrying
    /// may help.
    async fn instant_once(&self, query: &str, time: i64) -> Result<(u16, Vec<u8>), (String, bool)> {
        let mut request = self
            .client
            .query(query)
            .at(time)
            .timeout(self.config.timeout.as_millis() as i64);
        if let Some(path) = &self.config.bearer_token_file {
            let token = std::fs::read_to_string(path).map_err(|e| {
                (
                    format!("cannot read the bearer token file {}: {e}", path.display()),
                    false,
                )
            })?;
            request = request.header(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {}", token.trim())
                    .parse::<reqwest::header::HeaderValue>()
                    .map_err(|e| {
                        (
                            format!("bearer token is not a valid header value: {e}"),
                            false,
                        )
                    })?,
            );
        }
        if let Some((user, password_file)) = &self.config.basic_auth {
            use base64::Engine as _;
            let password = std::fs::read_to_string(password_file).map_err(|e| {
                (
                    format!(
                        "cannot read the basic-auth password file {}: {e}",
                        password_file.display()
                    ),
                    false,
                )
            })?;
            let credentials = base64::engine::general_purpose::STANDARD.encode(format!(
                "{user}:{}",
                password.trim_end_matches(['\n', '\r'])
            ));
            let value = format!("Basic {credentials}")
                .parse::<reqwest::header::HeaderValue>()
                .map_err(|e| {
                    (
                        format!("basic-auth credentials are not a valid header value: {e}"),
                        false,
                    )
                })?;
            request = request.header(reqwest::header::AUTHORIZATION, value);
        }
        let mut response = request.post_raw().await.map_err(|e| {
            let message = describe(&e);
            // A certificate problem does not go away on retry; say what fixes it.
            let client_flags = (
                "--prometheus-client-cert-file and --prometheus-client-key-file",
                self.config.client_identity.is_some(),
            );
            if let Some(hint) =
                crate::http::certificate_hint(&message, "--prometheus-ca-file", client_flags)
            {
                return (format!("{message} ({hint})"), false);
            }
            let transient = !matches!(e, prometheus_http_query::Error::ParseUrl(_));
            (message, transient)
        })?;
        let status = response.status();
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > self.config.max_response_bytes {
                        return Err((
                            format!(
                                "answer larger than {} bytes (raise --prometheus-max-response-bytes or shorten --prometheus-chunk)",
                                self.config.max_response_bytes
                            ),
                            false,
                        ));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => {
                    return Err((
                        format!("reading the answer failed: {}", crate::error::chain(&e)),
                        true,
                    ));
                }
            }
        }
        Ok((status.as_u16(), body))
    }

    /// Pulls every family gpu-reaper reads between `from` and `to` (unix seconds) into a
    /// [`Trace`], chunk by chunk, with what the history holds ([`Coverage::check`] says
    /// what it lacks).
    pub async fn fetch_trace(
        &self,
        from: i64,
        to: i64,
        options: &ReadOptions,
    ) -> Result<(Trace, Coverage), PrometheusError> {
        let mut builder = TraceBuilder::new(&ReadOptions {
            skip_unknown_metrics: true,
            ..options.clone()
        });
        let coverage = self
            .read_history(from, to, &options.workload_labels, &mut |s| builder.add(s))
            .await?;
        let trace = builder
            .finish(&self.config.url)
            .map_err(|e| self.no_samples(from, to, KNOWN_METRICS, &e.message))?;
        Ok((trace, coverage))
    }

    /// Hands every raw sample of every family gpu-reaper reads between `from` and `to`
    /// (unix seconds) to `on_sample`, as [`Self::fetch_trace`] reads them — family by
    /// family in [`KNOWN_METRICS`] order, each series' samples in increasing time — and
    /// says what they hold (`workload_labels`: how DCGM series name their pod). What
    /// `gpu-reaper export` writes to a file is exactly what a backtest reads here.
    pub async fn read_history(
        &self,
        from: i64,
        to: i64,
        workload_labels: &WorkloadLabels,
        on_sample: &mut dyn FnMut(&RawSample<'_>) -> Result<(), String>,
    ) -> Result<Coverage, PrometheusError> {
        let mut coverage = Coverage::new(workload_labels.clone());
        // A range selector covers (end - range, end]: start one second early so a
        // sample exactly at `from` is included.
        self.read_samples_after(from - 1, to, 0, KNOWN_METRICS, "", &mut |s| {
            coverage.observe(s);
            on_sample(s)
        })
        .await?;
        if coverage.samples == 0 {
            return Err(self.no_samples(
                from,
                to,
                KNOWN_METRICS,
                "none of the families gpu-reaper reads has one",
            ));
        }
        Ok(coverage)
    }

    fn no_samples(&self, from: i64, to: i64, families: &[&str], message: &str) -> PrometheusError {
        PrometheusError {
            url: self.config.url.clone(),
            query: format!("{{__name__=~\"{}\"}}", families.join("|")),
            message: format!(
                "no samples between {} and {}: {message} (is the DCGM exporter scraped, and is the time range right?)",
                jiff::Timestamp::from_second(from)
                    .map(|t| t.to_string())
                    .unwrap_or_default(),
                jiff::Timestamp::from_second(to)
                    .map(|t| t.to_string())
                    .unwrap_or_default(),
            ),
        }
    }

    /// As [`Self::fetch_trace`], for some of the families only (e.g. the activity the
    /// controller's start-up backfill needs), without their [`Coverage`]: one query per
    /// family and `--prometheus-chunk` of the range. `None` when the range holds no
    /// sample of them (a piece of history from before the exporter ran is no error).
    pub async fn fetch_families(
        &self,
        from: i64,
        to: i64,
        families: &[&str],
        options: &ReadOptions,
    ) -> Result<Option<Trace>, PrometheusError> {
        // A range selector covers (end - range, end]: start one second early so a
        // sample exactly at `from` is included, within the first query.
        let mut builder = TraceBuilder::new(&ReadOptions {
            skip_unknown_metrics: true,
            ..options.clone()
        });
        self.read_samples_after(from - 1, to, 1, families, "", &mut |s| builder.add(s))
            .await?;
        // `finish` refuses only a trace without samples.
        Ok(builder.finish(&self.config.url).ok())
    }

    /// The length of one range query (`--prometheus-chunk`).
    pub fn chunk(&self) -> std::time::Duration {
        self.config.chunk
    }
}

mod answer;
mod live;

pub use answer::{
    GpuVector, add_matrix, for_each_matrix_sample, parse_answer, parse_vector, vector_by_gpu,
};
pub use live::Refreshed;

fn describe(e: &prometheus_http_query::Error) -> String {
    match e {
        prometheus_http_query::Error::Client(c) => crate::error::chain(c),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
