//! The calendar source of the resumption risk. PURE.
//!
//! A workload's **calendar** says, for a moment `c`, on how many of the past
//! [`DAYS`] days it was busy at the same time of day, from [`MARGIN_SECS`] before `c`
//! to the end of the regret horizon and [`MARGIN_SECS`] after: a server idle through
//! every evening of the past week is **quiet** at 19:00; one that had requests in that
//! window on most days is **busy** then, however long it has been idle today.
//!
//! The policy's **moments** are the evidence: every [`GRID_SECS`] of every idle span (up
//! to [`GRID_MAX_SECS`] into it), the calendar class of its workload at that moment, how
//! long it had been idle (a [`BANDS`]-hour band), and whether it was busy again within
//! the horizon. A moment is settled once that is known (the horizon passed idle, or the
//! workload came back), and kept by the day it fell on for the lookback. The estimate for
//! a workload idle for `t` at `now` is the share of the moments of its class and band
//! that resumed, weighed against the cautious prior like every estimate
//! (`estimate::Estimate::risk`).
//!
//! Measured on the 23-day production file (docs/decision-quality.md): the class at the
//! moment of the decision separates what the hour of the day and the workload's own span
//! lengths did not — idle 6h or more, quiet on every day seen: 1 % resumed within 2h;
//! busy on most days: 52 %.

use std::collections::VecDeque;

use jiff::Timestamp;

/// Seconds per calendar slot: busy and observed are kept per ten minutes.
const SLOT_SECS: i64 = 600;
/// Past days the calendar looks at.
pub const DAYS: i64 = 7;
/// Days seen (with telemetry in the window) before a calendar has a class.
pub const MIN_DAYS: u32 = 3;
/// Slots kept: the days looked at, and two more for the margin and the horizon.
const SLOTS: i64 = (DAYS + 2) * 86_400 / SLOT_SECS;
const WORDS: usize = (SLOTS as usize).div_ceil(64);
/// Widening of the window on each side: a server used at 19:10 yesterday is not quiet at
/// 19:00 today. Measured: without it the 5 % level realised 5.6 %, with 30 minutes 4.2 %.
pub const MARGIN_SECS: i64 = 1800;
/// A moment every ten minutes of an idle span…
const GRID_SECS: i64 = 600;
/// …up to ten hours into it (the ceiling `maxIdle` is rarely longer).
const GRID_MAX_SECS: i64 = 10 * 3600;
/// Idle-time bands: 0–1h, 1–2h, …, 5–6h, 6h and longer.
pub const BANDS: usize = 7;

/// What a workload's past days say about the window from now through the horizon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Busy in the window on none of the days seen.
    Quiet,
    /// Busy on at most a third of them.
    Low,
    /// Busy on more.
    Busy,
}

impl Class {
    fn index(self) -> usize {
        self as usize
    }
}

/// A calendar's answer at one moment: its class, and the days behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Days {
    pub class: Class,
    /// Days with activity in the window.
    pub busy: u8,
    /// Days with telemetry in the window.
    pub seen: u8,
}

impl Days {
    fn of(busy: u32, seen: u32) -> Option<Self> {
        if seen < MIN_DAYS {
            return None;
        }
        let class = if busy == 0 {
            Class::Quiet
        } else if 3 * busy <= seen {
            Class::Low
        } else {
            Class::Busy
        };
        Some(Self {
            class,
            busy: busy as u8,
            seen: seen as u8,
        })
    }
}

/// One workload's busy and observed ten-minute slots over the last days, in a ring.
#[derive(Debug, Clone, Default)]
pub struct Calendar {
    /// The latest slot written (None: nothing yet).
    latest: Option<i64>,
    busy: Vec<u64>,
    observed: Vec<u64>,
    /// The next moment of the span in progress to settle (1 = ten minutes in).
    next_moment: i64,
}

fn slot_of(secs: i64) -> i64 {
    secs.div_euclid(SLOT_SECS)
}

fn bit(slot: i64) -> (usize, u64) {
    let i = slot.rem_euclid(SLOTS) as usize;
    (i / 64, 1 << (i % 64))
}

impl Calendar {
    /// Observed at `at`, busy or not.
    pub fn mark(&mut self, at: Timestamp, busy: bool) {
        let slot = slot_of(at.as_second());
        if self.busy.is_empty() {
            self.busy = vec![0; WORDS];
            self.observed = vec![0; WORDS];
        }
        match self.latest {
            Some(latest) if slot <= latest - SLOTS => return, // older than kept
            Some(latest) if slot > latest => {
                // Reuse the slots between: they hold the days that fell out of the ring.
                for s in (latest + 1..=slot).take(SLOTS as usize) {
                    let (w, b) = bit(s);
                    self.busy[w] &= !b;
                    self.observed[w] &= !b;
                }
                self.latest = Some(slot);
            }
            None => self.latest = Some(slot),
            Some(_) => {}
        }
        let (w, b) = bit(slot);
        self.observed[w] |= b;
        if busy {
            self.busy[w] |= b;
        }
    }

