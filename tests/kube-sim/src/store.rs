//! The object store: every object as JSON, keyed by (group, resource, namespace, name),
//! one global resourceVersion counter, a bounded event history for watches, and the
//! resource-type registry (which follows the stored CRDs).
//!
//! All mutation happens under one `std::sync::Mutex` held only for in-memory work (never
//! across an await); watchers get events through a broadcast channel fed under the same
//! lock, so history + live events never leave a gap. Garbage collection through
//! ownerReferences and CRD/namespace cascades are done here, synchronously.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::resources::{self, ResourceType};
use crate::status::ApiError;

/// ADDED / MODIFIED / DELETED, as in watch events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, kept in the history and sent to watchers.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub kind: EventKind,
    /// Shared with the store: events cost no copy of the object.
    pub object: Arc<Value>,
    /// The object before a MODIFIED event (selector-filtered watches need it).
    pub old: Option<Arc<Value>>,
}

/// How dependents are treated when their owner goes (`propagationPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

type TypeKey = (String, String);
/// Past events after a resourceVersion, plus the live feed from there on.
pub type Subscription = (Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>);
type ObjectKey = (String, String);

/// Everything behind the store lock.
pub struct State {
    rv: u64,
    types: Vec<ResourceType>,
    objects: HashMap<TypeKey, BTreeMap<ObjectKey, Arc<Value>>>,
    history: VecDeque<Arc<Event>>,
    history_limit: usize,
    /// Watches must start at or after this resourceVersion; older ones get 410 Gone.
    compacted: u64,
    events: broadcast::Sender<Arc<Event>>,
}

/// Shared handle on the store.
#[derive(Clone)]
pub struct Store {
    state: Arc<Mutex<State>>,
}

/// The namespaces a fresh cluster has.
pub const INITIAL_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// Where objects of a type are kept. events.k8s.io/v1 Events are the core/v1 Events
/// seen through another API, as in kube-apiserver: both share one store (core shape).
pub fn storage_key(group: &str, plural: &str) -> (String, String) {
    if is_event_alias(group, plural) {
        (String::new(), "events".into())
    } else {
        (group.to_string(), plural.to_string())
    }
}

/// Whether (group, plural) is the events.k8s.io view of core Events.
pub fn is_event_alias(group: &str, plural: &str) -> bool {
    group == "events.k8s.io" && plural == "events"
}

/// RFC 3339 time in seconds, as metadata timestamps are written.
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| jiff::Timestamp::now().to_string())
}

impl Store {
    pub fn new(history_limit: usize, watch_buffer: usize) -> Self {
        let (events, _) = broadcast::channel(watch_buffer.max(16));
        let mut state = State {
            rv: 1,
            types: resources::builtins(),
            objects: HashMap::new(),
            history: VecDeque::new(),
            history_limit,
            compacted: 1,
            events,
        };
        let now = now_rfc3339();
        for ns in INITIAL_NAMESPACES {
            let object = json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "uid": uuid::Uuid::new_v4().to_string(),
                    "creationTimestamp": now, "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            });
            let t = state.find_type("", "namespaces").expect("built-in").clone();
            // The store was just made: nothing can clash.
            let _ = state.insert(&t, object);
        }
        state.compacted = state.rv;
        Self {
            state: Arc::new(Mutex::new(state)),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent-enough JSON; keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The resourceVersion of a stored object as a number (0 when absent or malformed).
pub fn object_rv(object: &Value) -> u64 {
    meta_str(object, "resourceVersion").parse().unwrap_or(0)
}

fn has_owner(object: &Value, uid: &str) -> bool {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            refs.iter()
                .any(|r| r.get("uid").and_then(Value::as_str) == Some(uid))
        })
}

/// Whether a write changes nothing but its resourceVersion and managedFields times.
fn unchanged(current: &Value, new: &Value) -> bool {
    let normalise = |o: &Value| {
        let mut o = o.clone();
        if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
            if let Some(Value::Array(entries)) = meta.get_mut("managedFields") {
                for e in entries.iter_mut().filter_map(Value::as_object_mut) {
                    e.remove("time");
                }
            }
        }
        o
    };
    normalise(current) == normalise(new)
}

