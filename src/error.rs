//! Typed errors with a metric-safe label. Every message names what was wrong and, where
//! it can, how to fix it.

use std::path::PathBuf;

use crate::api::validate::InvalidResource;
use crate::telemetry::openmetrics::TraceError;

/// Errors of gpu-reaper's commands.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A policy or attestation document failed validation.
    #[error("{0}")]
    InvalidResource(#[from] InvalidResource),
    /// A telemetry trace could not be read.
    #[error("{0}")]
    Trace(#[from] TraceError),
    /// Prometheus could not answer.
    #[error("{0}")]
    Prometheus(#[from] crate::telemetry::prometheus::PrometheusError),
    /// A history from Prometheus lacks series a backtest needs (which, and what to install).
    #[error("{0}")]
    MissingSeries(#[from] crate::telemetry::coverage::MissingSeries),
    /// `audit --check` found problems (already printed).
    #[error("{0} telemetry check(s) failed")]
    NotReady(usize),
    /// A command-line value is wrong.
    #[error("--{flag}: {message}")]
    InvalidArgument { flag: &'static str, message: String },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Serialising output failed.
    #[error("could not serialise output: {0}")]
    Serialize(String),
    /// A call to the Kubernetes API failed.
    #[error("{action}: {source}")]
    Kube { action: String, source: kube::Error },
    /// `check` denied objects (already printed).
    #[error("the budget gate denied {0} object(s)")]
    Denied(usize),
    /// The webhook could not start or stopped.
    #[error("webhook: {0}")]
    Webhook(String),
    /// The webhook's serving certificate could not be loaded.
    #[error("webhook: {}", chain(.0))]
    Certificate(#[from] crate::admission::server::CertError),
    /// The controller could not start or evaluate.
    #[error("controller: {0}")]
    Controller(String),
}

impl From<serde_yaml::Error> for Error {
    fn from(e: serde_yaml::Error) -> Self {
        Error::Serialize(e.to_string())
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Serialize(e.to_string())
    }
}

impl Error {
    /// Process exit code: 2 for bad input the user can fix, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::InvalidResource(_)
            | Error::Trace(_)
            | Error::InvalidArgument { .. }
            | Error::MissingSeries(_) => 2,
            // Files named by --tls-cert/--tls-key that are missing or wrong: the user's fix.
            Error::Certificate(e) => {
                use crate::admission::server::CertError;
                if matches!(e, CertError::Poisoned | CertError::Config(_)) {
                    1
                } else {
                    2
                }
            }
            Error::Io { .. }
            | Error::Serialize(_)
            | Error::Prometheus(_)
            | Error::NotReady(_)
            | Error::Kube { .. }
            | Error::Denied(_)
            | Error::Webhook(_)
            | Error::Controller(_) => 1,
        }
    }
}

/// Result with gpu-reaper's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error with its causes, so "connection refused" is not lost behind "request failed".
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
