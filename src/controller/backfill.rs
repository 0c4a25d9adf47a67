//! Start-up backfill of the idle-span history. The controller learns idle spans from the
//! observations each cycle already has; a controller that just started (or a new leader)
//! has none, so the resumption-risk estimate and the request-driven-inference test would
//! fall back to the fixed durations for days. Once per policy, it replays the activity of
//! the last `--history-backfill` from Prometheus (chunked range-vector queries of the two
//! activity families only: the same raw samples `backtest` reads) into the history.
//!
//! The range is read one piece at a time, oldest first ([`pieces`]: one
//! `--prometheus-chunk` each), and every piece is fed into the history of each policy
//! backfilled in that cycle before the next is read: memory holds one piece, whatever the
//! range. [`Stream`] is pure: it maps each piece's GPUs to the workloads that exist now (a
//! pod is mapped to its root workload through the current inventory; pods gone since are
//! not) and feeds [`crate::engine::step::backfill`], which `backtest --warmup` runs too,
//! bucket by bucket within the piece's bounds. Fed in pieces, a history is the one the
//! whole range fed at once would give (for a range within the policy's `idle.history`:
//! beyond it, the oldest spans are forgotten as the feed moves on, as the cycles do).

use std::collections::HashMap;

use jiff::{SignedDuration, Timestamp};

use crate::cluster::inventory::{ObjectKey, Workload};
use crate::engine::{Histories, Rules};
use crate::telemetry::trace::Trace;

/// The activity families the backfill reads.
pub const FAMILIES: [&str; 2] = ["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL"];

/// The bucket of the backfill's trace (the `step_seconds` of its reads).
pub const STEP_SECONDS: i64 = 60;

/// What a backfill added.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Backfilled {
    /// Workloads with at least one GPU series in the trace.
    pub workloads: usize,
    /// Finished idle spans now in the history.
    pub spans: usize,
}

/// The consecutive pieces `[from, until]` of the range `from`..`until`, oldest first: a
/// piece ends on a multiple of `length` (rounded down to whole buckets, one at least), so
/// inside the range every boundary falls between two buckets and each bucket is fed by
/// one piece. A piece read from Prometheus as `FAMILY[length + 1s]` is one query per
/// family (`PrometheusSource::fetch_families` starts a second early).
pub fn pieces(
    from: Timestamp,
    until: Timestamp,
    length: SignedDuration,
) -> Vec<(Timestamp, Timestamp)> {
    let length = (length.as_secs() / STEP_SECONDS).max(1) * STEP_SECONDS;
    let mut out = Vec::new();
    let mut start = from;
    while start < until {
        let next = (start.as_second().div_euclid(length) + 1) * length;
        let end = Timestamp::from_second(next).map_or(until, |t| t.min(until));
        out.push((start, end));
        start = end;
    }
    out
}

/// One backfill, fed piece by piece, oldest first, into the histories of the policies
/// backfilled together. Between pieces it remembers only which bucket comes next, so that
/// what the pieces do not show (a piece without a workload's GPUs, buckets without any
/// sample between two pieces) reads as not observed, as in one trace of the whole range.
pub struct Stream<'a> {
    workloads: &'a [Workload],
    root_of: HashMap<(&'a str, &'a str), usize>,
    /// Workloads with a GPU series in any piece so far.
    seen: Vec<bool>,
    /// The first bucket after the last one fed, once a piece had samples.
    next_bucket: Option<i64>,
}

/// A piece of the range, ready to feed every history backfilled with it.
pub struct Piece<'t> {
    trace: &'t Trace,
    from: Timestamp,
    until: Timestamp,
    /// Each workload (key, indexes of its GPUs' series in the piece).
    fed: Vec<(ObjectKey, Vec<usize>)>,
    /// When the buckets no piece showed began, if some did since the last piece fed.
    unseen_since: Option<Timestamp>,
    /// The first bucket fed (the workloads without GPUs in the piece are not observed
    /// from then on).
    first_fed: Option<Timestamp>,
}

impl<'a> Stream<'a> {
    /// A backfill for the root workloads of `workloads` (the inventory now).
    pub fn new(workloads: &'a [Workload]) -> Self {
        let mut root_of = HashMap::new();
        for (i, w) in workloads.iter().enumerate() {
            for p in &w.pods {
                root_of.insert((p.meta.namespace.as_str(), p.meta.name.as_str()), i);
            }
        }
        Self {
            workloads,
            root_of,
            seen: vec![false; workloads.len()],
            next_bucket: None,
        }
    }

