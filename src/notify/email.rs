//! Email: warnings and reclaim notices to the owner's addresses over SMTP
//! (docs/notifications.md#email). Touches the network (one SMTP connection per send) and
//! reads the password file on every send, so a rotated Secret takes effect without a
//! restart; everything else is read once at start-up by [`EmailNotifier::from_config`].
//!
//! The message is multipart/alternative: the plain text the templates rendered, and an
//! HTML part [`html`] builds from the same fields (every value escaped). The snooze
//! command is in both, in full: the link-free way to keep a workload is a command the
//! owner can paste.
//!
//! The SMTP dialogue is driven step by step (lettre's connection, not its transport) so
//! each recipient's answer is known: a 5xx to one RCPT makes that address unrouted while
//! the others still get the message; any 4xx, a refused connection or a timeout retries
//! the whole message before any copy was sent, so a retry never duplicates a delivery.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart};
use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::{AsyncSmtpConnection, Certificate, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::{Address, Message};

use super::NotifyConfig;
use super::content::{Kind, html_escape};
use super::error::{NotifyError, Result};
use super::{Failure, Notification, Notifier, Personal};

/// How long connecting (TCP and, for implicit TLS, the handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the whole dialogue, from connecting to the server accepting the message,
/// may take. A server that stalls is retried later rather than holding a reconcile.
const DIALOGUE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long QUIT may take once the outcome is known (its failure changes nothing).
const QUIT_TIMEOUT: Duration = Duration::from_secs(5);

/// The header naming the workload a message is about, for mail filters and support.
const WORKLOAD_HEADER: HeaderName = HeaderName::new_from_ascii_str("X-GPU-Reaper-Workload");
/// RFC 3834: out-of-office and other automatic replies are not sent to gpu-reaper.
const AUTO_SUBMITTED: HeaderName = HeaderName::new_from_ascii_str("Auto-Submitted");

/// How the connection is secured, with what the TLS handshake checks.
#[derive(Clone)]
enum Security {
    Starttls(TlsParameters),
    Tls(TlsParameters),
    None,
}

/// Sends personal notifications by email. Built from the `--smtp-*` flags.
pub struct EmailNotifier {
    host: String,
    port: u16,
    security: Security,
    /// The SMTP user and the file its password is read from on every send.
    login: Option<(String, PathBuf)>,
    from: Mailbox,
}

impl std::fmt::Debug for EmailNotifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailNotifier")
            .field("server", &self.server())
            .field(
                "security",
                &match self.security {
                    Security::Starttls(_) => "starttls",
                    Security::Tls(_) => "tls",
                    Security::None => "none",
                },
            )
            .field("user", &self.login.as_ref().map(|(user, _)| user))
            .field("from", &self.from.to_string())
            .finish()
    }
}

const PASSWORD_FLAG: &str = "--smtp-password-file";

fn read_password(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(|source| NotifyError::File {
        flag: PASSWORD_FLAG,
        path: path.to_path_buf(),
        source,
    })?;
    // Secrets mounted from files often end with a newline nobody meant as part of them.
    // (Unlike the Slack secrets, other whitespace may be part of a password.)
    let password = text.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        return Err(NotifyError::EmptyFile {
            flag: PASSWORD_FLAG,
            path: path.to_path_buf(),
        });
    }
    Ok(password.to_string())
}

fn tls_parameters(host: &str, ca_file: Option<&Path>) -> Result<TlsParameters> {
    const FLAG: &str = "--smtp-ca-file";
    let mut builder = TlsParameters::builder(host.to_string());
    if let Some(path) = ca_file {
        let pem = std::fs::read(path).map_err(|source| NotifyError::File {
            flag: FLAG,
            path: path.to_path_buf(),
            source,
        })?;
        // lettre accepts a file without any certificate; an empty trust addition is a
        // mistake the operator should hear about now, not at the first handshake.
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let count = CertificateDer::pem_slice_iter(&pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|source| NotifyError::Pem {
                flag: FLAG,
                path: path.to_path_buf(),
                source,
            })?
            .len();
        if count == 0 {
            return Err(NotifyError::Invalid {
                flag: FLAG,
                message: format!(
                    "{}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
                    path.display()
                ),
            });
        }
        let certificate = Certificate::from_pem(&pem)
            .map_err(|source| NotifyError::SmtpTls { flag: FLAG, source })?;
        builder = builder.add_root_certificate(certificate);
    }
    builder.build().map_err(|source| NotifyError::SmtpTls {
        flag: "--smtp-host",
        source,
    })
}

