//! Resumption risk: how likely an idle workload is to become active again within the
//! regret horizon, given how long it has been idle now. PURE: spans are fed in time order
//! by the caller (the controller each cycle, backtest each step); nothing here reads a
//! clock or looks past the instant it is asked about.
//!
//! The estimate is survival analysis over idle spans. A span runs from the last busy
//! instant to the next busy one ("resumed after R") or to the moment the workload stopped
//! being observed — a gap, its pods gone, or an action ("censored at C"). Idle for `t` now,
//! the risk is
//!
//! ```text
//!            spans with t < R ≤ t + h
//! risk = ─────────────────────────────────────────────────────────────
//!        spans with R > t  +  censored spans observed idle to C ≥ t + h
//! ```
//!
//! i.e. among past idle spans that lasted longer than this one has so far, the share that
//! ended within the horizon `h`. Censored spans count only when they are known to have
//! outlasted `t + h`; so do the spans still in progress of the other workloads (a retired
//! server's, one acted on that has not come back), censored at their last idle
//! observation. The pooled spans of the workloads of the same policy and idle shape are
//! tried in this order: of the same rhythm (the class of their median idle span, and
//! whether their long pauses recur at one time of day: a chatty server does not borrow a
//! sparse one's pauses, nor an office-hours server's nights) that began in the same
//! quarter of the day (UTC) as this span; of any rhythm that began in that quarter (an
//! evening pause is like other evening pauses); of the same rhythm at any hour; of any
//! rhythm at any hour (a young workload, with no rhythm yet, borrows its peers'). When at
//! least `minIdleSpans` of the workload's own spans qualify, they decide, blended with the
//! first of those pools that has enough other workloads' spans ([`PEER_WEIGHT`]); else
//! that pool decides; else there is no estimate and the policy's fixed durations decide.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use jiff::{SignedDuration, Timestamp};

use super::classify::human;
use super::model::IdleShape;

/// Where an estimate's spans came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The workload's own idle spans.
    Own,
    /// Idle spans of the workloads of the same shape and rhythm under the policy (and
    /// whose long pauses recur at one time of day, or not, as this one's); with hours,
    /// only those that began in the same quarter of the day (UTC) as this one.
    Rhythm(IdleShape, Rhythm, Daily, Option<Hours>),
    /// Idle spans of all workloads of the same shape under the policy; with hours, only
    /// those that began in the same quarter of the day as this one.
    Peers(IdleShape, Option<Hours>),
}

/// A quarter of the day (UTC) in which idle spans began: six hours from `first` o'clock
/// (0, 6, 12 or 18). An office-hours server's pauses that begin in the evening last the
/// night; its pauses in the working day end soon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hours {
    pub first: u8,
}

/// Hours per slice of the day. Measured with `backtest --sweep` (docs/decision-quality.md):
/// 1, 3, 4 and 6 all help; 6 spreads the cases least thin and gave the best frontier.
const SLICE_HOURS: u8 = 6;

/// The quarter of the day (0–3, UTC) of an instant: long pauses are tallied by quarter.
fn quarter_of(at: Timestamp) -> usize {
    (at.as_second().rem_euclid(86_400) / (6 * 3600)) as usize
}

impl Hours {
    fn of(at: Timestamp) -> Self {
        let hour = (at.as_second().rem_euclid(86_400) / 3600) as u8;
        Self {
            first: hour - hour % SLICE_HOURS,
        }
    }

    fn words(self) -> String {
        format!(
            "{:02}:00–{:02}:00 UTC",
            self.first,
            (self.first + SLICE_HOURS) % 24
        )
    }
}

/// A workload's rhythm: the length class of its typical (median) finished idle span.
/// Workloads of one rhythm pool their spans, so a chatty server does not borrow the long
/// pauses of a sparse one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rhythm {
    /// Typical idle span up to 4 minutes.
    Chatty,
    /// 4 to 16 minutes.
    Steady,
    /// 16 to 64 minutes.
    Sparse,
    /// Longer than 64 minutes.
    Rare,
}

impl Rhythm {
    const ALL: [Rhythm; 4] = [Rhythm::Chatty, Rhythm::Steady, Rhythm::Sparse, Rhythm::Rare];

    fn of(seconds: i64) -> Self {
        match seconds {
            ..=240 => Rhythm::Chatty,
            241..=960 => Rhythm::Steady,
            961..=3840 => Rhythm::Sparse,
            _ => Rhythm::Rare,
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The class in words, e.g. "a typical idle span under 4m".
    pub fn words(self) -> &'static str {
        match self {
            Rhythm::Chatty => "a typical idle span under 4m",
            Rhythm::Steady => "a typical idle span of 4–16m",
            Rhythm::Sparse => "a typical idle span of 16m–1h4m",
            Rhythm::Rare => "a typical idle span over 1h4m",
        }
    }
}

/// Finished spans a workload needs before its rhythm is known.
const RHYTHM_SPANS: u32 = 20;

/// An idle span this long is a long pause (a night, a weekend, a quiet period).
const LONG_PAUSE_SECS: i64 = 3 * 3600;
/// Long pauses that began in one quarter of the day that make them a daily habit.
const DAILY_PAUSES: u32 = 2;

/// Whether a workload's long pauses recur at one time of day: an office-hours server's
/// nights do; a chatty server that now and then goes quiet for hours does not. The two
/// share a rhythm (short idle spans by day) but not what a pause at 19:00 means, so they
/// do not pool their long pauses. Measured with `backtest --sweep`
/// (docs/decision-quality.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Daily(pub bool);

impl Daily {
    fn words(self) -> &'static str {
        if self.0 {
            "long pauses recurring at one time of day"
        } else {
            "no recurring long pause"
        }
    }
}

/// A workload's own estimate blended with its peers': the peers' spans weigh as this
/// many cases. A workload's own history holds few long pauses (ten, say), and a share
/// over ten cases is a coarse thing: "0 of 10" is not a zero risk. Measured with
/// `backtest --sweep`: 10 and 30 did as well (docs/decision-quality.md).
pub const PEER_WEIGHT: u32 = 20;

/// The cautious prior every estimate starts from: that the workload resumes within the
/// horizon (a risk of 100 %)…
pub const PRIOR_RISK: f64 = 1.0;
/// …weighing as this many cases. With few comparable spans the prior dominates (the risk
/// stays high and the gate holds); the data overtake it as cases accumulate: 0 of 36
/// cases gives 10 %, 0 of 76 gives 5 %. Measured with `backtest --sweep`
/// (docs/decision-quality.md): 50 % over 2, 4 or 10 cases and 100 % over 2 regretted
/// more on the production trace.
pub const PRIOR_CASES: f64 = 4.0;

