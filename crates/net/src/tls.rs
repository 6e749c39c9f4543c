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
    /// When set, servers built from this identity present whatever this
    /// holds at each handshake, so the certificate can be replaced while they
    /// run (see [`SelfSigned::renew_if_due`]).
    pub rotation: Option<Arc<RotatingCert>>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            rotation: self.rotation.clone(),
        }
    }
}

/// The certificate a server presents, replaceable while it runs.
#[derive(Debug)]
pub struct RotatingCert(std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>);

impl RotatingCert {
    fn new(identity: &Identity) -> anyhow::Result<Self> {
        Ok(Self(std::sync::RwLock::new(certified_key(identity)?)))
    }

    /// Presents `identity` from the next handshake on; refuses (and keeps the
    /// current one) when its key does not match its certificate.
    pub fn set(&self, identity: &Identity) -> anyhow::Result<()> {
        let k = certified_key(identity)?;
        k.keys_match().context("certificate and key do not match")?;
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = k;
        Ok(())
    }
}

impl rustls::server::ResolvesServerCert for RotatingCert {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

fn certified_key(identity: &Identity) -> anyhow::Result<Arc<rustls::sign::CertifiedKey>> {
    let key = provider()
        .key_provider
        .load_private_key(identity.key.clone_key())
        .context("unusable private key")?;
    Ok(Arc::new(rustls::sign::CertifiedKey::new(
        identity.chain.clone(),
        key,
    )))
}

/// Builds a server config presenting `identity` (through its rotation, if
/// any), verifying client certificates with `clients` when given.
pub(crate) fn with_identity(
    builder: rustls::ConfigBuilder<rustls::ServerConfig, rustls::WantsVerifier>,
    identity: &Identity,
    clients: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> anyhow::Result<rustls::ServerConfig> {
    let builder = match clients {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    Ok(match &identity.rotation {
        Some(r) => builder.with_cert_resolver(r.clone()),
        None => builder
            .with_single_cert(identity.chain.clone(), identity.key.clone_key())
            .context("certificate and key do not match")?,
    })
}

/// Lifetime of the self-signed certificates quichub makes: under the 14 days
/// WebTransport's `serverCertificateHashes` accepts.
const SELF_SIGNED_DAYS: i64 = 13;

/// A self-signed certificate kept in a directory, so its hash (pinned by
/// browsers and `--fingerprint`) and its PEM file (`mosquitto_pub --cafile`)
/// stay the same across restarts until it is renewed, a few days before it
/// expires.
pub struct SelfSigned {
    /// The identity to serve (with a rotation handle).
    pub identity: Identity,
    /// The PEM certificate in the directory.
    pub cert_path: std::path::PathBuf,
    /// Whether the certificate on disk was reused (false: made now).
    pub reused: bool,
    dir: std::path::PathBuf,
    names: Vec<String>,
    expires: time::OffsetDateTime,
}

impl SelfSigned {
    /// How long before expiry a certificate is replaced.
    pub const RENEW_BEFORE: time::Duration = time::Duration::days(3);

    /// Loads the certificate kept in `dir`, or makes (and keeps) a new one
    /// when there is none, it is unreadable, or it expires within
    /// [`SelfSigned::RENEW_BEFORE`]. Files: `cert.pem`, `key.pem` (0600),
    /// `cert.sha256`, `cert.expires` (Unix seconds).
    pub fn load_or_make(dir: &Path, names: &[&str]) -> anyhow::Result<Self> {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        create_private_dir(dir)?;
        let cert_path = dir.join("cert.pem");
        let now = time::OffsetDateTime::now_utc();
        if let Ok((identity, expires)) = Self::load(dir) {
            if expires - now > Self::RENEW_BEFORE {
                let rotation = Some(Arc::new(RotatingCert::new(&identity)?));
                return Ok(Self {
                    identity: Identity {
                        rotation,
                        ..identity
                    },
                    cert_path,
                    reused: true,
                    dir: dir.to_path_buf(),
                    names,
                    expires,
                });
            }
        }
        let (identity, expires) = Identity::self_signed_until(&names)?;
        Self::store(dir, &identity, expires)?;
        let rotation = Some(Arc::new(RotatingCert::new(&identity)?));
        Ok(Self {
            identity: Identity {
                rotation,
                ..identity
            },
            cert_path,
            reused: false,
            dir: dir.to_path_buf(),
            names,
            expires,
        })
    }

    /// When the certificate expires.
    pub fn expires(&self) -> time::OffsetDateTime {
        self.expires
    }

    /// When renewal is due, makes a new certificate, keeps it in the
    /// directory and presents it from the next handshake on; returns its
    /// SHA-256 (hex) then.
    pub fn renew_if_due(&mut self, now: time::OffsetDateTime) -> anyhow::Result<Option<String>> {
        if self.expires - now > Self::RENEW_BEFORE {
            return Ok(None);
        }
        let (identity, expires) = Identity::self_signed_until(&self.names)?;
        Self::store(&self.dir, &identity, expires)?;
        if let Some(r) = &self.identity.rotation {
            r.set(&identity)?;
        }
        self.identity.chain = identity.chain;
        self.identity.key = identity.key;
        self.expires = expires;
        Ok(Some(self.identity.fingerprint_hex()))
    }

    fn load(dir: &Path) -> anyhow::Result<(Identity, time::OffsetDateTime)> {
        let identity = Identity::from_pem_files(&dir.join("cert.pem"), &dir.join("key.pem"))?;
        // Two relays sharing a data directory may have written at once:
        // never serve a certificate with someone else's key.
        certified_key(&identity)?
            .keys_match()
            .context("cert.pem and key.pem do not match")?;
        let secs: i64 = std::fs::read_to_string(dir.join("cert.expires"))?
            .trim()
            .parse()?;
        Ok((identity, time::OffsetDateTime::from_unix_timestamp(secs)?))
    }

    fn store(dir: &Path, identity: &Identity, expires: time::OffsetDateTime) -> anyhow::Result<()> {
        let pem = |tag: &str, der: &[u8]| pem::encode(&pem::Pem::new(tag, der.to_vec()));
        let chain: String = identity
            .chain
            .iter()
            .map(|c| pem("CERTIFICATE", c))
            .collect();
        // Key first and private: a reader never finds a certificate whose
        // key is not there yet.
        write_private(
            &dir.join("key.pem"),
            pem("PRIVATE KEY", identity.key.secret_der()).as_bytes(),
        )?;
        write_private(&dir.join("cert.pem"), chain.as_bytes())?;
        write_private(
            &dir.join("cert.sha256"),
            format!("{}\n", identity.fingerprint_hex()).as_bytes(),
        )?;
        write_private(
            &dir.join("cert.expires"),
            format!("{}\n", expires.unix_timestamp()).as_bytes(),
        )?;
        Ok(())
    }
}

fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("create {}", dir.display()))
}

/// Writes `data` to `path` atomically (a temporary file renamed), mode 0600
/// whatever the mode of a file it replaces.
fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    // A leftover of a crashed run would keep its own mode if opened as is:
    // the mode below applies only to a file that open creates.
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("write {}", tmp.display()))?;
    let written = f
        .write_all(data)
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("write {}", path.display()))
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
        Ok(Self {
            chain,
            key,
            rotation: None,
        })
    }

    /// Makes a self-signed ECDSA P-256 certificate for `names`, valid from one
    /// hour ago for 13 days (WebTransport's certificate-hash rule caps it at 14).
    pub fn self_signed(names: &[&str]) -> anyhow::Result<Self> {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        Ok(Self::self_signed_until(&names)?.0)
    }

    /// [`Identity::self_signed`], with its expiry.
    fn self_signed_until(names: &[String]) -> anyhow::Result<(Self, time::OffsetDateTime)> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = rcgen::CertificateParams::new(names.to_vec())?;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(SELF_SIGNED_DAYS);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "quichub self-signed");
        let cert = params.self_signed(&key)?;
        Ok((
            Self {
                chain: vec![cert.der().clone()],
                key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
                rotation: None,
            },
            params.not_after,
        ))
    }

    /// Writes the chain and key as PEM files (for peers that load a trust root
    /// from a file, and for `--cert/--key`); the key is 0600, also when it
    /// replaces a file readable by others.
    pub fn write_pem(&self, cert: &Path, key: &Path) -> anyhow::Result<()> {
        let pem = |tag: &str, der: &[u8]| pem::encode(&pem::Pem::new(tag, der.to_vec()));
        let chain: String = self.chain.iter().map(|c| pem("CERTIFICATE", c)).collect();
        std::fs::write(cert, chain).with_context(|| format!("write {}", cert.display()))?;
        write_private(key, pem("PRIVATE KEY", self.key.secret_der()).as_bytes())
    }

    /// This identity with a [`RotatingCert`]: servers built from it present
    /// whatever the rotation holds at each handshake, so a reload (SIGHUP)
    /// can replace the certificate without dropping connections. Keeps an
    /// existing rotation.
    pub fn rotating(self) -> anyhow::Result<Self> {
        if self.rotation.is_some() {
            return Ok(self);
        }
        let rotation = Some(Arc::new(RotatingCert::new(&self)?));
        Ok(Self { rotation, ..self })
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
    tcp_server_config_with_clients(identity, alpn, &ClientCertConfig::default())
}

