//! Fault injection, configured at runtime by tests: per-path latency, forced status
//! codes (every request, the next N, or one in N — deterministic, no randomness), and
//! dropping every open watch connection at once.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

/// One fault rule; matches requests whose path starts with `path_prefix` (and whose
/// method is `method`, when set).
#[derive(Debug, Clone, Default)]
pub struct Fault {
    pub path_prefix: String,
    pub method: Option<String>,
    /// Match only watch requests (`?watch=true`), or only non-watch ones.
    pub watch: Option<bool>,
    pub latency: Option<Duration>,
    /// Answer with this code (409, 410, 429, 500, 504…) instead of serving the request.
    pub status: Option<u16>,
    /// Hit only this many matching requests, then stop.
    pub times: Option<u64>,
    /// Hit one matching request in `every_nth` (1 = all).
    pub every_nth: Option<u64>,
}

impl Fault {
    /// A rule for every request under `path_prefix`.
    pub fn on(path_prefix: impl Into<String>) -> Self {
        Self {
            path_prefix: path_prefix.into(),
            ..Self::default()
        }
    }

    pub fn status(mut self, code: u16) -> Self {
        self.status = Some(code);
        self
    }

    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = Some(latency);
        self
    }

    pub fn times(mut self, times: u64) -> Self {
        self.times = Some(times);
        self
    }

    pub fn every_nth(mut self, n: u64) -> Self {
        self.every_nth = Some(n.max(1));
        self
    }

    pub fn method(mut self, method: &str) -> Self {
        self.method = Some(method.to_ascii_uppercase());
        self
    }

    pub fn watch_only(mut self) -> Self {
        self.watch = Some(true);
        self
    }

    pub fn non_watch_only(mut self) -> Self {
        self.watch = Some(false);
        self
    }
}

struct Rule {
    fault: Fault,
    seen: u64,
    hits: u64,
}

/// What a matching rule asks of a request.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub latency: Option<Duration>,
    pub status: Option<u16>,
}

/// The rule set plus the watch-drop signal.
pub struct Faults {
    rules: Mutex<Vec<Rule>>,
    drops: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            rules: Mutex::new(Vec::new()),
            drops: watch::channel(0).0,
        }
    }
}

impl Faults {
    pub fn add(&self, fault: Fault) {
        self.lock().push(Rule {
            fault,
            seen: 0,
            hits: 0,
        });
    }

    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Rule>> {
        self.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many requests each rule has hit so far, in insertion order.
    pub fn hits(&self) -> Vec<u64> {
        self.lock().iter().map(|r| r.hits).collect()
    }

    /// Finds what the rules ask of a request, counting it against them.
    pub fn check(&self, method: &str, path: &str, is_watch: bool) -> Verdict {
        let mut verdict = Verdict::default();
        for rule in self.lock().iter_mut() {
            let f = &rule.fault;
            if !path.starts_with(&f.path_prefix)
                || f.method.as_deref().is_some_and(|m| m != method)
                || f.watch.is_some_and(|w| w != is_watch)
                || f.times.is_some_and(|t| rule.hits >= t)
            {
                continue;
            }
            rule.seen += 1;
            if rule.seen % f.every_nth.unwrap_or(1) != 0 {
                continue;
            }
            rule.hits += 1;
            verdict.latency = verdict.latency.max(f.latency);
            if verdict.status.is_none() {
                verdict.status = f.status;
            }
        }
        verdict
    }

    /// Cuts every open watch connection (clients see the stream break).
    pub fn drop_watches(&self) {
        self.drops.send_modify(|n| *n += 1);
    }

    pub fn drop_signal(&self) -> watch::Receiver<u64> {
        self.drops.subscribe()
    }
}
