//! The stable-toolchain twins of the cargo-fuzz targets `prometheus_answer`, `trace`,
//! `policy` and `object` (fuzz/fuzz_targets): structured mutations of the committed seed corpora
//! (fuzz/corpus/<target>, real data) and arbitrary bytes. The property is invariant 10:
//! bad input gets an error that says what and where, never a panic.
//!
//! Cases per property: `FUZZ_CASES` (default 256; the policy property runs a quarter of
//! them), bounded for CI; by hand, e.g.
//! `FUZZ_CASES=100000 cargo test --release --test pure fuzz_inputs::`.

use std::sync::OnceLock;

use gpu_reaper::api::GpuPolicy;
use gpu_reaper::api::validate::parse_resource;
use gpu_reaper::engine::Rules;
use gpu_reaper::telemetry::prometheus::{add_matrix, parse_answer, vector_by_gpu};
use gpu_reaper::telemetry::trace::{MAX_TRACE_BUCKETS, ReadOptions, TraceBuilder, read_trace};
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// `FUZZ_CASES / divisor` cases: a policy case runs CEL and costs ten trace cases.
fn config(divisor: u32) -> ProptestConfig {
    ProptestConfig {
        cases: (cases() / divisor).max(1),
        // Shrinking a failure is worth a few more runs, not minutes.
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    }
}

/// The committed seeds of one cargo-fuzz target, in name order.
fn seeds(target: &str) -> &'static [Vec<u8>] {
    static CORPORA: OnceLock<std::collections::BTreeMap<&'static str, Vec<Vec<u8>>>> =
        OnceLock::new();
    let corpora = CORPORA.get_or_init(|| {
        ["prometheus_answer", "trace", "policy", "object"]
            .into_iter()
            .map(|t| {
                let dir = format!("{}/fuzz/corpus/{t}", env!("CARGO_MANIFEST_DIR"));
                let mut paths: Vec<_> = std::fs::read_dir(&dir)
                    .unwrap_or_else(|e| {
                        panic!("{dir}: {e}: the seeds are derived from ../shared/fixtures by `python3 fuzz/make_seeds.py` (scripts/test runs it)")
                    })
                    .map(|e| e.unwrap().path())
                    .collect();
                paths.sort();
                let files: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
                assert!(files.len() >= 5, "{dir}: only {} seeds", files.len());
                (t, files)
            })
            .collect()
    });
    &corpora[target]
}

/// One structured change to a real input.
#[derive(Debug, Clone)]
enum Mutation {
    /// Cut at this fraction of the length (per mille).
    Truncate(u16),
    /// XOR one byte (position per mille).
    FlipByte(u16, u8),
    /// Insert a slice of another seed of the same target.
    Splice {
        at: u16,
        seed: usize,
        from: u16,
        len: u16,
    },
    /// Replace the n-th number with an extreme one.
    Number(usize, &'static str),
    /// Insert text that is not ASCII (or not text).
    Unicode(u16, &'static str),
    /// Repeat the first label or key of the n-th line (`a="x"` → `a="x",a="x"`).
    DuplicateLabel(usize),
    /// Repeat a whole line.
    DuplicateLine(usize),
    /// Drop a whole line.
    DropLine(usize),
}

const NUMBERS: &[&str] = &[
    "NaN",
    "+Inf",
    "-Inf",
    "-1",
    "-0",
    "0",
    "1e308",
    "-1e308",
    "1e400",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551616",
    "99999999999999999999999",
    "0.000000000000000000001",
    "4294967296",
    "1e11",
    "1e14",
    "-1e14",
    "\"1\"",
    "true",
    "null",
];

const UNICODE: &[&str] = &[
    "é", "\u{202e}", "😀", "\u{0}", "\u{feff}", "ﬀ", "\\", "\"", "\\u0000", "\u{ffff}", "\n", "\t",
    "{", "}", "# ", ": ", "- ", "&a *a", "!!binary",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0u16..1000).prop_map(Mutation::Truncate),
        (0u16..1000, 1u8..=255).prop_map(|(at, x)| Mutation::FlipByte(at, x)),
        (0u16..1000, 0usize..64, 0u16..1000, 1u16..400).prop_map(|(at, seed, from, len)| {
            Mutation::Splice {
                at,
                seed,
                from,
                len,
            }
        }),
        (0usize..64, proptest::sample::select(NUMBERS))
            .prop_map(|(n, with)| Mutation::Number(n, with)),
        (0u16..1000, proptest::sample::select(UNICODE))
            .prop_map(|(at, text)| Mutation::Unicode(at, text)),
        (0usize..64).prop_map(Mutation::DuplicateLabel),
        (0usize..64).prop_map(Mutation::DuplicateLine),
        (0usize..64).prop_map(Mutation::DropLine),
    ]
}

