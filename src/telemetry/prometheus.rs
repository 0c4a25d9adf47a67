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

use prometheus_http_query::response::Data;
use serde::Deserialize;

use super::openmetrics::RawSample;
use super::trace::{KNOWN_METRICS, ReadOptions, Trace, TraceBuilder};

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
        let mut attempt = 0;
        loop {
            match self
                .instant_once(query, time)
                .await
                .and_then(|(status, body)| parse(status, &body))
            {
                Ok(data) => return Ok(data),
                Err((message, transient)) if transient && attempt < self.config.retries => {
                    attempt += 1;
                    let backoff = Duration::from_millis(200 * 2u64.pow(attempt)) + jitter();
                    tracing::warn!(query, attempt, error = %message, "Prometheus query failed; retrying");
                    tokio::time::sleep(backoff).await;
                }
                Err((message, _)) => return Err(fail(message)),
            }
        }
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
                Err(e) => return Err((format!("reading the answer failed: {}", chain(&e)), true)),
            }
        }
        Ok((status.as_u16(), body))
    }

    /// Pulls every family gpu-reaper reads between `from` and `to` (unix seconds) into a
    /// [`Trace`], chunk by chunk.
    pub async fn fetch_trace(
        &self,
        from: i64,
        to: i64,
        options: &ReadOptions,
    ) -> Result<Trace, PrometheusError> {
        self.fetch_families(from, to, KNOWN_METRICS, options).await
    }

    /// As [`Self::fetch_trace`], for some of the families only (e.g. the activity the
    /// controller's start-up backfill needs).
    pub async fn fetch_families(
        &self,
        from: i64,
        to: i64,
        families: &[&str],
        options: &ReadOptions,
    ) -> Result<Trace, PrometheusError> {
        // A range selector covers (end - range, end]: start one second early so a
        // sample exactly at `from` is included.
        let (builder, _) = self.read_after(from - 1, to, families, "", options).await?;
        builder.finish(&self.config.url).map_err(|e| PrometheusError {
            url: self.config.url.clone(),
            query: format!("{{__name__=~\"{}\"}}", families.join("|")),
            message: format!(
                "no samples between {} and {}: {} (is the DCGM exporter scraped, and is the time range right?)",
                jiff::Timestamp::from_second(from).map(|t| t.to_string()).unwrap_or_default(),
                jiff::Timestamp::from_second(to).map(|t| t.to_string()).unwrap_or_default(),
                e.message
            ),
        })
    }
}

impl PrometheusSource {
    /// The raw samples of `families` stamped in (`after`, `to`], chunk by chunk, and the
    /// number of queries sent.
    async fn read_after(
        &self,
        after: i64,
        to: i64,
        families: &[&str],
        selector: &str,
        options: &ReadOptions,
    ) -> Result<(TraceBuilder, usize), PrometheusError> {
        let chunk = (self.config.chunk.as_secs() as i64).max(60);
        let mut builder = TraceBuilder::new(&ReadOptions {
            skip_unknown_metrics: true,
            ..options.clone()
        });
        let mut queries = 0;
        for family in families {
            let mut end = after;
            while end < to {
                let start = end;
                end = (start + chunk).min(to);
                let query = format!("{family}{selector}[{}s]", end - start);
                // Streamed when the answer is what Prometheus writes; anything else is
                // read the generic way, whose errors are the ones reported.
                let answer = self
                    .instant_with(&query, end, |status, body| {
                        if status == 200
                            && let Some(series) = super::matrix::parse(body, family)
                        {
                            return Ok(Matrix::Streamed(series));
                        }
                        parse_answer(status, body).map(Matrix::Generic)
                    })
                    .await?;
                queries += 1;
                let fail = |message: String| PrometheusError {
                    url: self.config.url.clone(),
                    query: query.clone(),
                    message,
                };
                match answer {
                    Matrix::Streamed(series) => {
                        for s in &series {
                            for &(timestamp, value) in &s.samples {
                                builder
                                    .add(&RawSample {
                                        metric: family,
                                        series: &s.text,
                                        labels: &s.labels,
                                        value,
                                        timestamp,
                                        line: 0,
                                    })
                                    .map_err(fail)?;
                            }
                        }
                    }
                    Matrix::Generic(data) => {
                        add_matrix(&mut builder, family, data).map_err(fail)?
                    }
                }
            }
        }
        Ok((builder, queries))
    }