/// How the SMTP connection is secured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SmtpSecurity {
    /// STARTTLS, required.
    #[default]
    Starttls,
    /// Implicit TLS (SMTPS).
    Tls,
    /// No TLS (refused with a password).
    None,
}

impl EmailNotifier {
    /// The email channel from the flags: `None` without `--smtp-host` (email is off).
    /// Errors name the flag to fix: an unreadable or empty CA file, a From that is not an
    /// address, a user without a readable password file (or the reverse), a password over
    /// an unencrypted connection.
    pub fn from_config(args: &NotifyConfig) -> Result<Option<EmailNotifier>> {
        let Some(host) = args
            .smtp_host
            .as_deref()
            .map(str::trim)
            .filter(|h| !h.is_empty())
        else {
            return Ok(None);
        };
        let from: Mailbox = args.smtp_from.trim().parse().map_err(|e| NotifyError::Invalid {
            flag: "--smtp-from",
            message: format!(
                "{:?}: not an email address ({e}); e.g. \"gpu-reaper <gpu-reaper@example.com>\"",
                args.smtp_from
            ),
        })?;
        let port = match (args.smtp_port, args.smtp_security) {
            (Some(0), _) => {
                return Err(NotifyError::Invalid {
                    flag: "--smtp-port",
                    message: "0: not a port".into(),
                });
            }
            (Some(port), _) => port,
            (None, SmtpSecurity::Starttls) => 587,
            (None, SmtpSecurity::Tls) => 465,
            (None, SmtpSecurity::None) => 25,
        };
        let security = match args.smtp_security {
            SmtpSecurity::Starttls => {
                Security::Starttls(tls_parameters(host, args.smtp_ca_file.as_deref())?)
            }
            SmtpSecurity::Tls => Security::Tls(tls_parameters(host, args.smtp_ca_file.as_deref())?),
            SmtpSecurity::None => {
                if let Some(path) = &args.smtp_ca_file {
                    return Err(NotifyError::Invalid {
                        flag: "--smtp-ca-file",
                        message: format!(
                            "{}: --smtp-security none uses no TLS; use starttls or tls, or drop the CA file",
                            path.display()
                        ),
                    });
                }
                Security::None
            }
        };
        let login = match (&args.smtp_user, &args.smtp_password_file) {
            (None, None) => None,
            (Some(_), None) => {
                return Err(NotifyError::Invalid {
                    flag: "--smtp-user",
                    message: "needs --smtp-password-file (a file holding the password)".into(),
                });
            }
            (None, Some(path)) => {
                return Err(NotifyError::Invalid {
                    flag: PASSWORD_FLAG,
                    message: format!("{}: needs --smtp-user", path.display()),
                });
            }
            (Some(user), Some(path)) => {
                if matches!(security, Security::None) {
                    return Err(NotifyError::Invalid {
                        flag: "--smtp-user",
                        message: format!(
                            "{user}: --smtp-security none would send the password in clear text; use starttls or tls"
                        ),
                    });
                }
                read_password(path)?;
                Some((user.clone(), path.clone()))
            }
        };
        Ok(Some(EmailNotifier {
            host: host.to_string(),
            port,
            security,
            login,
            from,
        }))
    }

