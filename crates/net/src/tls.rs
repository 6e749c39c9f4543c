//! Certificates: load PEM files, or make a self-signed ECDSA P-256 certificate
//! valid for less than 14 days so browsers accept it via `serverCertificateHashes`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A certificate chain with its key.
pub struct Identity {
    /// Leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// Private key.
    pub key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl Identity {
    /// Loads a PEM certificate chain and a PEM private key.
    pub fn from_pem_files(cert: &Path, key: &Path) -> anyhow::Result<Self> {
        let chain = rustls_pemfile::certs(&mut std::io::BufReader::new(
            std::fs::File::open(cert).with_context(|| format!("open {}", cert.display()))?,
        ))
        .collect::<Result<Vec<_>, _>>()
        .context("parse certificate PEM")?;
        anyhow::ensure!(!chain.is_empty(), "no certificate in {}", cert.display());
        let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
            std::fs::File::open(key).with_context(|| format!("open {}", key.display()))?,
        ))
        .context("parse key PEM")?
        .with_context(|| format!("no private key in {}", key.display()))?;
        Ok(Self { chain, key })
    }

    /// Makes a self-signed ECDSA P-256 certificate for `names`, valid from one
    /// hour ago for 13 days (WebTransport's certificate-hash rule caps it at 14).
    pub fn self_signed(names: &[&str]) -> anyhow::Result<Self> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(13);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "quichub self-signed");
        let cert = params.self_signed(&key)?;
        Ok(Self {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        })
    }

    /// Writes the chain and key as PEM files (for peers that load a trust root
    /// from a file, and for `--cert/--key`).
    pub fn write_pem(&self, cert: &Path, key: &Path) -> anyhow::Result<()> {
        let pem = |tag: &str, der: &[u8]| pem::encode(&pem::Pem::new(tag, der.to_vec()));
        let chain: String = self.chain.iter().map(|c| pem("CERTIFICATE", c)).collect();
        std::fs::write(cert, chain)?;
        std::fs::write(key, pem("PRIVATE KEY", self.key.secret_der()))?;
        Ok(())
    }

    /// SHA-256 of the leaf certificate.
    pub fn fingerprint(&self) -> [u8; 32] {
        sha256(&self.chain[0])
    }

    /// SHA-256 of the leaf as lowercase hex.
    pub fn fingerprint_hex(&self) -> String {
        hex(&self.fingerprint())
    }
}

/// SHA-256 of a DER certificate.
pub fn sha256(cert: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, cert);
    d.as_ref().try_into().expect("32 bytes")
}

/// Lowercase hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses hex (with optional `:` separators) into bytes.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    let s: String = s.chars().filter(|c| *c != ':').collect();
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// A TLS 1.2/1.3 server configuration for TCP listeners (MQTT over TLS),
/// with `identity` and the given ALPN protocols (empty: no ALPN).
pub fn tcp_server_config(
    identity: &Identity,
    alpn: &[&[u8]],
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())?;
    tls.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(Arc::new(tls))
}

/// The crypto provider every config in quichub uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// How a client checks the server's certificate.
#[derive(Debug, Clone, Default)]
pub enum Verify {
    /// Accept only a leaf whose SHA-256 is one of these.
    Fingerprints(Vec<Vec<u8>>),
    /// Accept anything (testing only).
    #[default]
    Insecure,
}

#[derive(Debug)]
pub(crate) struct Verifier {
    verify: Verify,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl Verifier {
    pub(crate) fn new(verify: Verify) -> Arc<Self> {
        Arc::new(Self {
            verify,
            provider: provider(),
        })
    }
}

impl rustls::client::danger::ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match &self.verify {
            Verify::Insecure => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            Verify::Fingerprints(f) => {
                let h = sha256(end_entity);
                if f.iter().any(|x| x[..] == h[..]) {
                    Ok(rustls::client::danger::ServerCertVerified::assertion())
                } else {
                    Err(rustls::Error::InvalidCertificate(
                        rustls::CertificateError::UnknownIssuer,
                    ))
                }
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_is_p256_and_hashable() {
        let id = Identity::self_signed(&["localhost"]).unwrap();
        assert_eq!(id.fingerprint_hex().len(), 64);
        assert_eq!(unhex(&id.fingerprint_hex()).unwrap(), id.fingerprint());
    }

    #[test]
    fn pem_roundtrip() {
        let id = Identity::self_signed(&["localhost", "127.0.0.1"]).unwrap();
        let dir = std::env::temp_dir().join(format!("quichub-pem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
        id.write_pem(&c, &k).unwrap();
        let back = Identity::from_pem_files(&c, &k).unwrap();
        assert_eq!(back.chain, id.chain);
        assert_eq!(back.key.secret_der(), id.key.secret_der());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