/// The peers' share an own estimate was blended with.
#[derive(Debug, Clone, PartialEq)]
pub struct Blend {
    /// Peers' spans (the workload's own left out) that outlasted `idle_for` and then ended
    /// within the horizon.
    pub resumed: u32,
    /// Peers' spans that outlasted `idle_for`, censored ones included.
    pub longer: u32,
    /// Their product-limit probability of resuming within the horizon.
    pub product_limit: f64,
    /// Which peers.
    pub basis: Basis,
}

/// One resumption-risk estimate, with its evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// How long the workload has been idle.
    pub idle_for: SignedDuration,
    /// The regret horizon.
    pub horizon: SignedDuration,
    /// Past spans that outlasted `idle_for` and then ended within the horizon.
    pub resumed: u32,
    /// Past spans that outlasted `idle_for` (the cases at risk): finished ones, and the
    /// censored ones — still open elsewhere, cut short by an action, pods gone — each
    /// evidence that a span lasted at least as long as it was seen idle.
    pub longer: u32,
    /// Product-limit (Kaplan–Meier) probability that a span idle for `idle_for` ends
    /// within the horizon, from these cases: a censored span counts as at risk for as
    /// long as it was seen idle, and no longer.
    pub product_limit: f64,
    pub basis: Basis,
    /// With the own spans: the peers' estimate they were blended with, weighing
    /// [`PEER_WEIGHT`] cases.
    pub blend: Option<Blend>,
}

impl Estimate {
    /// Probability of activity within the horizon (0–1): the product-limit estimate (with
    /// a blend, `(n·own + w·peers) / (n + w)`) weighed, as many cases as it has (own and
    /// peers'), against the cautious prior ([`PRIOR_RISK`] over [`PRIOR_CASES`] cases).
    pub fn risk(&self) -> f64 {
        let n = f64::from(self.longer);
        let (data, cases) = match &self.blend {
            // The peers weigh PEER_WEIGHT cases in the blend, but all their cases are
            // evidence against the prior.
            Some(b) if b.longer > 0 => {
                let w = f64::from(PEER_WEIGHT);
                (
                    (n * self.product_limit + w * b.product_limit) / (n + w),
                    n + f64::from(b.longer),
                )
            }
            _ => (self.product_limit, n),
        };
        (cases * data + PRIOR_CASES * PRIOR_RISK) / (cases + PRIOR_CASES)
    }

    /// "idle 3h10m; this workload's idle spans longer than 3h10m ended within 2h in 2 of
    /// 40 cases (product-limit 5 %): 7 % with the prior", and with a blend "…in 2 of 12
    /// cases; other MemoryHeld workloads' idle spans longer than 3h10m in 8 of 112
    /// (product-limit 7 %), weighed as 20 cases: 10 % with the prior".
    pub fn sentence(&self) -> String {
        let t = human(self.idle_for);
        let own = format!(
            "idle {t}; {} {t} ended within {} in {} of {} cases",
            describe(self.basis, false),
            human(self.horizon),
            self.resumed,
            self.longer,
        );
        let prior = format!(
            "{:.0} % with the cautious prior ({:.0} % over {PRIOR_CASES} cases)",
            self.risk() * 100.0,
            PRIOR_RISK * 100.0
        );
        match &self.blend {
            Some(b) => format!(
                "{own} (product-limit {:.0} %); {} {t} in {} of {} (product-limit {:.0} %), weighed as {PEER_WEIGHT} cases: {prior}",
                self.product_limit * 100.0,
                describe(b.basis, true),
                b.resumed,
                b.longer,
                b.product_limit * 100.0,
            ),
            None => format!(
                "{own} (product-limit {:.0} %): {prior}",
                self.product_limit * 100.0
            ),
        }
    }
}

/// The cases of one source at `(t, t + h)`, for the product-limit estimate: how many
/// spans outlasted `t`, and of those, per minute of the horizon, how many resumed and how
/// many stopped being seen (censored) in that minute.
#[derive(Debug, Clone, PartialEq)]
struct Cases {
    /// Minute bucket of `t`: spans in later buckets outlasted it.
    first: usize,
    at_risk: i64,
    resumed: Vec<i64>,
    censored: Vec<i64>,
}

impl Cases {
    fn new(first: usize, last: usize) -> Self {
        let width = last.saturating_sub(first);
        Self {
            first,
            at_risk: 0,
            resumed: vec![0; width],
            censored: vec![0; width],
        }
    }

    /// One span that lasted to `bucket` (resumed there, or censored: seen idle to there).
    fn add(&mut self, bucket: usize, resumed: bool, delta: i64) {
        if bucket <= self.first {
            return;
        }
        self.at_risk += delta;
        let k = bucket - self.first - 1;
        if k < self.resumed.len() {
            if resumed {
                self.resumed[k] += delta;
            } else {
                self.censored[k] += delta;
            }
        }
    }

    fn subtract(&mut self, other: &Cases) {
        self.at_risk -= other.at_risk;
        for (a, b) in self.resumed.iter_mut().zip(&other.resumed) {
            *a -= b;
        }
        for (a, b) in self.censored.iter_mut().zip(&other.censored) {
            *a -= b;
        }
    }

    fn resumed_total(&self) -> i64 {
        self.resumed.iter().sum()
    }

    /// 1 − Π (1 − resumed / at risk) over the minutes of the horizon.
    fn product_limit(&self) -> f64 {
        let mut at_risk = self.at_risk as f64;
        let mut survival = 1.0;
        for (d, c) in self.resumed.iter().zip(&self.censored) {
            if at_risk <= 0.0 {
                break;
            }
            survival *= 1.0 - (*d as f64 / at_risk).clamp(0.0, 1.0);
            at_risk -= (d + c) as f64;
        }
        1.0 - survival
    }

    fn count(n: i64) -> u32 {
        u32::try_from(n.max(0)).unwrap_or(u32::MAX)
    }
}

/// "this workload's idle spans longer than", "idle spans of MemoryHeld workloads with … that
/// began in 18:00–00:00 UTC as this one did and lasted longer than"; `others`: the peers
/// other than this workload.
fn describe(basis: Basis, others: bool) -> String {
    let other = if others { "other " } else { "" };
    let (spans, hours) = match basis {
        Basis::Own => ("this workload's idle spans".to_string(), None),
        Basis::Rhythm(shape, rhythm, daily, hours) => (
            format!(
                "idle spans of {other}{} workloads with {} and {}",
                shape.as_str(),
                rhythm.words(),
                daily.words()
            ),
            hours,
        ),
        Basis::Peers(shape, hours) => (
            format!("{other}{} workloads' idle spans", shape.as_str()),
            hours,
        ),
    };
    // Conditioned on the hours: say so, and which.
    match hours {
        Some(h) => format!(
            "{spans} that began in {} as this one did and lasted longer than",
            h.words()
        ),
        None => format!("{spans} longer than"),
    }
}

