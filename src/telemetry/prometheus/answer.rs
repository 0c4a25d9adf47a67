//! Reading Prometheus answers: the JSON envelope, instant vectors by GPU, range
//! matrices into a [`TraceBuilder`]. Pure, so they can be fuzzed.

use super::*;

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
pub type GpuVector = std::collections::BTreeMap<
    (String, String, String),
    (crate::telemetry::trace::GpuIdentity, f64),
>;

/// Keys an instant-vector answer by GPU; a series without a GPU identity is an error.
pub fn vector_by_gpu(
    data: Data,
    names: &crate::telemetry::trace::WorkloadLabels,
) -> Result<GpuVector, String> {
    let Data::Vector(items) = data else {
        return Err("expected an instant vector answer".into());
    };
    let mut out = GpuVector::new();
    for item in items {
        let (metric, sample) = item.into_inner();
        let identity = crate::telemetry::trace::gpu_identity(
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
    names: &crate::telemetry::trace::WorkloadLabels,
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
    use crate::telemetry::matrix::{Envelope, Labels, Str};
    use crate::telemetry::trace::{WorkloadLabels, gpu_identity};

    pub(super) fn vector(body: &[u8], names: &WorkloadLabels) -> Option<GpuVector> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let vector = de.deserialize_map(Envelope(Data { names })).ok()??;
        de.end().ok()?;
        Some(vector)
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
    for_each_matrix_sample(family, data, &mut |s| builder.add(s))
}

/// Hands every sample of a range-vector answer for `family` to `on_sample`, series by
/// series, as a file would.
pub fn for_each_matrix_sample(
    family: &str,
    data: Data,
    on_sample: &mut dyn FnMut(&RawSample<'_>) -> Result<(), String>,
) -> Result<(), String> {
    let Data::Matrix(series) = data else {
        return Err("expected a range vector (matrix) answer".into());
    };
    let mut series_text = String::new();
    let mut labels_text = String::new();
    for s in series {
        let (metric, samples) = s.into_inner();
        format_series(family, &metric, &mut series_text, &mut labels_text);
        for sample in samples {
            on_sample(&RawSample {
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
pub(super) fn format_series(
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
