//! A streaming reader of range-vector (matrix) answers: what `parse_answer` then
//! `add_matrix` read, without a label map per series (every live read and the start-up
//! read are matrices of every GPU: ≈ 15 labels per series, 10,000+ series per answer).
//! Labels are borrowed from the body where no escape forbids it, and each series comes
//! out as the identity text and label text the trace builder keys on.
//!
//! Pure. Anything it does not expect (an error answer, another result type, fields out of
//! Prometheus' order, a repeated label) gives `None`, and the caller reads the answer
//! the generic way, so errors and their messages are the generic reader's.

use std::borrow::Cow;
use std::fmt::{self, Write as _};

use serde::Deserializer as _;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// One series of a matrix answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// `family{a="x",b="y"}`, labels sorted, `__name__` left out.
    pub text: String,
    /// The text between the braces.
    pub labels: String,
    /// (timestamp in seconds, value), in the answer's order.
    pub samples: Vec<(f64, f64)>,
}

/// The series of a successful matrix answer for `family`, or `None`.
pub fn parse(body: &[u8], family: &str) -> Option<Vec<Series>> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let series = de.deserialize_map(Envelope(Data { family })).ok()??;
    de.end().ok()?;
    Some(series)
}

/// `{"status": "success", "data": …}`, other fields (warnings, infos) skipped; `data` is
/// read by the seed `S` (this module's matrix, or the instant-vector reader's). The value
/// is `None` for an answer that is not a success.
pub(crate) struct Envelope<S>(pub(crate) S);

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for Envelope<S> {
    type Value = Option<S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Prometheus API answer")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seed = Some(self.0);
        let mut success = None;
        let mut data = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "status" if success.is_none() => {
                    success = Some(map.next_value::<Cow<'de, str>>()? == "success");
                }
                // Prometheus writes the status first: an error answer is left to the
                // generic reader.
                "data" if success == Some(true) && data.is_none() => {
                    let seed = seed.take().ok_or_else(|| de::Error::custom("unexpected"))?;
                    data = Some(map.next_value_seed(seed)?);
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

/// `{"resultType": "matrix", "result": [...]}`, in this order.
struct Data<'f> {
    family: &'f str,
}

impl<'de> DeserializeSeed<'de> for Data<'_> {
    type Value = Vec<Series>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<Series>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Data<'_> {
    type Value = Vec<Series>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a range vector")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<Series>, A::Error> {
        let unexpected = || de::Error::custom("unexpected");
        if map.next_key::<Cow<'de, str>>()?.as_deref() != Some("resultType")
            || map.next_value::<Cow<'de, str>>()? != "matrix"
            || map.next_key::<Cow<'de, str>>()?.as_deref() != Some("result")
        {
            return Err(unexpected());
        }
        let series = map.next_value_seed(List {
            family: self.family,
        })?;
        if map.next_key::<IgnoredAny>()?.is_some() {
            return Err(unexpected());
        }
        Ok(series)
    }
}

struct List<'f> {
    family: &'f str,
}

