//! `dcgmi dmon` CSV exports as a trace: a header naming DCGM field short names
//! (`EntityId,GRACT,FBUSD,TimeStamp`, as in MIGProfiler's traces), one row per GPU entity
//! and sample. Each entity becomes one GPU held by a bare pod named after the file (no
//! workload metadata exists in such a file), so `backtest` replays it like a recorded
//! exporter. Streaming, like the OpenMetrics reader: one row in memory at a time.

use std::fmt::Write as _;
use std::io::BufRead;

use super::openmetrics::{RawSample, TraceError};
use super::trace::{ReadOptions, Trace, TraceBuilder};

/// DCGM field short names `dcgmi dmon` prints, and the exporter family each becomes.
const FIELDS: &[(&str, &str)] = &[
    ("GRACT", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    ("GPUTL", "DCGM_FI_DEV_GPU_UTIL"),
    ("FBUSD", "DCGM_FI_DEV_FB_USED"),
    ("POWER", "DCGM_FI_DEV_POWER_USAGE"),
    ("PCIRX", "DCGM_FI_PROF_PCIE_RX_BYTES"),
];

/// Whether `first_line` is a `dcgmi dmon` CSV header (`EntityId,…,TimeStamp`).
pub fn is_dmon_header(first_line: &[u8]) -> bool {
    let line = String::from_utf8_lossy(first_line);
    let mut columns = line.trim().split(',').map(str::trim);
    columns.next() == Some("EntityId") && line.contains("TimeStamp")
}

/// Where the rows of a dmon file belong: the namespace and pod holding its GPUs, and the
/// GPU model (absent from the file).
#[derive(Debug, Clone)]
pub struct DmonIdentity {
    pub namespace: String,
    pub pod: String,
    pub model: String,
}

impl DmonIdentity {
    /// A bare pod in namespace `dmon` named after the file's stem (lower case, `-`
    /// for anything a pod name cannot hold).
    pub fn for_file(path: &str) -> Self {
        let stem = std::path::Path::new(path)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut pod: String = stem
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        pod.truncate(63);
        let pod = pod.trim_matches('-').to_string();
        Self {
            namespace: "dmon".into(),
            pod: if pod.is_empty() { "dmon".into() } else { pod },
            model: "unknown".into(),
        }
    }
}

/// Reads a `dcgmi dmon` CSV into a trace, bucketing samples by `options.step_seconds`.
/// Errors name the file, the line and the column.
pub fn read_dmon<R: BufRead>(
    mut input: R,
    source: &str,
    options: &ReadOptions,
    identity: &DmonIdentity,
) -> Result<Trace, TraceError> {
    let fail = |line: u64, message: String| TraceError {
        source: source.to_string(),
        line,
        message,
    };
    let mut line = String::new();
    if input
        .read_line(&mut line)
        .map_err(|e| fail(0, e.to_string()))?
        == 0
    {
        return Err(fail(0, "empty file".into()));
    }
    let header: Vec<String> = line
        .trim()
        .split(',')
        .map(|c| c.trim().to_string())
        .collect();
    let column = |name: &str| header.iter().position(|c| c == name);
    let (Some(entity_col), Some(time_col)) = (column("EntityId"), column("TimeStamp")) else {
        return Err(fail(
            1,
            format!(
                "not a dcgmi dmon CSV header: {:?} (expected EntityId, field columns, TimeStamp)",
                line.trim()
            ),
        ));
    };
    let fields: Vec<(usize, &str)> = FIELDS
        .iter()
        .filter_map(|(short, family)| column(short).map(|i| (i, *family)))
        .collect();
    if !fields
        .iter()
        .any(|(_, f)| f.contains("GR_ENGINE") || f.contains("GPU_UTIL"))
    {
        return Err(fail(
            1,
            format!(
                "no activity column: a dmon trace needs GRACT (DCGM_FI_PROF_GR_ENGINE_ACTIVE, dcgmi dmon -e 1001) or GPUTL (-e 203); columns: {}",
                header.join(",")
            ),
        ));
    }
    let mut builder = TraceBuilder::new(options);
    let mut series = String::new();
    let mut labels = String::new();
    let mut line_no = 1u64;
    loop {
        line.clear();
        if input
            .read_line(&mut line)
            .map_err(|e| fail(line_no + 1, e.to_string()))?
            == 0
        {
            break;
        }
        line_no += 1;
        let row = line.trim();
        if row.is_empty() || row.starts_with('#') {
            continue;
        }
        let cells: Vec<&str> = row.split(',').map(str::trim).collect();
        let cell = |i: usize, name: &str| {
            cells.get(i).copied().ok_or_else(|| {
                fail(
                    line_no,
                    format!(
                        "{} columns, the header has {}: no {name}",
                        cells.len(),
                        header.len()
                    ),
                )
            })
        };
        let entity = cell(entity_col, "EntityId")?;
        if entity.is_empty() || !entity.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(fail(
                line_no,
                format!("EntityId {entity:?} is not a GPU id"),
            ));
        }
        let timestamp: f64 = cell(time_col, "TimeStamp")?.parse().map_err(|_| {
            fail(
                line_no,
                format!("TimeStamp {:?} is not unix seconds", cells[time_col]),
            )
        })?;
        labels.clear();
        let _ = write!(
            labels,
            "UUID=\"dmon-{}-{entity}\",gpu=\"{entity}\",modelName=\"{}\",namespace=\"{}\",pod=\"{}\"",
            identity.pod, identity.model, identity.namespace, identity.pod
        );
        for &(i, family) in &fields {
            let text = cell(i, header[i].as_str())?;
            // dmon prints N/A for a field the GPU does not report: a gap, not a zero.
            if text == "N/A" || text == "-" {
                continue;
            }
            let value: f64 = text
                .parse()
                .map_err(|_| fail(line_no, format!("{} {text:?} is not a number", header[i])))?;
            series.clear();
            let _ = write!(series, "{family}{{{labels}}}");
            builder
                .add(&RawSample {
                    metric: family,
                    series: &series,
                    labels: &labels,
                    value,
                    timestamp,
                    line: line_no,
                })
                .map_err(|message| fail(line_no, message))?;
        }
    }
    builder.finish(source)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Trace, TraceError> {
        read_dmon(
            text.as_bytes(),
            "t.csv",
            &ReadOptions::default(),
            &DmonIdentity::for_file("dir/Run_A100__x.csv"),
        )
    }

    #[test]
    fn rows_become_one_gpu_per_entity_held_by_a_pod_named_after_the_file() {
        let t = read(
            "EntityId,GRACT,FBUSD,TimeStamp\n0,0.000,3,1656776962\n1,0.5,900,1656776962\n0,0.800,3010,1656777030\n1,N/A,900,1656777030\n",
        )
        .unwrap();
        assert_eq!(t.gpus.len(), 2);
        let g0 = t
            .gpus
            .iter()
            .find(|g| g.gpu.id == "dmon-run-a100--x-0")
            .unwrap();
        assert_eq!(g0.gpu.pod, "run-a100--x");
        assert_eq!(g0.gpu.namespace, "dmon");
        let b = 1656776962 / 60;
        assert_eq!(g0.engine_active.get(b), Some(0.0));
        assert_eq!(g0.engine_active.get(b + 1), Some(0.8));
        assert_eq!(g0.fb_used.get(b + 1), Some(3010.0));
        // N/A is a gap, not a zero.
        let g1 = t.gpus.iter().find(|g| g.gpu.id.ends_with("-1")).unwrap();
        assert_eq!(g1.engine_active.get(b + 1), None);
        assert!(is_dmon_header(b"EntityId,GRACT,FBUSD,TimeStamp\n"));
        assert!(!is_dmon_header(b"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"));
    }

    #[test]
    fn bad_rows_name_the_line_and_column() {
        let e =
            read("EntityId,GRACT,TimeStamp\n0,0.1,1656776962\n0,lots,1656776963\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("GRACT \"lots\" is not a number"), "{e}");
        let e = read("EntityId,GRACT,TimeStamp\n0,0.1\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("no TimeStamp"), "{e}");
        let e = read("EntityId,FBUSD,TimeStamp\n0,3,1656776962\n").unwrap_err();
        assert!(e.message.contains("no activity column"), "{e}");
        let e = read("EntityId,GRACT,TimeStamp\n0,0.1,1656776963\n0,0.1,1656776962\n").unwrap_err();
        assert!(e.message.contains("go backwards"), "{e}");
        let e = read("").unwrap_err();
        assert!(e.message.contains("empty"), "{e}");
    }
}
