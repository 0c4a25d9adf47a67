//! Reports: turning backtest (and later audit) results into a table for people, JSON and
//! CSV for tools, and an SVG timeline. Pure string building; the CLI edge writes files.

pub mod audit;
pub mod backtest;
pub mod render;
pub mod svg;