    /// (any busy, any observed) over the slots of `[from, to)` (Unix seconds) still kept.
    fn window(&self, from: i64, to: i64) -> (bool, bool) {
        let Some(latest) = self.latest else {
            return (false, false);
        };
        let (mut busy, mut seen) = (false, false);
        for s in slot_of(from).max(latest - SLOTS + 1)..=slot_of(to - 1).min(latest) {
            let (w, b) = bit(s);
            busy |= self.busy[w] & b != 0;
            seen |= self.observed[w] & b != 0;
        }
        (busy, seen)
    }

    /// The class at `at` for a horizon of `horizon_secs`: the past [`DAYS`] days' windows
    /// from `at − MARGIN` to `at + horizon + MARGIN`. None with fewer than [`MIN_DAYS`]
    /// days seen. Only slots at least a day old are read, so the answer for a past moment
    /// is the same whenever it is asked (within the ring).
    pub fn days_at(&self, at: Timestamp, horizon_secs: i64) -> Option<Days> {
        let c = at.as_second();
        let (mut busy, mut seen) = (0, 0);
        for k in 1..=DAYS {
            let from = c - k * 86_400 - MARGIN_SECS;
            let to = (c - k * 86_400 + horizon_secs + MARGIN_SECS).min(c);
            let (b, s) = self.window(from, to);
            busy += u32::from(b && s);
            seen += u32::from(s);
        }
        Days::of(busy, seen)
    }

    /// A new idle span began: its moments are counted from ten minutes in.
    pub fn span_began(&mut self) {
        self.next_moment = 1;
    }

    /// Settles the moments of the span that began at `began` whose outcome is known at
    /// `at`: with `resumed_at`, every moment before it (resumed if within the horizon);
    /// else those whose horizon passed idle by `at`. Each settled moment is handed to
    /// `settle` as (its instant, idle seconds then, its calendar, resumed).
    pub fn settle(
        &mut self,
        began: Timestamp,
        at: Timestamp,
        resumed_at: Option<Timestamp>,
        horizon_secs: i64,
        mut settle: impl FnMut(Timestamp, i64, Option<Days>, bool),
    ) {
        if self.next_moment == 0 {
            return; // no span began since the calendar was made (or it was settled)
        }
        let b = began.as_second();
        while self.next_moment * GRID_SECS <= GRID_MAX_SECS {
            let t = self.next_moment * GRID_SECS;
            let c = b + t;
            let resumed = match resumed_at {
                Some(r) if c < r.as_second() => r.as_second() - c <= horizon_secs,
                Some(_) => break,
                None if c + horizon_secs <= at.as_second() => false,
                None => break,
            };
            if let Ok(moment) = Timestamp::from_second(c) {
                settle(moment, t, self.days_at(moment, horizon_secs), resumed);
            }
            self.next_moment += 1;
        }
        if resumed_at.is_some() {
            self.next_moment = 0;
        }
    }

    /// The span in progress stopped being seen: its unsettled moments are unknown.
    pub fn span_censored(&mut self) {
        self.next_moment = 0;
    }
}

/// The settled moments of one day, by class and band: (moments, resumed).
#[derive(Debug, Clone)]
struct DayTally {
    day: i64,
    counts: [[(u32, u32); BANDS]; 3],
}

/// The policy's settled moments over the lookback.
#[derive(Debug, Clone, Default)]
pub struct Moments {
    days: VecDeque<DayTally>,
}

/// The band of an idle time: whole hours, the last band open-ended.
pub fn band(idle_secs: i64) -> usize {
    ((idle_secs.max(0) / 3600) as usize).min(BANDS - 1)
}

impl Moments {
    pub fn add(&mut self, at: Timestamp, idle_secs: i64, days: Days, resumed: bool) {
        let day = at.as_second().div_euclid(86_400);
        let i = match self.days.iter().position(|d| d.day >= day) {
            Some(i) if self.days[i].day == day => i,
            Some(i) => {
                self.days.insert(
                    i,
                    DayTally {
                        day,
                        counts: [[(0, 0); BANDS]; 3],
                    },
                );
                i
            }
            None => {
                self.days.push_back(DayTally {
                    day,
                    counts: [[(0, 0); BANDS]; 3],
                });
                self.days.len() - 1
            }
        };
        let slot = &mut self.days[i].counts[days.class.index()][band(idle_secs)];
        slot.0 += 1;
        slot.1 += u32::from(resumed);
    }

    /// Forgets the days before `from`.
    pub fn prune(&mut self, from: Timestamp) {
        let day = from.as_second().div_euclid(86_400);
        while self.days.front().is_some_and(|d| d.day < day) {
            self.days.pop_front();
        }
    }