    /// The next piece, `trace` read for `from`..`until` (the buckets at or after `until`
    /// belong to the next piece).
    pub fn piece<'t>(&mut self, trace: &'t Trace, from: Timestamp, until: Timestamp) -> Piece<'t> {
        let step = trace.step_seconds.max(1);
        let mut gpus_of: Vec<Vec<usize>> = vec![Vec::new(); self.workloads.len()];
        for (gi, g) in trace.gpus.iter().enumerate() {
            if let Some(&wi) = self
                .root_of
                .get(&(g.gpu.namespace.as_str(), g.gpu.pod.as_str()))
            {
                gpus_of[wi].push(gi);
                self.seen[wi] = true;
            }
        }
        // The buckets `engine::step::backfill` walks for this piece.
        let first = trace.first_bucket.max(from.as_second().div_euclid(step));
        let last = trace
            .last_bucket
            .min((until.as_second() - 1).div_euclid(step));
        let at = |bucket: i64| Timestamp::from_second(bucket * step).ok();
        let (mut unseen_since, mut first_fed) = (None, None);
        if first <= last {
            unseen_since = self.next_bucket.filter(|b| *b < first).and_then(at);
            first_fed = at(first);
            self.next_bucket = Some(last + 1);
        }
        Piece {
            trace,
            from,
            until,
            fed: self
                .workloads
                .iter()
                .zip(gpus_of)
                .map(|(w, gpus)| (w.root.key(), gpus))
                .collect(),
            unseen_since,
            first_fed,
        }
    }

    /// The rest of the range could not be read from `at`: every span in progress ends
    /// there, censored (a gap is never idleness); the cycles learn on from now.
    pub fn interrupted(&self, history: &mut Histories<ObjectKey>, at: Timestamp) {
        for w in self.workloads {
            history.unobserved(&w.root.key(), at);
        }
    }

    /// What `history` holds after the pieces so far.
    pub fn backfilled(&self, history: &Histories<ObjectKey>) -> Backfilled {
        Backfilled {
            workloads: self.seen.iter().filter(|s| **s).count(),
            spans: history.spans(),
        }
    }
}

impl Piece<'_> {
    /// Feeds `history` with every bucket of the piece, for every workload: a bucket with a
    /// sample at or above the threshold on any GPU is busy, one with samples all below is
    /// idle, one without samples is not observed.
    pub fn feed(&self, history: &mut Histories<ObjectKey>, rules: &Rules) {
        // What one trace of the whole range would have said of the buckets this stream
        // did not walk: not observed. The first of them is enough: a span in progress is
        // censored there, and again is nothing more. Unknown workloads are untouched.
        if let Some(at) = self.unseen_since {
            for (key, _) in &self.fed {
                history.unobserved(key, at);
            }
        }
        if let Some(at) = self.first_fed {
            for (key, _) in self.fed.iter().filter(|(_, gpus)| gpus.is_empty()) {
                history.unobserved(key, at);
            }
        }
        // The same feed `backtest --warmup` runs.
        crate::engine::step::backfill(history, self.trace, &self.fed, rules, self.from, self.until);
    }
}

