//! Certificates and TLS configs: a throw-away CA and a serving certificate made at
//! start-up (rcgen), rustls server/client configs on the ring provider, and the
//! kubeconfig that embeds the CA so kubectl and `kube::Client` verify the server.

use std::sync::Arc;

use base64::Engine;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A CA and one certificate it signed for the given names.
pub struct Pki {
    /// PEM of the CA certificate (what goes in a kubeconfig or a caBundle).
    pub ca_pem: String,
    pub cert_der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Pki {
    /// Makes a CA and a serving certificate for `names` (DNS names or IP addresses).
    pub fn generate(names: &[&str]) -> Result<Self, rcgen::Error> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "kube-sim CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let mut leaf =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        leaf.distinguished_name.push(DnType::CommonName, "kube-sim");
        let leaf_key = KeyPair::generate()?;
        let cert = leaf.signed_by(&leaf_key, &issuer)?;
        Ok(Self {
            ca_pem: ca_cert.pem(),
            cert_der: cert.der().clone(),
            key_der: leaf_key.serialize_der(),
        })
    }

    /// The CA as base64 PEM, the form of kubeconfig `certificate-authority-data` and
    /// webhook `caBundle`.
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes())
    }

    /// A rustls server config serving this certificate over HTTP/1.1.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![self.cert_der.clone()], key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A rustls client config trusting only the CAs in `ca_pem` (a webhook's caBundle).
pub fn client_config(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| format!("bad caBundle: {e}"))?;
        roots.add(cert).map_err(|e| format!("bad caBundle: {e}"))?;
    }
    if roots.is_empty() {
        return Err("caBundle holds no certificate".into());
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A kubeconfig for `server` (an `https://` URL) trusting `ca_pem`.
pub fn kubeconfig(server: &str, ca_pem: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kube-sim
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: kube-sim
  user:
    token: kube-sim
contexts:
- name: kube-sim
  context:
    cluster: kube-sim
    user: kube-sim
    namespace: default
current-context: kube-sim
"
    )
}