    /// Brings `live` up to `now` for `policies` with one read of every GPU's samples
    /// since the previous one (or of the horizon, when it starts over): the same queries
    /// whatever the number of policies ([`super::live`]). On an error the state is left
    /// as it was, and the next refresh reads the whole gap.
    pub async fn refresh(
        &self,
        live: &mut super::live::LiveTelemetry,
        policies: &[crate::engine::Rules],
        settings: &super::live::ReadSettings,
        now: i64,
    ) -> Result<Refreshed, PrometheusError> {
        let to = now - settings.lag_seconds.max(0);
        let Some(read) = live.next_read(policies, to) else {
            return Ok(Refreshed::default());
        };
        let options = ReadOptions {
            workload_labels: settings.workload_labels.clone(),
            step_seconds: live.step_seconds(),
            skip_unknown_metrics: true,
        };
        let (builder, queries) = self
            .read_after(
                read.from,
                read.to,
                &super::live::FAMILIES,
                &settings.selector,
                &options,
            )
            .await?;
        // No sample at all is an answer too: every GPU followed has a gap.
        let trace = builder.finish(&self.config.url).ok();
        live.apply(read, policies, trace.as_ref());
        Ok(Refreshed {
            queries,
            rebuilt: read.rebuild,
            seconds_read: read.to - read.from,
            samples: trace.map_or(0, |t| t.samples),
        })
    }
}

/// A range-vector answer, streamed ([`super::matrix`]) or read the generic way.
enum Matrix {
    Streamed(Vec<super::matrix::Series>),
    Generic(Data),
}

/// What one [`PrometheusSource::refresh`] read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Refreshed {
    pub queries: usize,
    /// The state started over (start-up, a gap longer than the horizon, new rule sets).
    pub rebuilt: bool,
    pub seconds_read: i64,
    pub samples: u64,
}

/// Reads one `/api/v1/query` answer: the JSON envelope, then its data. The error's flag
/// says whether retrying may help (5xx, 429). Pure, so it can be fuzzed
/// (fuzz/fuzz_targets/prometheus_answer.rs).
pub fn parse_answer(status: u16, body: &[u8]) -> Result<Data, (String, bool)> {
    let transient = (500..600).contains(&status) || status == 429;
    let credentials = matches!(status, 401 | 403);
    let status = reqwest::StatusCode::from_u16(status)
        .map_or_else(|_| status.to_string(), |s| s.to_string());
    if credentials {
        let preview = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
        return Err((
            format!(
                "HTTP {status}: Prometheus refused the credentials ({:?}): check --prometheus-bearer-token-file, or --prometheus-basic-auth-user and --prometheus-basic-auth-password-file",
                preview.trim()
            ),
            false,
        ));
    }
    let envelope: Envelope = serde_json::from_slice(body).map_err(|e| {
        let preview = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
        (
            format!("HTTP {status}: not a Prometheus API answer ({e}); it starts with {preview:?}"),
            transient,
        )
    })?;
    if envelope.status != "success" {
        return Err((
            format!(
                "HTTP {status}: {} error: {}",
                envelope.error_type.unwrap_or_else(|| "unknown".into()),
                envelope.error.unwrap_or_default()
            ),
            transient,
        ));
    }
    envelope
        .data
        .ok_or_else(|| (format!("HTTP {status}: success without data"), false))
}

/// An instant vector keyed by (namespace, pod, GPU id), with each GPU's identity.
pub type GpuVector =
    std::collections::BTreeMap<(String, String, String), (super::trace::GpuIdentity, f64)>;

/// Keys an instant-vector answer by GPU; a series without a GPU identity is an error.
pub fn vector_by_gpu(
    data: Data,
    names: &super::trace::WorkloadLabels,
) -> Result<GpuVector, String> {
    let Data::Vector(items) = data else {
        return Err("expected an instant vector answer".into());
    };
    let mut out = GpuVector::new();
    for item in items {
        let (metric, sample) = item.into_inner();
        let identity = super::trace::gpu_identity(
            |k| metric.get(k).map(String::as_str).filter(|v| !v.is_empty()),
            names,
        )
        .map_err(|e| format!("a series without GPU identity: {e}"))?;
        out.insert(
            (
                identity.namespace.clone(),
                identity.pod.clone(),
                identity.id.clone(),
            ),
            (identity, sample.value()),
        );
    }
    Ok(out)
}