/// Feeds `history` with every bucket of `trace` before `until`, for the root workloads
/// of `workloads`, as one piece: the whole range at once.
pub fn feed(
    history: &mut Histories<ObjectKey>,
    trace: &Trace,
    workloads: &[Workload],
    rules: &Rules,
    until: Timestamp,
) -> Backfilled {
    let mut stream = Stream::new(workloads);
    stream
        .piece(trace, Timestamp::MIN, until)
        .feed(history, rules);
    stream.backfilled(history)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::inventory::{pod_info, resolve};
    use crate::engine::inference::request_driven;
    use crate::gpus::GpuResources;
    use crate::telemetry::trace::{ReadOptions, read_trace};
    use jiff::SignedDuration;
    use serde_json::json;
    use std::fmt::Write as _;

    const T0: i64 = 1_793_577_600;

    /// `ml/chat-0` busy 10 minutes, idle 3, for `hours`; `ml/gone-0` (no longer in the
    /// cluster) the same.
    fn trace(hours: i64) -> Trace {
        let mut s = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
        for pod in ["chat-0", "gone-0"] {
            for m in 0..hours * 60 {
                let v = if m % 13 < 10 { 0.8 } else { 0.0 };
                let _ = writeln!(
                    s,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"0\",UUID=\"GPU-{pod}\",modelName=\"NVIDIA L4\",namespace=\"ml\",pod=\"{pod}\"}} {v} {}",
                    T0 + m * 60
                );
            }
        }
        s.push_str("# EOF\n");
        read_trace(s.as_bytes(), "test", &ReadOptions::default()).unwrap()
    }

    fn workloads() -> Vec<Workload> {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "chat-0", "namespace": "ml", "creationTimestamp": "2026-11-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}});
        let now = Timestamp::from_second(T0).unwrap();
        resolve(
            vec![pod_info(&pod, &GpuResources::default(), now).unwrap()],
            &HashMap::new(),
        )
    }

    #[test]
    fn a_day_of_history_teaches_the_rhythm_of_the_workloads_that_exist_now() {
        let spec = crate::backtest::samples::sample_policy().unwrap().spec;
        let rules = Rules::from_spec(&spec);
        let w = workloads();
        let key = w[0].root.key();
        let until = Timestamp::from_second(T0 + 24 * 3600).unwrap();
        let mut history = Histories::new(rules.risk);
        let added = feed(&mut history, &trace(24), &w, &rules, until);
        assert_eq!(added.workloads, 1, "gone-0 is not in the cluster");
        // 24 h / 13 min ≈ 110 busy→idle→busy cycles, each a finished idle span.
        assert!(added.spans >= 100, "{added:?}");
        assert_eq!(history.workloads(), 1);
        let why = request_driven(history.get(&key)).expect("chatty");
        assert!(why.contains("under 4m"), "{why}");
        // Too short a backfill: not enough spans to tell.
        let mut short = Histories::new(rules.risk);
        feed(&mut short, &trace(2), &w, &rules, until);
        assert_eq!(request_driven(short.get(&key)), None);
    }

    /// A minute's activity of a pod (`None`: no sample).
    type Activity = fn(i64) -> Option<f64>;

    /// Four days at 30 s scrapes (stamped 7.25 s into each half-minute, as Prometheus'
    /// milliseconds fall), of: `chat-0`, busy 10 minutes of 13, with a 5-hour gap on day
    /// 2; `batch-0`, busy 08:00–18:00 UTC; `late-0`, from day 3 only; `left-0`, for its
    /// first 30 hours only; `gone-0` (not in the cluster); and 3 hours of day 3 with no
    /// sample from anyone (Prometheus down). As Prometheus answers `FAMILY[..]` at
    /// `until` from `from - 1s`: the samples in (`from` - 1 s, `until`].
    fn days(from: i64, until: i64) -> Option<Trace> {
        const DAYS: i64 = 4;
        let pods: [(&str, Activity); 5] = [
            ("chat-0", |m| {
                (!(30 * 60..35 * 60).contains(&m)).then_some(if m % 13 < 10 { 0.8 } else { 0.0 })
            }),
            ("batch-0", |m| {
                Some(if (8 * 60..18 * 60).contains(&(m % 1440)) {
                    0.9
                } else {
                    0.01
                })
            }),
            ("late-0", |m| {
                (m >= 2 * 1440).then_some(if m % 97 < 40 { 0.6 } else { 0.0 })
            }),
            ("left-0", |m| {
                (m < 30 * 60).then_some(if m % 240 < 30 { 0.5 } else { 0.0 })
            }),
            ("gone-0", |m| Some(if m % 7 < 3 { 0.8 } else { 0.0 })),
        ];
        let mut s = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
        for (pod, activity) in pods {
            for k in 0..DAYS * 1440 * 2 {
                let t = T0 as f64 + k as f64 * 30.0 + 7.25;
                let m = k / 2;
                if t <= (from - 1) as f64
                    || t > until as f64
                    || (3 * 1440 + 300..3 * 1440 + 480).contains(&m)
                {
                    continue;
                }
                if let Some(v) = activity(m) {
                    let _ = writeln!(
                        s,
                        "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"0\",UUID=\"GPU-{pod}\",modelName=\"NVIDIA L4\",namespace=\"ml\",pod=\"{pod}\"}} {v} {t}"
                    );
                }
            }
        }
        s.push_str("# EOF\n");
        // An empty piece is no trace (`fetch_families` says so with `None`).
        read_trace(s.as_bytes(), "test", &ReadOptions::default()).ok()
    }

    fn pod(name: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "creationTimestamp": "2026-11-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}})
    }

    /// Everything of `history` the decisions read, per workload of `w`, comparable.
    fn seen_by_decisions(
        history: &mut Histories<ObjectKey>,
        w: &[Workload],
        now: Timestamp,
    ) -> Vec<String> {
        use crate::engine::shape::IdleShape;
        let mut out = vec![format!(
            "{} spans, {} workloads",
            history.spans(),
            history.workloads()
        )];
        for k in w.iter().map(|w| w.root.key()) {
            history.set_shape(&k, IdleShape::Unused);
        }
        for k in w.iter().map(|w| w.root.key()) {
            let h = history.get(&k);
            out.push(format!(
                "{k}: finished {:?}, open since {:?}, rhythm {:?}",
                h.map(|h| h.finished().collect::<Vec<_>>()),
                h.and_then(|h| h.open_since()),
                h.and_then(|h| h.rhythm()),
            ));
            for idle in [5, 40, 3 * 60, 9 * 60] {
                let e = history.estimate_at(
                    &k,
                    IdleShape::Unused,
                    SignedDuration::from_mins(idle),
                    now,
                );
                out.push(format!("{k} idle {idle}m: {e:?}"));
            }
        }
        out
    }

    #[test]
    fn a_backfill_fed_in_pieces_equals_the_whole_range_fed_at_once() {
        let policy = crate::api::validate::parse_resource::<crate::api::GpuPolicy>(
            include_str!("../../config/samples/inference-risk.yaml"),
            "inference-risk.yaml",
        )
        .unwrap();
        let rules = Rules::from_spec(&policy.spec);
        let now = Timestamp::from_second(T0 + 4 * 86_400 - 1234).unwrap();
        let w = resolve(
            ["chat-0", "batch-0", "late-0", "left-0"]
                .iter()
                .map(|n| pod_info(&pod(n), &GpuResources::default(), now).unwrap())
                .collect(),
            &HashMap::new(),
        );
        let from = now - SignedDuration::from_hours(95);
        let mut whole = Histories::new(rules.risk);
        let trace = days(from.as_second(), now.as_second()).unwrap();
        let at_once = feed(&mut whole, &trace, &w, &rules, now);
        assert!(at_once.spans > 300, "{at_once:?}");
        let expected = seen_by_decisions(&mut whole, &w, now);
        // The calendar source answers, so the comparison covers it.
        assert!(
            expected.iter().any(|e| e.contains("Calendar")),
            "{expected:#?}"
        );
        // Pieces of 2 h (the default chunk), of 7 minutes, and of 5 hours: the gaps fall
        // inside pieces, over their boundaries, and fill whole pieces.
        for minutes in [120, 7, 300] {
            let mut pieced = Histories::new(rules.risk);
            let mut stream = Stream::new(&w);
            let pieces = pieces(from, now, SignedDuration::from_mins(minutes));
            assert_eq!(pieces.first().map(|p| p.0), Some(from));
            assert_eq!(pieces.last().map(|p| p.1), Some(now));
            let mut empty = 0;
            for &(a, b) in &pieces {
                assert!(b.as_second() % 60 == 0 || b == now, "{b}");
                match days(a.as_second(), b.as_second()) {
                    Some(t) => stream.piece(&t, a, b).feed(&mut pieced, &rules),
                    None => empty += 1,
                }
            }
            // The 3 hours without samples hold whole pieces of 2h and of 7m.
            assert_eq!(empty >= 1, minutes < 180, "pieces of {minutes}m");
            assert_eq!(stream.backfilled(&pieced), at_once, "pieces of {minutes}m");
            assert_eq!(
                seen_by_decisions(&mut pieced, &w, now),
                expected,
                "pieces of {minutes}m"
            );
        }
    }

    #[test]
    fn a_piece_that_cannot_be_read_ends_the_spans_in_progress_there() {
        let spec = crate::backtest::samples::sample_policy().unwrap().spec;
        let rules = Rules::from_spec(&spec);
        let now = Timestamp::from_second(T0 + 86_400).unwrap();
        let w = resolve(
            vec![pod_info(&pod("left-0"), &GpuResources::default(), now).unwrap()],
            &HashMap::new(),
        );
        let key = w[0].root.key();
        let pieces = pieces(
            now - SignedDuration::from_hours(24),
            now,
            SignedDuration::from_hours(2),
        );
        let mut history = Histories::new(rules.risk);
        let mut stream = Stream::new(&w);
        // Busy 04:00–04:29, then idle: the span from 04:29 is in progress at 06:00.
        for &(a, b) in &pieces[..3] {
            let t = days(a.as_second(), b.as_second()).unwrap();
            stream.piece(&t, a, b).feed(&mut history, &rules);
        }
        let open = history.get(&key).and_then(|h| h.open_since()).unwrap();
        assert_eq!(
            open,
            Timestamp::from_second(T0 + 4 * 3600 + 29 * 60).unwrap()
        );
        let finished = history.spans();
        // The fourth piece fails: the span ends there, censored, never idle through the gap.
        stream.interrupted(&mut history, pieces[3].0);
        assert_eq!(history.get(&key).and_then(|h| h.open_since()), None);
        assert_eq!(history.spans(), finished + 1);
        let last = history.get(&key).unwrap().finished().last().unwrap();
        // Ended at 06:00, idle from 04:29 to its last idle observation (05:59).
        assert_eq!(last, (T0 + 6 * 3600, 90 * 60, false));
    }

    #[test]
    fn nothing_at_or_after_the_cut_is_fed() {
        let spec = crate::backtest::samples::sample_policy().unwrap().spec;
        let rules = Rules::from_spec(&spec);
        let w = workloads();
        let t = trace(24);
        let cut = Timestamp::from_second(T0 + 12 * 3600).unwrap();
        let mut full = Histories::new(rules.risk);
        feed(&mut full, &t, &w, &rules, cut);
        let mut half = Histories::new(rules.risk);
        feed(&mut half, &trace(12), &w, &rules, cut);
        assert_eq!(full.spans(), half.spans());
    }
}
