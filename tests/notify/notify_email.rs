//! The email channel against a real SMTP server on loopback (tests/smtp/server.py, aiosmtpd):
//! STARTTLS with AUTH, implicit TLS, refused and busy recipients, a wrong or rotated
//! password, an untrusted certificate, nothing listening. What the server received is
//! read back from the .eml files it writes and parsed here (headers, MIME parts,
//! quoted-printable and base64), so the assertions are about the bytes on the wire.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common::pki;
use gpu_reaper::cluster::inventory::ObjectInfo;
use gpu_reaper::notify::content::{Fields, Kind, Templates};
use gpu_reaper::notify::email::EmailNotifier;
use gpu_reaper::notify::owner::{Owner, OwnerSource};
use gpu_reaper::notify::{Failure, Notification, Notifier, Personal, Severity};
use gpu_reaper::notify::{NotifyConfig, SmtpSecurity};
use tokio::io::{AsyncBufReadExt, BufReader};

const SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/smtp/server.py");
/// Far above the notifier's own bounds: only a broken test waits this long.
const SAFETY: Duration = Duration::from_secs(120);
const SNOOZE: &str = "kubectl annotate deployment/chat -n ml gpureaper.io/snooze-until=2026-11-30T01:00:00Z --overwrite";

fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A throw-away CA and a certificate for 127.0.0.1, as PEM.
struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn pki() -> Pki {
    let ca = pki::Ca::new("notify-email test CA");
    let leaf = ca.leaf(&["127.0.0.1"], "smtp.test");
    Pki {
        ca_pem: ca.pem,
        cert_pem: leaf.cert_pem,
        key_pem: leaf.key_pem,
    }
}

/// tests/smtp/server.py, stopped when dropped (its stdin closes and it is killed).
struct SmtpServer {
    _child: tokio::process::Child,
    port: u16,
    out: PathBuf,
    dir: tempfile::TempDir,
}

impl SmtpServer {
    async fn start(mode: &str, auth: Option<&str>) -> SmtpServer {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki();
        let (cert, key, ca) = (
            dir.path().join("cert.pem"),
            dir.path().join("key.pem"),
            dir.path().join("ca.pem"),
        );
        std::fs::write(&cert, &pki.cert_pem).unwrap();
        std::fs::write(&key, &pki.key_pem).unwrap();
        std::fs::write(&ca, &pki.ca_pem).unwrap();
        let out = dir.path().join("received");
        std::fs::create_dir(&out).unwrap();
        let mut command = tokio::process::Command::new("python3");
        command
            .arg(SERVER)
            .args(["--port", "0", "--mode", mode])
            .arg("--cert")
            .arg(&cert)
            .arg("--key")
            .arg(&key)
            .arg("--out")
            .arg(&out)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(auth) = auth {
            command.args(["--auth", auth]);
        }
        let mut child = command
            .spawn()
            .expect("python3 runs (with aiosmtpd: .ci/run installs it)");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(30),
            BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .expect("the SMTP server says ready within 30 s")
        .unwrap();
        let port = line
            .trim()
            .strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "expected `ready <port>` from {SERVER} (is aiosmtpd installed?), got {line:?}"
                )
            });
        SmtpServer {
            _child: child,
            port,
            out,
            dir,
        }
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The messages received so far, in order.
    fn received(&self) -> Vec<Eml> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "eml"))
            .collect();
        files.sort_by_key(|p| {
            p.file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.parse::<u32>().ok())
                .unwrap_or(u32::MAX)
        });
        files
            .iter()
            .map(|p| Eml::parse(&std::fs::read_to_string(p).unwrap()))
            .collect()
    }
}

/// A port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---- a small MIME reader: enough for what lettre writes ----

/// One entity: unfolded headers and its raw body.
#[derive(Debug)]
struct Eml {
    headers: Vec<(String, String)>,
    body: String,
}