    fn server(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The SMTP dialogue up to the server accepting the message (or refusing every
    /// recipient). Returns the open connection so QUIT can be bounded separately.
    async fn deliver(
        &self,
        recipients: &[Address],
        message: &[u8],
        credentials: Option<&Credentials>,
    ) -> std::result::Result<(AsyncSmtpConnection, Delivery), Failure> {
        let server = self.server();
        let hello = ClientId::default();
        let wrapper = match &self.security {
            Security::Tls(tls) => Some(tls.clone()),
            _ => None,
        };
        let mut conn = AsyncSmtpConnection::connect_tokio1(
            (self.host.as_str(), self.port),
            Some(CONNECT_TIMEOUT),
            &hello,
            wrapper,
            None,
        )
        .await
        .map_err(|e| Failure::Retry(format!("SMTP {server}: connecting failed: {e}")))?;
        if let Security::Starttls(tls) = &self.security {
            // Required, never opportunistic: without STARTTLS nothing is sent. A failed
            // handshake leaves lettre's connection without a stream: it is dropped, not
            // QUIT (lettre asserts on any use of it).
            conn.starttls(tls.clone(), &hello)
                .await
                .map_err(|e| Failure::Retry(format!("SMTP {server}: STARTTLS failed: {e}")))?;
        }
        let result = self
            .dialogue(&mut conn, recipients, message, credentials)
            .await;
        match result {
            Ok(delivery) => Ok((conn, delivery)),
            Err(failure) => {
                conn.abort().await;
                Err(failure)
            }
        }
    }

    async fn dialogue(
        &self,
        conn: &mut AsyncSmtpConnection,
        recipients: &[Address],
        message: &[u8],
        credentials: Option<&Credentials>,
    ) -> std::result::Result<Delivery, Failure> {
        let server = self.server();
        let retry = |what: &str, e: lettre::transport::smtp::Error| {
            Failure::Retry(format!("SMTP {server}: {what}: {e}"))
        };
        if let (Some(credentials), Some((user, _))) = (credentials, &self.login) {
            conn.auth(DEFAULT_MECHANISMS, credentials)
                .await
                .map_err(|e| retry(&format!("authentication as {user} failed"), e))?;
        }
        let info = conn.server_info();
        let mut parameters = Vec::new();
        let mut delivery = Delivery::default();
        let mut candidates = Vec::new();
        let utf8 = info.supports_feature(Extension::SmtpUtfEight);
        for address in recipients {
            if !ascii(address) && !utf8 {
                delivery.refused.push((
                    address.to_string(),
                    "a non-ASCII address, and the server does not offer SMTPUTF8".into(),
                ));
            } else {
                candidates.push(address);
            }
        }
        if candidates.iter().any(|a| !ascii(a)) {
            parameters.push(MailParameter::SmtpUtfEight);
        }
        if !message.is_ascii() {
            // lettre encodes bodies and headers to 7-bit; this is a safety net.
            if !info.supports_feature(Extension::EightBitMime) {
                return Err(Failure::Retry(format!(
                    "SMTP {server}: the message is 8-bit and the server does not offer 8BITMIME"
                )));
            }
            parameters.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }
        if candidates.is_empty() {
            return Ok(delivery);
        }
        conn.command(Mail::new(Some(self.from.email.clone()), parameters))
            .await
            .map_err(|e| retry(&format!("MAIL FROM:<{}> refused", self.from.email), e))?;
        for address in candidates {
            match conn.command(Rcpt::new(address.clone(), vec![])).await {
                Ok(_) => delivery.accepted.push(address.to_string()),
                // The server says this mailbox will never take it; the others still can.
                Err(e) if e.is_permanent() => {
                    delivery.refused.push((address.to_string(), e.to_string()))
                }
                // 4xx (greylisting, a full mailbox…) or a broken connection: retry the
                // whole message; nothing was sent to anyone yet.
                Err(e) => return Err(retry(&format!("RCPT TO:<{address}> not accepted"), e)),
            }
        }
        if delivery.accepted.is_empty() {
            return Ok(delivery);
        }
        conn.command(Data)
            .await
            .map_err(|e| retry("DATA refused", e))?;
        conn.message(message)
            .await
            .map_err(|e| retry("the message was not accepted", e))?;
        Ok(delivery)
    }

    async fn send(&self, n: &Notification, p: &Personal) -> std::result::Result<String, Failure> {
        let workload = workload_key(n);
        if p.owner.emails.is_empty() {
            return Err(Failure::Unrouted(format!(
                "no email address for {workload}: owner is {}",
                p.owner.describe()
            )));
        }
        let mut recipients = Vec::new();
        let mut invalid = Vec::new();
        for email in &p.owner.emails {
            match email.trim().parse::<Address>() {
                Ok(address) if !recipients.contains(&address) => recipients.push(address),
                Ok(_) => {}
                Err(e) => invalid.push(format!("{email}: not an address ({e})")),
            }
        }
        if recipients.is_empty() {
            return Err(Failure::Unrouted(format!(
                "no valid email address for {workload}: {}",
                invalid.join("; ")
            )));
        }
        let credentials = match &self.login {
            Some((user, path)) => Some(Credentials::new(
                user.clone(),
                read_password(path).map_err(|e| Failure::Retry(format!("SMTP password {e}")))?,
            )),
            None => None,
        };
        let message = message(&self.from, &recipients, n, p)
            .map_err(|e| Failure::Retry(e.to_string()))?
            .formatted();
        let server = self.server();
        let (mut conn, delivery) = tokio::time::timeout(
            DIALOGUE_TIMEOUT,
            self.deliver(&recipients, &message, credentials.as_ref()),
        )
        .await
        .map_err(|_| {
            Failure::Retry(format!(
                "SMTP {server}: no answer within {} s",
                DIALOGUE_TIMEOUT.as_secs()
            ))
        })??;
        let mut refused: Vec<String> = delivery
            .refused
            .iter()
            .map(|(address, why)| format!("{address}: {why}"))
            .collect();
        refused.extend(invalid);
        if delivery.accepted.is_empty() {
            let _ = tokio::time::timeout(QUIT_TIMEOUT, conn.abort()).await;
            return Err(Failure::Unrouted(format!(
                "every email address of {workload} was refused by {server}: {}",
                refused.join("; ")
            )));
        }
        // The message is accepted: a slow or failed QUIT must not turn it into a retry.
        let _ = tokio::time::timeout(QUIT_TIMEOUT, conn.quit()).await;
        let mut sent = format!("email to {}", delivery.accepted.join(", "));
        if !refused.is_empty() {
            sent.push_str(&format!(" (refused: {})", refused.join("; ")));
        }
        Ok(sent)
    }
}

fn ascii(address: &Address) -> bool {
    AsRef::<str>::as_ref(address).is_ascii()
}

/// What the server did with each recipient.
#[derive(Debug, Default)]
struct Delivery {
    accepted: Vec<String>,
    /// Address and the server's answer (or why it was not tried).
    refused: Vec<(String, String)>,
}

fn workload_key(n: &Notification) -> String {
    let w = &n.workload;
    format!("{}/{}/{}", w.namespace, w.kind, w.name)
}

/// A Message-ID that is the same for the same notice: a retry after an unclear outcome
/// (the connection broke after DATA, or the leader died between sending and recording
/// it) lets mail clients fold the copies into one. A notice is its workload, its reason,
/// the idle span it is about and its deadline — not its text, which a retry renders
/// again with a later "idle for".
fn message_id(n: &Notification, p: &Personal, domain: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let field = |name| p.fields.get(name).map_or("", String::as_str);
    for part in [
        workload_key(n).as_str(),
        n.reason,
        field("idle_since"),
        field("action_at"),
    ] {
        ctx.update(part.as_bytes());
        ctx.update(&[0]);
    }
    let digest = ctx.finish();
    let hex: String = digest.as_ref()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "<gpu-reaper.{}.{hex}@{domain}>",
        n.reason.to_ascii_lowercase()
    )
}

fn message(
    from: &Mailbox,
    recipients: &[Address],
    n: &Notification,
    p: &Personal,
) -> Result<Message> {
    let mut builder = Message::builder()
        .from(from.clone())
        .subject(p.rendered.subject.as_str())
        .message_id(Some(message_id(n, p, from.email.domain())))
        .raw_header(HeaderValue::new(WORKLOAD_HEADER, workload_key(n)))
        .raw_header(HeaderValue::new(AUTO_SUBMITTED, "auto-generated".into()));
    for address in recipients {
        builder = builder.to(Mailbox::new(None, address.clone()));
    }
    builder
        .multipart(MultiPart::alternative_plain_html(
            p.rendered.text.clone(),
            html(p),
        ))
        .map_err(|source| NotifyError::EmailMessage {
            workload: workload_key(n),
            source,
        })
}

impl Notifier for EmailNotifier {
    fn name(&self) -> &'static str {
        "email"
    }

