//! A streaming reader of OpenMetrics / Prometheus text with timestamps — the format
//! `promtool tsdb create-blocks-from openmetrics` reads. It hands each sample to a
//! callback without allocating per line, so files of hundreds of MB stream through in
//! constant memory. Every error names the file and line.

use std::fmt;
use std::io::BufRead;

/// A trace that could not be read.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceError {
    /// File (or `<embedded sample>`).
    pub source: String,
    /// 1-based line number; 0 when the error is about the whole file.
    pub line: u64,
    pub message: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.source, self.message)
        } else {
            write!(f, "{}:{}: {}", self.source, self.line, self.message)
        }
    }
}

impl std::error::Error for TraceError {}

/// One sample line, borrowed from the reader's buffer.
#[derive(Debug, Clone, Copy)]
pub struct RawSample<'a> {
    /// Metric name.
    pub metric: &'a str,
    /// `name{labels}` exactly as written: the series' identity within the file.
    pub series: &'a str,
    /// The text between the braces (empty when there are no labels).
    pub labels: &'a str,
    pub value: f64,
    /// Seconds since the Unix epoch.
    pub timestamp: f64,
    pub line: u64,
}

/// Reads samples from `input`, calling `on_sample` for each. Comment lines (`# HELP`,
/// `# TYPE`, `# UNIT`, `# EOF`) are skipped; exemplars are ignored. Timestamps above 1e11
/// are taken as milliseconds (Prometheus text format), others as seconds (OpenMetrics).
pub fn read_samples<R: BufRead>(
    mut input: R,
    source: &str,
    mut on_sample: impl FnMut(&RawSample<'_>) -> Result<(), String>,
) -> Result<u64, TraceError> {
    let mut buf = String::with_capacity(512);
    // Samples of a series are usually consecutive: when a line starts with the previous
    // line's `name{labels}`, skip re-scanning the label set.
    let mut prev_series = String::with_capacity(512);
    let mut line_no = 0u64;
    let mut samples = 0u64;
    let err = |line: u64, message: String| TraceError {
        source: source.to_string(),
        line,
        message,
    };
    loop {
        buf.clear();
        let n = input
            .read_line(&mut buf)
            .map_err(|e| err(line_no + 1, format!("cannot read: {e}")))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let line = buf.trim_end_matches(['\n', '\r']);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let known = prev_series.len();
        let same_series = known > 0
            && line.len() > known
            && line.as_bytes()[known] == b' '
            && line.starts_with(prev_series.as_str());
        let sample = if same_series {
            parse_rest(line, known, line_no)
        } else {
            parse_line(line, line_no)
        }
        .map_err(|m| err(line_no, m))?;
        if !same_series {
            prev_series.clear();
            prev_series.push_str(sample.series);
        }
        on_sample(&sample).map_err(|m| err(line_no, m))?;
        samples += 1;
    }
    Ok(samples)
}

fn parse_line(line: &str, line_no: u64) -> Result<RawSample<'_>, String> {
    let name_end = line.find(['{', ' ']).ok_or_else(|| {
        format!(
            "expected `name{{labels}} value timestamp`, got {:?}",
            clip(line)
        )
    })?;
    let metric = &line[..name_end];
    if !is_metric_name(metric) {
        return Err(format!("invalid metric name {:?}", clip(metric)));
    }
    let series_end = if line.as_bytes()[name_end] == b'{' {
        let close =
            find_label_end(&line[name_end + 1..]).ok_or("unterminated label set: missing `}`")?;
        name_end + close + 2
    } else {
        name_end
    };
    parse_rest(line, series_end, line_no)
}

/// Parses the value and timestamp after the series part `line[..series_end]`.
fn parse_rest(line: &str, series_end: usize, line_no: u64) -> Result<RawSample<'_>, String> {
    let series = &line[..series_end];
    let (metric, labels) = match series.find('{') {
        Some(open) => (&series[..open], &series[open + 1..series.len() - 1]),
        None => (series, ""),
    };
    let rest = &line[series_end..];
    let rest = match rest.find(" # ") {
        Some(i) => &rest[..i],
        None => rest,
    };
    let mut fields = rest.split_ascii_whitespace();
    let value_text = fields.next().ok_or("missing sample value")?;
    let value = parse_float(value_text)
        .ok_or_else(|| format!("invalid sample value {:?}", clip(value_text)))?;
    let ts_text = fields
        .next()
        .ok_or("sample has no timestamp; backtest needs recorded samples with timestamps (OpenMetrics: `name{labels} value <unix seconds>`)")?;
    let mut timestamp = parse_float(ts_text)
        .filter(|t| t.is_finite())
        .ok_or_else(|| format!("invalid timestamp {:?}", clip(ts_text)))?;
    if timestamp > 1e11 {
        timestamp /= 1000.0;
    }
    if let Some(extra) = fields.next() {
        return Err(format!("unexpected {:?} after the timestamp", clip(extra)));
    }
    Ok(RawSample {
        metric,
        series,
        labels,
        value,
        timestamp,
        line: line_no,
    })
}