impl Eml {
    fn parse(raw: &str) -> Eml {
        let raw = raw.replace("\r\n", "\n");
        let (head, body) = raw.split_once("\n\n").unwrap_or((raw.as_str(), ""));
        let mut headers: Vec<(String, String)> = Vec::new();
        for line in head.lines() {
            if line.starts_with([' ', '\t']) {
                if let Some((_, value)) = headers.last_mut() {
                    value.push(' ');
                    value.push_str(line.trim());
                }
            } else if let Some((name, value)) = line.split_once(':') {
                headers.push((name.trim().to_string(), value.trim().to_string()));
            }
        }
        Eml {
            headers,
            body: body.to_string(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The header, with RFC 2047 encoded words decoded.
    fn text_header(&self, name: &str) -> String {
        decode_words(self.header(name).unwrap_or_default())
    }

    fn content_type(&self) -> String {
        self.header("Content-Type")
            .unwrap_or("text/plain")
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
    }

    fn param(&self, header: &str, param: &str) -> Option<String> {
        self.header(header)?.split(';').skip(1).find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case(param)
                .then(|| v.trim().trim_matches('"').to_string())
        })
    }

    /// The parts of a multipart entity.
    fn parts(&self) -> Vec<Eml> {
        let boundary = self
            .param("Content-Type", "boundary")
            .expect("a multipart Content-Type has a boundary");
        let delimiter = format!("--{boundary}");
        let mut parts = Vec::new();
        for chunk in self.body.split(&delimiter).skip(1) {
            if chunk.starts_with("--") {
                break;
            }
            parts.push(Eml::parse(chunk.trim_start_matches('\n')));
        }
        parts
    }

    /// The body, transfer-decoded, as text with `\n` line ends.
    fn text(&self) -> String {
        let encoding = self
            .header("Content-Transfer-Encoding")
            .unwrap_or("7bit")
            .to_ascii_lowercase();
        let bytes = match encoding.as_str() {
            "quoted-printable" => quoted_printable(&self.body),
            "base64" => {
                use base64::Engine;
                let compact: String = self.body.split_whitespace().collect();
                base64::engine::general_purpose::STANDARD
                    .decode(compact)
                    .expect("valid base64 body")
            }
            _ => self.body.clone().into_bytes(),
        };
        String::from_utf8(bytes)
            .expect("UTF-8 text")
            .replace("\r\n", "\n")
            .trim_end_matches('\n')
            .to_string()
    }
}

fn quoted_printable(body: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut lines = body.split('\n').peekable();
    while let Some(line) = lines.next() {
        let line = line.trim_end_matches([' ', '\t']);
        let (line, soft) = match line.strip_suffix('=') {
            Some(l) => (l, true),
            None => (line, false),
        };
        let bytes = line.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let escaped = bytes
                .get(i + 1..i + 3)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok());
            if let (b'=', Some(b)) = (bytes[i], escaped) {
                out.push(b);
                i += 3;
                continue;
            }
            out.push(bytes[i]);
            i += 1;
        }
        if !soft && lines.peek().is_some() {
            out.push(b'\n');
        }
    }
    out
}

/// RFC 2047: `=?utf-8?b?…?=` and `=?utf-8?q?…?=` words; space between two words is dropped.
fn decode_words(value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    let mut last_was_word = false;
    while !rest.is_empty() {
        let Some(start) = rest.find("=?") else {
            out.push_str(rest);
            break;
        };
        let (before, from) = rest.split_at(start);
        let word = from[2..].splitn(3, '?').collect::<Vec<_>>();
        let decoded = (word.len() == 3)
            .then(|| {
                let (encoding, tail) = (word[1], word[2]);
                let end = tail.find("?=")?;
                let text = &tail[..end];
                let bytes = match encoding.to_ascii_lowercase().as_str() {
                    "b" => {
                        use base64::Engine;
                        base64::engine::general_purpose::STANDARD
                            .decode(text)
                            .ok()?
                    }
                    "q" => quoted_printable(&text.replace('_', " ")),
                    _ => return None,
                };
                let consumed = 2 + word[0].len() + 1 + encoding.len() + 1 + end + 2;
                Some((String::from_utf8(bytes).ok()?, consumed))
            })
            .flatten();
        match decoded {
            Some((text, consumed)) => {
                if !(last_was_word && before.trim().is_empty()) {
                    out.push_str(before);
                }
                out.push_str(&text);
                rest = &from[consumed..];
                last_was_word = true;
            }
            None => {
                out.push_str(before);
                out.push_str("=?");
                rest = &from[2..];
                last_was_word = false;
            }
        }
    }
    out
}