    fn notify<'a>(
        &'a self,
        n: &'a Notification,
    ) -> BoxFuture<'a, std::result::Result<String, Failure>> {
        async move {
            match &n.personal {
                Some(p) => self.send(n, p).await,
                None => Err(Failure::Unrouted(format!(
                    "{} on {} is for the Event only: no message for a person",
                    n.reason,
                    workload_key(n)
                ))),
            }
        }
        .boxed()
    }
}

/// PURE: the HTML part of a notice, from the same fields as the plain text: a heading,
/// the sentence, the evidence as a table, the commands to keep or restore the workload
/// in `<pre>` blocks, and a link when `url` is set. Every value is escaped.
pub fn html(p: &Personal) -> String {
    let field = |name: &str| p.fields.get(name).map_or("", |v| v.trim());
    let esc = |name: &str| html_escape(field(name));
    // Joins the parts whose field is set, so a missing value leaves no dangling words.
    let joined = |parts: &[(&str, &str, &str)]| -> String {
        parts
            .iter()
            .filter(|(_, name, _)| !field(name).is_empty())
            .map(|(before, name, after)| format!("{before}{}{after}", esc(name)))
            .collect::<String>()
            .trim()
            .to_string()
    };

    let heading = match p.kind {
        Kind::Warning => "Idle GPUs",
        Kind::Reclaimed => "Reclaimed idle GPUs",
    };
    let workload = esc("workload");
    let what = joined(&[("", "gpus", " "), ("", "model", "")]);
    let what = if what.is_empty() {
        "GPUs".to_string()
    } else {
        what
    };
    let holder = joined(&[
        ("", "kind", " "),
        ("<b>", "name", "</b>"),
        (" in namespace ", "namespace", ""),
    ]);
    let holder = match (holder.is_empty(), workload.is_empty()) {
        (false, _) => holder,
        (true, false) => workload.clone(),
        (true, true) => "a workload".to_string(),
    };
    let sentence = match p.kind {
        Kind::Warning => {
            let mut s = format!("{what} held by {holder} have been idle");
            if !field("idle_for").is_empty() {
                s.push_str(&format!(" for {}", esc("idle_for")));
            }
            s.push('.');
            if !field("action_verb").is_empty() {
                s.push_str(&format!(" gpu-reaper will {}", esc("action_verb")));
                if !field("action_at").is_empty() {
                    s.push_str(&format!(" at <b>{}</b>", esc("action_at")));
                }
                s.push_str(" unless the GPUs are used again or you keep it.");
            }
            if !field("mode_note").is_empty() {
                s.push_str(&format!(" {}", esc("mode_note")));
            }
            s
        }
        Kind::Reclaimed => {
            let mut s = format!("gpu-reaper reclaimed {what} from {holder}");
            if !field("detail").is_empty() {
                s.push_str(&format!(": {}", esc("detail")));
            }
            s.push('.');
            s
        }
    };

    let mut rows: Vec<(&str, String)> = vec![
        ("GPUs", joined(&[("", "gpus", " × "), ("", "model", "")])),
        (
            "Idle since",
            joined(&[("", "idle_since", " "), ("(", "idle_for", ")")]),
        ),
        ("Shape", esc("shape")),
        (
            "Cost",
            joined(&[
                ("", "wasted_usd", " USD so far"),
                (", ", "hourly_usd", " USD per hour"),
            ])
            .trim_start_matches(", ")
            .to_string(),
        ),
    ];
    match p.kind {
        Kind::Warning => rows.push((
            "Action",
            joined(&[("", "action", " "), ("at ", "action_at", "")]),
        )),
        Kind::Reclaimed => rows.push(("Action", joined(&[("", "action", "")]))),
    }
    rows.push(("Policy", esc("policy")));

    let mut out = String::with_capacity(4096);
    out.push_str("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>");
    out.push_str(&html_escape(&p.rendered.subject));
    out.push_str("</title></head>\n");
    out.push_str("<body style=\"font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;font-size:14px;line-height:1.5;color:#1f2328\">\n");
    out.push_str(&format!(
        "<h2 style=\"margin:0 0 12px\">{heading}: {workload}</h2>\n"
    ));
    out.push_str(&format!("<p>{sentence}</p>\n"));
    out.push_str("<table style=\"border-collapse:collapse;margin:12px 0\">\n");
    for (label, value) in rows.iter().filter(|(_, v)| !v.is_empty()) {
        out.push_str(&format!(
            "<tr><th style=\"text-align:left;padding:4px 16px 4px 0;color:#59636e;font-weight:normal\">{label}</th><td style=\"padding:4px 0\">{value}</td></tr>\n"
        ));
    }
    out.push_str("</table>\n");
    let pre = "<pre style=\"background:#f6f8fa;border:1px solid #d1d9e0;border-radius:6px;padding:8px 12px;white-space:pre-wrap;word-break:break-all\">";
    if p.kind == Kind::Reclaimed && !field("wake_command").is_empty() {
        out.push_str(&format!(
            "<p>To restore it, run:</p>\n{pre}{}</pre>\n",
            esc("wake_command")
        ));
    }
    if !field("snooze_command").is_empty() {
        let intro = match p.kind {
            Kind::Warning => "To keep it for 4 hours, run:",
            Kind::Reclaimed => "To keep it for 4 hours once it runs again:",
        };
        out.push_str(&format!(
            "<p>{intro}</p>\n{pre}{}</pre>\n",
            esc("snooze_command")
        ));
    }
    let url = field("url");
    if url.starts_with("https://") || url.starts_with("http://") {
        out.push_str(&format!(
            "<p><a href=\"{}\">Open {workload}</a></p>\n",
            html_escape(url)
        ));
    } else if !url.is_empty() {
        // Not a web link (a typo in --workload-url?): shown, never made clickable.
        out.push_str(&format!("<p>Dashboard: {}</p>\n", html_escape(url)));
    }
    let footer = joined(&[("Sent to ", "owner", " by gpu-reaper.")]);
    if !footer.is_empty() {
        out.push_str(&format!(
            "<p style=\"color:#59636e;font-size:12px\">{footer}</p>\n"
        ));
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
#[path = "email_tests.rs"]
mod tests;