/// [`tcp_server_config`], asking clients for a certificate as `clients`
/// says: none without a `cafile`; with one, a certificate is verified
/// against it, and a client without one fails the handshake when
/// `require_certificate` is set (as mosquitto's listener does).
pub fn tcp_server_config_with_clients(
    identity: &Identity,
    alpn: &[&[u8]],
    clients: &ClientCertConfig,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let mut tls = with_identity(
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?,
        identity,
        clients.verifier(clients.require_certificate)?,
    )?;
    tls.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(Arc::new(tls))
}

/// mosquitto's client certificate options of a TLS listener (`cafile`,
/// `require_certificate`, `use_identity_as_username`), for MQTT over TLS and
/// MQTT over QUIC. Deserialisable for a config file section.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientCertConfig {
    /// PEM file of the CA certificates that client certificates must chain
    /// to. Without it clients are not asked for a certificate.
    pub cafile: Option<std::path::PathBuf>,
    /// Refuse clients without a valid certificate: at the TLS handshake on
    /// TLS over TCP; on the QUIC endpoint, whose TLS handshake every ALPN
    /// shares, right after it (MoQT, WebTransport, HTTP/3:
    /// [`crate::server::establish_any`]) or at CONNECT (MQTT: Not
    /// authorized).
    pub require_certificate: bool,
    /// The certificate's subject Common Name is the client's MQTT user name;
    /// the CONNECT's user name and password are ignored, and a client
    /// without a certificate (or with one without a CN) is refused (Bad user
    /// name or password).
    pub use_identity_as_username: bool,
}