/// Reads an instant-vector answer straight into a [`GpuVector`]: what
/// [`parse_answer`] then [`vector_by_gpu`] give, without building every series' label
/// map (at 10,000 GPUs an answer is ≈ 4.5 MB of JSON with ≈ 14 labels per series). The
/// outer error is the answer's (as [`parse_answer`]'s), the inner one the vector's (as
/// [`vector_by_gpu`]'s). Anything the streaming reader does not expect — an error
/// answer, another result type, fields out of Prometheus' order, a malformed series —
/// is read again by those two functions, so the result and the error messages are
/// theirs.
pub fn parse_vector(
    status: u16,
    body: &[u8],
    names: &super::trace::WorkloadLabels,
) -> Result<Result<GpuVector, String>, (String, bool)> {
    if status == 200
        && let Some(vector) = stream::vector(body, names)
    {
        return Ok(Ok(vector));
    }
    let data = parse_answer(status, body)?;
    Ok(vector_by_gpu(data, names))
}

/// The streaming reader of [`parse_vector`]: `None` wherever the answer is not a
/// well-formed, successful instant vector of series that all have a GPU identity.
mod stream {
    use std::borrow::Cow;
    use std::fmt;

    use serde::Deserializer as _;
    use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

    use super::GpuVector;
    use crate::telemetry::matrix::{Labels, Str};
    use crate::telemetry::trace::{WorkloadLabels, gpu_identity};

    pub(super) fn vector(body: &[u8], names: &WorkloadLabels) -> Option<GpuVector> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let vector = de.deserialize_map(Envelope { names }).ok()??;
        de.end().ok()?;
        Some(vector)
    }

    /// `{"status": "success", "data": …}`, other fields (warnings, infos) skipped.
    struct Envelope<'n> {
        names: &'n WorkloadLabels,
    }

    impl<'de> Visitor<'de> for Envelope<'_> {
        type Value = Option<GpuVector>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a Prometheus API answer")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let (mut success, mut data) = (None, None);
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                match key.as_ref() {
                    "status" if success.is_none() => {
                        success = Some(map.next_value::<Cow<'de, str>>()? == "success");
                    }
                    // Prometheus writes the status first: an error answer is left to
                    // `parse_answer`.
                    "data" if success == Some(true) && data.is_none() => {
                        data = Some(map.next_value_seed(Data { names: self.names })?);
                    }
                    "status" | "data" => return Err(de::Error::custom("unexpected")),
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(data.filter(|_| success == Some(true)))
        }
    }

    /// `{"resultType": "vector", "result": [...]}`, in this order.
    struct Data<'n> {
        names: &'n WorkloadLabels,
    }

    impl<'de> DeserializeSeed<'de> for Data<'_> {
        type Value = GpuVector;

        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<GpuVector, D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for Data<'_> {
        type Value = GpuVector;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an instant vector")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<GpuVector, A::Error> {
            let unexpected = || de::Error::custom("unexpected");
            if map.next_key::<Cow<'de, str>>()?.as_deref() != Some("resultType")
                || map.next_value::<Cow<'de, str>>()? != "vector"
                || map.next_key::<Cow<'de, str>>()?.as_deref() != Some("result")
            {
                return Err(unexpected());
            }
            let vector = map.next_value_seed(Series { names: self.names })?;
            if map.next_key::<IgnoredAny>()?.is_some() {
                return Err(unexpected());
            }
            Ok(vector)
        }
    }

    /// The result array, each series keyed by GPU as it is read.
    struct Series<'n> {
        names: &'n WorkloadLabels,
    }

    impl<'de> DeserializeSeed<'de> for Series<'_> {
        type Value = GpuVector;

        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<GpuVector, D::Error> {
            d.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for Series<'_> {
        type Value = GpuVector;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of series")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<GpuVector, A::Error> {
            let mut out = GpuVector::new();
            while let Some(series) = seq.next_element::<One<'de>>()? {
                let (labels, (_, value)) = (series.metric, series.value);
                let value: f64 = value.0.parse().map_err(de::Error::custom)?;
                // As a label map would read them: the last of repeated names wins.
                let identity = gpu_identity(
                    |k| {
                        labels
                            .0
                            .iter()
                            .rev()
                            .find(|(name, _)| name.0 == k)
                            .map(|(_, v)| v.0.as_ref())
                            .filter(|v| !v.is_empty())
                    },
                    self.names,
                )
                .map_err(de::Error::custom)?;
                out.insert(
                    (
                        identity.namespace.clone(),
                        identity.pod.clone(),
                        identity.id.clone(),
                    ),
                    (identity, value),
                );
            }
            Ok(out)
        }
    }

    /// One series, its labels borrowed from the answer where no escape forbids it.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct One<'a> {
        #[serde(borrow)]
        metric: Labels<'a>,
        #[serde(borrow)]
        value: (f64, Str<'a>),
    }
}

