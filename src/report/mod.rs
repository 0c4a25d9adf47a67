//! Reports, PURE: backtest results as a table for people, JSON and CSV for tools, and an
//! SVG timeline; the audit's attribution, summary and readiness checklist. Files, the
//! cluster and Prometheus are the commands' edges (`commands::backtest`, `commands::audit`).

pub mod audit;
pub mod explain;
pub mod render;
pub mod svg;

/// How a report is written: a table for people, JSON or CSV for tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Table,
    Json,
    Csv,
}
