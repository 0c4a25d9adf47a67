//! Outgoing HTTPS clients (Prometheus): the process' one rustls provider, extra CAs to
//! trust, a client certificate for mutual TLS, and errors that name the flag to fix.
//! (Slack's client is slack-morphism's hyper connector; `notify::slack` builds its rustls
//! config on the same ring provider.)

use std::path::Path;

/// A client builder on the process' rustls provider (ring; installing it twice is a no-op).
pub fn builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

/// Trusts every certificate of the PEM bundle at `ca` as well as the system's roots.
pub fn trust_ca(
    mut builder: reqwest::ClientBuilder,
    ca: &Path,
    flag: &str,
) -> Result<reqwest::ClientBuilder, String> {
    let pem = std::fs::read(ca).map_err(|e| format!("{flag} {}: {e}", ca.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("{flag} {}: not PEM certificates: {e}", ca.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{flag} {}: no CERTIFICATE block found",
            ca.display()
        ));
    }
    for cert in certs {
        builder = builder.add_root_certificate(cert);
    }
    Ok(builder)
}

/// Presents the certificate chain at `cert` with the private key at `key` (both PEM) to
/// servers that ask for one (mutual TLS).
pub fn client_identity(
    builder: reqwest::ClientBuilder,
    (cert, cert_flag): (&Path, &str),
    (key, key_flag): (&Path, &str),
) -> Result<reqwest::ClientBuilder, String> {
    let mut pem =
        std::fs::read(cert).map_err(|e| format!("{cert_flag} {}: {e}", cert.display()))?;
    if !pem.windows(11).any(|w| w == b"CERTIFICATE") {
        return Err(format!(
            "{cert_flag} {}: no CERTIFICATE block found",
            cert.display()
        ));
    }
    let key_pem = std::fs::read(key).map_err(|e| format!("{key_flag} {}: {e}", key.display()))?;
    if !key_pem.windows(11).any(|w| w == b"PRIVATE KEY") {
        return Err(format!(
            "{key_flag} {}: no PRIVATE KEY block found (PEM, PKCS#8, PKCS#1 or SEC1)",
            key.display()
        ));
    }
    pem.push(b'\n');
    pem.extend_from_slice(&key_pem);
    let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
        format!(
            "{cert_flag} {} with {key_flag} {}: not a usable certificate and key: {e}",
            cert.display(),
            key.display()
        )
    })?;
    Ok(builder.identity(identity))
}

/// What to do about a TLS failure, judged from the error text (rustls' own words), or
/// `None` when the failure is not about certificates. `client_flags` names the flags that
/// give a client certificate, and whether one was presented.
pub fn certificate_hint(error: &str, ca_flag: &str, client_flags: (&str, bool)) -> Option<String> {
    let lower = error.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    let (client_flag, presented) = client_flags;
    if has(&["unknownissuer", "unknown issuer"]) {
        Some(format!(
            "the server's certificate is signed by a CA this process does not trust: pass that CA's PEM bundle with {ca_flag}"
        ))
    } else if has(&["notvalidforname", "not valid for name"]) {
        Some("the server's certificate does not name the host in the URL: use the host name the certificate was issued for".into())
    } else if has(&["certificate expired", "expired certificate", "expired("]) {
        Some("the server's certificate has expired: renew it".into())
    } else if has(&[
        "certificaterequired",
        "certificate required",
        "badcertificate",
        "bad certificate",
        "unknownca",
        "unknown ca",
    ]) {
        Some(if presented {
            "the server refused this client's certificate: check that it is signed by the CA the server trusts for clients and has not expired".into()
        } else {
            format!("the server requires a client certificate (mutual TLS): pass {client_flag}")
        })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_failures_say_what_to_do() {
        let flags = ("--cert and --key", false);
        let hint = certificate_hint(
            "error sending request: invalid peer certificate: UnknownIssuer",
            "--prometheus-ca-file",
            flags,
        )
        .unwrap();
        assert!(hint.contains("--prometheus-ca-file"), "{hint}");
        let alert = "received fatal alert: BadCertificate";
        let hint = certificate_hint(alert, "--ca", flags).unwrap();
        assert!(
            hint.contains("requires a client certificate") && hint.contains("--cert and --key"),
            "{hint}"
        );
        let hint = certificate_hint(alert, "--ca", ("--cert", true)).unwrap();
        assert!(hint.contains("refused this client's certificate"), "{hint}");
        assert!(certificate_hint("Connection refused (os error 111)", "--ca", flags).is_none());
    }

    #[test]
    fn bad_files_name_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = trust_ca(builder(), &missing, "--prometheus-ca-file").unwrap_err();
        assert!(e.starts_with("--prometheus-ca-file"), "{e}");
        let text = dir.path().join("text.pem");
        std::fs::write(&text, "hello").unwrap();
        let e = trust_ca(builder(), &text, "--prometheus-ca-file").unwrap_err();
        assert!(e.contains("no CERTIFICATE block"), "{e}");
        let e = client_identity(builder(), (&text, "--cert"), (&text, "--key")).unwrap_err();
        assert!(
            e.starts_with("--cert") && e.contains("no CERTIFICATE block"),
            "{e}"
        );
        let cert = dir.path().join("cert.pem");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = client_identity(builder(), (&cert, "--cert"), (&text, "--key")).unwrap_err();
        assert!(e.starts_with("--key") && e.contains("PRIVATE KEY"), "{e}");
    }
}
