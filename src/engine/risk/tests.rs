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

/// Four office-hours servers (keys 1–4), six days each.
fn office_fleet() -> Histories<u32> {
    let mut h = Histories::new(params(10));
    for key in 1..=4 {
        office_hours(&mut h, key);
    }
    h
}

/// Workload 4's estimate, idle `idle_for` minutes at `now`.
fn ask_at(h: &Histories<u32>, idle_for: i64, now: Timestamp) -> Estimate {
    h.estimate_at(
        &4,
        IdleShape::MemoryHeld,
        SignedDuration::from_mins(idle_for),
        now,
    )
    .unwrap()
}

#[test]
fn an_evening_of_a_workload_quiet_every_evening_borrows_the_quiet_moments_of_its_policy() {
    let mut h = office_fleet();
    // Day 6: busy until 19:00, idle since. At 21:00 its past six evenings were idle from
    // 20:30 to 23:30: quiet. The moments as quiet and idle 2–3h are those of the nights
    // from day 3 on (three days seen before them), six each (2h00 … 2h50), of the four
    // workloads: none saw activity within 2h.
    busy_through(&mut h, 4, clock(6, 7, 0), clock(6, 19, 0));
    idle_between(&mut h, 4, clock(6, 19, 0), clock(6, 21, 1));
    let e = ask_at(&h, 2 * 60, clock(6, 21, 0));
    assert_eq!(
        e.basis,
        Basis::Calendar(
            CalendarDays {
                class: CalendarClass::Quiet,
                busy: 0,
                seen: 6
            },
            2
        )
    );
    assert_eq!((e.resumed, e.longer), (0, 72));
    assert_eq!(
        e.sentence(),
        "idle 2h; at this time of day (30m before to 30m past the 2h horizon) it was busy on 0 of its last 6 days seen (quiet): of its policy's moments as quiet and idle 2–3h, 0 of 72 saw activity within 2h (0 %): 5 % with the cautious prior (100 % over 4 cases)"
    );
    // At lunch, an hour into the pause: its past days had work from 14:00, within the
    // window; every such moment saw activity within 2h.
    let mut lunch = office_fleet();
    busy_through(&mut lunch, 4, clock(6, 7, 0), clock(6, 12, 30));
    idle_between(&mut lunch, 4, clock(6, 12, 30), clock(6, 13, 31));
    let e = ask_at(&lunch, 60, clock(6, 13, 30));
    assert!(matches!(
        e.basis,
        Basis::Calendar(
            CalendarDays {
                class: CalendarClass::Busy,
                ..
            },
            1
        )
    ));
    assert_eq!(e.resumed, e.longer);
    assert!(e.risk() > 0.99, "{}", e.sentence());
    // Without a calendar (two days seen), the spans decide as before.
    let mut young = Histories::new(params(3));
    office_hours(&mut young, 1);
    let e = ask(&mut young, 2, clock(6, 19, 0), 60).unwrap();
    assert!(matches!(e.basis, Basis::Peers(..)));
}
