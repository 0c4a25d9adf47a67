//! Whole-trace replays that need no server but take half a minute in a debug build:
//! backtest and its sweep on synthetic and production traces, the controller and the
//! backtest planning alike. Apart from tests/pure.rs to keep the fast tier fast.

mod decision_quality;
