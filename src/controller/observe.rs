//! Observe (IO): what a cycle looks at.
//!
//! - [`cluster`]: GPU pods resolved to root workloads, their owners, the policies (each
//!   read on its own: one that cannot be used is set aside, see `policies`) and
//!   namespace labels — from the watches' stores when running, by listing (pages of
//!   500) with `--once`;
//! - [`telemetry`]: every GPU's samples since the previous cycle, read once for all
//!   policies (`telemetry::live`: one query per DCGM family, the horizon at start-up);
//! - [`backfill`]: the activity history replayed into the idle spans of the policies
//!   evaluated for the first time, together, one piece of the range at a time.

use std::collections::{BTreeMap, HashMap};

use jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams};

use super::context::Context;
use super::policies::{self, Policies, Unusable};
use crate::api::GpuPolicy;
use crate::cluster::inventory::{self, ObjectInfo, ObjectKey, Workload};
use crate::cluster::{discovery, snapshot};
use crate::engine::{Histories, Rules};
use crate::telemetry::live::LiveTelemetry;
use crate::telemetry::prometheus::{PrometheusError, Refreshed};
use crate::{Error, Result};

/// What one observation of the cluster found.
pub struct Observed {
    pub workloads: Vec<Workload>,
    pub owners: HashMap<ObjectKey, ObjectInfo>,
    /// The policies this gpu-reaper can use.
    pub policies: Vec<GpuPolicy>,
    /// The ones it cannot (a field that does not fit, a value it does not know): not
    /// evaluated, but their stand-ins still choose (`policies`).
    pub unusable: Vec<Unusable>,
    /// Namespace labels by name.
    pub namespaces: HashMap<String, BTreeMap<String, String>>,
}

pub(super) fn kube_err(action: &str) -> impl FnOnce(kube::Error) -> Error + '_ {
    move |source| Error::Kube {
        action: action.to_string(),
        source,
    }
}

/// GPU pods resolved to root workloads, policies, namespace labels.
pub async fn cluster(ctx: &Context, now: Timestamp) -> Result<Observed> {
    let (gpu_pods, owners, policies, namespaces) = match &ctx.caches {
        Some(caches) => caches.read(&ctx.settings.resources, now),
        None => list(ctx, now).await?,
    };
    let Policies { usable, unusable } = policies;
    Ok(Observed {
        workloads: inventory::resolve(gpu_pods, &owners),
        owners,
        policies: usable,
        unusable,
        namespaces,
    })
}

/// One listing of everything a cycle needs, in pages of 500.
#[allow(clippy::type_complexity)]
async fn list(
    ctx: &Context,
    now: Timestamp,
) -> Result<(
    Vec<inventory::PodInfo>,
    HashMap<ObjectKey, ObjectInfo>,
    Policies,
    HashMap<String, BTreeMap<String, String>>,
)> {
    let c = &ctx.client;
    let owner_resources = discovery::owner_resources(c, discovery::OWNER_KINDS).await;
    let (gpu_pods, owners) =
        snapshot::gpu_pods_and_owners(c, &ctx.settings.resources, &owner_resources, now).await?;
    // Untyped, each read on its own: one policy that does not fit is set aside, never
    // failing the list.
    let objects = snapshot::list_all_matching(
        &Api::<DynamicObject>::all_with(c.clone(), &ApiResource::erase::<GpuPolicy>(&())),
        &ctx.settings.policy_selector,
    )
    .await
    .map_err(kube_err("listing GpuPolicies"))?;
    let policies = policies::read_all(&objects);
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(c.clone())
        .list_metadata(&ListParams::default())
        .await
        .map_err(kube_err("listing namespaces"))?
        .items
        .into_iter()
        .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
        .collect();
    Ok((gpu_pods, owners, policies, namespaces))
}

/// One read of every GPU's samples since the previous cycle into `live`, whatever the
/// number of policies; each policy then takes its observations from memory.
pub async fn telemetry(
    ctx: &Context,
    live: &mut LiveTelemetry,
    rules: &[Rules],
    now: Timestamp,
) -> std::result::Result<Refreshed, PrometheusError> {
    let read = ctx
        .telemetry
        .refresh(live, rules, &ctx.settings.reads, now.as_second())
        .await;
    if let Ok(read) = &read {
        tracing::debug!(
            queries = read.queries,
            rebuilt = read.rebuilt,
            seconds = read.seconds_read,
            samples = read.samples,
            gpus = live.gpus(),
            "telemetry read"
        );
    }
    read
}

/// A policy whose idle-span history is backfilled this cycle.
pub struct Backfill<'a> {
    pub name: &'a str,
    pub rules: &'a Rules,
    pub history: &'a mut Histories<ObjectKey>,
}

