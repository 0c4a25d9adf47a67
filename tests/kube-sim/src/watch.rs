//! Watch streams: newline-delimited JSON events (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR)
//! from a resourceVersion, with initial events (`resourceVersion` unset or "0", or
//! `sendInitialEvents=true`), periodic bookmarks, `timeoutSeconds`, selectors,
//! metadata-only objects, 410 Gone for compacted versions, and fault-injected drops.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::Shared;
use crate::http::{Body, Representation, Req, Target, metadata_only};
use crate::objects;
use crate::read::selectors;
use crate::status::ApiError;
use crate::store::{Event, EventKind};

/// Longest watch the server keeps open when the client asks for none.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

type Chunk = Result<Frame<Bytes>, std::io::Error>;

fn line(event_type: &str, object: &Value) -> Bytes {
    let mut bytes =
        serde_json::to_vec(&json!({"type": event_type, "object": object})).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// Starts a watch; the response body streams until timeout, drop, or client hang-up.
pub fn watch(shared: &Arc<Shared>, req: &Req, target: &Target) -> Result<Response<Body>, ApiError> {
    let (labels, mut fields) = selectors(req, target)?;
    if let Some(name) = &target.name {
        // Watch on a single object path (legacy /watch/<plural>/<name>).
        fields = crate::selectors::FieldSelector::parse(&format!("metadata.name={name}"), "", "")?;
    }
    let bookmarks = req.flag("allowWatchBookmarks");
    let send_initial = req.flag("sendInitialEvents");
    let timeout = req
        .param("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let representation = req.wants();
    let rv_param = req.param("resourceVersion").unwrap_or("0");
    let t = target.t.clone();
    let version = target.version.clone();
    let namespace = target.namespace.clone();
    let storage = crate::store::storage_key(&t.group, &t.plural);
    let matches = move |group: &str, resource: &str, ns: &str, object: &Value| {
        (group, resource) == (storage.0.as_str(), storage.1.as_str())
            && namespace.as_deref().is_none_or(|want| want == ns)
            && labels.matches(object)
            && fields.matches(object)
    };
    let t = target.t.clone();
    let render = move |object: &Value| -> Value {
        let object = objects::for_version(&t, &version, object.clone());
        match representation {
            Representation::Full => object,
            Representation::Metadata => metadata_only(&object),
            Representation::Table => {
                let rv = crate::store::object_rv(&object);
                crate::table::table(&t, std::slice::from_ref(&object), rv, None)
            }
        }
    };

    let (initial, past, receiver, start_rv) = {
        let state = shared.store.lock();
        if send_initial || rv_param == "0" {
            let initial: Vec<Arc<Value>> = state
                .list_shared(
                    &target.t.group,
                    &target.t.plural,
                    target.namespace.as_deref(),
                    None,
                )
                .filter(|((ns, _), o)| matches(&target.t.group, &target.t.plural, ns, o))
                .map(|(_, o)| o.clone())
                .collect();
            (
                initial,
                Vec::new(),
                state.subscribe(),
                state.resource_version(),
            )
        } else {
            let since: u64 = rv_param.parse().map_err(|_| {
                ApiError::bad_request(format!("invalid resourceVersion {rv_param:?}"))
            })?;
            match state.subscribe_since(since) {
                Ok((past, receiver)) => (Vec::new(), past, receiver, since),
                Err(gone) => {
                    let mut response = Response::new(
                        http_body_util::Full::new(line("ERROR", &gone.to_status()))
                            .map_err(|never| match never {})
                            .boxed(),
                    );
                    response.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    return Ok(response);
                }
            }
        }
    };

    let (tx, rx) = mpsc::channel::<Chunk>(256);
    let mut drops = shared.faults.drop_signal();
    drops.mark_unchanged();
    let bookmark_every = shared.config.bookmark_interval;
    let kind = target.t.kind.clone();
    let api_version = target.t.api_version(&target.version);
    let bookmark = move |rv: u64, initial_end: bool| {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        line(
            "BOOKMARK",
            &json!({"kind": kind, "apiVersion": api_version, "metadata": meta}),
        )
    };
    tokio::spawn(async move {
        let send = |bytes: Bytes| tx.send(Ok(Frame::data(bytes)));
        for object in &initial {
            if send(line("ADDED", &render(object))).await.is_err() {
                return;
            }
        }
        if send_initial && bookmarks && send(bookmark(start_rv, true)).await.is_err() {
            return;
        }
        let mut last_rv = start_rv;
        // Like the watch cache: an object moving into a selector is ADDED for this
        // watcher, one moving out is DELETED (with its previous content).
        let deliver = |event: &Event| -> Option<Bytes> {
            let now = matches(
                &event.group,
                &event.resource,
                &event.namespace,
                &event.object,
            );
            let before = event
                .old
                .as_ref()
                .map(|old| matches(&event.group, &event.resource, &event.namespace, old));
            match (event.kind, before, now) {
                (EventKind::Modified, Some(false), true) => {
                    Some(line("ADDED", &render(&event.object)))
                }
                (EventKind::Modified, Some(true), false) => {
                    let mut old = event.old.as_deref().cloned().unwrap_or_default();
                    old["metadata"]["resourceVersion"] = json!(event.rv.to_string());
                    Some(line("DELETED", &render(&old)))
                }
                (_, _, true) => Some(line(event.kind.as_str(), &render(&event.object))),
                _ => None,
            }
        };
        for event in past {
            last_rv = event.rv;
            if let Some(bytes) = deliver(&event)
                && send(bytes).await.is_err()
            {
                return;
            }
        }
        let mut receiver = receiver;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(bookmark_every);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = drops.changed() => {
                    // Break the connection mid-stream, as a lost apiserver would.
                    let _ = tx.send(Err(std::io::Error::other("kube-sim: watch dropped"))).await;
                    return;
                }
                _ = ticker.tick(), if bookmarks => {
                    if send(bookmark(last_rv, false)).await.is_err() {
                        return;
                    }
                }
                received = receiver.recv() => match received {
                    Ok(event) => {
                        if event.rv <= last_rv {
                            continue;
                        }
                        last_rv = event.rv;
                        if let Some(bytes) = deliver(&event)
                            && send(bytes).await.is_err() {
                                return;
                            }
                    }
                    // A watcher too slow for the buffer is cut; it re-watches from
                    // its last resourceVersion, which the history still holds.
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tx.closed() => return,
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    let mut response = Response::new(StreamBody::new(stream).boxed());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(response)
}