/// What the estimate needs from the policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RiskParams {
    pub horizon: SignedDuration,
    pub lookback: SignedDuration,
    pub min_spans: u32,
}

/// A finished idle span.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Span {
    /// When it began (the last busy instant).
    began: Timestamp,
    /// When it ended (resumed or stopped being observed), Unix seconds.
    ended_at: i64,
    /// Seconds from the last busy instant to the resumption (or to the last idle
    /// observation, when censored).
    length: i64,
    resumed: bool,
    shape: Option<IdleShape>,
    rhythm: Option<Rhythm>,
    /// The workload's [`Daily`] when the span ended.
    daily: Daily,
}

/// Idle spans of one workload over the lookback, plus the span in progress.
#[derive(Debug, Clone, Default)]
pub struct IdleHistory {
    spans: VecDeque<Span>,
    /// Last busy instant, while the workload is observed (None: not observed since a gap).
    last_busy: Option<Timestamp>,
    /// Last idle instant observed after `last_busy`.
    last_idle: Option<Timestamp>,
    /// The idle shape the workload was last classified in: its spans are pooled with
    /// peers of that shape.
    shape: Option<IdleShape>,
    /// Its resumed spans kept, by rhythm class (for the median).
    by_rhythm: [u32; 4],
    /// Its long pauses kept, by the quarter of the day they began in.
    long_by_quarter: [u32; 4],
}

impl IdleHistory {
    /// Finished spans kept.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The class of the median resumed span, once there are enough of them.
    pub fn rhythm(&self) -> Option<Rhythm> {
        let n: u32 = self.by_rhythm.iter().sum();
        if n < RHYTHM_SPANS {
            return None;
        }
        let mut seen = 0;
        for r in Rhythm::ALL {
            seen += self.by_rhythm[r.index()];
            if 2 * seen >= n {
                return Some(r);
            }
        }
        None
    }

    /// Whether its long pauses recur at one time of day: at least [`DAILY_PAUSES`] of
    /// them kept began in the same quarter of the day.
    pub fn daily(&self) -> Daily {
        Daily(self.long_by_quarter.iter().any(|n| *n >= DAILY_PAUSES))
    }

    /// Counts a kept span in (or out of) the rhythm and long-pause tallies.
    fn tally(&mut self, span: &Span, add: bool) {
        let bump = |slot: &mut u32| {
            *slot = if add {
                *slot + 1
            } else {
                slot.saturating_sub(1)
            }
        };
        if span.resumed {
            bump(&mut self.by_rhythm[Rhythm::of(span.length).index()]);
        }
        if span.length >= LONG_PAUSE_SECS {
            bump(&mut self.long_by_quarter[quarter_of(span.began)]);
        }
    }

    /// Its spans' cases at `(t, t + h)` (see [`Cases`]), of those that `keep`.
    fn cases_where(
        &self,
        cases: &mut Cases,
        bucket: impl Fn(i64) -> usize,
        keep: impl Fn(&Span) -> bool,
    ) {
        for s in self.spans.iter().filter(|s| keep(s)) {
            cases.add(bucket(s.length), s.resumed, 1);
        }
    }
}

/// Prefix sums over minute buckets (a Fenwick tree): the pooled spans of one shape.
#[derive(Debug, Clone)]
struct Buckets {
    tree: Vec<i64>,
    /// Count in each bucket (the product-limit estimate walks the horizon's minutes).
    point: Vec<i32>,
}

impl Buckets {
    fn new(n: usize) -> Self {
        Self {
            tree: vec![0; n + 1],
            point: vec![0; n],
        }
    }

    fn at(&self, bucket: usize) -> i64 {
        self.point.get(bucket).map_or(0, |n| i64::from(*n))
    }

    fn add(&mut self, bucket: usize, delta: i64) {
        let b = bucket.min(self.point.len() - 1);
        self.point[b] += i32::try_from(delta).unwrap_or(0);
        let mut i = bucket.min(self.tree.len() - 2) + 1;
        while i < self.tree.len() {
            self.tree[i] += delta;
            i += i & i.wrapping_neg();
        }
    }

    /// Count in buckets `0..=bucket`.
    fn prefix(&self, bucket: usize) -> i64 {
        let mut i = (bucket.min(self.tree.len() - 2)) + 1;
        let mut s = 0;
        while i > 0 {
            s += self.tree[i];
            i -= i & i.wrapping_neg();
        }
        s
    }

    fn total(&self) -> i64 {
        self.prefix(self.tree.len() - 2)
    }
}

#[derive(Debug, Clone)]
struct Pool {
    resumed: Buckets,
    censored: Buckets,
}

/// The idle histories of every workload of one policy, and their pool by shape.
#[derive(Debug, Clone)]
pub struct Histories<K> {
    params: RiskParams,
    /// Bucket count: one per minute of the lookback, plus one for longer spans.
    buckets: usize,
    by_workload: HashMap<K, IdleHistory>,
    /// Spans by shape, shape and rhythm, and each of these by the quarter of the day they
    /// began in.
    pool: HashMap<PoolKey, Pool>,
}

type PoolKey = (IdleShape, Option<(Rhythm, Daily)>, Option<Hours>);

impl<K: Eq + Hash + Clone> Histories<K> {
    pub fn new(params: RiskParams) -> Self {
        let minutes = (params.lookback.as_secs() / 60).clamp(1, 366 * 24 * 60) as usize;
        Self {
            params,
            buckets: minutes + 1,
            by_workload: HashMap::new(),
            pool: HashMap::new(),
        }
    }

    pub fn params(&self) -> RiskParams {
        self.params
    }

    pub fn get(&self, key: &K) -> Option<&IdleHistory> {
        self.by_workload.get(key)
    }

    /// Workloads tracked.
    pub fn workloads(&self) -> usize {
        self.by_workload.len()
    }

    /// Finished spans kept, over all workloads.
    pub fn spans(&self) -> usize {
        self.by_workload.values().map(IdleHistory::len).sum()
    }

    fn bucket(&self, seconds: i64) -> usize {
        ((seconds.max(0) / 60) as usize).min(self.buckets - 1)
    }

    fn pool_add(&mut self, span: &Span, delta: i64) {
        let Some(shape) = span.shape else { return };
        let b = self.bucket(span.length);
        let n = self.buckets;
        let hours = Hours::of(span.began);
        let keys = [
            Some((shape, None, None)),
            span.rhythm.map(|r| (shape, Some((r, span.daily)), None)),
            Some((shape, None, Some(hours))),
            span.rhythm
                .map(|r| (shape, Some((r, span.daily)), Some(hours))),
        ];
        for key in keys.into_iter().flatten() {
            let pool = self.pool.entry(key).or_insert_with(|| Pool {
                resumed: Buckets::new(n),
                censored: Buckets::new(n),
            });
            if span.resumed {
                pool.resumed.add(b, delta);
            } else {
                pool.censored.add(b, delta);
            }
        }
    }

