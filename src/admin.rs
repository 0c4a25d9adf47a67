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

/// `text` with the OpenMetrics content type (what prometheus-client encodes; the
/// controller and the webhook both serve it so).
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    async fn get(app: &Router, path: &str) -> (StatusCode, Option<String>, String) {
        let request = Request::builder().uri(path).body(Body::empty()).unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    #[tokio::test]
    async fn readyz_answers_what_the_caller_says_and_metrics_what_it_encodes() {
        let ready = Arc::new(AtomicBool::new(false));
        let flag = ready.clone();
        let app = router(
            Arc::new(move || {
                if flag.load(Ordering::Relaxed) {
                    Ok(())
                } else {
                    Err("not yet")
                }
            }),
            Arc::new(|| openmetrics("# EOF\n".into())),
        );
        assert_eq!(get(&app, "/healthz").await.2, "ok");
        let (status, _, body) = get(&app, "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "not yet")
        );
        ready.store(true, Ordering::Relaxed);
        let (status, _, body) = get(&app, "/readyz").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
        let (status, content_type, body) = get(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            content_type.as_deref(),
            Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
        );
        assert_eq!(body, "# EOF\n");
        assert_eq!(get(&app, "/validate").await.0, StatusCode::NOT_FOUND);
    }
}
