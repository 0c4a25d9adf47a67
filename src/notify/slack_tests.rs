use serde_json::Value;

use super::*;
use crate::notify::Severity;
use crate::notify::content::{Fields, Templates};
use crate::notify::owner::{self, OwnerSource};

fn workload() -> ObjectInfo {
    ObjectInfo {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        namespace: "ml".into(),
        name: "chat".into(),
        uid: String::new(),
        owner: None,
        labels: Default::default(),
        annotations: Default::default(),
        created_at: jiff::Timestamp::UNIX_EPOCH,
        deleting: false,
    }
}

fn notification(kind: Kind, url: &str) -> Notification {
    let fields = Fields::from([
        ("workload", "ml/Deployment/chat".to_string()),
        ("gpus", "2".to_string()),
        ("model", "NVIDIA H100 80GB HBM3".to_string()),
        ("idle_since", "2026-11-29T10:00:00Z".to_string()),
        ("idle_for", "2h".to_string()),
        ("shape", "MemoryHeld".to_string()),
        ("wasted_usd", "16.00".to_string()),
        ("hourly_usd", "8.00".to_string()),
        ("action", "ScaleToZero".to_string()),
        ("action_at", "2026-11-29T13:00:00Z".to_string()),
        ("owner", "ana@example.com (from the workload)".to_string()),
        ("url", url.to_string()),
    ]);
    let rendered = Templates::default().render(kind, &fields);
    Notification {
        workload: workload(),
        reason: "IdleGpus",
        severity: Severity::Warning,
        message: rendered.text.clone(),
        personal: Some(Personal {
            kind,
            fields,
            rendered,
            owner: owner::parse("ana@example.com", OwnerSource::Workload),
            policy: "research".into(),
            slack_channel: Some("C0GPUS".into()),
        }),
    }
}

/// The blocks as Slack receives them (JSON).
fn blocks_of(n: &Notification) -> Vec<Value> {
    let blocks = message_blocks(n, n.personal.as_ref().unwrap());
    match serde_json::to_value(blocks).unwrap() {
        Value::Array(blocks) => blocks,
        other => panic!("blocks serialize to an array, not {other}"),
    }
}

#[test]
fn a_warning_has_header_text_facts_context_link_and_three_buttons() {
    let n = notification(Kind::Warning, "https://grafana.example.com/d/ml/chat");
    let blocks = blocks_of(&n);
    let types: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "header", "section", "section", "context", "actions", "actions"
        ]
    );
    assert_eq!(
        blocks[0]["text"]["text"],
        "Idle GPUs: ml/Deployment/chat will be reclaimed at 2026-11-29T13:00:00Z"
    );
    let facts: Vec<&str> = blocks[2]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        facts,
        [
            "*GPUs*\n2 × NVIDIA H100 80GB HBM3",
            "*Idle since*\n2026-11-29T10:00:00Z (2h)",
            "*Shape*\nMemoryHeld",
            "*Wasted*\n16.00 USD (8.00 USD/h)",
            "*Action*\nScaleToZero at 2026-11-29T13:00:00Z",
        ]
    );
    let context = blocks[3]["elements"][0]["text"].as_str().unwrap();
    assert!(context.contains("Policy *research*"), "{context}");
    assert!(
        context.contains("ana@example.com (from the workload)"),
        "{context}"
    );
    assert_eq!(
        blocks[4]["elements"][0]["url"],
        "https://grafana.example.com/d/ml/chat"
    );
    let decision = &blocks[5];
    assert_eq!(decision["block_id"], DECISION_BLOCK);
    let ids: Vec<&str> = decision["elements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["action_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [KEEP_4H, KEEP_24H, NOT_MINE]);
    let value = decision["elements"][0]["value"].as_str().unwrap();
    assert_eq!(
        value,
        r#"{"w":"ml/Deployment/chat","v":"apps/v1","p":"research"}"#
    );
    assert_eq!(
        ButtonValue::parse(value).unwrap().workload().unwrap().kind,
        "Deployment"
    );
}