/// Feeds a range-vector answer for `family` into `builder`, as if read from a file.
pub fn add_matrix(builder: &mut TraceBuilder, family: &str, data: Data) -> Result<(), String> {
    let Data::Matrix(series) = data else {
        return Err("expected a range vector (matrix) answer".into());
    };
    let mut series_text = String::new();
    let mut labels_text = String::new();
    for s in series {
        let (metric, samples) = s.into_inner();
        format_series(family, &metric, &mut series_text, &mut labels_text);
        for sample in samples {
            builder.add(&RawSample {
                metric: family,
                series: &series_text,
                labels: &labels_text,
                value: sample.value(),
                timestamp: sample.timestamp(),
                line: 0,
            })?;
        }
    }
    Ok(())
}

/// `name{a="x",b="y"}` with labels sorted, as the series' identity, and the label text.
fn format_series(
    family: &str,
    metric: &HashMap<String, String>,
    series: &mut String,
    labels: &mut String,
) {
    let mut keys: Vec<&String> = metric.keys().filter(|k| k.as_str() != "__name__").collect();
    keys.sort_unstable();
    labels.clear();
    for (i, k) in keys.iter().enumerate() {
        if i > 0 {
            labels.push(',');
        }
        let v = &metric[*k];
        let _ = write!(
            labels,
            "{k}=\"{}\"",
            v.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n")
        );
    }
    series.clear();
    let _ = write!(series, "{family}{{{labels}}}");
}

fn describe(e: &prometheus_http_query::Error) -> String {
    match e {
        prometheus_http_query::Error::Client(c) => chain(c),
        other => other.to_string(),
    }
}

/// An error with its causes, so "connection refused" is not lost behind "request failed".
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn jitter() -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    Duration::from_millis(u64::from(nanos % 200))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_identity_sorts_labels_and_escapes_values() {
        let metric: HashMap<String, String> =
            [("__name__", "X"), ("pod", "p\"1"), ("UUID", "GPU-1")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let (mut s, mut l) = (String::new(), String::new());
        format_series("X", &metric, &mut s, &mut l);
        assert_eq!(s, "X{UUID=\"GPU-1\",pod=\"p\\\"1\"}");
        assert_eq!(
            super::super::openmetrics::parse_labels(&l).unwrap()[1].1,
            "p\"1"
        );
    }
}

/// What the live cycle needs besides the policy: how often the exporter is scraped (to
/// turn sample counts into coverage), how far back to look for the last activity, and an
/// optional extra selector (e.g. one cluster of a Thanos).
#[derive(Debug, Clone)]
pub struct LiveSettings {
    pub scrape_interval_seconds: i64,
    pub horizon_seconds: i64,
    pub step_seconds: i64,
    pub selector: String,
    /// Override of the workload label names (default: detected per series).
    pub workload_labels: super::trace::WorkloadLabels,
}

/// Observations of every GPU at one instant, keyed by (namespace, pod, GPU id); GPUs with
/// no workload have empty namespace and pod. `pod` indexes are left 0 for the caller.
pub type Observations =
    std::collections::BTreeMap<(String, String, String), crate::engine::GpuObservation>;

