use super::*;

#[test]
fn durations_times_and_starts_are_typed_by_their_parsers() {
    assert_eq!(duration("1h30m"), Ok(SignedDuration::from_mins(90)));
    assert!(duration("soon").unwrap_err().contains("write e.g. 1m"));
    assert!(duration("-5m").unwrap_err().contains("negative"));
    assert_eq!(
        positive_duration("250ms"),
        Ok(std::time::Duration::from_millis(250))
    );
    assert!(
        positive_duration("0s")
            .unwrap_err()
            .contains("longer than 0s")
    );
    let t: Timestamp = "2026-11-02T08:00:00Z".parse().unwrap();
    assert_eq!(timestamp("2026-11-02T08:00:00Z"), Ok(t));
    assert!(timestamp("noon").unwrap_err().contains("RFC 3339"));
    assert_eq!(since("2026-11-02T08:00:00Z"), Ok(Since::At(t)));
    assert_eq!(
        since("2h").map(|s| s.before(t)),
        Ok(t - SignedDuration::from_hours(2))
    );
    assert!(since("yesterday").unwrap_err().contains("RFC 3339"));
}

#[test]
fn the_flags_parse_into_their_types() {
    let cli = Cli::try_parse_from([
        "gpu-reaper",
        "backtest",
        "--step",
        "30s",
        "--from",
        "6h",
        "--prometheus-chunk",
        "30m",
    ])
    .unwrap();
    let Command::Backtest(args) = cli.command else {
        panic!("backtest")
    };
    assert_eq!(args.step, SignedDuration::from_secs(30));
    assert_eq!(args.from, Since::Ago(SignedDuration::from_hours(6)));
    assert_eq!(
        args.prometheus.prometheus_chunk,
        std::time::Duration::from_secs(1800)
    );
}

#[test]
fn the_history_backfill_defaults_to_the_controllers_constant_and_reads_as_go_writes_it() {
    assert_eq!(
        GoDuration(crate::backtest::CONTROLLER_BACKFILL).to_string(),
        "168h"
    );
    let Command::Explain(args) = Cli::try_parse_from(["gpu-reaper", "explain", "ns/Deployment/d"])
        .unwrap()
        .command
    else {
        panic!("explain")
    };
    assert_eq!(
        args.live.history_backfill,
        GoDuration(crate::backtest::CONTROLLER_BACKFILL)
    );
    assert_eq!(
        go_duration("90m"),
        Ok(GoDuration(SignedDuration::from_mins(90)))
    );
}
