//! The plain-HTTP admin port of both servers (the controller's `--listen`, the webhook's
//! `--probe-listen`): `GET /healthz` (the process serves), `GET /readyz` (ready for
//! traffic: what "ready" means is the caller's) and `GET /metrics`. Nothing else is
//! served there: the webhook's `/validate` never is (any pod could ask it for
//! decisions), the controller merges in Slack's interactivity endpoint when configured.

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;

/// Whether the process is ready; `Err` carries the body of the 503.
pub type Readiness = Arc<dyn Fn() -> Result<(), &'static str> + Send + Sync>;

/// The `/metrics` answer.
pub type Exposition = Arc<dyn Fn() -> Response + Send + Sync>;

/// `/healthz`, `/readyz` and `/metrics`.
pub fn router(ready: Readiness, metrics: Exposition) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let answer = ready();
                async move {
                    match answer {
                        Ok(()) => (StatusCode::OK, "ok").into_response(),
                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let answer = metrics();
                async move { answer }
            }),
        )
}

/// The OpenMetrics text of `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// `text` with the OpenMetrics content type (what the webhook serves).
pub fn openmetrics(text: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `text` as `text/plain; charset=utf-8` (what the controller has always served; the text
/// is OpenMetrics all the same).
pub fn plain(text: String) -> Response {
    text.into_response()
}
