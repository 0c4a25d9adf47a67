//! Writing OpenMetrics text with timestamps: the inverse of [`super::openmetrics`]. What
//! `gpu-reaper export` writes, and what `backtest --trace` and `promtool tsdb
//! create-blocks-from openmetrics` read back. Pure: it writes to any [`Write`].
//!
//! Every family is declared a gauge (each family gpu-reaper reads is one: a counter would
//! need OpenMetrics' `_total` naming). Values and timestamps are written in Rust's
//! shortest round-trip form, so reading the file gives back the very same `f64`s.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::{self, Write};

use super::openmetrics::RawSample;

/// Writes samples as OpenMetrics text, family by family.
pub struct OpenMetricsWriter<W: Write> {
    out: W,
    /// The family being written (its `# TYPE` line is out).
    family: String,
    /// Families already written and closed: OpenMetrics forbids meeting one again.
    closed: HashSet<String>,
    line: String,
    samples: u64,
}

impl<W: Write> OpenMetricsWriter<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            family: String::new(),
            closed: HashSet::new(),
            line: String::with_capacity(512),
            samples: 0,
        }
    }

    /// Writes one sample: `metric{labels} value timestamp`. `labels` is the text between
    /// the braces as [`super::openmetrics::read_samples`] hands it over (already escaped).
    /// A family's samples must come together; one that comes back after another family is
    /// refused rather than written into a file promtool would reject.
    pub fn write(&mut self, s: &RawSample<'_>) -> io::Result<()> {
        if s.metric != self.family {
            if self.closed.contains(s.metric) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "samples of {} come after those of another family: OpenMetrics needs a family's samples together",
                        s.metric
                    ),
                ));
            }
            if !self.family.is_empty() {
                self.closed.insert(std::mem::take(&mut self.family));
            }
            self.family.push_str(s.metric);
            writeln!(self.out, "# TYPE {} gauge", s.metric)?;
        }
        self.line.clear();
        self.line.push_str(s.metric);
        if !s.labels.is_empty() {
            let _ = write!(self.line, "{{{}}}", s.labels);
        }
        self.line.push(' ');
        push_float(&mut self.line, s.value);
        self.line.push(' ');
        push_float(&mut self.line, s.timestamp);
        self.line.push('\n');
        self.out.write_all(self.line.as_bytes())?;
        self.samples += 1;
        Ok(())
    }

    /// Samples written so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Ends the text with `# EOF` and hands back the output, flushed.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.write_all(b"# EOF\n")?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// A number as OpenMetrics spells it: `NaN`, `+Inf`, `-Inf`, else the shortest decimal