fn at(len: usize, per_mille: u16) -> usize {
    len * usize::from(per_mille) / 1000
}

/// Byte ranges of the lines of `input` (without their `\n`).
fn lines(input: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, b) in input.iter().enumerate() {
        if *b == b'\n' {
            out.push(start..i);
            start = i + 1;
        }
    }
    if start < input.len() {
        out.push(start..input.len());
    }
    out
}

/// Byte ranges of the numbers (`-?[0-9][0-9.eE+-]*`) in `input`.
fn numbers(input: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < input.len() {
        if input[i].is_ascii_digit() && (i == 0 || !input[i - 1].is_ascii_alphanumeric()) {
            let start = if i > 0 && input[i - 1] == b'-' {
                i - 1
            } else {
                i
            };
            let mut end = i;
            while end < input.len()
                && (input[end].is_ascii_digit() || b".eE+-".contains(&input[end]))
            {
                end += 1;
            }
            out.push(start..end);
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

fn apply(mut input: Vec<u8>, mutation: &Mutation, corpus: &[Vec<u8>]) -> Vec<u8> {
    match *mutation {
        Mutation::Truncate(p) => input.truncate(at(input.len(), p)),
        Mutation::FlipByte(p, x) => {
            if !input.is_empty() {
                let i = at(input.len() - 1, p);
                input[i] ^= x;
            }
        }
        Mutation::Splice {
            at: p,
            seed,
            from,
            len,
        } => {
            let other = &corpus[seed % corpus.len()];
            let start = at(other.len(), from);
            let end = (start + usize::from(len)).min(other.len());
            let i = at(input.len(), p);
            input.splice(i..i, other[start..end].iter().copied());
        }
        Mutation::Number(n, with) => {
            let found = numbers(&input);
            if !found.is_empty() {
                let r = found[n % found.len()].clone();
                input.splice(r, with.bytes());
            }
        }
        Mutation::Unicode(p, text) => {
            let i = at(input.len(), p);
            input.splice(i..i, text.bytes());
        }
        Mutation::DuplicateLabel(n) => {
            let all = lines(&input);
            if !all.is_empty() {
                let line = all[n % all.len()].clone();
                let text = &input[line.clone()];
                // A label set `{a="x",…`, a JSON object `{"a":"x",…` or a YAML `key: value`.
                if let Some(open) = text.iter().position(|b| *b == b'{') {
                    let body = open + 1;
                    let end = text[body..]
                        .iter()
                        .position(|b| *b == b',' || *b == b'}')
                        .map_or(text.len(), |e| body + e);
                    if end > body {
                        let mut copy = text[body..end].to_vec();
                        copy.push(b',');
                        let i = line.start + body;
                        input.splice(i..i, copy);
                    }
                } else {
                    let mut copy = text.to_vec();
                    copy.push(b'\n');
                    input.splice(line.start..line.start, copy);
                }
            }
        }
        Mutation::DuplicateLine(n) => {
            let all = lines(&input);
            if !all.is_empty() {
                let line = all[n % all.len()].clone();
                let mut copy = input[line.clone()].to_vec();
                copy.push(b'\n');
                input.splice(line.start..line.start, copy);
            }
        }
        Mutation::DropLine(n) => {
            let all = lines(&input);
            if !all.is_empty() {
                let line = all[n % all.len()].clone();
                let end = (line.end + 1).min(input.len());
                input.drain(line.start..end);
            }
        }
    }
    input
}

/// A real seed of `target` with up to four mutations, or arbitrary bytes.
fn input(target: &'static str) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => (
            0usize..64,
            proptest::collection::vec(mutation(), 0..4)
        )
            .prop_map(move |(i, mutations)| {
                let corpus = seeds(target);
                let seed = corpus[i % corpus.len()].clone();
                mutations.iter().fold(seed, |acc, m| apply(acc, m, corpus))
            }),
        1 => proptest::collection::vec(any::<u8>(), 0..512),
    ]
}

// --- Prometheus answers -------------------------------------------------------------------

fn check_prometheus_answer(body: &[u8]) {
    let data = match parse_answer(200, body) {
        Ok(data) => data,
        Err((message, transient)) => {
            assert!(message.starts_with("HTTP 200 OK: "), "{message}");
            assert!(!transient, "a 200 is never worth retrying");
            return;
        }
    };
    if let Err(message) = vector_by_gpu(data.clone(), &Default::default()) {
        assert!(
            message.starts_with("expected") || message.contains("GPU identity"),
            "{message}"
        );
    }
    let mut builder = TraceBuilder::new(&ReadOptions {
        workload_labels: Default::default(),
        step_seconds: 60,
        skip_unknown_metrics: true,
    });
    match add_matrix(&mut builder, "DCGM_FI_DEV_GPU_UTIL", data) {
        Ok(()) => {
            if let Ok(trace) = builder.finish("<fuzz>") {
                // `[1,"0"]` is the shortest sample: 7 bytes.
                assert!(trace.samples <= body.len() as u64 / 7, "{}", trace.samples);
                assert!(trace.last_bucket - trace.first_bucket < MAX_TRACE_BUCKETS);
            }
        }
        Err(message) => assert!(!message.is_empty()),
    }
}

proptest! {
    #![proptest_config(config(1))]

    #[test]
    fn a_prometheus_answer_gets_observations_or_a_clear_error_never_a_panic(
        body in input("prometheus_answer")
    ) {
        check_prometheus_answer(&body);
    }
}

#[test]
fn every_prometheus_answer_seed_is_read() {
    for body in seeds("prometheus_answer") {
        if body.starts_with(br#"{"status":"error""#) {
            let (message, _) = parse_answer(200, body).unwrap_err();
            assert!(message.contains("bad_data"), "{message}");
            continue;
        }
        let data = parse_answer(200, body).unwrap();
        match data {
            prometheus_http_query::response::Data::Vector(_) => {
                assert_eq!(vector_by_gpu(data, &Default::default()).unwrap().len(), 16);
            }
            _ => {
                let mut builder = TraceBuilder::new(&ReadOptions {
                    workload_labels: Default::default(),
                    step_seconds: 60,
                    skip_unknown_metrics: true,
                });
                add_matrix(&mut builder, "DCGM_FI_DEV_GPU_UTIL", data).unwrap();
                assert_eq!(builder.finish("<seed>").unwrap().samples, 12);
            }
        }
    }
}

// --- OpenMetrics traces -----------------------------------------------------------------

fn check_trace(text: &[u8]) {
    let lines = text.split(|b| *b == b'\n').count() as u64;
    let options = ReadOptions {
        workload_labels: Default::default(),
        step_seconds: 60,
        skip_unknown_metrics: true,
    };
    match read_trace(text, "<fuzz>", &options) {
        Ok(trace) => {
            assert!(
                trace.samples <= lines,
                "{} samples, {lines} lines",
                trace.samples
            );
            assert!(trace.last_bucket - trace.first_bucket < MAX_TRACE_BUCKETS);
        }
        Err(e) => {
            assert!(!e.message.is_empty());
            assert!(e.line <= lines, "{e}");
            assert!(e.to_string().starts_with("<fuzz>"), "{e}");
        }
    }
}

proptest! {
    #![proptest_config(config(1))]

    #[test]
    fn a_trace_gets_samples_bounded_by_its_lines_or_an_error_naming_the_line(
        text in input("trace")
    ) {
        check_trace(&text);
    }
}

#[test]
fn the_timestamped_seeds_and_sample_slices_are_read() {
    let dir = format!("{}/fuzz/corpus/trace", env!("CARGO_MANIFEST_DIR"));
    let mut read = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let text = std::fs::read(&path).unwrap();
        let options = ReadOptions {
            workload_labels: Default::default(),
            step_seconds: 60,
            skip_unknown_metrics: true,
        };
        let result = read_trace(&text[..], &name, &options);
        if name.contains("replicaset_owner") || name.contains("namespace_labels") {
            // Owner and namespace records only: no samples of a GPU or pod.
            assert!(result.is_ok() || result.unwrap_err().message.contains("no samples"));
        } else if name.ends_with("+ts.prom") || name.ends_with(".om") {
            let trace = result.unwrap_or_else(|e| panic!("{e}"));
            assert!(trace.samples > 0, "{name}");
            read += 1;
        } else {
            // Scrapes without timestamps and raw CSV: an error naming the first sample line.
            let e = result.unwrap_err();
            assert!(e.line > 0, "{e}");
        }
    }
    assert!(read >= 20, "{read}");
}