impl<'de> DeserializeSeed<'de> for List<'_> {
    type Value = Vec<Series>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<Series>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for List<'_> {
    type Value = Vec<Series>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of series")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Series>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(one) = seq.next_element::<One<'de>>()? {
            let mut labels: Vec<(&str, &str)> = one
                .metric
                .0
                .iter()
                .filter(|(k, _)| k.0 != "__name__")
                .map(|(k, v)| (k.0.as_ref(), v.0.as_ref()))
                .collect();
            labels.sort_unstable_by(|a, b| a.0.cmp(b.0));
            if labels.windows(2).any(|w| w[0].0 == w[1].0) {
                return Err(de::Error::custom("a repeated label"));
            }
            let mut text = String::with_capacity(64 * labels.len());
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                let _ = write!(text, "{k}=\"");
                for c in v.chars() {
                    match c {
                        '\\' => text.push_str("\\\\"),
                        '"' => text.push_str("\\\""),
                        '\n' => text.push_str("\\n"),
                        c => text.push(c),
                    }
                }
                text.push('"');
            }
            let samples = one
                .values
                .iter()
                .map(|(t, v)| v.0.parse::<f64>().map(|v| (*t, v)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(de::Error::custom)?;
            out.push(Series {
                text: format!("{}{{{text}}}", self.family),
                labels: text,
                samples,
            });
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
    values: Vec<(f64, Str<'a>)>,
}

/// A string borrowed from the answer unless it holds escapes (serde's `Cow<str>` always
/// copies). Also read by the instant-vector reader (`prometheus::stream`).
pub(crate) struct Str<'a>(pub(crate) Cow<'a, str>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Str<'a> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

/// A series' labels in answer order, names and values borrowed where they can be.
pub(crate) struct Labels<'a>(pub(crate) Vec<(Str<'a>, Str<'a>)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Labels<'a> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Labels<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a label map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Labels<'de>, A::Error> {
                let mut labels = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some(entry) = map.next_entry()? {
                    labels.push(entry);
                }
                Ok(Labels(labels))
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::prometheus::{add_matrix, parse_answer};
    use crate::telemetry::trace::{ReadOptions, TraceBuilder};

    const ANSWER: &str = r#"{"status":"success","data":{"resultType":"matrix","result":[
        {"metric":{"__name__":"DCGM_FI_DEV_FB_USED","pod":"p\"1","UUID":"GPU-1","namespace":"ml","modelName":"NVIDIA L4"},
         "values":[[1793577600,"30000"],[1793577630.5,"NaN"],[1793577660,"31000"]]},
        {"metric":{"UUID":"GPU-2","namespace":"ml","pod":"q\\n","modelName":"NVIDIA L4"},
         "values":[[1793577600,"1e3"]]}]}}"#;

    fn by_generic(body: &str, family: &str) -> crate::telemetry::trace::Trace {
        let mut b = TraceBuilder::new(&ReadOptions::default());
        add_matrix(&mut b, family, parse_answer(200, body.as_bytes()).unwrap()).unwrap();
        b.finish("test").unwrap()
    }

    fn by_stream(body: &str, family: &str) -> crate::telemetry::trace::Trace {
        let mut b = TraceBuilder::new(&ReadOptions::default());
        for s in parse(body.as_bytes(), family).expect("streamed") {
            for (t, v) in s.samples {
                b.add(&crate::telemetry::openmetrics::RawSample {
                    metric: family,
                    series: &s.text,
                    labels: &s.labels,
                    value: v,
                    timestamp: t,
                    line: 0,
                })
                .unwrap();
            }
        }
        b.finish("test").unwrap()
    }

    #[test]
    fn the_streamed_matrix_reads_as_the_generic_one() {
        let family = "DCGM_FI_DEV_FB_USED";
        let (a, b) = (by_generic(ANSWER, family), by_stream(ANSWER, family));
        assert_eq!(a.gpus.len(), 2);
        assert_eq!(format!("{:?}", a.gpus), format!("{:?}", b.gpus));
        assert_eq!(a.samples, b.samples);
        let s = parse(ANSWER.as_bytes(), family).unwrap();
        assert_eq!(
            s[0].text,
            r#"DCGM_FI_DEV_FB_USED{UUID="GPU-1",modelName="NVIDIA L4",namespace="ml",pod="p\"1"}"#
        );
        assert!(s[0].samples[1].1.is_nan());
    }

    #[test]
    fn anything_unexpected_is_left_to_the_generic_reader() {
        for body in [
            r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
            r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
            r#"{"data":{"resultType":"matrix","result":[]},"status":"success"}"#,
            r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"1","a":"2"},"values":[]}]}}"#,
            r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"x"]]}]}}"#,
            r#"{"status":"success","data":{"resultType":"matrix","result":[]}} trailing"#,
            "not json",
        ] {
            assert_eq!(parse(body.as_bytes(), "X"), None, "{body}");
        }
        assert_eq!(
            parse(
                br#"{"status":"success","data":{"resultType":"matrix","result":[]},"warnings":["w"]}"#,
                "X"
            ),
            Some(vec![])
        );
    }
}