/// that reads back as the same `f64` (never an exponent).
fn push_float(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v == f64::INFINITY {
        out.push_str("+Inf");
    } else if v == f64::NEG_INFINITY {
        out.push_str("-Inf");
    } else {
        let _ = write!(out, "{v}");
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufReader, Read as _};

    use super::*;
    use crate::telemetry::openmetrics::read_samples;
    use crate::telemetry::trace::{ReadOptions, read_trace};

    /// (metric, labels, value bits, timestamp bits) of every sample in `text`.
    fn samples_of(text: &[u8]) -> Vec<(String, String, u64, u64)> {
        let mut out = Vec::new();
        read_samples(text, "t.om", |s| {
            out.push((
                s.metric.to_string(),
                s.labels.to_string(),
                s.value.to_bits(),
                s.timestamp.to_bits(),
            ));
            Ok(())
        })
        .unwrap();
        out
    }

    /// Reads `text` and writes every sample back out.
    fn rewrite(text: &[u8]) -> Vec<u8> {
        let mut writer = OpenMetricsWriter::new(Vec::new());
        read_samples(text, "t.om", |s| writer.write(s).map_err(|e| e.to_string())).unwrap();
        writer.finish().unwrap()
    }

    #[test]
    fn written_samples_read_back_bit_for_bit() {
        let text = concat!(
            "# TYPE DCGM_FI_DEV_FB_USED gauge\n",
            "DCGM_FI_DEV_FB_USED{UUID=\"GPU-1\",pod=\"p\\\"1\",note=\"a\\\\b\\nc}\"} 74166 1793577600\n",
            "DCGM_FI_DEV_FB_USED{UUID=\"GPU-1\",pod=\"p\\\"1\",note=\"a\\\\b\\nc}\"} NaN 1793577630.5\n",
            "DCGM_FI_DEV_FB_USED{UUID=\"GPU-2\"} 0.1 1793577600.123\n",
            "# TYPE up gauge\n",
            "up +Inf 1793577600\n",
            "up -Inf 1793577660\n",
            "up 1e-7 1793577720\n",
            "up 12345678901234567890 1793577780\n",
            "up -0.000001 1793577840\n",
            "# EOF\n",
        );
        let written = rewrite(text.as_bytes());
        assert_eq!(samples_of(&written), samples_of(text.as_bytes()));
        assert_eq!(samples_of(&written).len(), 8);
        let written = String::from_utf8(written).unwrap();
        assert!(written.ends_with("\n# EOF\n"), "{written}");
        assert_eq!(written.matches("# TYPE up gauge\n").count(), 1, "{written}");
        assert!(
            written.contains("\nup 0.0000001 1793577720\n"),
            "no exponent: {written}"
        );
    }

    #[test]
    fn a_series_without_labels_is_written_without_braces() {
        let mut writer = OpenMetricsWriter::new(Vec::new());
        writer
            .write(&RawSample {
                metric: "up",
                series: "up{}",
                labels: "",
                value: 1.0,
                timestamp: 1_700_000_000.0,
                line: 0,
            })
            .unwrap();
        assert_eq!(
            String::from_utf8(writer.finish().unwrap()).unwrap(),
            "# TYPE up gauge\nup 1 1700000000\n# EOF\n"
        );
    }

    #[test]
    fn a_family_met_again_after_another_is_refused() {
        let mut writer = OpenMetricsWriter::new(Vec::new());
        let sample = |metric| RawSample {
            metric,
            series: metric,
            labels: "",
            value: 1.0,
            timestamp: 1.0,
            line: 0,
        };
        writer.write(&sample("a")).unwrap();
        writer.write(&sample("a")).unwrap();
        writer.write(&sample("b")).unwrap();
        let e = writer.write(&sample("a")).unwrap_err();
        assert!(e.to_string().contains("samples of a come after"), "{e}");
        assert_eq!(writer.samples(), 3);
    }

    #[test]
    fn the_bundled_trace_written_out_reads_as_the_same_trace() {
        // The whole path backtest takes: samples → text → trace, against the original.
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(crate::backtest::samples::SAMPLE_TRACE_GZ)
            .read_to_end(&mut text)
            .unwrap();
        let written = rewrite(&text);
        let options = ReadOptions::default();
        let before = read_trace(BufReader::new(&text[..]), "sample", &options).unwrap();
        let after = read_trace(BufReader::new(&written[..]), "written", &options).unwrap();
        assert!(before.gpus.len() > 10 && before.pods.len() > 10);
        assert_eq!(after.samples, before.samples);
        assert_eq!(
            (after.first_bucket, after.last_bucket),
            (before.first_bucket, before.last_bucket)
        );
        assert_eq!(format!("{:?}", after.gpus), format!("{:?}", before.gpus));
        assert_eq!(format!("{:?}", after.pods), format!("{:?}", before.pods));
        assert_eq!(after.waiting_reasons, before.waiting_reasons);
        assert_eq!(
            format!("{:?}", sorted(&after.replicaset_owners)),
            format!("{:?}", sorted(&before.replicaset_owners))
        );
        assert_eq!(samples_of(&written), samples_of(&text));
    }

    fn sorted<K: Ord + Clone, V: Clone>(
        map: &std::collections::HashMap<K, V>,
    ) -> std::collections::BTreeMap<K, V> {
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}