/// Found while writing the `trace` fuzz target (2026-11-29), confirmed on the unfixed
/// binary: two samples of one series 3,000 years apart made the GPU's column reserve a
/// slot per minute in between (`backtest` aborted allocating 6.7 GB), and timestamps
/// of ±1e300 at `--step 1s` overflowed the bucket arithmetic (a panic).
#[test]
fn samples_centuries_apart_are_an_error_naming_the_line_not_gigabytes() {
    let text = "DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-1\"} 1 1\n\
                DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-1\"} 1 99999999999\n";
    let options = ReadOptions {
        workload_labels: Default::default(),
        step_seconds: 60,
        skip_unknown_metrics: true,
    };
    let e = read_trace(text.as_bytes(), "t.om", &options).unwrap_err();
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("--step"), "{e}");
    let text = "DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-1\"} 1 -1e300\n\
                DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-1\"} 1 1e300\n";
    let options = ReadOptions {
        step_seconds: 1,
        ..options
    };
    let e = read_trace(text.as_bytes(), "t.om", &options).unwrap_err();
    assert_eq!(e.line, 1, "{e}");
    assert!(e.message.contains("between 1970 and 5138"), "{e}");
}

// --- GpuPolicy documents -----------------------------------------------------------------

fn check_policy(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match parse_resource::<GpuPolicy>(&text, "p.yaml") {
        Ok(policy) => {
            let _ = Rules::from_spec(&policy.spec);
        }
        Err(e) => {
            assert!(!e.problems.is_empty(), "{e}");
            assert!(e.to_string().starts_with("p.yaml: not a valid GpuPolicy:"));
            for p in &e.problems {
                assert!(!p.message.is_empty(), "{e}");
                match p.field.as_str() {
                    // Whole-document problems say where, or what shape was expected.
                    "(document)" => assert!(
                        p.message.contains("line")
                            || p.message.contains("mapping")
                            || p.message.contains("document"),
                        "{e}"
                    ),
                    // A key as written (an unknown one may hold any character).
                    field => assert!(!field.is_empty(), "no field: {e}"),
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config(4))]

    #[test]
    fn a_policy_is_valid_or_every_problem_names_its_field_never_a_panic(
        data in input("policy")
    ) {
        check_policy(&data);
    }
}

#[test]
fn every_policy_seed_is_valid() {
    for text in seeds("policy") {
        parse_resource::<GpuPolicy>(std::str::from_utf8(text).unwrap(), "seed")
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Found by this file's policy property (2026-11-29): `window: 9223372036854775807h`
/// made kube-core's duration parser panic (`Duration::mul_f64` overflow) inside
/// `parse_resource`; now an error naming `spec.idle.window`.
#[test]
fn a_duration_past_any_clock_is_an_error_naming_the_field_not_a_panic() {
    let seed = std::str::from_utf8(&seeds("policy")[0]).unwrap();
    assert!(seed.contains("window: 30m"), "{seed}");
    for huge in [
        "9223372036854775807h",
        "99999999999999999999s",
        "1h999999999999999999m",
    ] {
        let e = parse_resource::<GpuPolicy>(
            &seed.replace("window: 30m", &format!("window: {huge}")),
            "p.yaml",
        )
        .unwrap_err();
        assert_eq!(e.problems[0].field, "spec.idle.window", "{e}");
    }
}

// --- The controller's object readers -------------------------------------------------------

/// What the `object` fuzz target checks: one watched object (JSON) through every reader
/// the controller runs on it. Returns the policy's problem when it was set aside.
fn check_object(data: &[u8]) -> Option<String> {
    use gpu_reaper::api::ReadinessAttestation;
    use gpu_reaper::api::policy::{ActionType, PolicyMode};
    use gpu_reaper::cluster::actions::RestoreRecord;
    use gpu_reaper::cluster::inventory::{ClaimGpus, ObjectInfo, pod_info_from_parts};
    use gpu_reaper::controller::deliver::Delivery;
    use gpu_reaper::controller::policies;
    use gpu_reaper::engine::model::LadderState;
    use gpu_reaper::gpus::GpuResources;

    let object = serde_json::from_slice::<kube::api::DynamicObject>(data).ok()?;
    let problem = match policies::read(&object) {
        Ok(_) => None,
        Err(u) => {
            assert!(!u.problem.is_empty());
            // A policy set aside takes part in choosing only: it never acts.
            if let Some(s) = &u.stand_in {
                assert_eq!(s.spec.mode, PolicyMode::Audit);
                assert_eq!(s.spec.action.type_, ActionType::None);
            }
            Some(u.problem)
        }
    };
    if let Err(e) = gpu_reaper::api::read_dynamic::<ReadinessAttestation>(&object) {
        assert!(!e.is_empty());
    }
    let value = serde_json::to_value(&object).unwrap();
    let info = ObjectInfo::from_value(&value)?;
    let now = jiff::Timestamp::UNIX_EPOCH;
    if let Some(d) = Delivery::parse(&info.annotations) {
        let _ = (
            d.due(now),
            d.notice(jiff::SignedDuration::from_mins(30), now),
        );
        // What it writes back reads as the same record.
        let again = std::collections::BTreeMap::from([(
            gpu_reaper::api::keys::NOTIFIED.to_string(),
            d.to_annotation(),
        )]);
        assert_eq!(Delivery::parse(&again), Some(d));
    }
    let _ = RestoreRecord::parse(&info.annotations);
    let _ = LadderState::from_annotations(&info.annotations);
    let _ = pod_info_from_parts(
        info,
        &value["spec"],
        &value["status"],
        &GpuResources::default(),
        &(),
        &ClaimGpus::new(),
        now,
    );
    problem
}

proptest! {
    #![proptest_config(config(1))]

    #[test]
    fn a_watched_object_is_read_or_set_aside_naming_its_field_never_a_panic(
        data in input("object")
    ) {
        check_object(&data);
    }
}

#[test]
fn the_object_seeds_are_read_as_the_controller_reads_them() {
    let seed = |name: &str| -> Vec<u8> {
        std::fs::read(format!(
            "{}/fuzz/corpus/object/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap_or_else(|e| {
            panic!("fuzz/corpus/object/{name}: {e} (python3 fuzz/make_seeds.py ../shared/fixtures)")
        })
    };
    assert_eq!(check_object(&seed("policy.json")), None, "a usable policy");
    let problem = check_object(&seed("policy-newer-enum.json")).expect("set aside");
    assert!(
        problem.contains("spec.action.type") && problem.contains("Hibernate"),
        "{problem}"
    );
    let attestation: kube::api::DynamicObject =
        serde_json::from_slice(&seed("attestation.json")).unwrap();
    gpu_reaper::api::read_dynamic::<gpu_reaper::api::ReadinessAttestation>(&attestation).unwrap();
    // The real objects with gpu-reaper's records: the delivery record parses.
    let marked: Vec<kube::api::DynamicObject> = seeds("object")
        .iter()
        .filter(|s| String::from_utf8_lossy(s).contains("gpureaper.io/notified"))
        .filter_map(|s| serde_json::from_slice(s).ok())
        .collect();
    assert!(marked.len() >= 5, "{} seeds with records", marked.len());
    for object in marked {
        let info = gpu_reaper::cluster::inventory::ObjectInfo::from_value(
            &serde_json::to_value(&object).unwrap(),
        )
        .expect("metadata");
        let d =
            gpu_reaper::controller::deliver::Delivery::parse(&info.annotations).expect("record");
        assert_eq!(
            d.channels["event"].note.as_deref(),
            Some("Idle GPUs: … scaled to zero at 16:55:41")
        );
    }
}

/// Found by the `object` fuzz target (2026-12-04): a watched GpuPolicy with
/// `idle.window: 3111…110m` made kube-core's duration parser panic inside the controller's
/// policy reader (`parse_resource` had the guard; the watch path did not): the whole
/// controller would stop. Now the policy is set aside naming the field, and the others go on.
#[test]
fn a_watched_policy_with_a_duration_past_any_clock_is_set_aside_not_a_panic() {
    let seed = std::fs::read_to_string(format!(
        "{}/fuzz/corpus/object/policy.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("fuzz/corpus/object/policy.json (python3 fuzz/make_seeds.py ../shared/fixtures)");
    assert!(seed.contains(r#""window": "30m""#), "{seed}");
    for huge in [
        format!("3{}0m", "1".repeat(110)),
        "9223372036854775807h".to_string(),
    ] {
        let data = seed.replace(r#""window": "30m""#, &format!(r#""window": "{huge}""#));
        let problem = check_object(data.as_bytes()).expect("set aside");
        assert!(
            problem.starts_with("spec.idle.window: duration") && problem.contains("too long"),
            "{problem}"
        );
    }
}