#[test]
fn a_reclaim_notice_has_no_buttons_and_no_link_without_url() {
    let n = notification(Kind::Reclaimed, "");
    let blocks = blocks_of(&n);
    assert!(blocks.iter().all(|b| b["type"] != "actions"), "{blocks:?}");
    let facts = blocks[2]["fields"].to_string();
    assert!(facts.contains("*Done*\\nScaleToZero"), "{facts}");
    assert!(!facts.contains(" at 2026"), "{facts}");
}

#[test]
fn text_is_escaped_and_capped_to_block_kit_limits() {
    let mut n = notification(Kind::Warning, "");
    let p = n.personal.as_mut().unwrap();
    p.rendered.subject = "x".repeat(400);
    p.rendered.text = "y".repeat(5000);
    p.fields.insert("model", "A<B>&C".into());
    p.fields.insert("shape", String::new());
    let blocks = blocks_of(&n);
    assert_eq!(
        blocks[0]["text"]["text"].as_str().unwrap().chars().count(),
        150
    );
    assert_eq!(
        blocks[1]["text"]["text"].as_str().unwrap().chars().count(),
        3000
    );
    let facts = blocks[2]["fields"].to_string();
    assert!(facts.contains("A&lt;B&gt;&amp;C"), "{facts}");
    assert!(
        !facts.contains("Shape"),
        "empty facts are left out: {facts}"
    );
}

#[test]
fn malformed_button_values_are_refused_with_a_reason() {
    for (value, why) in [
        ("nope", "not {"),
        (
            r#"{"w":"ml/chat","v":"apps/v1","p":"x"}"#,
            "namespace/Kind/name",
        ),
        (
            r#"{"w":"ml/Deployment/a/b","v":"apps/v1","p":"x"}"#,
            "namespace/Kind/name",
        ),
        (r#"{"w":"ml/Deployment/chat","v":"","p":"x"}"#, "apiVersion"),
        (
            r#"{"w":"ml/Deployment/chat","v":"apps/v1","p":""}"#,
            "no policy",
        ),
    ] {
        let err = ButtonValue::parse(value).unwrap_err().to_string();
        assert!(err.contains(why), "{value}: {err}");
    }
}

#[test]
fn only_missing_recipients_are_unrouted() {
    let e = |code: &str| NotifyError::Slack {
        method: "chat.postMessage".into(),
        code: code.into(),
    };
    assert!(matches!(
        e("channel_not_found").to_failure(),
        Failure::Unrouted(_)
    ));
    assert_eq!(
        e("invalid_auth").to_failure(),
        Failure::Retry("Slack chat.postMessage: invalid_auth".into())
    );
}

#[test]
fn from_config_is_off_without_a_token_and_names_the_flag_on_errors() {
    let args = NotifyConfig {
        slack_api_url: "https://slack.com/api".into(),
        ..NotifyConfig::default()
    };
    assert!(SlackNotifier::from_config(&args).unwrap().is_none());
    let dir = tempfile::tempdir().unwrap();
    let missing = NotifyConfig {
        slack_token_file: Some(dir.path().join("absent")),
        ..args.clone()
    };
    let err = SlackNotifier::from_config(&missing)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("--slack-token-file "), "{err}");
    let token = dir.path().join("token");
    std::fs::write(&token, "xoxb-1\n").unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "not a certificate").unwrap();
    let bad_ca = NotifyConfig {
        slack_token_file: Some(token.clone()),
        slack_ca_file: Some(ca),
        ..args.clone()
    };
    let err = SlackNotifier::from_config(&bad_ca).unwrap_err().to_string();
    assert!(err.starts_with("--slack-ca-file "), "{err}");
    let ok = NotifyConfig {
        slack_token_file: Some(token),
        ..args
    };
    let notifier = SlackNotifier::from_config(&ok).unwrap().unwrap();
    assert_eq!(notifier.name(), "slack");
}