// ---- notifications ----

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
        ("snooze_command", SNOOZE.to_string()),
        (
            "owner",
            "ana@example.com, bo@example.com (from the workload)".to_string(),
        ),
    ])
}

fn notification(kind: Kind, fields: Fields, emails: &[&str]) -> Notification {
    let rendered = Templates::default().render(kind, &fields);
    Notification {
        workload: ObjectInfo {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: "ml".into(),
            name: fields.get("name").cloned().unwrap_or_default(),
            uid: String::new(),
            owner: None,
            labels: Default::default(),
            annotations: Default::default(),
            created_at: jiff::Timestamp::UNIX_EPOCH,
            deleting: false,
        },
        reason: match kind {
            Kind::Warning => "IdleGpus",
            Kind::Reclaimed => "Reclaimed",
        },
        severity: Severity::Warning,
        message: rendered.text.clone(),
        personal: Some(Personal {
            kind,
            rendered,
            fields,
            owner: Owner {
                emails: emails.iter().map(|e| e.to_string()).collect(),
                slack_ids: if emails.is_empty() {
                    vec!["U024BE7LH".into()]
                } else {
                    vec![]
                },
                source: OwnerSource::Workload,
                invalid: vec![],
            },
            policy: "research".into(),
            slack_channel: None,
        }),
    }
}

struct Settings<'a> {
    port: u16,
    security: SmtpSecurity,
    ca_file: Option<PathBuf>,
    login: Option<(&'a str, &'a Path)>,
}

fn notifier(s: Settings<'_>) -> EmailNotifier {
    install_crypto();
    let args = NotifyConfig {
        smtp_host: Some("127.0.0.1".into()),
        smtp_port: Some(s.port),
        smtp_security: s.security,
        smtp_ca_file: s.ca_file,
        smtp_user: s.login.map(|(user, _)| user.to_string()),
        smtp_password_file: s.login.map(|(_, path)| path.to_path_buf()),
        smtp_from: "gpu-reaper <reaper@gpu-reaper.test>".into(),
        ..NotifyConfig::default()
    };
    EmailNotifier::from_config(&args)
        .expect("valid settings")
        .expect("email is on")
}

async fn send(notifier: &EmailNotifier, n: &Notification) -> Result<String, Failure> {
    tokio::time::timeout(SAFETY, notifier.notify(n))
        .await
        .expect("the notifier bounds its own time")
}

fn password_file(dir: &Path, password: &str) -> PathBuf {
    let path = dir.join("smtp-password");
    std::fs::write(&path, format!("{password}\n")).unwrap();
    path
}

// ---- the tests ----

