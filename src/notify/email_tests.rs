use super::*;
use crate::notify::content::{Fields, Templates};
use crate::notify::owner::{Owner, OwnerSource};

fn fields() -> Fields {
    Fields::from([
        ("namespace", "ml".to_string()),
        ("kind", "Deployment".to_string()),
        ("name", "chat".to_string()),
        ("workload", "ml/Deployment/chat".to_string()),
        ("policy", "research".to_string()),
        ("gpus", "2".to_string()),
        ("model", "NVIDIA H100 80GB HBM3".to_string()),
        ("idle_since", "2026-11-29T19:00:00Z".to_string()),
        ("idle_for", "2h".to_string()),
        ("shape", "MemoryHeld".to_string()),
        ("hourly_usd", "8.00".to_string()),
        ("wasted_usd", "16.00".to_string()),
        ("action", "ScaleToZero".to_string()),
        ("action_verb", "scale it to zero".to_string()),
        ("action_at", "2026-11-29T22:00:00Z".to_string()),
        (
            "snooze_command",
            "kubectl annotate deployment/chat -n ml gpureaper.io/snooze-until=2026-11-30T01:00:00Z --overwrite".to_string(),
        ),
        ("wake_command", "gpu-reaper wake ml/Deployment/chat".to_string()),
        ("owner", "ana@example.com (from the workload)".to_string()),
    ])
}

fn personal(kind: Kind, fields: Fields) -> Personal {
    Personal {
        kind,
        rendered: Templates::default().render(kind, &fields),
        fields,
        owner: Owner {
            emails: vec!["ana@example.com".into()],
            source: OwnerSource::Workload,
            ..Owner::default()
        },
        policy: "research".into(),
        slack_channel: None,
    }
}

fn args(host: Option<&str>) -> NotifyConfig {
    NotifyConfig {
        smtp_host: host.map(str::to_string),
        smtp_from: "gpu-reaper <gpu-reaper@localhost>".into(),
        ..NotifyConfig::default()
    }
}

#[test]
fn the_warning_html_has_heading_sentence_evidence_and_the_snooze_command() {
    let html = html(&personal(Kind::Warning, fields()));
    assert!(
        html.contains("<h2 style=\"margin:0 0 12px\">Idle GPUs: ml/Deployment/chat</h2>"),
        "{html}"
    );
    assert!(html.contains("2 NVIDIA H100 80GB HBM3 held by Deployment <b>chat</b> in namespace ml have been idle for 2h. gpu-reaper will scale it to zero at <b>2026-11-29T22:00:00Z</b>"), "{html}");
    assert!(html.contains(">2 × NVIDIA H100 80GB HBM3</td>"), "{html}");
    assert!(html.contains(">2026-11-29T19:00:00Z (2h)</td>"), "{html}");
    assert!(
        html.contains(">16.00 USD so far, 8.00 USD per hour</td>"),
        "{html}"
    );
    assert!(
        html.contains(">ScaleToZero at 2026-11-29T22:00:00Z</td>"),
        "{html}"
    );
    assert!(
        html.contains("gpureaper.io/snooze-until=2026-11-30T01:00:00Z --overwrite</pre>"),
        "{html}"
    );
    assert!(
        !html.contains("gpu-reaper wake"),
        "a warning has nothing to wake: {html}"
    );
    assert!(!html.contains("<a "), "no url, no link: {html}");
}

#[test]
fn the_reclaimed_html_has_the_wake_command_and_a_link_when_there_is_a_url() {
    let mut f = fields();
    f.insert("detail", "scaled to zero from 2 replicas".into());
    f.insert(
        "url",
        "https://grafana.example.com/d/x?ns=ml&name=chat".into(),
    );
    let html = html(&personal(Kind::Reclaimed, f));
    assert!(
        html.contains("Reclaimed idle GPUs: ml/Deployment/chat</h2>"),
        "{html}"
    );
    assert!(
        html.contains(
            "from Deployment <b>chat</b> in namespace ml: scaled to zero from 2 replicas."
        ),
        "{html}"
    );
    assert!(
        html.contains(">gpu-reaper wake ml/Deployment/chat</pre>"),
        "{html}"
    );
    assert!(html.contains("<a href=\"https://grafana.example.com/d/x?ns=ml&amp;name=chat\">Open ml/Deployment/chat</a>"), "{html}");
}

#[test]
fn every_value_in_the_html_is_escaped_and_odd_urls_are_not_links() {
    let mut f = fields();
    f.insert("name", "<script>alert(1)</script>".into());
    f.insert("shape", "\"Unused\" & 'idle'".into());
    f.insert("url", "javascript:alert(1)".into());
    let mut p = personal(Kind::Warning, f);
    p.rendered.subject = "</title><script>x</script>".into();
    let html = html(&p);
    assert!(!html.contains("<script>"), "{html}");
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{html}"
    );
    assert!(
        html.contains("&quot;Unused&quot; &amp; &#39;idle&#39;"),
        "{html}"
    );
    assert!(!html.contains("href"), "{html}");
    assert!(html.contains("Dashboard: javascript:alert(1)"), "{html}");
}