fn finalizers(object: &Value) -> Vec<String> {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|f| {
            f.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

impl State {
    pub fn types(&self) -> &[ResourceType] {
        &self.types
    }

    pub fn find_type(&self, group: &str, plural: &str) -> Option<&ResourceType> {
        self.types.iter().find(|t| t.is(group, plural))
    }

    /// The type served at group/version under `plural`.
    pub fn served_type(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .iter()
            .find(|t| t.is(group, plural) && t.versions.iter().any(|v| v == version))
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    pub fn set_history_limit(&mut self, limit: usize) {
        self.history_limit = limit;
        self.trim_history();
    }

    /// Forgets all history: every watch from an earlier resourceVersion gets 410 Gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    fn trim_history(&mut self) {
        while self.history.len() > self.history_limit {
            if let Some(event) = self.history.pop_front() {
                self.compacted = event.rv;
            }
        }
    }

    pub fn get(&self, group: &str, plural: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&storage_key(group, plural))?
            .get(&(namespace.to_string(), name.to_string()))
            .map(Arc::as_ref)
    }

    /// Objects of a type, sorted by namespace then name, starting after `after`
    /// (a continue key), in `namespace` when given.
    pub fn list<'a>(
        &'a self,
        group: &str,
        plural: &str,
        namespace: Option<&'a str>,
        after: Option<&'a ObjectKey>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Value)> + 'a {
        self.list_shared(group, plural, namespace, after)
            .map(|(k, v)| (k, v.as_ref()))
    }

    /// Like [`State::list`], with the shared objects (cheap to keep after the lock).
    pub fn list_shared<'a>(
        &'a self,
        group: &str,
        plural: &str,
        namespace: Option<&'a str>,
        after: Option<&'a ObjectKey>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> + 'a {
        let objects = self.objects.get(&storage_key(group, plural));
        let start = match after {
            Some(key) => std::ops::Bound::Excluded(key.clone()),
            None => match namespace {
                Some(ns) => std::ops::Bound::Included((ns.to_string(), String::new())),
                None => std::ops::Bound::Unbounded,
            },
        };
        objects
            .into_iter()
            .flat_map(move |m| m.range((start.clone(), std::ops::Bound::Unbounded)))
            .take_while(move |((ns, _), _)| namespace.is_none_or(|want| want == ns))
    }

    /// Subscribes to live events and returns the history after `since` (both under the
    /// lock, so nothing falls between). `Err` when `since` has been compacted away.
    pub fn subscribe_since(&self, since: u64) -> Result<Subscription, ApiError> {
        if since < self.compacted {
            return Err(ApiError::gone(format!(
                "too old resource version: {since} ({})",
                self.compacted
            )));
        }
        let past = self
            .history
            .iter()
            .filter(|e| e.rv > since)
            .cloned()
            .collect();
        Ok((past, self.events.subscribe()))
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn emit(
        &mut self,
        t: &ResourceType,
        kind: EventKind,
        object: Arc<Value>,
        old: Option<Arc<Value>>,
    ) {
        let event = Arc::new(Event {
            rv: self.rv,
            group: storage_key(&t.group, &t.plural).0,
            resource: storage_key(&t.group, &t.plural).1,
            namespace: meta_str(&object, "namespace").to_string(),
            kind,
            object,
            old,
        });
        self.history.push_back(event.clone());
        self.trim_history();
        // No receivers is fine.
        let _ = self.events.send(event);
    }

    /// Stores a new object (its metadata already prepared) under a fresh resourceVersion.
    pub fn insert(&mut self, t: &ResourceType, mut object: Value) -> Result<Value, ApiError> {
        if is_event_alias(&t.group, &t.plural) {
            object = crate::objects::event_to_core(object);
        }
        let namespace = meta_str(&object, "namespace").to_string();
        let name = meta_str(&object, "name").to_string();
        let key = storage_key(&t.group, &t.plural);
        if self
            .objects
            .get(&key)
            .is_some_and(|m| m.contains_key(&(namespace.clone(), name.clone())))
        {
            return Err(ApiError::already_exists(&t.group, &t.plural, &name));
        }
        let rv = self.next_rv();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if t.is("apiextensions.k8s.io", "customresourcedefinitions") {
            object["status"] = resources::crd_status(&object, &now_rfc3339());
        }
        let shared = Arc::new(object.clone());
        self.objects
            .entry(key)
            .or_default()
            .insert((namespace, name), shared.clone());
        self.emit(t, EventKind::Added, shared, None);
        if t.is("apiextensions.k8s.io", "customresourcedefinitions") {
            self.refresh_custom_types();
        }
        Ok(object)
    }

    /// Replaces a stored object. `expected_rv` is the version the caller read or was
    /// sent; a mismatch is a 409 Conflict. Removes the object instead when it is being
    /// deleted and has no finalizers left.
    pub fn replace(
        &mut self,
        t: &ResourceType,
        mut object: Value,
        expected_rv: Option<u64>,
    ) -> Result<Value, ApiError> {
        if is_event_alias(&t.group, &t.plural) {
            object = crate::objects::event_to_core(object);
        }
        let namespace = meta_str(&object, "namespace").to_string();
        let name = meta_str(&object, "name").to_string();
        let Some(current) = self.get(&t.group, &t.plural, &namespace, &name) else {
            return Err(ApiError::not_found(&t.group, &t.plural, &name));
        };
        if expected_rv.is_some_and(|rv| rv != object_rv(current)) {
            return Err(ApiError::conflict(
                &t.group,
                &t.plural,
                &name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        if unchanged(current, &object) {
            // Like kube-apiserver: a no-op write stores nothing and notifies no one.
            return Ok(current.clone());
        }
        let rv = self.next_rv();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if object.pointer("/metadata/deletionTimestamp").is_some() && finalizers(&object).is_empty()
        {
            self.remove_now(
                t,
                &namespace,
                &name,
                Some(object.clone()),
                Propagation::Background,
            );
            return Ok(object);
        }
        let shared = Arc::new(object.clone());
        let old = self
            .objects
            .entry(storage_key(&t.group, &t.plural))
            .or_default()
            .insert((namespace, name), shared.clone());
        self.emit(t, EventKind::Modified, shared, old);
        if t.is("apiextensions.k8s.io", "customresourcedefinitions") {
            self.refresh_custom_types();
        }
        Ok(object)
    }

    /// DELETE: marks the object for deletion when finalizers (or foreground dependents)
    /// hold it, removes it otherwise. Returns the object as last seen.
    pub fn delete(
        &mut self,
        t: &ResourceType,
        namespace: &str,
        name: &str,
        propagation: Propagation,
        precondition_uid: Option<&str>,
        precondition_rv: Option<u64>,
    ) -> Result<Value, ApiError> {
        let Some(current) = self.get(&t.group, &t.plural, namespace, name).cloned() else {
            return Err(ApiError::not_found(&t.group, &t.plural, name));
        };
        if precondition_uid.is_some_and(|uid| uid != meta_str(&current, "uid")) {
            return Err(ApiError::conflict(
                &t.group,
                &t.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {}, UID in object meta: {}",
                    precondition_uid.unwrap_or_default(),
                    meta_str(&current, "uid")
                ),
            ));
        }
        if precondition_rv.is_some_and(|rv| rv != object_rv(&current)) {
            return Err(ApiError::conflict(
                &t.group,
                &t.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let uid = meta_str(&current, "uid").to_string();
        let mut held = !finalizers(&current).is_empty();
        if propagation == Propagation::Foreground && !held {
            self.delete_dependents(&uid, Propagation::Background);
            if self.has_dependents(&uid) {
                held = true;
            }
        }
        if held {
            let mut marked = current.clone();
            if marked.pointer("/metadata/deletionTimestamp").is_none() {
                marked["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            }
            if propagation == Propagation::Foreground {
                let mut f = finalizers(&marked);
                if !f.iter().any(|x| x == "foregroundDeletion") {
                    f.push("foregroundDeletion".into());
                    marked["metadata"]["finalizers"] = json!(f);
                }
            }
            if marked == current {
                return Ok(current);
            }
            let rv = self.next_rv();
            marked["metadata"]["resourceVersion"] = json!(rv.to_string());
            let shared = Arc::new(marked.clone());
            let old = self
                .objects
                .entry(storage_key(&t.group, &t.plural))
                .or_default()
                .insert((namespace.to_string(), name.to_string()), shared.clone());
            self.emit(t, EventKind::Modified, shared, old);
            return Ok(marked);
        }
        let removed = self.remove_now(t, namespace, name, None, propagation);
        Ok(removed.unwrap_or(current))
    }

    /// Removes an object at once and cascades: its dependents (per `propagation`), its
    /// custom objects (for a CRD), its contents (for a namespace), and owners waiting on
    /// it in foreground deletion.
    fn remove_now(
        &mut self,
        t: &ResourceType,
        namespace: &str,
        name: &str,
        last: Option<Value>,
        propagation: Propagation,
    ) -> Option<Value> {
        let removed = self
            .objects
            .get_mut(&storage_key(&t.group, &t.plural))?
            .remove(&(namespace.to_string(), name.to_string()))?;
        let mut object = last.unwrap_or_else(|| Arc::unwrap_or_clone(removed));
        let rv = self.next_rv();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.emit(t, EventKind::Deleted, Arc::new(object.clone()), None);
        let uid = meta_str(&object, "uid").to_string();
        if t.is("apiextensions.k8s.io", "customresourcedefinitions") {
            if let Some(gone) = self
                .types
                .iter()
                .find(|c| c.crd.as_deref() == Some(name))
                .cloned()
            {
                let keys: Vec<ObjectKey> = self
                    .objects
                    .get(&(gone.group.clone(), gone.plural.clone()))
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default();
                for (ns, n) in keys {
                    self.remove_now(&gone, &ns, &n, None, Propagation::Background);
                }
            }
            self.refresh_custom_types();
        }
        if t.is("", "namespaces") {
            let types = self.types.clone();
            for nt in types
                .iter()
                .filter(|nt| nt.namespaced && !is_event_alias(&nt.group, &nt.plural))
            {
                let keys: Vec<ObjectKey> = self
                    .list(&nt.group, &nt.plural, Some(name), None)
                    .map(|(k, _)| k.clone())
                    .collect();
                for (ns, n) in keys {
                    self.remove_now(nt, &ns, &n, None, Propagation::Background);
                }
            }
        }
        match propagation {
            Propagation::Orphan => self.orphan_dependents(&uid),
            _ => self.delete_dependents(&uid, Propagation::Background),
        }
        self.finish_foreground_owners(&object);
        Some(object)
    }

    /// (type, namespace, name) of every object that lists `uid` as an owner.
    fn dependents(&self, uid: &str) -> Vec<(ResourceType, String, String)> {
        let mut found = Vec::new();
        for t in &self.types {
            if is_event_alias(&t.group, &t.plural) {
                continue;
            }
            if let Some(objects) = self.objects.get(&(t.group.clone(), t.plural.clone())) {
                for ((ns, n), o) in objects {
                    if has_owner(o, uid) {
                        found.push((t.clone(), ns.clone(), n.clone()));
                    }
                }
            }
        }
        found
    }

    fn has_dependents(&self, uid: &str) -> bool {
        !self.dependents(uid).is_empty()
    }

    fn delete_dependents(&mut self, uid: &str, propagation: Propagation) {
        for (t, ns, n) in self.dependents(uid) {
            let _ = self.delete(&t, &ns, &n, propagation, None, None);
        }
    }

    fn orphan_dependents(&mut self, uid: &str) {
        for (t, ns, n) in self.dependents(uid) {
            if let Some(mut o) = self.get(&t.group, &t.plural, &ns, &n).cloned() {
                if let Some(refs) = o["metadata"]["ownerReferences"].as_array_mut() {
                    refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
                }
                let _ = self.replace(&t, o, None);
            }
        }
    }

    /// An owner in foreground deletion goes once its last dependent has gone.
    fn finish_foreground_owners(&mut self, removed: &Value) {
        let Some(refs) = removed
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
        else {
            return;
        };
        let namespace = meta_str(removed, "namespace").to_string();
        for r in refs.clone() {
            let (Some(uid), Some(kind)) = (
                r.get("uid").and_then(Value::as_str),
                r.get("kind").and_then(Value::as_str),
            ) else {
                continue;
            };
            if self.has_dependents(uid) {
                continue;
            }
            let candidates: Vec<ResourceType> = self
                .types
                .iter()
                .filter(|t| t.kind == kind)
                .cloned()
                .collect();
            for t in candidates {
                let ns = if t.namespaced { namespace.as_str() } else { "" };
                let Some(name) = r.get("name").and_then(Value::as_str) else {
                    continue;
                };
                let Some(owner) = self.get(&t.group, &t.plural, ns, name).cloned() else {
                    continue;
                };
                if meta_str(&owner, "uid") != uid
                    || !finalizers(&owner).iter().any(|f| f == "foregroundDeletion")
                {
                    continue;
                }
                let mut owner = owner;
                let rest: Vec<String> = finalizers(&owner)
                    .into_iter()
                    .filter(|f| f != "foregroundDeletion")
                    .collect();
                owner["metadata"]["finalizers"] = json!(rest);
                let _ = self.replace(&t, owner, None);
            }
        }
    }

    /// Re-reads the served custom types from the stored CRDs.
    fn refresh_custom_types(&mut self) {
        let mut types = resources::builtins();
        if let Some(crds) = self.objects.get(&(
            "apiextensions.k8s.io".to_string(),
            "customresourcedefinitions".to_string(),
        )) {
            for crd in crds.values() {
                if crd.pointer("/metadata/deletionTimestamp").is_some() {
                    continue;
                }
                if let Some(t) = resources::from_crd(crd)
                    && !types.iter().any(|b| b.is(&t.group, &t.plural))
                {
                    types.push(t);
                }
            }
        }
        self.types = types;
    }
}