    fn push(&mut self, key: &K, mut span: Span) {
        if let Some(h) = self.by_workload.get_mut(key) {
            span.rhythm = h.rhythm();
            span.daily = h.daily();
            h.tally(&span, true);
            h.spans.push_back(span);
        }
        self.pool_add(&span, 1);
    }

    /// The workload was classified idle in `shape`: its spans pool with that shape's. The
    /// first time, the spans it already has without a shape (a start-up backfill, which
    /// classifies nothing) join that pool too.
    pub fn set_shape(&mut self, key: &K, shape: IdleShape) {
        let h = self.by_workload.entry(key.clone()).or_default();
        if h.shape.replace(shape).is_some() {
            return;
        }
        let mut joined = Vec::new();
        for span in h.spans.iter_mut().filter(|s| s.shape.is_none()) {
            span.shape = Some(shape);
            joined.push(*span);
        }
        for span in joined {
            self.pool_add(&span, 1);
        }
    }

    /// Activity at or above the threshold at `at`. Ends the idle span in progress, if
    /// any lasted longer than `resolution` (one evaluation step).
    pub fn busy(&mut self, key: &K, at: Timestamp, resolution: SignedDuration) {
        let h = self.by_workload.entry(key.clone()).or_default();
        if h.last_busy.is_some_and(|b| b >= at) {
            return; // already known (the controller sees the same last-busy instant again)
        }
        let previous = h.last_busy.replace(at);
        h.last_idle = None;
        let shape = h.shape;
        if let Some(from) = previous {
            let length = at.duration_since(from);
            if length > resolution {
                self.push(
                    key,
                    Span {
                        began: from,
                        ended_at: at.as_second(),
                        length: length.as_secs(),
                        resumed: true,
                        shape,
                        rhythm: None,
                        daily: Daily(false),
                    },
                );
            }
        }
    }

    /// Observed below the threshold at `at`.
    pub fn idle(&mut self, key: &K, at: Timestamp) {
        let h = self.by_workload.entry(key.clone()).or_default();
        if h.last_busy.is_some() {
            h.last_idle = Some(at);
        }
    }

    /// Not observed at `at` (telemetry gap, pods gone, or acted on): the span in progress
    /// is censored at its last idle observation.
    pub fn unobserved(&mut self, key: &K, at: Timestamp) {
        let Some(h) = self.by_workload.get_mut(key) else {
            return;
        };
        let (Some(from), Some(to)) = (h.last_busy.take(), h.last_idle.take()) else {
            return;
        };
        let shape = h.shape;
        self.push(
            key,
            Span {
                began: from,
                ended_at: at.as_second(),
                length: to.duration_since(from).as_secs(),
                resumed: false,
                shape,
                rhythm: None,
                daily: Daily(false),
            },
        );
    }

    /// Drops spans that ended before the lookback, and workloads with nothing left that
    /// are gone. `present` says which workloads hold GPUs now: one that does not (scaled
    /// to zero, suspended) is known not busy, so its open idle span runs on until it comes
    /// back busy — that is how the length of an idle span cut short by an action is
    /// learnt.
    pub fn prune(&mut self, now: Timestamp, present: impl Fn(&K) -> bool) {
        let horizon = (now - self.params.lookback).as_second();
        let lookback_start = now - self.params.lookback;
        let mut dropped = Vec::new();
        self.by_workload.retain(|k, h| {
            while let Some(s) = h.spans.front().filter(|s| s.ended_at < horizon).copied() {
                h.spans.pop_front();
                h.tally(&s, false);
                dropped.push(s);
            }
            if present(k) {
                return true;
            }
            match h.last_busy {
                // Away for longer than the lookback: forget the open span.
                Some(b) if b < lookback_start => {
                    h.last_busy = None;
                    h.last_idle = None;
                }
                Some(_) => h.last_idle = Some(now),
                None => {}
            }
            h.last_busy.is_some() || !h.spans.is_empty()
        });
        for s in dropped {
            self.pool_add(&s, -1);
        }
    }

    /// Spans still in progress in the pool `pool_key`, other than `key`'s, censored at
    /// their last idle observation: a retired server's, or one acted on that has not come
    /// back. Without them the pools would lack exactly the longest spans and overstate the
    /// risk of long idleness.
    fn open_cases(&self, key: &K, pool_key: PoolKey, cases: &mut Cases) {
        let (shape, rhythm, hours) = pool_key;
        for (k, w) in &self.by_workload {
            let (Some(from), Some(to)) = (w.last_busy, w.last_idle) else {
                continue;
            };
            if w.shape != Some(shape)
                || k == key
                || rhythm.is_some_and(|(r, d)| w.rhythm() != Some(r) || w.daily() != d)
                || hours.is_some_and(|h| Hours::of(from) != h)
            {
                continue;
            }
            cases.add(self.bucket(to.duration_since(from).as_secs()), false, 1);
        }
    }