impl ClientCertConfig {
    /// Whether client certificates are asked for.
    pub fn enabled(&self) -> bool {
        self.cafile.is_some()
    }

    /// Refuses options that need a `cafile` without one.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.cafile.is_some() || !(self.require_certificate || self.use_identity_as_username),
            "require_certificate and use_identity_as_username need a cafile to verify client certificates against"
        );
        Ok(())
    }

    /// A verifier of client certificates against the `cafile` (`None`
    /// without one); `required`: a client without a certificate fails the
    /// handshake, else it may go on without one.
    pub fn verifier(
        &self,
        required: bool,
    ) -> anyhow::Result<Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>> {
        self.validate()?;
        let Some(path) = &self.cafile else {
            return Ok(None);
        };
        let mut roots = rustls::RootCertStore::empty();
        let certs = rustls_pemfile::certs(&mut std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?,
        ))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parse {}", path.display()))?;
        anyhow::ensure!(!certs.is_empty(), "no certificate in {}", path.display());
        for c in certs {
            roots
                .add(c)
                .with_context(|| format!("CA certificate in {}", path.display()))?;
        }
        let builder = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        );
        let builder = if required {
            builder
        } else {
            builder.allow_unauthenticated()
        };
        Ok(Some(
            builder.build().context("client certificate verifier")?,
        ))
    }
}

/// What a verified client certificate says about the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCert {
    /// The subject's Common Name (the first, if several), when it has one
    /// and it is a string.
    pub subject_cn: Option<String>,
}