fn parse_float(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Index of the `}` closing a label set, skipping quoted values with escapes.
fn find_label_end(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut in_quotes = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if in_quotes => i += 1,
            b'"' => in_quotes = !in_quotes,
            b'}' if !in_quotes => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// Parses `a="x",b="y"` into pairs, unescaping `\\`, `\"` and `\n`.
pub fn parse_labels(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let eq = rest
            .find('=')
            .ok_or_else(|| format!("label without `=` in {{{}}}", clip(text)))?;
        let name = rest[..eq].trim();
        if !is_metric_name(name) || name.contains(':') {
            return Err(format!("invalid label name {:?}", clip(name)));
        }
        let after = rest[eq + 1..].trim_start();
        let body = after
            .strip_prefix('"')
            .ok_or_else(|| format!("label {name}: value must be quoted"))?;
        let mut value = String::new();
        let mut chars = body.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => break,
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = end.ok_or_else(|| format!("label {name}: unterminated value"))?;
        out.push((name.to_string(), value));
        rest = body[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Ok(out)
}

fn clip(s: &str) -> &str {
    match s.char_indices().nth(80) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(text: &str) -> Result<Vec<(String, String, f64, f64)>, TraceError> {
        let mut out = vec![];
        read_samples(text.as_bytes(), "t.om", |s| {
            out.push((
                s.metric.to_string(),
                s.labels.to_string(),
                s.value,
                s.timestamp,
            ));
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn samples_with_labels_values_and_timestamps_are_read() {
        let got = collect(
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\",modelName=\"Tesla T4\"} 91 1700000000\n# EOF\n",
        )
        .unwrap();
        assert_eq!(
            got,
            vec![(
                "DCGM_FI_DEV_GPU_UTIL".into(),
                "gpu=\"0\",modelName=\"Tesla T4\"".into(),
                91.0,
                1.7e9
            )]
        );
    }

    #[test]
    fn millisecond_timestamps_of_the_prometheus_text_format_are_converted() {
        let got = collect("up 1 1700000000123\n").unwrap();
        assert!((got[0].3 - 1_700_000_000.123).abs() < 1e-6);
    }

    #[test]
    fn a_sample_without_timestamp_names_file_and_line() {
        let e = collect("# TYPE up gauge\nup 1\n").unwrap_err();
        assert_eq!((e.source.as_str(), e.line), ("t.om", 2));
        assert!(
            e.to_string().starts_with("t.om:2: sample has no timestamp"),
            "{e}"
        );
    }

    #[test]
    fn garbage_lines_get_a_line_numbered_error() {
        for bad in [
            "up{a=\"1\" 1 2",
            "up{a=\"1\"} one 2",
            "9up 1 2",
            "up 1 2 3",
            "up",
        ] {
            let e = collect(&format!("up 1 1\n{bad}\n")).unwrap_err();
            assert_eq!(e.line, 2, "{bad}: {e}");
        }
    }

    #[test]
    fn label_values_are_unescaped_and_may_contain_braces() {
        let labels = parse_labels(r#"a="x\"y}",b="line\nnext",c="back\\slash""#).unwrap();
        assert_eq!(labels[0], ("a".into(), "x\"y}".into()));
        assert_eq!(labels[1].1, "line\nnext");
        assert_eq!(labels[2].1, "back\\slash");
        assert!(parse_labels("a=unquoted").is_err());
        assert!(parse_labels("a=\"open").is_err());
    }

    #[test]
    fn consecutive_series_of_equal_length_are_told_apart() {
        let got = collect("a{x=\"1\"} 1 10\na{x=\"1\"} 2 20\na{x=\"2\"} 3 10\na{x=\"2\"} 4 20\n")
            .unwrap();
        let labels: Vec<_> = got.iter().map(|s| (s.1.as_str(), s.2)).collect();
        assert_eq!(
            labels,
            [
                ("x=\"1\"", 1.0),
                ("x=\"1\"", 2.0),
                ("x=\"2\"", 3.0),
                ("x=\"2\"", 4.0)
            ]
        );
    }

    #[test]
    fn callback_errors_carry_the_line() {
        let e = read_samples("a 1 1\nb 1 1\n".as_bytes(), "f", |s| {
            if s.metric == "b" {
                Err("nope".into())
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "f:2: nope");
    }
}
