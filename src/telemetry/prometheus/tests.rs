use super::answer::format_series;
use super::*;

#[test]
fn series_identity_sorts_labels_and_escapes_values() {
    let metric: HashMap<String, String> = [("__name__", "X"), ("pod", "p\"1"), ("UUID", "GPU-1")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (mut s, mut l) = (String::new(), String::new());
    format_series("X", &metric, &mut s, &mut l);
    assert_eq!(s, "X{UUID=\"GPU-1\",pod=\"p\\\"1\"}");
    assert_eq!(
        crate::telemetry::openmetrics::parse_labels(&l).unwrap()[1].1,
        "p\"1"
    );
}