    /// (moments, resumed) of `class` in the band of `idle_secs`.
    pub fn count(&self, class: Class, idle_secs: i64) -> (u32, u32) {
        let b = band(idle_secs);
        self.days.iter().fold((0, 0), |(n, k), d| {
            let (dn, dk) = d.counts[class.index()][b];
            (n + dn, k + dk)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(day: i64, hour: i64, min: i64) -> Timestamp {
        Timestamp::from_second(1_700_006_400 + day * 86_400 + hour * 3600 + min * 60).unwrap()
    }

    /// Observed every ten minutes of `days` days, busy at the instants `busy` says.
    fn observed(days: i64, busy: impl Fn(i64, i64, i64) -> bool) -> Calendar {
        let mut c = Calendar::default();
        for d in 0..days {
            for m in (0..24 * 60).step_by(10) {
                let (hour, min) = (m / 60, m % 60);
                c.mark(at(d, hour, min), busy(d, hour, min));
            }
        }
        c
    }

    #[test]
    fn a_calendar_has_a_class_once_three_days_are_seen() {
        let h = 2 * 3600;
        // Requests at 19:10 every evening: busy in the window of 19:00 on every day.
        let evenings = observed(4, |_, hour, min| hour == 19 && min == 10);
        assert_eq!(
            evenings.days_at(at(4, 19, 0), h),
            Some(Days {
                class: Class::Busy,
                busy: 4,
                seen: 4
            })
        );
        // At 16:00 the window runs to 18:30: the margin does not reach 19:10.
        assert_eq!(
            evenings.days_at(at(4, 16, 0), h).unwrap().class,
            Class::Quiet
        );
        // At 16:45 it runs to 19:15: the margin catches the request.
        assert_eq!(
            evenings.days_at(at(4, 16, 45), h).unwrap().class,
            Class::Busy
        );
        // Two days seen are not enough for a class.
        assert_eq!(evenings.days_at(at(2, 19, 0), h), None);
        // Busy on one evening of four: a third or less.
        let once = observed(4, |d, hour, _| d == 1 && hour == 20);
        assert_eq!(
            once.days_at(at(4, 19, 0), h),
            Some(Days {
                class: Class::Low,
                busy: 1,
                seen: 4
            })
        );
        // Days not observed are not days seen.
        let mut gaps = Calendar::default();
        for d in [0, 3] {
            for m in (0..24 * 60).step_by(10) {
                gaps.mark(at(d, m / 60, m % 60), false);
            }
        }
        assert_eq!(gaps.days_at(at(4, 19, 0), h), None);
    }

    #[test]
    fn slots_older_than_the_ring_are_forgotten() {
        let mut c = observed(3, |_, hour, _| hour == 19);
        // Nine days later, only the new day is kept: the old evenings are gone.
        for m in (0..24 * 60).step_by(10) {
            c.mark(at(12, m / 60, m % 60), false);
        }
        assert_eq!(c.days_at(at(13, 19, 0), 2 * 3600), None);
        let (busy, seen) = c.window(at(1, 19, 0).as_second(), at(1, 20, 0).as_second());
        assert!(!busy && !seen);
    }

    #[test]
    fn moments_settle_idle_once_the_horizon_passed_and_resumed_when_activity_came_within_it() {
        let h = 2 * 3600;
        let mut c = Calendar::default();
        let began = at(0, 10, 0);
        let mut settled = Vec::new();
        c.span_began();
        // Idle at 12:10: only the moment ten minutes in has seen its horizon pass idle.
        c.settle(began, at(0, 12, 10), None, h, |_, t, _, r| {
            settled.push((t / 60, r))
        });
        assert_eq!(settled, vec![(10, false)]);
        // Busy again at 13:00: the moments from 20 to 170 minutes in settle; those from
        // an hour in saw the activity within the horizon.
        settled.clear();
        c.settle(began, at(0, 12, 50), None, h, |_, t, _, r| {
            settled.push((t / 60, r))
        });
        c.settle(began, at(0, 13, 0), Some(at(0, 13, 0)), h, |_, t, _, r| {
            settled.push((t / 60, r))
        });
        let expected: Vec<(i64, bool)> = (2..=17).map(|k| (k * 10, k >= 6)).collect();
        assert_eq!(settled, expected);
        // Settled once: nothing more for that span.
        settled.clear();
        c.settle(began, at(0, 18, 0), None, h, |_, t, _, r| {
            settled.push((t / 60, r))
        });
        assert!(settled.is_empty());
        // A span that stops being seen leaves its unsettled moments unknown.
        c.span_began();
        c.span_censored();
        c.settle(at(0, 13, 0), at(0, 20, 0), None, h, |_, t, _, r| {
            settled.push((t / 60, r))
        });
        assert!(settled.is_empty());
    }

    #[test]
    fn moments_are_counted_by_class_and_band_and_forgotten_after_the_lookback() {
        let mut m = Moments::default();
        let quiet = Days {
            class: Class::Quiet,
            busy: 0,
            seen: 5,
        };
        m.add(at(0, 20, 0), 3600 + 60, quiet, false);
        m.add(at(1, 20, 0), 3600 + 600, quiet, true);
        m.add(at(1, 21, 0), 7 * 3600, quiet, false);
        assert_eq!(m.count(Class::Quiet, 3600), (2, 1));
        assert_eq!(m.count(Class::Quiet, 30 * 3600), (1, 0));
        assert_eq!(m.count(Class::Busy, 3600), (0, 0));
        m.prune(at(1, 0, 0));
        assert_eq!(m.count(Class::Quiet, 3600), (1, 1));
    }
}