    /// The resumption risk of `key`, idle in `shape` for `idle_for`. The first source
    /// with `min_spans` cases that outlasted `idle_for` among the pooled spans (finished,
    /// censored, and the other workloads' in progress) of its shape and rhythm that began
    /// in the same quarter of the day as its span in progress, of its shape in that
    /// quarter, of its shape and rhythm, of its shape. When its own spans have `min_spans`
    /// such cases too, they decide, blended with that source's other workloads' spans
    /// weighing [`PEER_WEIGHT`] cases. None when neither has enough cases: then nothing
    /// is known, and the gate waits.
    pub fn estimate(
        &self,
        key: &K,
        shape: IdleShape,
        idle_for: SignedDuration,
    ) -> Option<Estimate> {
        let (t, h) = (idle_for.as_secs(), self.params.horizon.as_secs());
        let (tb, thb) = (self.bucket(t), self.bucket(t + h));
        let min = i64::from(self.params.min_spans.max(1));
        let own = self.by_workload.get(key);
        let bucket = |secs: i64| self.bucket(secs);
        let own_cases = own
            .map(|w| {
                let mut c = Cases::new(tb, thb);
                w.cases_where(&mut c, bucket, |_| true);
                c
            })
            .filter(|c| c.at_risk >= min);
        let rhythm = own.and_then(IdleHistory::rhythm);
        let daily = own.map_or(Daily(false), IdleHistory::daily);
        // The hours of the day this span began in (its last busy instant).
        let hours = own.and_then(|w| w.last_busy).map(Hours::of);
        // The hours of the day come before the rhythm: a pause that began in the evening is
        // more like other evening pauses than like the same rhythm's pauses at any hour.
        let candidates = [
            rhythm.zip(hours).map(|(r, hr)| {
                (
                    (shape, Some((r, daily)), Some(hr)),
                    Basis::Rhythm(shape, r, daily, Some(hr)),
                )
            }),
            hours.map(|hr| ((shape, None, Some(hr)), Basis::Peers(shape, Some(hr)))),
            rhythm.map(|r| {
                (
                    (shape, Some((r, daily)), None),
                    Basis::Rhythm(shape, r, daily, None),
                )
            }),
            Some(((shape, None, None), Basis::Peers(shape, None))),
        ];
        let mut peers = None;
        for (pool_key, basis) in candidates.into_iter().flatten() {
            let mut cases = self.pool_cases(key, pool_key, tb, thb);
            if own_cases.is_some()
                && let Some(w) = own
            {
                // Blended with the own spans: the others' only.
                let (shape, rhythm, hours) = pool_key;
                let mut mine = Cases::new(tb, thb);
                w.cases_where(&mut mine, bucket, |s| {
                    s.shape == Some(shape)
                        && rhythm.is_none_or(|(r, d)| s.rhythm == Some(r) && s.daily == d)
                        && hours.is_none_or(|hr| Hours::of(s.began) == hr)
                });
                cases.subtract(&mine);
            }
            if cases.at_risk >= min {
                peers = Some((cases, basis));
                break;
            }
        }
        let estimate = |c: &Cases, basis, blend| Estimate {
            idle_for,
            horizon: self.params.horizon,
            resumed: Cases::count(c.resumed_total()),
            longer: Cases::count(c.at_risk),
            product_limit: c.product_limit(),
            basis,
            blend,
        };
        match (own_cases, peers) {
            (Some(mine), Some((theirs, basis))) => Some(estimate(
                &mine,
                Basis::Own,
                Some(Blend {
                    resumed: Cases::count(theirs.resumed_total()),
                    longer: Cases::count(theirs.at_risk),
                    product_limit: theirs.product_limit(),
                    basis,
                }),
            )),
            (Some(mine), None) => Some(estimate(&mine, Basis::Own, None)),
            (None, Some((theirs, basis))) => Some(estimate(&theirs, basis, None)),
            (None, None) => None,
        }
    }

    /// The cases of the pool `pool_key` at `(t, t + h)` (minute buckets `tb`, `thb`): its
    /// finished and censored spans, and the spans in progress of workloads other than
    /// `key`.
    fn pool_cases(&self, key: &K, pool_key: PoolKey, tb: usize, thb: usize) -> Cases {
        let mut cases = Cases::new(tb, thb);
        if let Some(pool) = self.pool.get(&pool_key) {
            cases.at_risk = pool.resumed.total() - pool.resumed.prefix(tb) + pool.censored.total()
                - pool.censored.prefix(tb);
            for b in tb + 1..=thb {
                let k = b - tb - 1;
                if k < cases.resumed.len() {
                    cases.resumed[k] = pool.resumed.at(b);
                    cases.censored[k] = pool.censored.at(b);
                }
            }
        }
        self.open_cases(key, pool_key, &mut cases);
        cases
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(min: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + min * 60).unwrap()
    }

    fn params(min_spans: u32) -> RiskParams {
        RiskParams {
            horizon: SignedDuration::from_hours(2),
            lookback: SignedDuration::from_hours(24 * 7),
            min_spans,
        }
    }

    const STEP: SignedDuration = SignedDuration::from_secs(60);

    /// Feeds idle spans of the given lengths (minutes), separated by one busy minute.
    fn feed(h: &mut Histories<u32>, key: u32, start: i64, lengths: &[i64]) -> i64 {
        let mut m = start;
        h.set_shape(&key, IdleShape::MemoryHeld);
        h.busy(&key, t(m), STEP);
        for &len in lengths {
            for k in 1..len {
                h.idle(&key, t(m + k));
            }
            m += len;
            h.busy(&key, t(m), STEP);
        }
        m
    }

    #[test]
    fn own_spans_give_the_share_that_ended_within_the_horizon() {
        let mut h = Histories::new(params(3));
        // Spans of 10m, 3h, 4h, 10h, 20h: idle for 2h now, 4 spans lasted longer, of which
        // those ending by 4h (3h and 4h) resumed within the horizon.
        feed(&mut h, 1, 0, &[10, 180, 240, 600, 1200]);
        let e = h
            .estimate(&1, IdleShape::MemoryHeld, SignedDuration::from_hours(2))
            .unwrap();
        assert_eq!((e.resumed, e.longer, e.basis), (2, 4, Basis::Own));
        assert_eq!(e.product_limit, 0.5);
        // Four cases against the prior's four: (4 × 50 % + 4 × 100 %) / 8.
        assert_eq!(e.risk(), 0.75);
        assert_eq!(
            e.sentence(),
            "idle 2h; this workload's idle spans longer than 2h ended within 2h in 2 of 4 cases (product-limit 50 %): 75 % with the cautious prior (100 % over 4 cases)"
        );
    }

    #[test]
    fn too_few_own_spans_borrow_the_peers_of_the_same_shape_then_give_up() {
        let mut h = Histories::new(params(3));
        feed(&mut h, 1, 0, &[300, 300, 300, 300]);
        feed(&mut h, 2, 0, &[5]);
        let e = h
            .estimate(&2, IdleShape::MemoryHeld, SignedDuration::from_hours(1))
            .unwrap();
        assert_eq!((e.resumed, e.longer), (0, 4));
        assert_eq!(e.basis, Basis::Peers(IdleShape::MemoryHeld, None));
        assert!(
            h.estimate(&2, IdleShape::Unused, SignedDuration::from_hours(1))
                .is_none()
        );
        assert!(
            h.estimate(&2, IdleShape::MemoryHeld, SignedDuration::from_hours(5))
                .is_none(),
            "no span outlasted 5h: no basis"
        );
    }

    #[test]
    fn pooled_counts_equal_the_sum_of_own_counts_at_minute_resolution() {
        let mut h = Histories::new(params(1));
        let lens: Vec<i64> = (1..200).map(|i| (i * 37) % 900 + 2).collect();
        feed(&mut h, 1, 0, &lens[..100]);
        feed(&mut h, 2, 0, &lens[100..]);
        for idle in [30, 60, 125, 240, 600] {
            let d = SignedDuration::from_mins(idle);
            let (tb, thb) = (h.bucket(d.as_secs()), h.bucket(d.as_secs() + 7200));
            let mut both = Cases::new(tb, thb);
            for w in [1, 2] {
                h.get(&w)
                    .unwrap()
                    .cases_where(&mut both, |s| h.bucket(s), |_| true);
            }
            // A workload with no spans of its own gets the pool: both workloads' spans.
            let e = h.estimate(&3, IdleShape::MemoryHeld, d).unwrap();
            assert_eq!(e.basis, Basis::Peers(IdleShape::MemoryHeld, None));
            assert_eq!(
                (e.resumed, e.longer),
                (
                    Cases::count(both.resumed_total()),
                    Cases::count(both.at_risk)
                ),
                "idle {idle}m"
            );
            assert!((e.product_limit - both.product_limit()).abs() < 1e-12);
        }
    }

