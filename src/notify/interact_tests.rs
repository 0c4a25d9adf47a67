use serde_json::{Value, json};

use super::*;

fn sign(secret: &str, timestamp: &str, body: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, format!("v0:{timestamp}:{body}").as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("v0={hex}")
}

#[test]
fn slacks_documented_example_signature_verifies_and_is_stale_now() {
    // The worked example of Slack's "Verifying requests from Slack": the signature
    // matches, and its 2018 timestamp is long past the 5 minutes.
    let secret = "8f742231b10e8888abcd99yyyzzz85a5";
    let body = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    let good = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
    assert_eq!(verify(secret, "1531420618", body, good), Verdict::Stale);
    assert_eq!(
        verify(secret, "1531420619", body, good),
        Verdict::BadSignature
    );
    assert_eq!(
        verify("other", "1531420618", body, good),
        Verdict::BadSignature
    );
    for forged in [&good.replace("v0=", "v1="), "v0=zz", "v0=abc", ""] {
        assert_eq!(
            verify(secret, "1531420618", body, forged),
            Verdict::BadSignature,
            "{forged}"
        );
    }
}

#[test]
fn a_fresh_signed_request_is_authentic_and_its_body_counts() {
    let now = Timestamp::now().as_second().to_string();
    let secret = "s3cret";
    let signature = sign(secret, &now, "payload=%7B%7D");
    assert_eq!(
        verify(secret, &now, "payload=%7B%7D", &signature),
        Verdict::Authentic
    );
    assert_eq!(
        verify(secret, &now, "payload=%7B%22x%22%7D", &signature),
        Verdict::BadSignature
    );
    assert_eq!(
        verify("", &now, "payload=%7B%7D", &signature),
        Verdict::BadSignature,
        "an empty secret verifies nothing"
    );
}

#[test]
fn a_signature_is_accepted_once_and_the_memory_stays_bounded() {
    let mut guard = ReplayGuard::default();
    assert!(guard.first_time("v0=aa", 1000));
    assert!(!guard.first_time("v0=aa", 1001));
    // Long after it could pass the timestamp check, it is forgotten.
    assert!(guard.first_time("v0=bb", 1000 + 2 * MAX_SKEW_SECONDS + 1));
    assert!(!guard.seen.contains("v0=aa"));
    for i in 0..REPLAY_CAPACITY + 10 {
        guard.first_time(&format!("v0={i}"), 5000);
    }
    assert!(guard.order.len() <= REPLAY_CAPACITY);
    assert_eq!(guard.seen.len(), guard.order.len());
}

fn form(payload: &Value) -> Vec<u8> {
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish()
        .into_bytes()
}

/// A block_actions payload as Slack sends it (fields gpu-reaper does not read included).
fn click_payload(action_id: &str, value: &str) -> Value {
    json!({
        "type": "block_actions",
        "team": {"id": "T1", "domain": "example"},
        "api_app_id": "A1",
        "container": {"type": "message", "message_ts": "1764417600.000100", "channel_id": "D1"},
        "trigger_id": "1.2.3",
        "user": {"id": "U0ANA0001", "username": "ana"},
        "response_url": "https://hooks.slack.com/actions/T1/2/abc",
        "actions": [{"type": "button", "action_id": action_id, "value": value}],
        "message": {"type": "message", "ts": "1764417600.000100",
                    "blocks": [{"type": "header", "text": {"type": "plain_text", "text": "Idle"}}]},
    })
}

#[test]
fn clicks_are_read_and_bad_payloads_named() {
    let value = r#"{"w":"ml/Deployment/chat","v":"apps/v1","p":"research"}"#;
    let Request::Click(click) = parse_request(&form(&click_payload(KEEP_24H, value))).unwrap()
    else {
        panic!("a click")
    };
    assert_eq!(click.choice, Choice::Keep(SignedDuration::from_hours(24)));
    assert_eq!(click.choice.outcome(), Outcome::Kept24h);
    assert_eq!(click.value.p, "research");
    assert_eq!(click.user, "U0ANA0001");
    assert_eq!(
        click.response_url,
        "https://hooks.slack.com/actions/T1/2/abc"
    );
    assert_eq!(click.blocks.len(), 1);
    assert!(matches!(
        parse_request(&form(&click_payload("open_workload", ""))).unwrap(),
        Request::Ignored(_)
    ));
    assert!(matches!(
        parse_request(&form(&json!({"type": "view_submission"}))).unwrap(),
        Request::Ignored(_)
    ));
    for (body, why) in [
        (b"nothing=here".to_vec(), "no `payload`"),
        (b"payload=%7Bnot".to_vec(), "not an interaction payload"),
        (
            form(&json!({"type": "block_actions", "actions": []})),
            "without actions",
        ),
        (
            form(&json!({"type": "block_actions", "actions": [{"action_id": KEEP_4H}]})),
            "not an interaction payload",
        ),
        (form(&click_payload(NOT_MINE, "{}")), "button value"),
        (
            form(&{
                let mut p = click_payload(NOT_MINE, value);
                p["user"]["id"] = "<!channel>".into();
                p
            }),
            "user.id",
        ),
    ] {
        let err = parse_request(&body).unwrap_err().to_string();
        assert!(err.contains(why), "{why}: {err}");
    }
}

#[test]
fn the_answered_message_loses_its_decision_buttons_only() {
    let original: Vec<SlackBlock> = serde_json::from_value(json!([
        {"type": "header", "text": {"type": "plain_text", "text": "Idle"}},
        {"type": "actions", "block_id": "gpu_reaper_link", "elements": [{"type": "button", "action_id": "open_workload", "text": {"type": "plain_text", "text": "Open"}, "url": "https://x.example/"}]},
        {"type": "actions", "block_id": "renamed-by-slack", "elements": [{"type": "button", "action_id": KEEP_4H, "text": {"type": "plain_text", "text": "Keep 4h"}}]},
        {"type": "actions", "block_id": DECISION_BLOCK, "elements": []},
        {"type": "actions", "block_id": "untyped", "elements": [{"type": "button", "action_id": NOT_MINE}]},
    ]))
    .unwrap();
    let blocks = serde_json::to_value(answered_blocks(&original, "kept")).unwrap();
    let blocks = blocks.as_array().unwrap();
    assert_eq!(blocks.len(), 3, "{blocks:?}");
    assert_eq!(blocks[1]["block_id"], "gpu_reaper_link");
    assert_eq!(blocks[2]["elements"][0]["text"], "kept");
}