#[tokio::test]
async fn starttls_with_auth_delivers_the_subject_both_parts_and_the_headers() {
    let server = SmtpServer::start("starttls", Some("reaper:s3cret")).await;
    let password = password_file(server.dir.path(), "s3cret");
    let email = notifier(Settings {
        port: server.port,
        security: SmtpSecurity::Starttls,
        ca_file: Some(server.ca_file()),
        login: Some(("reaper", &password)),
    });
    let n = notification(
        Kind::Warning,
        fields(),
        &["ana@example.com", "bo@example.com"],
    );
    let sent = send(&email, &n).await.expect("delivered");
    assert_eq!(sent, "email to ana@example.com, bo@example.com");

    let received = server.received();
    assert_eq!(received.len(), 1, "one message for both owners");
    let m = &received[0];
    assert!(
        m.header("X-Test-TLS").unwrap().starts_with("TLSv1."),
        "{m:?}"
    );
    assert_eq!(m.header("X-Test-Auth"), Some("reaper"));
    assert_eq!(
        m.header("X-Test-Envelope-From"),
        Some("reaper@gpu-reaper.test")
    );
    assert_eq!(
        m.header("X-Test-Envelope-To"),
        Some("ana@example.com, bo@example.com")
    );

    let p = n.personal.as_ref().unwrap();
    assert_eq!(m.text_header("Subject"), p.rendered.subject);
    assert_eq!(
        m.text_header("Subject"),
        "Idle GPUs: ml/Deployment/chat will be reclaimed at 2026-11-29T22:00:00Z"
    );
    let to = m.header("To").unwrap();
    assert!(
        to.contains("ana@example.com") && to.contains("bo@example.com"),
        "{to}"
    );
    assert!(
        m.header("From")
            .unwrap()
            .contains("<reaper@gpu-reaper.test>")
    );
    let id = m.header("Message-ID").unwrap();
    assert!(
        id.starts_with("<gpu-reaper.idlegpus.") && id.ends_with("@gpu-reaper.test>"),
        "{id}"
    );
    assert_eq!(
        m.header("X-GPU-Reaper-Workload"),
        Some("ml/Deployment/chat")
    );
    assert_eq!(m.header("Auto-Submitted"), Some("auto-generated"));
    assert!(m.header("Date").is_some());

    assert_eq!(m.content_type(), "multipart/alternative");
    let parts = m.parts();
    assert_eq!(parts.len(), 2, "{parts:?}");
    let (text, html) = (&parts[0], &parts[1]);
    assert_eq!(text.content_type(), "text/plain");
    assert_eq!(html.content_type(), "text/html");

    let text = text.text();
    assert_eq!(text, p.rendered.text);
    assert!(
        text.starts_with(
            "2 NVIDIA H100 80GB HBM3 held by Deployment chat in namespace ml have been idle since 2026-11-29T19:00:00Z (2h, MemoryHeld)."
        ),
        "{text}"
    );
    assert!(
        text.contains("16.00 USD so far, 8.00 USD per hour"),
        "{text}"
    );
    assert!(
        text.contains(&format!("To keep it for 4 hours: {SNOOZE}")),
        "{text}"
    );

    let html = html.text();
    assert!(
        html.contains("<h2 style=\"margin:0 0 12px\">Idle GPUs: ml/Deployment/chat</h2>"),
        "{html}"
    );
    assert!(html.contains(">2 × NVIDIA H100 80GB HBM3</td>"), "{html}");
    assert!(html.contains(">2026-11-29T19:00:00Z (2h)</td>"), "{html}");
    assert!(html.contains(">MemoryHeld</td>"), "{html}");
    assert!(
        html.contains(">16.00 USD so far, 8.00 USD per hour</td>"),
        "{html}"
    );
    assert!(html.contains(&format!("\">{SNOOZE}</pre>")), "{html}");
    assert!(html.contains("<pre "), "{html}");
}

#[tokio::test]
async fn implicit_tls_delivers() {
    let server = SmtpServer::start("tls", None).await;
    let email = notifier(Settings {
        port: server.port,
        security: SmtpSecurity::Tls,
        ca_file: Some(server.ca_file()),
        login: None,
    });
    let mut f = fields();
    f.insert("detail", "scaled to zero from 2 replicas".into());
    f.insert("wake_command", "gpu-reaper wake ml/Deployment/chat".into());
    let n = notification(Kind::Reclaimed, f, &["ana@example.com"]);
    assert_eq!(
        send(&email, &n).await,
        Ok("email to ana@example.com".to_string())
    );
    let received = server.received();
    assert_eq!(received.len(), 1);
    let m = &received[0];
    assert!(
        m.header("X-Test-TLS").unwrap().starts_with("TLSv1."),
        "{m:?}"
    );
    assert_eq!(m.header("X-Test-Auth"), Some("none"));
    assert_eq!(
        m.text_header("Subject"),
        "Reclaimed idle GPUs: ml/Deployment/chat"
    );
    let parts = m.parts();
    assert!(
        parts[0]
            .text()
            .contains("To restore it: gpu-reaper wake ml/Deployment/chat")
    );
    let html = parts[1].text();
    assert!(
        html.contains("\">gpu-reaper wake ml/Deployment/chat</pre>"),
        "{html}"
    );
    assert!(html.contains(&format!("\">{SNOOZE}</pre>")), "{html}");
}