impl PeerCert {
    /// Reads the leaf (first) of a chain the TLS layer verified; `None` for
    /// an empty chain or a certificate that does not parse.
    pub fn from_chain(chain: &[CertificateDer<'_>]) -> Option<Self> {
        let (_, cert) = x509_parser::parse_x509_certificate(chain.first()?).ok()?;
        let subject_cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        Some(Self { subject_cn })
    }

    /// The verified certificate of a QUIC connection's peer (once its
    /// handshake completed, or from the resumed session).
    pub fn of_quic(conn: &quinn::Connection) -> Option<Self> {
        let any = conn.peer_identity()?;
        let chain = any.downcast_ref::<Vec<CertificateDer<'static>>>()?;
        Self::from_chain(chain)
    }
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
    /// Accept a chain to one of these CAs, for the server's name (WebPKI).
    Roots(Arc<rustls::client::WebPkiServerVerifier>),
    /// Accept anything (testing only).
    #[default]
    Insecure,
}

impl Verify {
    /// Verification against the CA certificates of a PEM file.
    pub fn ca_file(path: &std::path::Path) -> anyhow::Result<Self> {
        use anyhow::Context;
        let pem = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            roots
                .add(cert.with_context(|| format!("{}: a certificate", path.display()))?)
                .with_context(|| format!("{}: a CA certificate", path.display()))?;
        }
        anyhow::ensure!(!roots.is_empty(), "{}: no certificate", path.display());
        let v = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .with_context(|| format!("{}: CA certificates", path.display()))?;
        Ok(Verify::Roots(v))
    }
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
            Verify::Roots(v) => {
                v.verify_server_cert(end_entity, _intermediates, _server_name, _ocsp, _now)
            }
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

    /// The private key is written 0600, also over an existing key file
    /// others may read (whose mode a plain write would keep).
    #[test]
    fn write_pem_keeps_the_key_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let dir = std::env::temp_dir().join(format!("quichub-pem-mode-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
        let id = Identity::self_signed(&["localhost"]).unwrap();
        id.write_pem(&c, &k).unwrap();
        assert_eq!(mode(&k), 0o600);

        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o644)).unwrap();
        let other = Identity::self_signed(&["localhost"]).unwrap();
        other.write_pem(&c, &k).unwrap();
        assert_eq!(mode(&k), 0o600);
        let back = Identity::from_pem_files(&c, &k).unwrap();
        assert_eq!(back.key.secret_der(), other.key.secret_der());
        // No temporary file is left beside them.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[cfg(test)]
mod client_cert_tests {
    use super::*;