/// Replays the last `--history-backfill` of activity into the histories of `policies`
/// (those that use one; spans older than each policy's `idle.history` are pruned), all
/// together: the range is read from Prometheus one piece (`--prometheus-chunk`) at a
/// time, oldest first, and each piece feeds every history before the next is read, so
/// one piece is held at a time, whatever the range and the number of policies. A piece
/// that cannot be read ends the backfill with a warning: what was fed is kept (the spans
/// in progress censored there) and the cycles learn the rest; the fixed durations decide
/// meanwhile.
pub async fn backfill(
    ctx: &Context,
    policies: &mut [Backfill<'_>],
    workloads: &[Workload],
    now: Timestamp,
) {
    let since = ctx.settings.history_backfill;
    if policies.is_empty() || since <= SignedDuration::ZERO {
        return;
    }
    let started = std::time::Instant::now();
    let options = crate::telemetry::trace::ReadOptions {
        workload_labels: ctx.settings.history_labels.clone(),
        step_seconds: super::backfill::STEP_SECONDS,
        skip_unknown_metrics: true,
    };
    let chunk = SignedDuration::try_from(ctx.telemetry.chunk()).unwrap_or(SignedDuration::MAX);
    let pieces = super::backfill::pieces(now - since, now, chunk);
    let mut stream = super::backfill::Stream::new(workloads);
    let mut read = 0;
    for &(from, until) in &pieces {
        match ctx
            .telemetry
            .fetch_families(
                from.as_second(),
                until.as_second(),
                &super::backfill::FAMILIES,
                &options,
            )
            .await
        {
            Ok(trace) => {
                read += 1;
                if let Some(trace) = trace {
                    let piece = stream.piece(&trace, from, until);
                    for p in policies.iter_mut() {
                        piece.feed(p.history, p.rules);
                    }
                }
            }
            Err(e) => {
                for p in policies.iter_mut() {
                    stream.interrupted(p.history, from);
                }
                let names: Vec<&str> = policies.iter().map(|p| p.name).collect();
                tracing::warn!(policies = ?names, error = %e, backfilled_from = %(now - since), failed_at = %from, "could not backfill all of the idle-span history; learning the rest from the cycles");
                break;
            }
        }
    }
    if read == 0 {
        return;
    }
    for p in policies.iter() {
        let added = stream.backfilled(p.history);
        tracing::info!(policy = p.name, from = %(now - since), pieces = read, seconds = started.elapsed().as_secs_f64(), workloads = added.workloads, spans = added.spans, "idle-span history backfilled from Prometheus");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::cluster::inventory::{pod_info, resolve};
    use crate::gpus::GpuResources;
    use crate::telemetry::trace::{ReadOptions, read_trace};

    const T0: i64 = 1_793_577_600;

    /// `ml/chat-0` busy 10 minutes of 13 from T0 on, a sample a minute.
    fn activity(t: i64) -> Option<f64> {
        (t >= T0).then(|| if (t - T0) / 60 % 13 < 10 { 0.8 } else { 0.0 })
    }

    /// A Prometheus that answers `FAMILY[Ns]` at `time` with `activity`'s samples in
    /// (time - N, time], records every (query, time), and refuses (400) the queries
    /// ending after `fail_after`.
    async fn prometheus(fail_after: i64) -> (String, Arc<Mutex<Vec<(String, i64)>>>) {
        use axum::body::Bytes;
        use axum::extract::State;
        type Asked = Arc<Mutex<Vec<(String, i64)>>>;
        async fn query(
            State((asked, fail_after)): State<(Asked, i64)>,
            body: Bytes,
        ) -> (axum::http::StatusCode, String) {
            let (mut q, mut time) = (String::new(), 0);
            for (k, v) in url::form_urlencoded::parse(&body) {
                match k.as_ref() {
                    "query" => q = v.into_owned(),
                    "time" => time = v.parse::<f64>().unwrap_or(0.0) as i64,
                    _ => {}
                }
            }
            asked.lock().unwrap().push((q.clone(), time));
            if time > fail_after {
                return (
                    axum::http::StatusCode::BAD_REQUEST,
                    r#"{"status":"error","errorType":"bad_data","error":"no"}"#.into(),
                );
            }
            let (family, range) = q.split_once('[').unwrap();
            let range: i64 = range.trim_end_matches("s]").parse().unwrap();
            let values: Vec<String> = (time - range + 1..=time)
                .filter(|t| t % 60 == 0)
                .filter_map(|t| Some(format!(r#"[{t},"{}"]"#, activity(t)?)))
                .collect();
            let result = if family == "DCGM_FI_PROF_GR_ENGINE_ACTIVE" && !values.is_empty() {
                format!(
                    r#"{{"metric":{{"__name__":"{family}","UUID":"GPU-chat","gpu":"0","modelName":"NVIDIA L4","namespace":"ml","pod":"chat-0"}},"values":[{}]}}"#,
                    values.join(",")
                )
            } else {
                String::new()
            };
            (
                axum::http::StatusCode::OK,
                format!(
                    r#"{{"status":"success","data":{{"resultType":"matrix","result":[{result}]}}}}"#
                ),
            )
        }
        let asked = Asked::default();
        let app = axum::Router::new()
            .route("/api/v1/query", axum::routing::post(query))
            .with_state((asked.clone(), fail_after));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, asked)
    }

    async fn context(prometheus: &str) -> Context {
        let config = crate::commands::controller::config_from_flags([
            "--prometheus-url",
            prometheus,
            "--history-backfill",
            "24h",
            "--prometheus-chunk",
            "2h",
        ])
        .unwrap();
        let kube = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        Context::test(kube::Client::try_from(kube).unwrap(), config).unwrap()
    }

    fn workloads(now: Timestamp) -> Vec<Workload> {
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "chat-0", "namespace": "ml", "creationTimestamp": "2026-11-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}});
        resolve(
            vec![pod_info(&pod, &GpuResources::default(), now).unwrap()],
            &HashMap::new(),
        )
    }

    /// Two policies' rules: the bundled sample's and a risk-gated one.
    fn two_rules() -> [Rules; 2] {
        let risky = crate::api::validate::parse_resource::<GpuPolicy>(
            include_str!("../../config/samples/inference-risk.yaml"),
            "inference-risk.yaml",
        )
        .unwrap();
        [
            Rules::from_spec(&crate::backtest::samples::sample_policy().unwrap().spec),
            Rules::from_spec(&risky.spec),
        ]
    }

    /// The day before `until` fed at once, as one read of it would.
    fn at_once(rules: &Rules, w: &[Workload], until: Timestamp) -> Histories<ObjectKey> {
        let mut s = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
        for t in (until.as_second() - 86_400..=until.as_second()).filter(|t| t % 60 == 0) {
            if let Some(v) = activity(t) {
                s.push_str(&format!(
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{UUID=\"GPU-chat\",gpu=\"0\",modelName=\"NVIDIA L4\",namespace=\"ml\",pod=\"chat-0\"}} {v} {t}\n"
                ));
            }
        }
        s.push_str("# EOF\n");
        let trace = read_trace(s.as_bytes(), "day", &ReadOptions::default()).unwrap();
        let mut history = Histories::new(rules.risk);
        crate::controller::backfill::feed(&mut history, &trace, w, rules, until);
        history
    }

    fn spans(h: &Histories<ObjectKey>, w: &[Workload]) -> Option<Vec<(i64, i64, bool)>> {
        h.get(&w[0].root.key()).map(|h| h.finished().collect())
    }

    #[tokio::test]
    async fn policies_backfilled_together_share_one_read_of_each_piece() {
        // The day before `now`: its first 4 hours before the exporter ran (empty pieces).
        let now = Timestamp::from_second(T0 + 20 * 3600 + 17).unwrap();
        let (url, asked) = prometheus(i64::MAX).await;
        let ctx = context(&url).await;
        let w = workloads(now);
        let rules = two_rules();
        let mut histories = [Histories::new(rules[0].risk), Histories::new(rules[1].risk)];
        let [a, b] = &mut histories;
        let mut policies = [
            Backfill {
                name: "a",
                rules: &rules[0],
                history: a,
            },
            Backfill {
                name: "b",
                rules: &rules[1],
                history: b,
            },
        ];
        backfill(&ctx, &mut policies, &w, now).await;
        // 13 pieces (the day does not start on a 2 h boundary), one query per family each,
        // whatever the number of policies; none longer than a chunk and its early second.
        let asked = asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 13 * 2, "{asked:#?}");
        assert!(
            asked.iter().all(|(q, _)| {
                let range: i64 = q
                    .split_once('[')
                    .unwrap()
                    .1
                    .trim_end_matches("s]")
                    .parse()
                    .unwrap();
                range <= 7201
            }),
            "{asked:#?}"
        );
        for (history, rules) in histories.iter().zip(&rules) {
            assert!(history.spans() > 50, "{}", history.spans());
            assert_eq!(spans(history, &w), spans(&at_once(rules, &w, now), &w));
        }
    }

    #[tokio::test]
    async fn a_piece_that_cannot_be_read_ends_the_backfill_keeping_what_was_fed() {
        let now = Timestamp::from_second(T0 + 20 * 3600 + 17).unwrap();
        let fails_from = T0 + 10 * 3600;
        let (url, asked) = prometheus(fails_from).await;
        let ctx = context(&url).await;
        let w = workloads(now);
        let rules = two_rules();
        let mut history = Histories::new(rules[1].risk);
        let mut policies = [Backfill {
            name: "b",
            rules: &rules[1],
            history: &mut history,
        }];
        backfill(&ctx, &mut policies, &w, now).await;
        // The first refused query is the last one asked.
        let asked = asked.lock().unwrap().clone();
        let refused = asked.iter().position(|(_, t)| *t > fails_from).unwrap();
        assert_eq!(refused, asked.len() - 1, "{asked:#?}");
        // What the pieces before it held (the day up to 10:00) is kept, the span in
        // progress at 10:00 censored there, as the day up to 10:00 fed at once gives.
        let until = Timestamp::from_second(fails_from).unwrap();
        let mut expected = at_once(&rules[1], &w, until);
        expected.unobserved(&w[0].root.key(), until);
        assert!(history.spans() > 30, "{}", history.spans());
        assert_eq!(spans(&history, &w), spans(&expected, &w));
        assert_eq!(
            history.get(&w[0].root.key()).and_then(|h| h.open_since()),
            None
        );
    }
}