impl PrometheusSource {
    /// Observes every GPU at `now` with a fixed number of queries (11 per policy; see
    /// [`super::promql`]), whatever the number of GPUs.
    pub async fn observe(
        &self,
        rules: &crate::engine::Rules,
        live: &LiveSettings,
        now: i64,
    ) -> Result<Observations, PrometheusError> {
        use super::promql::{ACTIVITY_SIGNALS, QueryShape, activity_queries, latest};
        use crate::api::policy::Signal;
        let window = rules.window.as_secs();
        let min_samples = ((rules.min_coverage * window as f64)
            / live.scrape_interval_seconds.max(1) as f64)
            .ceil() as u32;
        let mut out = Observations::new();
        let signals: Vec<(&str, f64)> = match rules.signal {
            Signal::Auto => ACTIVITY_SIGNALS.to_vec(),
            Signal::EngineActive => vec![ACTIVITY_SIGNALS[0]],
            Signal::GpuUtil => vec![ACTIVITY_SIGNALS[1]],
        };
        // GPUs already described by an earlier (preferred) family keep it.
        let mut described: std::collections::BTreeSet<(String, String, String)> =
            Default::default();
        for (family, scale) in signals {
            let shape = QueryShape {
                threshold: rules.threshold,
                window,
                horizon: live.horizon_seconds,
                step: live.step_seconds,
                min_samples,
            };
            let q = activity_queries(family, scale, &live.selector, &shape);
            let counts = self
                .vector(&q.samples_in_window, now, &live.workload_labels)
                .await?;
            let busy = self
                .vector(&q.last_busy, now, &live.workload_labels)
                .await?;
            let blind = self
                .vector(&q.last_blind, now, &live.workload_labels)
                .await?;
            let first = self
                .vector(&q.first_sample, now, &live.workload_labels)
                .await?;
            let mut this_family = std::collections::BTreeSet::new();
            for (key, (identity, _)) in counts.iter().chain(first.iter()) {
                if described.contains(key) {
                    continue;
                }
                this_family.insert(key.clone());
                let obs = out
                    .entry(key.clone())
                    .or_insert_with(|| crate::engine::GpuObservation {
                        id: identity.id.clone(),
                        model: identity.model.clone(),
                        share: identity.share,
                        ..Default::default()
                    });
                let count = counts.get(key).map_or(0.0, |(_, v)| *v);
                obs.coverage =
                    (count * live.scrape_interval_seconds as f64 / window.max(1) as f64).min(1.0);
                obs.last_busy_at = busy.get(key).and_then(|(_, v)| ts(*v));
                obs.first_sample_at = first.get(key).and_then(|(_, v)| ts(*v));
                // The current window counts too: with too few samples now, it is blind now.
                let blind_now = (count as u32) < min_samples.max(1);
                obs.blind_until = if blind_now {
                    ts(now as f64)
                } else {
                    blind.get(key).and_then(|(_, v)| ts(*v))
                };
            }
            described.extend(this_family);
        }
        for (family, field) in [
            ("DCGM_FI_DEV_FB_USED", 0),
            ("DCGM_FI_PROF_PCIE_RX_BYTES", 1),
            ("DCGM_FI_DEV_POWER_USAGE", 2),
        ] {
            for (key, (_, value)) in self
                .vector(
                    &latest(family, &live.selector, window),
                    now,
                    &live.workload_labels,
                )
                .await?
            {
                if let Some(obs) = out.get_mut(&key) {
                    match field {
                        0 => obs.fb_used_mib = Some(value),
                        1 => obs.pcie_rx_bytes_per_second = Some(value),
                        _ => obs.power_watts = Some(value),
                    }
                }
            }
        }
        Ok(out)
    }

    /// An instant vector keyed by GPU.
    async fn vector(
        &self,
        query: &str,
        at: i64,
        names: &super::trace::WorkloadLabels,
    ) -> Result<GpuVector, PrometheusError> {
        let fail = |message: String| PrometheusError {
            url: self.config.url.clone(),
            query: query.to_string(),
            message,
        };
        // The answer's errors (retried when transient) come first; a vector without GPU
        // identities is not retried.
        self.instant_with(query, at, |status, body| parse_vector(status, body, names))
            .await?
            .map_err(fail)
    }
}

fn ts(seconds: f64) -> Option<jiff::Timestamp> {
    seconds
        .is_finite()
        .then(|| jiff::Timestamp::from_second(seconds.floor() as i64).ok())
        .flatten()
}