    #[test]
    fn the_product_limit_counts_a_censored_span_at_risk_for_as_long_as_it_was_seen_idle() {
        let mut h = Histories::new(params(1));
        h.set_shape(&1, IdleShape::Unused);
        // Resumed after 150 minutes.
        h.busy(&1, t(0), STEP);
        for m in 1..150 {
            h.idle(&1, t(m));
        }
        h.busy(&1, t(150), STEP);
        // Seen idle for 200 minutes, then its pods went away.
        for m in 151..=350 {
            h.idle(&1, t(m));
        }
        h.unobserved(&1, t(351));
        // Idle 2h: both lasted longer. The first resumed with both at risk (1/2); the second
        // left the risk set at 200 minutes without resuming: 50 %, where dropping it would
        // say 100 % and counting it as lasting past 4h would say 50 % only by luck.
        let e = h
            .estimate(&2, IdleShape::Unused, SignedDuration::from_hours(2))
            .unwrap();
        assert_eq!((e.resumed, e.longer), (1, 2));
        assert!((e.product_limit - 0.5).abs() < 1e-12, "{e:?}");
        // With the cautious prior: (2 × 50 % + 4 × 100 %) / 6.
        assert!((e.risk() - 5.0 / 6.0).abs() < 1e-12);
        // Idle 3h: only the censored span lasted longer, and it ended no span: 0 %, which
        // one case cannot make more than a third of the way from the prior.
        let e = h
            .estimate(&2, IdleShape::Unused, SignedDuration::from_hours(3))
            .unwrap();
        assert_eq!((e.resumed, e.longer, e.product_limit), (0, 1, 0.0));
        assert!((e.risk() - PRIOR_CASES * PRIOR_RISK / (1.0 + PRIOR_CASES)).abs() < 1e-12);
    }

    #[test]
    fn a_chatty_workload_borrows_the_long_pauses_of_chatty_peers_not_of_sparse_ones() {
        // Nine cases needed: no quarter of the day holds that many long pauses (at most
        // eight), so the rhythm at any hour decides.
        let mut h = Histories::new(params(9));
        let mut chatty: Vec<i64> = vec![3; 30];
        // Its pauses last 2h59m: past 30 minutes, they outlast the horizon. (Not 3h: those
        // would be long pauses, and recurring at one time of day, as they are here, a
        // daily habit the third workload does not share.)
        chatty.extend([179; 12]);
        let mut sparse: Vec<i64> = vec![30; 30];
        sparse.extend([90; 12]); // its long pauses end within the horizon
        feed(&mut h, 1, 0, &chatty);
        feed(&mut h, 2, 0, &sparse);
        feed(&mut h, 3, 0, &[3; 30]);
        assert_eq!(h.get(&1).unwrap().rhythm(), Some(Rhythm::Chatty));
        assert_eq!(h.get(&1).unwrap().daily(), Daily(false));
        assert_eq!(h.get(&2).unwrap().rhythm(), Some(Rhythm::Sparse));
        let e = h
            .estimate(&3, IdleShape::MemoryHeld, SignedDuration::from_mins(30))
            .unwrap();
        assert_eq!(
            e.basis,
            Basis::Rhythm(IdleShape::MemoryHeld, Rhythm::Chatty, Daily(false), None)
        );
        assert_eq!((e.resumed, e.longer), (0, 12));
        assert_eq!(
            e.sentence(),
            "idle 30m; idle spans of MemoryHeld workloads with a typical idle span under 4m and no recurring long pause longer than 30m ended within 2h in 0 of 12 cases (product-limit 0 %): 25 % with the cautious prior (100 % over 4 cases)"
        );
        // A workload without a rhythm yet gets every peer of its shape.
        let e = h
            .estimate(&4, IdleShape::MemoryHeld, SignedDuration::from_mins(30))
            .unwrap();
        assert_eq!(e.basis, Basis::Peers(IdleShape::MemoryHeld, None));
        assert_eq!((e.resumed, e.longer), (12, 24));
    }

    /// A chatty day: 3-minute pauses from `from` for `n` spans; returns the last busy
    /// instant.
    fn chatty_day(h: &mut Histories<u32>, key: u32, from: Timestamp, n: usize) -> Timestamp {
        let mut at = from;
        h.busy(&key, at, STEP);
        for _ in 0..n {
            idle_between(h, key, at, at + SignedDuration::from_mins(3));
            at += SignedDuration::from_mins(3);
            h.busy(&key, at, STEP);
        }
        at
    }

    #[test]
    fn an_office_hours_server_and_a_chatty_one_that_goes_quiet_do_not_pool_their_pauses() {
        let mut h = Histories::new(params(3));
        // Four office-hours servers: chatty by day, a night from 19:00 to 07:00.
        for key in 1..=4 {
            h.set_shape(&key, IdleShape::MemoryHeld);
            for d in 0..6 {
                let end = chatty_day(&mut h, key, clock(d, 7, 0), 30);
                busy_through(&mut h, key, end, clock(d, 19, 0));
                idle_between(&mut h, key, clock(d, 19, 0), clock(d + 1, 7, 0));
            }
            h.busy(&key, clock(6, 7, 0), STEP);
            assert_eq!(h.get(&key).unwrap().daily(), Daily(true));
        }
        // Four always-on chatty servers that went quiet one evening each, for 2h30m.
        for key in 5..=8 {
            h.set_shape(&key, IdleShape::MemoryHeld);
            let mut at = chatty_day(&mut h, key, clock(0, 0, 0), 40);
            for d in 0..6 {
                let quiet = clock(d, 18, 30 + i64::from(key));
                busy_through(&mut h, key, at, quiet);
                idle_between(&mut h, key, quiet, quiet + SignedDuration::from_mins(150));
                at = chatty_day(&mut h, key, quiet + SignedDuration::from_mins(150), 5);
            }
            assert_eq!(h.get(&key).unwrap().rhythm(), Some(Rhythm::Chatty));
            assert_eq!(h.get(&key).unwrap().daily(), Daily(false));
        }
        // Another always-on chatty server, idle for an hour since 19:00: its peers' quiet
        // evenings ended within the horizon, whatever the office-hours servers' nights say.
        let mut at = chatty_day(&mut h, 9, clock(6, 0, 0), 40);
        at = chatty_day(&mut h, 9, at, 1);
        let e = ask(&mut h, 9, at.max(clock(6, 19, 0)), 60).unwrap();
        let evening = Some(Hours { first: 18 });
        assert_eq!(
            e.basis,
            Basis::Rhythm(IdleShape::MemoryHeld, Rhythm::Chatty, Daily(false), evening)
        );
        // 24 quiet evenings, all ended within the horizon, and 8 nights: each office-hours
        // server's first two, which ended before its habit was known (a span pools with the
        // rhythm its workload had when it ended). Borrowing all 24 nights would give 24 of
        // 48.
        assert_eq!((e.resumed, e.longer), (24, 32));
        assert!(
            e.sentence()
                .contains("no recurring long pause that began in 18:00–00:00 UTC"),
            "{}",
            e.sentence()
        );
    }