#[tokio::test]
async fn a_wrong_password_is_a_failure_that_names_authentication() {
    let server = SmtpServer::start("starttls", Some("reaper:s3cret")).await;
    let password = password_file(server.dir.path(), "not-the-password");
    let email = notifier(Settings {
        port: server.port,
        security: SmtpSecurity::Starttls,
        ca_file: Some(server.ca_file()),
        login: Some(("reaper", &password)),
    });
    let n = notification(Kind::Warning, fields(), &["ana@example.com"]);
    match send(&email, &n).await {
        Err(Failure::Retry(why)) => {
            assert!(why.contains("authentication as reaper failed"), "{why}");
            assert!(why.contains("535"), "the server's answer: {why}");
        }
        other => panic!("expected a retryable auth failure, got {other:?}"),
    }
    assert!(server.received().is_empty());
}

#[tokio::test]
async fn the_password_file_is_read_again_on_every_send() {
    let server = SmtpServer::start("starttls", Some("reaper:new-s3cret")).await;
    let password = password_file(server.dir.path(), "old-s3cret");
    let email = notifier(Settings {
        port: server.port,
        security: SmtpSecurity::Starttls,
        ca_file: Some(server.ca_file()),
        login: Some(("reaper", &password)),
    });
    let n = notification(Kind::Warning, fields(), &["ana@example.com"]);
    assert!(matches!(send(&email, &n).await, Err(Failure::Retry(_))));
    // The Secret is rotated: the same notifier now logs in with the new password.
    password_file(server.dir.path(), "new-s3cret");
    assert_eq!(
        send(&email, &n).await,
        Ok("email to ana@example.com".to_string())
    );
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn nothing_listening_is_retried() {
    let email = notifier(Settings {
        port: closed_port(),
        security: SmtpSecurity::Starttls,
        ca_file: None,
        login: None,
    });
    let n = notification(Kind::Warning, fields(), &["ana@example.com"]);
    match send(&email, &n).await {
        Err(Failure::Retry(why)) => assert!(why.contains("connecting failed"), "{why}"),
        other => panic!("expected Retry, got {other:?}"),
    }
}

#[tokio::test]
async fn an_owner_without_an_email_address_is_unrouted_without_connecting() {
    // Nothing listens: were a connection tried, this would be a Retry.
    let email = notifier(Settings {
        port: closed_port(),
        security: SmtpSecurity::Starttls,
        ca_file: None,
        login: None,
    });
    let n = notification(Kind::Warning, fields(), &[]);
    match send(&email, &n).await {
        Err(Failure::Unrouted(why)) => {
            assert!(
                why.starts_with("no email address for ml/Deployment/chat"),
                "{why}"
            );
            assert!(why.contains("U024BE7LH"), "says who the owner is: {why}");
        }
        other => panic!("expected Unrouted, got {other:?}"),
    }
    let mut event_only = notification(Kind::Warning, fields(), &["ana@example.com"]);
    event_only.personal = None;
    assert!(matches!(
        send(&email, &event_only).await,
        Err(Failure::Unrouted(_))
    ));
}

#[tokio::test]
async fn a_script_in_a_field_is_escaped_in_the_html_part() {
    let server = SmtpServer::start("starttls", None).await;
    let email = notifier(Settings {
        port: server.port,
        security: SmtpSecurity::Starttls,
        ca_file: Some(server.ca_file()),
        login: None,
    });
    let mut f = fields();
    f.insert("name", "<script>alert('x')</script>".into());
    f.insert("shape", "Unused & <b>cold</b>".into());
    let n = notification(Kind::Warning, f, &["ana@example.com"]);
    send(&email, &n).await.expect("delivered");
    let received = server.received();
    let html = received[0].parts()[1].text();
    assert!(!html.contains("<script>"), "{html}");
    assert!(
        html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"),
        "{html}"
    );
    assert!(
        html.contains(">Unused &amp; &lt;b&gt;cold&lt;/b&gt;</td>"),
        "{html}"
    );
    // The plain-text part says it as it is.
    assert!(
        received[0].parts()[0]
            .text()
            .contains("held by Deployment <script>alert('x')</script> in namespace ml")
    );
}

#[tokio::test]
async fn a_refused_address_is_named_and_the_others_still_get_the_message() {
    let server = SmtpServer::start("starttls", None).await;
    let email = notifier(Settings {
        port: server.port,
        security: SmtpSecurity::Starttls,
        ca_file: Some(server.ca_file()),
        login: None,
    });
    let n = notification(
        Kind::Warning,
        fields(),
        &["refused-ana@example.com", "bo@example.com"],
    );
    let sent = send(&email, &n).await.expect("delivered to bo");
    assert!(
        sent.starts_with(
            "email to bo@example.com (refused: refused-ana@example.com: permanent error (550)"
        ),
        "{sent}"
    );
    let received = server.received();
    assert_eq!(received.len(), 1);
    assert_eq!(
        received[0].header("X-Test-Envelope-To"),
        Some("bo@example.com")
    );

    let n = notification(Kind::Warning, fields(), &["refused-ana@example.com"]);
    match send(&email, &n).await {
        Err(Failure::Unrouted(why)) => {
            assert!(
                why.contains("refused-ana@example.com: permanent error (550)"),
                "{why}"
            );
            assert!(why.contains("no such user"), "the server's answer: {why}");
        }
        other => panic!("expected Unrouted, got {other:?}"),
    }
    assert_eq!(server.received().len(), 1, "nothing more was sent");
}

#[tokio::test]
async fn a_busy_mailbox_is_retried_and_nobody_gets_a_copy_yet() {
    let server = SmtpServer::start("starttls", None).await;
    let email = notifier(Settings {
        port: server.port,
        security: SmtpSecurity::Starttls,
        ca_file: Some(server.ca_file()),
        login: None,
    });
    let n = notification(
        Kind::Warning,
        fields(),
        &["ana@example.com", "busy-bo@example.com"],
    );
    match send(&email, &n).await {
        Err(Failure::Retry(why)) => {
            assert!(why.contains("RCPT TO:<busy-bo@example.com>"), "{why}");
            assert!(why.contains("450"), "{why}");
        }
        other => panic!("expected Retry, got {other:?}"),
    }
    assert!(
        server.received().is_empty(),
        "a retry must not duplicate ana's copy"
    );
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused() {
    let server = SmtpServer::start("starttls", None).await;
    // No --smtp-ca-file: the public roots do not know the test CA.
    let email = notifier(Settings {
        port: server.port,
        security: SmtpSecurity::Starttls,
        ca_file: None,
        login: None,
    });
    let n = notification(Kind::Warning, fields(), &["ana@example.com"]);
    match send(&email, &n).await {
        Err(Failure::Retry(why)) => assert!(why.contains("STARTTLS failed"), "{why}"),
        other => panic!("expected Retry, got {other:?}"),
    }
    assert!(server.received().is_empty());
}

#[tokio::test]
async fn starttls_is_required_not_opportunistic() {
    let server = SmtpServer::start("plain", None).await;
    let email = notifier(Settings {
        port: server.port,
        security: SmtpSecurity::Starttls,
        ca_file: None,
        login: None,
    });
    let n = notification(Kind::Warning, fields(), &["ana@example.com"]);
    match send(&email, &n).await {
        Err(Failure::Retry(why)) => {
            assert!(why.contains("STARTTLS failed"), "{why}");
            assert!(why.contains("not supported"), "{why}");
        }
        other => panic!("expected Retry, got {other:?}"),
    }
    assert!(server.received().is_empty(), "nothing sent in clear text");

    // Asked for no TLS, the same server takes it.
    let plain = notifier(Settings {
        port: server.port,
        security: SmtpSecurity::None,
        ca_file: None,
        login: None,
    });
    assert!(send(&plain, &n).await.is_ok());
    assert_eq!(server.received()[0].header("X-Test-TLS"), Some("none"));
}