    /// A CA, and a client certificate it signed with subject CN `cn`.
    fn ca_and_client(cn: &str) -> (rcgen::Certificate, Identity) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "test CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let client = Identity {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            rotation: None,
        };
        (ca_cert, client)
    }

    /// Runs a TLS handshake in memory; the client certificate chain the
    /// server saw, or the server's error.
    fn handshake(
        server: Arc<rustls::ServerConfig>,
        client_id: Option<&Identity>,
    ) -> Result<Option<Vec<CertificateDer<'static>>>, rustls::Error> {
        let b = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Verifier::new(Verify::Insecure));
        let client = match client_id {
            Some(id) => b
                .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
                .unwrap(),
            None => b.with_no_client_auth(),
        };
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut c = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
        let mut s = rustls::ServerConnection::new(server).unwrap();
        for _ in 0..10 {
            let mut buf = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut buf).unwrap();
            }
            s.read_tls(&mut &buf[..]).unwrap();
            s.process_new_packets()?;
            buf.clear();
            while s.wants_write() {
                s.write_tls(&mut buf).unwrap();
            }
            c.read_tls(&mut &buf[..]).unwrap();
            let _ = c.process_new_packets();
            if !s.is_handshaking() && !c.is_handshaking() {
                return Ok(s.peer_certificates().map(|p| p.to_vec()));
            }
        }
        panic!("handshake did not finish");
    }

    #[test]
    fn client_certificates_verified_against_the_cafile() {
        let dir = std::env::temp_dir().join(format!("quichub-cafile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, client) = ca_and_client("sensor-7");
        let cafile = dir.join("ca.pem");
        std::fs::write(&cafile, ca.pem()).unwrap();
        let (_, stranger) = ca_and_client("stranger");
        let server = Identity::self_signed(&["localhost"]).unwrap();

        // Required: a certificate from the CA passes and names the client;
        // none, or one from another CA, fails the handshake.
        let required = ClientCertConfig {
            cafile: Some(cafile.clone()),
            require_certificate: true,
            use_identity_as_username: true,
        };
        let cfg = tcp_server_config_with_clients(&server, &[b"mqtt"], &required).unwrap();
        let chain = handshake(cfg.clone(), Some(&client)).unwrap().unwrap();
        assert_eq!(
            PeerCert::from_chain(&chain),
            Some(PeerCert {
                subject_cn: Some("sensor-7".into())
            })
        );
        assert!(handshake(cfg.clone(), None).is_err());
        assert!(handshake(cfg, Some(&stranger)).is_err());

        // Optional: no certificate is fine, a bad one still is not.
        let optional = ClientCertConfig {
            require_certificate: false,
            ..required.clone()
        };
        let cfg = tcp_server_config_with_clients(&server, &[], &optional).unwrap();
        assert_eq!(handshake(cfg.clone(), None).unwrap(), None);
        assert!(handshake(cfg.clone(), Some(&client)).unwrap().is_some());
        assert!(handshake(cfg, Some(&stranger)).is_err());

        // No cafile: nothing asked; the options need one.
        let cfg = tcp_server_config(&server, &[]).unwrap();
        assert_eq!(handshake(cfg, Some(&client)).unwrap(), None);
        let e = tcp_server_config_with_clients(
            &server,
            &[],
            &ClientCertConfig {
                cafile: None,
                ..required.clone()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("cafile"), "{e}");
        let missing = ClientCertConfig {
            cafile: Some(dir.join("nope.pem")),
            ..required
        };
        assert!(missing.verifier(true).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn config_section_refuses_unknown_keys() {
        let c: ClientCertConfig =
            serde_json::from_str(r#"{"cafile": "/etc/ca.pem", "require_certificate": true}"#)
                .unwrap();
        assert!(c.enabled() && c.require_certificate && !c.use_identity_as_username);
        assert!(serde_json::from_str::<ClientCertConfig>(r#"{"capath": "/x"}"#).is_err());
    }
}

#[cfg(test)]
mod self_signed_tests {
    use super::*;

    #[test]
    fn kept_across_restarts_and_renewed_before_expiry() {
        let dir = std::env::temp_dir().join(format!("quichub-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = SelfSigned::load_or_make(&dir, &["localhost"]).unwrap();
        assert!(!a.reused);
        let b = SelfSigned::load_or_make(&dir, &["localhost"]).unwrap();
        assert!(b.reused);
        assert_eq!(a.identity.fingerprint(), b.identity.fingerprint());
        assert_eq!(
            std::fs::read_to_string(dir.join("cert.sha256"))
                .unwrap()
                .trim(),
            b.identity.fingerprint_hex()
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.join("key.pem")), 0o600);
        assert_eq!(mode(&dir), 0o700);

        // Not yet due: nothing changes.
        let mut c = b;
        let now = time::OffsetDateTime::now_utc();
        assert!(c.renew_if_due(now).unwrap().is_none());
        // Due: a new certificate, on disk and presented from now on.
        let later = c.expires() - SelfSigned::RENEW_BEFORE + time::Duration::minutes(1);
        let hash = c.renew_if_due(later).unwrap().expect("renewed");
        assert_ne!(hash, a.identity.fingerprint_hex());
        let d = SelfSigned::load_or_make(&dir, &["localhost"]).unwrap();
        assert!(d.reused);
        assert_eq!(d.identity.fingerprint_hex(), hash);
        let presented = c.identity.rotation.as_ref().unwrap();
        let k = presented.0.read().unwrap().clone();
        assert_eq!(hex(&sha256(&k.cert[0])), hash);

        // A key that does not match its certificate is replaced, not served.
        std::fs::copy(dir.join("cert.pem"), dir.join("cert.keep")).unwrap();
        let other = Identity::self_signed(&["localhost"]).unwrap();
        other
            .write_pem(&dir.join("other.pem"), &dir.join("key.pem"))
            .unwrap();
        let e = SelfSigned::load_or_make(&dir, &["localhost"]).unwrap();
        assert!(!e.reused);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
