//! Telemetry: where GPU activity comes from. Today: OpenMetrics text files (recorded DCGM
//! exporter and kube-state-metrics series) read by a streaming parser, and the trace they
//! form. The live Prometheus source joins this room.

pub mod coverage;
pub mod dmon;
pub mod live;
pub mod matrix;
pub mod openmetrics;
pub mod openmetrics_writer;
pub mod prometheus;
pub mod replay;
pub mod trace;
