//! Telemetry: where GPU activity comes from, and what is kept of it.
//!
//! Recorded: OpenMetrics text (DCGM exporter and kube-state-metrics series) read by a
//! streaming parser (`openmetrics`) or `dcgmi dmon` CSV (`dmon`), bucketed into a `trace`;
//! `openmetrics_writer` writes one back (`export`). Live: `prometheus`, the HTTP source
//! of the controller, `explain`, `audit`, `export` and `backtest --prometheus-url` (any
//! PromQL API; its client is the only IO here), whose answers are read by the pure
//! `prometheus::answer` and `matrix` into the same trace builder; `coverage` says what a
//! history read lacks; `live` keeps every GPU's activity trackers between the
//! controller's cycles, fed by `prometheus::live`'s incremental reads. `replay` serves a
//! trace or activity patterns back as a dcgm-exporter page. The rest is pure and takes
//! readers, bytes or samples; files, servers and the clock belong to the callers
//! (`commands`, the controller).

pub mod coverage;
pub mod dmon;
pub mod live;
pub mod matrix;
pub mod openmetrics;
pub mod openmetrics_writer;
pub mod prometheus;
pub mod replay;
pub mod trace;