    #[test]
    fn own_spans_are_blended_with_the_peers_weighing_twenty_cases() {
        let mut h = Histories::new(params(3));
        // Workload 1: five pauses past 2h, all lasting; workload 2: twelve, all ending
        // within the horizon.
        feed(&mut h, 1, 0, &[600; 5]);
        feed(&mut h, 2, 0, &[180; 12]);
        let e = h
            .estimate(&1, IdleShape::MemoryHeld, SignedDuration::from_mins(121))
            .unwrap();
        assert_eq!((e.resumed, e.longer, e.basis), (0, 5, Basis::Own));
        let blend = e.blend.clone().unwrap();
        // The peers' share leaves workload 1's own spans out: all of workload 2's that
        // began in the same quarter of the day as workload 1's pause.
        assert!(blend.longer >= 3, "{blend:?}");
        assert_eq!(blend.resumed, blend.longer);
        assert!(matches!(
            blend.basis,
            Basis::Peers(IdleShape::MemoryHeld, Some(_))
        ));
        // (0 + 20 × 1) / (5 + 20) = 80 %, not the 0 % of its own five cases; then the
        // prior, against the five own cases and all the peers'.
        let cases = 5.0 + f64::from(blend.longer);
        let want = (cases * 0.8 + PRIOR_CASES * PRIOR_RISK) / (cases + PRIOR_CASES);
        assert!((e.risk() - want).abs() < 1e-9, "{}", e.risk());
        let sentence = e.sentence();
        assert!(
            sentence.starts_with(
                "idle 2h1m; this workload's idle spans longer than 2h1m ended within 2h in 0 of 5 cases (product-limit 0 %); other MemoryHeld workloads' idle spans that began in "
            ) && sentence.ends_with(&format!(
                "in {0} of {0} (product-limit 100 %), weighed as 20 cases: 86 % with the cautious prior (100 % over 4 cases)",
                blend.longer
            )),
            "{sentence}"
        );
        // Too few peers: the own spans alone.
        let mut alone = Histories::new(params(3));
        feed(&mut alone, 1, 0, &[600; 5]);
        let e = alone
            .estimate(&1, IdleShape::MemoryHeld, SignedDuration::from_mins(121))
            .unwrap();
        assert_eq!((e.resumed, e.longer, &e.blend), (0, 5, &None));
        // Five lucky cases are not a zero risk: the prior weighs two of them.
        let want = PRIOR_CASES * PRIOR_RISK / (5.0 + PRIOR_CASES);
        assert!((e.risk() - want).abs() < 1e-9, "{}", e.risk());
    }

    #[test]
    fn censored_spans_are_cases_up_to_their_last_idle_observation() {
        let mut h = Histories::new(params(1));
        h.set_shape(&1, IdleShape::Unused);
        h.busy(&1, t(0), STEP);
        for m in 1..=300 {
            h.idle(&1, t(m));
        }
        h.unobserved(&1, t(301));
        h.busy(&1, t(400), STEP); // first busy after the gap starts no span
        for m in 401..=430 {
            h.idle(&1, t(m));
        }
        h.unobserved(&1, t(431));
        // Idle 1h: the 300-minute censored span outlasted 1h; the 30-minute one did not.
        let e = h
            .estimate(&1, IdleShape::Unused, SignedDuration::from_hours(1))
            .unwrap();
        assert_eq!((e.resumed, e.longer), (0, 1));
        // Idle 4h: the 300-minute span was seen idle to 5h: a case at risk until then.
        let e = h
            .estimate(&1, IdleShape::Unused, SignedDuration::from_hours(4))
            .unwrap();
        assert_eq!((e.resumed, e.longer), (0, 1));
        // Idle 5h: it did not outlast that: nothing known.
        assert!(
            h.estimate(&1, IdleShape::Unused, SignedDuration::from_hours(5))
                .is_none()
        );
    }

    #[test]
    fn spans_older_than_the_lookback_are_forgotten_by_the_workload_and_the_pool() {
        let mut h = Histories::new(RiskParams {
            lookback: SignedDuration::from_hours(10),
            ..params(1)
        });
        let end = feed(&mut h, 1, 0, &[120, 120, 120]);
        assert_eq!(h.spans(), 3);
        // The first span ended at minute 120: ten hours later it is out of the lookback.
        h.prune(t(120 + 600), |_| true);
        assert_eq!(h.spans(), 3);
        h.prune(t(120 + 601), |_| true);
        assert_eq!(h.spans(), 2);
        h.prune(t(end + 10_000), |_| false);
        assert_eq!(h.workloads(), 0);
        assert!(
            h.estimate(&2, IdleShape::MemoryHeld, SignedDuration::from_mins(30))
                .is_none()
        );
    }

    /// 2023-11-15 plus `day` days, at `hour`:`min` UTC.
    fn clock(day: i64, hour: i64, min: i64) -> Timestamp {
        Timestamp::from_second(1_700_006_400 + day * 86_400 + hour * 3600 + min * 60).unwrap()
    }

    /// Busy every minute from `from` to `to`, both included.
    fn busy_through(h: &mut Histories<u32>, key: u32, from: Timestamp, to: Timestamp) {
        let mut at = from;
        while at <= to {
            h.busy(&key, at, STEP);
            at += STEP;
        }
    }

    /// Idle every minute strictly between `from` and `to`.
    fn idle_between(h: &mut Histories<u32>, key: u32, from: Timestamp, to: Timestamp) {
        let mut at = from + STEP;
        while at < to {
            h.idle(&key, at);
            at += STEP;
        }
    }

    /// Six days of an office-hours server: a 90-minute lunch pause from 12:30, which ends
    /// within the horizon once it has lasted an hour, and a night from 19:00 to 07:00.
    fn office_hours(h: &mut Histories<u32>, key: u32) {
        h.set_shape(&key, IdleShape::MemoryHeld);
        for d in 0..6 {
            busy_through(h, key, clock(d, 7, 0), clock(d, 12, 30));
            idle_between(h, key, clock(d, 12, 30), clock(d, 14, 0));
            busy_through(h, key, clock(d, 14, 0), clock(d, 19, 0));
            idle_between(h, key, clock(d, 19, 0), clock(d + 1, 7, 0));
        }
        h.busy(&key, clock(6, 7, 0), STEP);
    }

