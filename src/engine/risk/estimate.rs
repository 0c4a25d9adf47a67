//! One estimate and its arithmetic: the cases at risk of a source, their product-limit
//! (Kaplan–Meier) probability of ending within the horizon, the blend of a workload's own
//! cases with its peers', the cautious prior, and the sentence warnings and reasons carry.
//! PURE.

use jiff::SignedDuration;

use super::Basis;
use crate::engine::classify::human;

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
        let (data, cases) = self.data();
        (cases * data + PRIOR_CASES * PRIOR_RISK) / (cases + PRIOR_CASES)
    }

    /// The share its cases give (0–1), without the cautious prior: what the estimate
    /// expects where overstating a risk would not be cautious (what waiting for the
    /// ceiling costs, `ladder::Deadline`).
    pub fn share(&self) -> f64 {
        self.data().0
    }

    /// (the share of its cases, how many cases).
    fn data(&self) -> (f64, f64) {
        let n = f64::from(self.longer);
        match &self.blend {
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
        }
    }

    /// "idle 3h10m; this workload's idle spans longer than 3h10m ended within 2h in 2 of
    /// 40 cases (product-limit 5 %): 7 % with the prior", and with a blend "…in 2 of 12
    /// cases; other MemoryHeld workloads' idle spans longer than 3h10m in 8 of 112
    /// (product-limit 7 %), weighed as 20 cases: 10 % with the prior".
    pub fn sentence(&self) -> String {
        let t = human(self.idle_for);
        if let Basis::Calendar(days, band) = self.basis {
            return calendar_sentence(self, &t, days, band);
        }
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
pub(super) struct Cases {
    /// Minute bucket of `t`: spans in later buckets outlasted it.
    pub(super) first: usize,
    pub(super) at_risk: i64,
    pub(super) resumed: Vec<i64>,
    pub(super) censored: Vec<i64>,
}

impl Cases {
    pub(super) fn new(first: usize, last: usize) -> Self {
        let width = last.saturating_sub(first);
        Self {
            first,
            at_risk: 0,
            resumed: vec![0; width],
            censored: vec![0; width],
        }
    }

    /// One span that lasted to `bucket` (resumed there, or censored: seen idle to there).
    pub(super) fn add(&mut self, bucket: usize, resumed: bool, delta: i64) {
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

    pub(super) fn subtract(&mut self, other: &Cases) {
        self.at_risk -= other.at_risk;
        for (a, b) in self.resumed.iter_mut().zip(&other.resumed) {
            *a -= b;
        }
        for (a, b) in self.censored.iter_mut().zip(&other.censored) {
            *a -= b;
        }
    }

    pub(super) fn resumed_total(&self) -> i64 {
        self.resumed.iter().sum()
    }

    /// 1 − Π (1 − resumed / at risk) over the minutes of the horizon.
    pub(super) fn product_limit(&self) -> f64 {
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

    pub(super) fn count(n: i64) -> u32 {
        u32::try_from(n.max(0)).unwrap_or(u32::MAX)
    }
}

/// "idle 2h10m; at this time of day (30m before to 30m past the 2h horizon) it was busy
/// on 0 of its last 5 days seen (quiet): of its policy's moments as quiet and idle 2–3h,
/// 12 of 1136 saw activity within 2h (1 %): 2 % with the cautious prior …".
fn calendar_sentence(e: &Estimate, t: &str, days: super::CalendarDays, band: u8) -> String {
    let class = match days.class {
        super::CalendarClass::Quiet => "quiet",
        super::CalendarClass::Low => "rarely busy",
        super::CalendarClass::Busy => "often busy",
    };
    let idle = if usize::from(band) + 1 >= super::calendar::BANDS {
        format!("idle {band}h or longer")
    } else {
        format!("idle {band}–{}h", band + 1)
    };
    format!(
        "idle {t}; at this time of day ({} before to {} past the {} horizon) it was busy on {} of its last {} days seen ({class}): of its policy's moments as {class} and {idle}, {} of {} saw activity within {} ({:.0} %): {:.0} % with the cautious prior ({:.0} % over {PRIOR_CASES} cases)",
        human(SignedDuration::from_secs(super::calendar::MARGIN_SECS)),
        human(SignedDuration::from_secs(super::calendar::MARGIN_SECS)),
        human(e.horizon),
        days.busy,
        days.seen,
        e.resumed,
        e.longer,
        human(e.horizon),
        e.product_limit * 100.0,
        e.risk() * 100.0,
        PRIOR_RISK * 100.0
    )
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
        Basis::Calendar(..) => ("moments of workloads with this calendar".to_string(), None),
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
