//! Resumption risk: how likely an idle workload is to become active again within the
//! regret horizon, given how long it has been idle now. PURE: spans are fed in time order
//! by the caller (the controller each cycle, backtest each step); nothing here reads a
//! clock or looks past the instant it is asked about.
//!
//! The estimate is survival analysis over idle spans. A span runs from the last busy
//! instant to the next busy one ("resumed after R") or to the moment the workload stopped
//! being observed — a gap, its pods gone, an action, or a span still open ("censored at
//! C"). Idle for `t` now, the risk is the product-limit (Kaplan–Meier) probability that a
//! span that lasted `t` ends within the horizon `h`:
//!
//! ```text
//! risk = 1 − Π over the minutes u in (t, t + h] of (1 − resumed at u / at risk at u)
//! ```
//!
//! where "at risk at u" counts every span that lasted to `u`: finished ones, and censored
//! ones for as long as they were seen idle (evidence that a span lasted at least so long,
//! and no more). It is then weighed against a cautious prior ([`PRIOR_RISK`] over
//! [`PRIOR_CASES`] cases; [`estimate`] holds the arithmetic). The pooled spans of the
//! workloads of the same policy and idle shape are tried in this order: of the same
//! rhythm (the class of their median idle span, and whether their long pauses recur at
//! one time of day: a chatty server does not borrow a sparse one's pauses, nor an
//! office-hours server's nights) that began in the same quarter of the day (UTC) as this
//! span; of any rhythm that began in that quarter (an evening pause is like other evening
//! pauses); of the same rhythm at any hour; of any rhythm at any hour (a young workload,
//! with no rhythm yet, borrows its peers'). When at least `minIdleSpans` of the
//! workload's own spans qualify, they decide, blended with the first of those pools that
//! has enough other workloads' spans ([`PEER_WEIGHT`]); else that pool decides; else
//! there is no estimate, and a risk-gated policy waits until `idle.maxIdle` (DESIGN.md
//! invariant 13: knowing nothing is not permission to act).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use jiff::{SignedDuration, Timestamp};

use super::shape::IdleShape;

pub(crate) mod calendar;
mod estimate;

use calendar::{Calendar, Moments};
pub use calendar::{Class as CalendarClass, Days as CalendarDays};
use estimate::Cases;
pub use estimate::{Blend, Estimate, PEER_WEIGHT, PRIOR_CASES, PRIOR_RISK};

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
    /// The policy's moments of workloads whose calendar had this class, idle as long (the
    /// hour band, `calendar::band`): the workload's own past days at this time of day.
    Calendar(CalendarDays, u8),
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
    /// When it was busy, by ten minutes, over the past days; and the moments of its span
    /// in progress still to settle.
    calendar: Calendar,
}

impl IdleHistory {
    /// Finished spans kept.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Its finished spans kept, oldest first: when each ended (Unix seconds), how long it
    /// lasted (seconds), and whether activity resumed (else it was censored).
    pub fn finished(&self) -> impl Iterator<Item = (i64, i64, bool)> + '_ {
        self.spans.iter().map(|s| (s.ended_at, s.length, s.resumed))
    }

    /// When the span in progress began (its last busy instant), while it is known.
    pub fn open_since(&self) -> Option<Timestamp> {
        self.last_busy
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

/// Settles the moments of a workload's span that began at `began` whose outcome is known
/// at `at` (see [`Calendar::settle`]) into the policy's `moments`; those without a
/// calendar class then are not evidence for any class.
fn settle(
    calendar: &mut Calendar,
    moments: &mut Moments,
    began: Timestamp,
    at: Timestamp,
    resumed_at: Option<Timestamp>,
    horizon_secs: i64,
) {
    calendar.settle(
        began,
        at,
        resumed_at,
        horizon_secs,
        |c, t, days, resumed| {
            if let Some(days) = days {
                moments.add(c, t, days, resumed);
            }
        },
    );
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
    /// The settled moments of every workload, by calendar class and idle band.
    moments: Moments,
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
            moments: Moments::default(),
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
        let horizon = self.params.horizon.as_secs();
        let h = self.by_workload.entry(key.clone()).or_default();
        if h.last_busy.is_some_and(|b| b >= at) {
            return; // already known (the controller sees the same last-busy instant again)
        }
        h.calendar.mark(at, true);
        let previous = h.last_busy.replace(at);
        h.last_idle = None;
        if let Some(from) = previous {
            settle(
                &mut h.calendar,
                &mut self.moments,
                from,
                at,
                Some(at),
                horizon,
            );
        }
        h.calendar.span_began();
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
        let horizon = self.params.horizon.as_secs();
        let h = self.by_workload.entry(key.clone()).or_default();
        h.calendar.mark(at, false);
        if let Some(from) = h.last_busy {
            h.last_idle = Some(at);
            settle(&mut h.calendar, &mut self.moments, from, at, None, horizon);
        }
    }

    /// Not observed at `at` (telemetry gap, pods gone, or acted on): the span in progress
    /// is censored at its last idle observation.
    pub fn unobserved(&mut self, key: &K, at: Timestamp) {
        let Some(h) = self.by_workload.get_mut(key) else {
            return;
        };
        h.calendar.span_censored();
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
        let horizon_secs = self.params.horizon.as_secs();
        let mut dropped = Vec::new();
        let moments = &mut self.moments;
        moments.prune(lookback_start);
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
                    h.calendar.span_censored();
                }
                Some(b) => {
                    h.last_idle = Some(now);
                    // Known not busy (it holds no GPU): its calendar says so too, or a
                    // server reclaimed every night would never have a night seen.
                    h.calendar.mark(now, false);
                    settle(&mut h.calendar, moments, b, now, None, horizon_secs);
                }
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

    /// The resumption risk of `key`, idle in `shape` for `idle_for` at `now`: from its
    /// calendar when it has one (its past days at this time of day, [`calendar`]) and the
    /// policy has `min_spans` moments of that class and idle band; else [`Self::estimate`].
    pub fn estimate_at(
        &self,
        key: &K,
        shape: IdleShape,
        idle_for: SignedDuration,
        now: Timestamp,
    ) -> Option<Estimate> {
        let horizon = self.params.horizon;
        let days = self
            .by_workload
            .get(key)
            .filter(|w| w.last_busy.is_some())
            .and_then(|w| w.calendar.days_at(now, horizon.as_secs()));
        if let Some(days) = days {
            let t = idle_for.as_secs();
            let (n, k) = self.moments.count(days.class, t);
            if n >= self.params.min_spans.max(1) {
                return Some(Estimate {
                    idle_for,
                    horizon,
                    resumed: k,
                    longer: n,
                    product_limit: f64::from(k) / f64::from(n),
                    basis: Basis::Calendar(days, calendar::band(t) as u8),
                    blend: None,
                });
            }
        }
        self.estimate(key, shape, idle_for)
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
mod tests;