    /// `key` went idle at `since`: what its estimate is after `idle_for`.
    fn ask(h: &mut Histories<u32>, key: u32, since: Timestamp, idle_for: i64) -> Option<Estimate> {
        h.set_shape(&key, IdleShape::MemoryHeld);
        h.unobserved(&key, since); // after a gap: what came before starts no span
        h.busy(&key, since, STEP);
        h.idle(&key, since + SignedDuration::from_mins(idle_for));
        h.estimate(
            &key,
            IdleShape::MemoryHeld,
            SignedDuration::from_mins(idle_for),
        )
    }

    #[test]
    fn an_evening_pause_borrows_the_pauses_that_began_in_the_same_quarter_of_the_day() {
        let mut h = Histories::new(params(3));
        office_hours(&mut h, 1);
        assert_eq!(h.spans(), 12);
        // Idle for an hour since 19:00: the six nights began 18:00–00:00 and lasted.
        let e = ask(&mut h, 2, clock(6, 19, 0), 60).unwrap();
        assert_eq!(
            e.basis,
            Basis::Peers(IdleShape::MemoryHeld, Some(Hours { first: 18 }))
        );
        assert_eq!((e.resumed, e.longer), (0, 6));
        assert_eq!(
            e.sentence(),
            "idle 1h; MemoryHeld workloads' idle spans that began in 18:00–00:00 UTC as this one did and lasted longer than 1h ended within 2h in 0 of 6 cases (product-limit 0 %): 40 % with the cautious prior (100 % over 4 cases)"
        );
        // Idle for an hour since 12:30: the six lunch pauses all ended within the horizon.
        let e = ask(&mut h, 3, clock(6, 12, 30), 60).unwrap();
        assert_eq!(
            e.basis,
            Basis::Peers(IdleShape::MemoryHeld, Some(Hours { first: 12 }))
        );
        assert_eq!((e.resumed, e.longer), (6, 6));
        // Without the hours, both would get the whole day: 6 of 12.
        let mut whole_day = Histories::new(params(7));
        office_hours(&mut whole_day, 1);
        let e = ask(&mut whole_day, 2, clock(6, 19, 0), 60).unwrap();
        assert_eq!(e.basis, Basis::Peers(IdleShape::MemoryHeld, None));
        assert_eq!((e.resumed, e.longer), (6, 12));
    }

    #[test]
    fn too_few_pauses_in_this_quarter_of_the_day_fall_back_to_the_rhythm_at_any_hour() {
        let mut h = Histories::new(params(5));
        // A chatty workload whose pauses of 2h50m (not 3h: no daily habit) all began around
        // 22:00.
        busy_through(&mut h, 1, clock(0, 0, 0), clock(0, 0, 0));
        h.set_shape(&1, IdleShape::MemoryHeld);
        let mut at = clock(0, 0, 0);
        for _ in 0..30 {
            idle_between(&mut h, 1, at, at + SignedDuration::from_mins(3));
            at += SignedDuration::from_mins(3);
            h.busy(&1, at, STEP);
        }
        for d in 0..6 {
            let from = clock(d, 22, 0);
            busy_through(&mut h, 1, at, from);
            let pause = SignedDuration::from_mins(170);
            idle_between(&mut h, 1, from, from + pause);
            at = from + pause;
            h.busy(&1, at, STEP);
        }
        assert_eq!(h.get(&1).unwrap().rhythm(), Some(Rhythm::Chatty));
        // Another chatty workload, idle an hour since 22:00: its rhythm at that hour.
        feed(&mut h, 2, 0, &[3; 30]);
        let e = ask(&mut h, 2, clock(6, 22, 0), 60).unwrap();
        let evening = Some(Hours { first: 18 });
        assert_eq!(
            e.basis,
            Basis::Rhythm(IdleShape::MemoryHeld, Rhythm::Chatty, Daily(false), evening)
        );
        assert_eq!((e.resumed, e.longer), (6, 6));
        // Idle an hour since 10:00: no long pause began 06:00–12:00, nor any of any
        // rhythm: the rhythm's pauses at any hour decide.
        feed(&mut h, 3, 0, &[3; 30]);
        let e = ask(&mut h, 3, clock(6, 10, 0), 60).unwrap();
        assert_eq!(
            e.basis,
            Basis::Rhythm(IdleShape::MemoryHeld, Rhythm::Chatty, Daily(false), None)
        );
        assert_eq!((e.resumed, e.longer), (6, 6));
    }

    #[test]
    fn a_span_still_in_progress_elsewhere_counts_once_it_outlasted_the_horizon() {
        let mut h = Histories::new(params(1));
        // Workload 1 went idle at minute 0 and is still idle five hours later (retired).
        h.set_shape(&1, IdleShape::MemoryHeld);
        h.busy(&1, t(0), STEP);
        for m in 1..=300 {
            h.idle(&1, t(m));
        }
        // Another workload, idle an hour, with no history: that span outlasted 1h + 2h.
        let e = h
            .estimate(&2, IdleShape::MemoryHeld, SignedDuration::from_hours(1))
            .unwrap();
        assert_eq!(e.basis, Basis::Peers(IdleShape::MemoryHeld, None));
        assert_eq!((e.resumed, e.longer), (0, 1));
        // Idle 4h: it was seen idle to 5h: a case, censored there.
        let e = h
            .estimate(&2, IdleShape::MemoryHeld, SignedDuration::from_hours(4))
            .unwrap();
        assert_eq!((e.resumed, e.longer, e.product_limit), (0, 1, 0.0));
        // Idle 5h: not outlasted: unknown.
        assert!(
            h.estimate(&2, IdleShape::MemoryHeld, SignedDuration::from_hours(5))
                .is_none()
        );
        // A workload's own span in progress is no case for itself.
        assert!(
            h.estimate(&1, IdleShape::MemoryHeld, SignedDuration::from_hours(1))
                .is_none()
        );
        // Once it resumes it is a finished span, counted once.
        h.busy(&1, t(301), STEP);
        let e = h
            .estimate(&2, IdleShape::MemoryHeld, SignedDuration::from_hours(1))
            .unwrap();
        assert_eq!((e.resumed, e.longer), (0, 1));
    }

    #[test]
    fn a_busy_step_right_after_another_is_no_span() {
        let mut h = Histories::new(params(1));
        for m in 0..10 {
            h.busy(&1, t(m), STEP);
        }
        assert_eq!(h.spans(), 0);
    }
}