#[test]
fn missing_fields_leave_no_dangling_words_or_empty_rows() {
    let html = html(&personal(
        Kind::Warning,
        Fields::from([("workload", "ml/Job/train".to_string())]),
    ));
    assert!(
        html.contains("<p>GPUs held by ml/Job/train have been idle.</p>"),
        "{html}"
    );
    assert!(!html.contains("<tr>"), "{html}");
    assert!(!html.contains("<pre"), "{html}");
    assert!(!html.contains(" at <b></b>"), "{html}");
}

#[test]
fn email_is_off_without_a_host() {
    assert!(EmailNotifier::from_config(&args(None)).unwrap().is_none());
    assert!(
        EmailNotifier::from_config(&args(Some("  ")))
            .unwrap()
            .is_none()
    );
    let on = EmailNotifier::from_config(&args(Some("smtp.example.com")))
        .unwrap()
        .unwrap();
    assert_eq!((on.host.as_str(), on.port), ("smtp.example.com", 587));
    assert_eq!(on.name(), "email");
}

#[test]
fn ports_default_by_security() {
    for (security, port) in [
        (SmtpSecurity::Starttls, 587),
        (SmtpSecurity::Tls, 465),
        (SmtpSecurity::None, 25),
    ] {
        let mut a = args(Some("smtp.example.com"));
        a.smtp_security = security;
        assert_eq!(EmailNotifier::from_config(&a).unwrap().unwrap().port, port);
        a.smtp_port = Some(2525);
        assert_eq!(EmailNotifier::from_config(&a).unwrap().unwrap().port, 2525);
    }
}

#[test]
fn bad_settings_are_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let err = |a: &NotifyConfig| EmailNotifier::from_config(a).unwrap_err().to_string();

    let mut a = args(Some("smtp.example.com"));
    a.smtp_ca_file = Some(dir.path().join("missing.pem"));
    assert!(err(&a).starts_with("--smtp-ca-file "), "{}", err(&a));
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    a.smtp_ca_file = Some(not_pem);
    assert!(
        err(&a).contains("--smtp-ca-file") && err(&a).contains("no PEM certificate"),
        "{}",
        err(&a)
    );

    let mut a = args(Some("smtp.example.com"));
    a.smtp_from = "gpu-reaper at example dot com".into();
    assert!(err(&a).starts_with("--smtp-from "), "{}", err(&a));

    let mut a = args(Some("smtp.example.com"));
    a.smtp_user = Some("reaper".into());
    assert!(
        err(&a).starts_with("--smtp-user needs --smtp-password-file"),
        "{}",
        err(&a)
    );
    a.smtp_password_file = Some(dir.path().join("missing-password"));
    assert!(err(&a).starts_with("--smtp-password-file "), "{}", err(&a));
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    a.smtp_password_file = Some(empty);
    assert!(err(&a).contains("empty"), "{}", err(&a));
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    a.smtp_password_file = Some(password.clone());
    assert!(EmailNotifier::from_config(&a).unwrap().is_some());
    a.smtp_security = SmtpSecurity::None;
    assert!(err(&a).contains("clear text"), "{}", err(&a));

    let mut a = args(Some("smtp.example.com"));
    a.smtp_password_file = Some(password);
    assert!(err(&a).contains("needs --smtp-user"), "{}", err(&a));

    let mut a = args(Some("smtp.example.com"));
    a.smtp_port = Some(0);
    assert!(err(&a).starts_with("--smtp-port 0"), "{}", err(&a));
}

#[test]
fn the_message_id_is_stable_for_the_same_notice_and_differs_between_notices() {
    let n = |p: Personal, reason| Notification {
        workload: crate::cluster::inventory::ObjectInfo {
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
        },
        reason,
        severity: crate::notify::Severity::Warning,
        message: String::new(),
        personal: Some(p),
    };
    let warning = personal(Kind::Warning, fields());
    let a = message_id(&n(warning.clone(), "IdleGpus"), &warning, "example.com");
    let b = message_id(&n(warning.clone(), "IdleGpus"), &warning, "example.com");
    assert_eq!(a, b);
    // The same warning sent again later (the leader died between sending and recording
    // it): "idle for" and the text differ, the notice does not.
    let mut later = fields();
    later.insert("idle_for", "2h3m".to_string());
    let again = personal(Kind::Warning, later);
    assert_ne!(again.rendered.text, warning.rendered.text);
    assert_eq!(
        message_id(&n(again.clone(), "IdleGpus"), &again, "example.com"),
        a
    );
    // Another idle span, or another deadline, is another notice.
    for (field, value) in [
        ("idle_since", "2026-11-30T19:00:00Z"),
        ("action_at", "2026-12-01T09:00:00Z"),
    ] {
        let mut other = fields();
        other.insert(field, value.to_string());
        let other = personal(Kind::Warning, other);
        assert_ne!(
            message_id(&n(other.clone(), "IdleGpus"), &other, "example.com"),
            a,
            "{field}"
        );
    }
    assert!(
        a.starts_with("<gpu-reaper.idlegpus.") && a.ends_with("@example.com>"),
        "{a}"
    );
    let reclaimed = personal(Kind::Reclaimed, fields());
    let c = message_id(
        &n(reclaimed.clone(), "Reclaimed"),
        &reclaimed,
        "example.com",
    );
    assert_ne!(a, c);
}
