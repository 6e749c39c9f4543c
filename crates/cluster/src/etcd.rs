//! The registry on etcd (v3 API, the `etcd-client` crate).
//!
//! Keys, under a prefix (`/quichub/` by default):
//! - `nodes/<id>`: each live relay ([`Node`] as JSON), on the relay's lease;
//! - `namespaces/<namespace>`: the relay that holds it (its [`Node`]), on
//!   the holder's lease.
//!
//! A relay renews its lease every third of the TTL. When it dies the lease
//! expires and etcd deletes its keys: the other relays see it leave (watch)
//! and its namespaces become free. A claim is one transaction (create the
//! key only if it does not exist), so two relays never both hold a
//! namespace. When etcd is unreachable nothing established stops: members
//! are kept as last seen, renewals and the watch are retried every second,
//! and only new claims fail (the publisher is told to retry). When the lease
//! was lost meanwhile (etcd was gone longer than the TTL and lost it), the
//! relay registers again and claims again what its publishers hold.
//!
//! Whoever may write under the prefix decides where the relays connect and
//! which certificates they pin, so the registry must be trusted and
//! reachable only by the relays: etcd over TLS (`etcds://`, or any of
//! [`EtcdTls`]'s files), its certificate checked against a CA, a client
//! certificate, and/or a user and password ([`EtcdUser`]) with a role that
//! may read and write the prefix only. With a user, a relay whose
//! authentication etcd forgot (a restart, an expired token) authenticates
//! again by itself.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::Context;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use moqt::TrackNamespace;
use tokio::sync::watch;

use crate::{namespace_key, BoxFuture, Claim, Members, Node, Registry};

/// How long a request to etcd may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// The wait before retrying after etcd failed.
const RETRY: Duration = Duration::from_secs(1);

/// Where and how to register in etcd.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Client URLs of the etcd cluster (`http://host:port`, or `https://`
    /// with [`EtcdOptions::tls`]).
    pub endpoints: Vec<String>,
    /// Key prefix shared by the relays of one cluster (ends with `/`).
    pub prefix: String,
    /// Lease TTL: how long after its last renewal a dead relay is dropped.
    pub ttl: Duration,
    /// TLS to etcd; `None`: plain HTTP/2.
    pub tls: Option<EtcdTls>,
    /// The etcd user this relay authenticates as; `None`: none (etcd's
    /// auth off, or a client certificate's CN as the user).
    pub user: Option<EtcdUser>,
}

/// TLS to etcd: how its certificate is checked, and this relay's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM file of the CAs that sign etcd's certificate; `None`: the
    /// system's CAs.
    pub ca: Option<PathBuf>,
    /// PEM files of this relay's client certificate and its key, for an
    /// etcd started with `--client-cert-auth`.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// An etcd user and its password.
#[derive(Clone)]
pub struct EtcdUser {
    /// The user's name.
    pub name: String,
    /// Its password (never shown by `Debug`).
    pub password: String,
}

impl fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl EtcdOptions {
    /// Parses `etcd://host:port[,host:port...][/prefix]` (the prefix
    /// defaults to `/quichub/`); `etcds://` is the same over TLS, its
    /// certificate checked against the system's CAs until
    /// [`EtcdOptions::with_tls`] says otherwise.
    pub fn from_url(url: &str, ttl: Duration) -> anyhow::Result<Self> {
        let (rest, tls) = match (url.strip_prefix("etcd://"), url.strip_prefix("etcds://")) {
            (Some(rest), _) => (rest, None),
            (_, Some(rest)) => (rest, Some(EtcdTls::default())),
            _ => anyhow::bail!("{url:?}: an etcd://host:port[/prefix] or etcds:// URL"),
        };
        let (hosts, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        anyhow::ensure!(
            !hosts.contains('@'),
            "{}: no user in the URL (cluster.etcd_user and etcd_password_file)",
            quichub_relay::origin::redact(url)
        );
        let endpoints: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("http://{h}"))
            .collect();
        anyhow::ensure!(!endpoints.is_empty(), "{url:?}: no etcd host");
        let path = path.trim_matches('/');
        let prefix = if path.is_empty() {
            "/quichub/".to_string()
        } else {
            format!("/{path}/")
        };
        anyhow::ensure!(
            ttl >= Duration::from_secs(2),
            "cluster lease TTL of {ttl:?}: at least 2 s"
        );
        let options = Self {
            endpoints,
            prefix,
            ttl,
            tls: None,
            user: None,
        };
        Ok(match tls {
            Some(tls) => options.with_tls(tls),
            None => options,
        })
    }

    /// Over TLS (`https://` endpoints).
    pub fn with_tls(mut self, tls: EtcdTls) -> Self {
        for e in &mut self.endpoints {
            if let Some(hostport) = e.strip_prefix("http://") {
                *e = format!("https://{hostport}");
            }
        }
        self.tls = Some(tls);
        self
    }

    /// Authenticating as `user`.
    pub fn with_user(mut self, user: EtcdUser) -> Self {
        self.user = Some(user);
        self
    }

    /// The `etcd-client` options: timeouts, TLS (its files read and
    /// checked here, so a wrong path fails at startup), user.
    fn connect_options(&self) -> anyhow::Result<ConnectOptions> {
        let mut o = ConnectOptions::new()
            .with_connect_timeout(REQUEST_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(Duration::from_secs(5), REQUEST_TIMEOUT);
        if let Some(tls) = &self.tls {
            let mut t = TlsOptions::new();
            match &tls.ca {
                Some(ca) => t = t.ca_certificate(Certificate::from_pem(read_pem(ca, Pem::Certs)?)),
                None => t = t.with_native_roots(),
            }
            if let Some((cert, key)) = &tls.identity {
                t = t.identity(Identity::from_pem(
                    read_pem(cert, Pem::Certs)?,
                    read_pem(key, Pem::Key)?,
                ));
            }
            o = o.with_tls(t);
        }
        if let Some(u) = &self.user {
            o = o.with_user(u.name.clone(), u.password.clone());
        }
        Ok(o)
    }
}

/// What a PEM file must hold.
enum Pem {
    Certs,
    Key,
}

/// The PEM file at `path`, once it holds what `want` says.
fn read_pem(path: &std::path::Path, want: Pem) -> anyhow::Result<Vec<u8>> {
    let pem = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let ok = match want {
        Pem::Certs => rustls_pemfile::certs(&mut &pem[..]).any(|c| c.is_ok()),
        Pem::Key => matches!(rustls_pemfile::private_key(&mut &pem[..]), Ok(Some(_))),
    };
    let what = match want {
        Pem::Certs => "certificate",
        Pem::Key => "private key",
    };
    anyhow::ensure!(ok, "{}: no PEM {what} in it", path.display());
    Ok(pem)
}

/// An error of the etcd client, told with its causes and what to check
/// (`etcd_client`'s own message hides the causes: a certificate refused
/// reads "transport error").
#[derive(Debug)]
pub struct EtcdError {
    what: &'static str,
    error: etcd_client::Error,
}

/// What an [`EtcdError`] says about the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdFailure {
    /// etcd refused the user or password, or needs one.
    Credentials,
    /// The user may not do this under the prefix.
    Permission,
    /// The TLS handshake failed (a certificate refused, either way, or
    /// TLS against plain HTTP).
    Tls,
    /// Anything else: etcd unreachable, no leader, a timeout.
    Other,
}

impl EtcdError {
    fn status(&self) -> Option<&tonic::Status> {
        match &self.error {
            etcd_client::Error::GRpcStatus(s) => Some(s),
            _ => None,
        }
    }

    /// Which of the configuration's parts failed, if any.
    pub fn failure(&self) -> EtcdFailure {
        use tonic::Code;
        if let Some(s) = self.status() {
            let m = s.message();
            match s.code() {
                Code::PermissionDenied => return EtcdFailure::Permission,
                // A token etcd no longer knows: not the configuration's fault.
                Code::Unauthenticated if m.contains("invalid auth token") => {}
                Code::Unauthenticated => return EtcdFailure::Credentials,
                Code::InvalidArgument | Code::FailedPrecondition
                    if m.contains("authentication") || m.contains("user name") =>
                {
                    return EtcdFailure::Credentials
                }
                _ => {}
            }
        }
        if self.causes().iter().any(|c| c.is_tls) {
            return EtcdFailure::Tls;
        }
        EtcdFailure::Other
    }

    /// No connection was made at all (nothing listens, no route, no
    /// answer in time), as opposed to one made and then refused.
    pub fn unreachable(&self) -> bool {
        self.causes().iter().any(|c| c.down)
    }

    /// etcd itself answered (an error of its own, such as no leader), so
    /// the connection worked.
    pub fn answered(&self) -> bool {
        self.status()
            .is_some_and(|s| s.message().starts_with("etcdserver:"))
    }

    /// etcd no longer accepts this client's authentication (its token
    /// expired, etcd restarted, or its users changed): a new client
    /// authenticates again.
    fn needs_authentication(&self) -> bool {
        self.status().is_some_and(|s| {
            s.code() == tonic::Code::Unauthenticated
                || (s.code() == tonic::Code::InvalidArgument && s.message().contains("auth"))
        })
    }

    /// The chain of causes under the client's error, each flagged if it is
    /// a TLS failure (rustls's errors hide inside `io::Error`s, whose
    /// `source` skips them).
    fn causes(&self) -> Vec<Cause> {
        let mut out = Vec::new();
        let mut next: Option<&(dyn std::error::Error + 'static)> = match &self.error {
            etcd_client::Error::TransportError(e) => Some(e),
            etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
            etcd_client::Error::IoError(e) => Some(e),
            _ => None,
        };
        while let Some(e) = next {
            let io_inner = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .map(|inner| inner as &(dyn std::error::Error + 'static));
            let text = e.to_string();
            // h2 hides the `io::Error` around rustls's error (its `source`
            // skips it), so rustls's messages are recognised too.
            let is_tls = e.downcast_ref::<rustls::Error>().is_some()
                || io_inner.is_some_and(|i| i.downcast_ref::<rustls::Error>().is_some())
                || RUSTLS_MESSAGES.iter().any(|m| text.contains(m));
            let io_kind = e.downcast_ref::<std::io::Error>().map(|io| io.kind());
            let down = matches!(
                io_kind,
                Some(
                    std::io::ErrorKind::ConnectionRefused
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::HostUnreachable
                        | std::io::ErrorKind::NetworkUnreachable
                        | std::io::ErrorKind::AddrNotAvailable
                )
            ) || DOWN_MESSAGES.iter().any(|m| text.contains(m));
            out.push(Cause { text, is_tls, down });
            next = e.source().or_else(|| io_inner.and_then(|i| i.source()));
        }
        out
    }
}

/// How rustls's errors (and tonic's own TLS one) begin, as displayed.
const RUSTLS_MESSAGES: &[&str] = &[
    "received fatal alert",
    "invalid peer certificate",
    "peer sent no certificates",
    "peer is incompatible",
    "peer misbehaved",
    "received corrupt message",
    "received unexpected message",
    "cannot decrypt peer's message",
    "HTTP/2 was not negotiated",
];

/// How the causes of an etcd that is not up (yet) read: no connection,
/// no name, no answer in time.
const DOWN_MESSAGES: &[&str] = &[
    "tcp connect error",
    "dns error",
    "failed to lookup address",
    "timeout expired",
    "timed out",
    "Connection refused",
];

struct Cause {
    text: String,
    /// No connection at all: etcd is down or unreachable, not refusing.
    down: bool,
    is_tls: bool,
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hint = match self.failure() {
            EtcdFailure::Credentials => {
                "etcd refused this relay's user or password (cluster.etcd_user, \
                 cluster.etcd_password_file): "
            }
            EtcdFailure::Permission => {
                "the etcd user may not use the cluster's key prefix (give its role \
                 readwrite on the prefix): "
            }
            EtcdFailure::Tls => {
                "TLS with etcd failed (cluster.etcd_ca checks etcd's certificate; \
                 etcd_cert and etcd_key are this relay's; etcds:// needs etcd to serve TLS): "
            }
            EtcdFailure::Other => "",
        };
        write!(f, "etcd {}: {hint}", self.what)?;
        let head = match &self.error {
            etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
            e => e.to_string(),
        };
        f.write_str(&head)?;
        // Each cause once: their messages often repeat the ones above.
        let mut written = head;
        for c in self.causes() {
            if !written.contains(&c.text) {
                write!(f, ": {}", c.text)?;
                written.push_str(&c.text);
            }
        }
        Ok(())
    }
}

impl std::error::Error for EtcdError {}

/// `?` for the client's results: an [`EtcdError`] saying what was asked.
trait EtcdResult<T> {
    fn etcd(self, what: &'static str) -> anyhow::Result<T>;
}

impl<T> EtcdResult<T> for Result<T, etcd_client::Error> {
    fn etcd(self, what: &'static str) -> anyhow::Result<T> {
        self.map_err(|error| EtcdError { what, error }.into())
    }
}

/// The [`EtcdError`] in `e`'s chain, if any.
pub fn etcd_error(e: &anyhow::Error) -> Option<&EtcdError> {
    e.chain().find_map(|c| c.downcast_ref::<EtcdError>())
}

/// The connection to etcd: a client made on first use, and again once
/// etcd no longer accepts its authentication. With a user, making one
/// authenticates (a request to etcd); without, it only prepares.
#[derive(Clone)]
struct Conn(Arc<ConnState>);

struct ConnState {
    endpoints: Vec<String>,
    options: ConnectOptions,
    authenticates: bool,
    client: tokio::sync::Mutex<Option<Client>>,
}

impl Conn {
    fn new(options: &EtcdOptions) -> anyhow::Result<Self> {
        Ok(Self(Arc::new(ConnState {
            endpoints: options.endpoints.clone(),
            options: options.connect_options()?,
            authenticates: options.user.is_some(),
            client: tokio::sync::Mutex::new(None),
        })))
    }

    async fn client(&self) -> anyhow::Result<Client> {
        let mut c = self.0.client.lock().await;
        if let Some(c) = c.as_ref() {
            return Ok(c.clone());
        }
        let new = Client::connect(&self.0.endpoints, Some(self.0.options.clone()))
            .await
            .etcd("connect")?;
        *c = Some(new.clone());
        Ok(new)
    }

    /// After a request failed with `e`: drops the client if etcd no
    /// longer accepts its authentication, so the next one authenticates.
    /// Returns whether it did.
    async fn failed(&self, e: &anyhow::Error) -> bool {
        let again =
            self.0.authenticates && etcd_error(e).is_some_and(EtcdError::needs_authentication);
        if again {
            *self.0.client.lock().await = None;
        }
        again
    }

    /// One request that needs the user's read permission on `prefix`: at
    /// startup, so wrong credentials or certificates stop the relay with a
    /// clear error instead of a warning repeated every second.
    async fn check(&self, prefix: &str) -> anyhow::Result<()> {
        let mut c = self.client().await?;
        c.get(
            prefix,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_limit(1),
            ),
        )
        .await
        .etcd("read")?;
        Ok(())
    }
}

/// A [`Registry`] on etcd.
pub struct EtcdRegistry {
    /// This relay as registered (its fingerprint changes with its
    /// certificate).
    me: Arc<RwLock<Node>>,
    /// A claim's value: this relay without its fingerprint, so claims stay
    /// the same across certificate changes (compared on release).
    me_json: String,
    options: EtcdOptions,
    conn: Conn,
    /// The lease this relay's keys hang on (0: none yet).
    lease: Arc<AtomicI64>,
    /// Namespace keys this relay holds, with the revision of its last
    /// write of each (claimed again on a new lease; released only if
    /// unchanged since, so a release never deletes a newer claim).
    claimed: Arc<Mutex<BTreeMap<String, i64>>>,
    members: watch::Sender<Members>,
    stop: watch::Sender<bool>,
}

impl EtcdRegistry {
    /// A registry for `me` on the etcd cluster of `options`. Without a
    /// user or TLS, connections are made lazily: etcd need not be up yet.
    /// With either, one request is made now: refused credentials or
    /// certificates fail here; an etcd that is not up yet is waited for in
    /// the background, as without.
    pub async fn new(me: Node, options: EtcdOptions) -> anyhow::Result<Self> {
        let endpoints = options.endpoints.join(",");
        let conn = Conn::new(&options).with_context(|| format!("etcd at {endpoints}"))?;
        if options.user.is_some() || options.tls.is_some() {
            let checked =
                tokio::time::timeout(REQUEST_TIMEOUT * 2, conn.check(&options.prefix)).await;
            match checked {
                Ok(Ok(())) => {}
                Ok(Err(e)) if etcd_error(&e).is_some_and(|e| e.failure() != EtcdFailure::Other) => {
                    return Err(e.context(format!("etcd at {endpoints}")));
                }
                // A TLS 1.3 server that refuses the client's certificate
                // may just close the connection after the handshake, with
                // or without an alert that reaches us.
                Ok(Err(e))
                    if options.tls.is_some()
                        && etcd_error(&e).is_some_and(|e| !e.unreachable() && !e.answered()) =>
                {
                    return Err(e.context(format!(
                        "etcd at {endpoints}: TLS with etcd failed? It ended the connection: \
                         does it accept this relay's certificate (cluster.etcd_cert, \
                         etcd_key), and serve TLS at all?"
                    )));
                }
                Ok(Err(e)) => {
                    tracing::warn!("etcd at {endpoints}: {e:#} (registering once it answers)")
                }
                Err(_) => tracing::warn!(
                    "etcd at {endpoints}: no answer in {:?} (registering once it answers)",
                    REQUEST_TIMEOUT * 2
                ),
            }
        } else {
            conn.client()
                .await
                .with_context(|| format!("etcd at {endpoints}"))?;
        }
        if options.user.is_some() && options.tls.is_none() {
            let local = options.endpoints.iter().all(|e| {
                let host = e.trim_start_matches("http://");
                host.starts_with("127.")
                    || host.starts_with("localhost:")
                    || host.starts_with("[::1]")
            });
            if !local {
                tracing::warn!(
                    "etcd at {endpoints}: a password over plain HTTP (etcds:// or cluster.etcd_ca for TLS)"
                );
            }
        }
        Ok(Self {
            me_json: serde_json::to_string(&Node {
                fingerprint: None,
                ..me.clone()
            })?,
            me: Arc::new(RwLock::new(me)),
            options,
            conn,
            lease: Arc::default(),
            claimed: Arc::default(),
            members: watch::channel(Members::new()).0,
            stop: watch::channel(false).0,
        })
    }

    fn node_key(&self, id: &str) -> String {
        node_key(&self.options.prefix, id)
    }

    fn namespace_key(&self, ns: &TrackNamespace) -> String {
        format!("{}namespaces/{}", self.options.prefix, namespace_key(ns))
    }

    /// Claims `key` on `lease`: created if absent, renewed if ours.
    async fn claim_key(
        client: &mut Client,
        key: &str,
        me: &Node,
        me_json: &str,
        lease: i64,
    ) -> anyhow::Result<(Claim, i64)> {
        let put = || TxnOp::put(key, me_json, Some(PutOptions::new().with_lease(lease)));
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then(vec![put()])
            .or_else(vec![TxnOp::get(key, None)]);
        let r = client.txn(txn).await.etcd("claim")?;
        let revision = |r: &etcd_client::TxnResponse| r.header().map_or(0, |h| h.revision());
        if r.succeeded() {
            return Ok((Claim::Ours, revision(&r)));
        }
        let holder = r.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        });
        let Some(holder) = holder else {
            // Deleted between the compare and the get: try once more later.
            anyhow::bail!("claim raced with its release");
        };
        let node: Node = serde_json::from_slice(&holder).context("a claim's holder in etcd")?;
        if node.id != me.id {
            return Ok((Claim::HeldBy(node), 0));
        }
        // Ours from an earlier lease: moved onto the current one, unless
        // it changed hands meanwhile.
        let txn = Txn::new()
            .when(vec![Compare::value(key, CompareOp::Equal, holder)])
            .and_then(vec![put()]);
        let r = client.txn(txn).await.etcd("claim")?;
        anyhow::ensure!(r.succeeded(), "claim changed hands");
        Ok((Claim::Ours, revision(&r)))
    }
}

fn node_key(prefix: &str, id: &str) -> String {
    format!(
        "{prefix}nodes/{}",
        percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC)
    )
}

impl Registry for EtcdRegistry {
    fn me(&self) -> Node {
        self.me.read().expect("me").clone()
    }

    fn update_fingerprint(&self, fingerprint: String) {
        let me = {
            let mut me = self.me.write().expect("me");
            if me.fingerprint.as_ref() == Some(&fingerprint) {
                return;
            }
            me.fingerprint = Some(fingerprint);
            me.clone()
        };
        let lease = self.lease.load(Relaxed);
        if lease == 0 {
            // Not registered now: the next registration carries it.
            return;
        }
        let (conn, key) = (self.conn.clone(), self.node_key(&me.id));
        tokio::spawn(async move {
            let Ok(json) = serde_json::to_string(&me) else {
                return;
            };
            let put = async {
                conn.client()
                    .await?
                    .put(key, json, Some(PutOptions::new().with_lease(lease)))
                    .await
                    .etcd("registration")
            }
            .await;
            match put {
                Ok(_) => tracing::info!("etcd: new certificate fingerprint registered"),
                Err(e) => {
                    tracing::warn!("etcd: registering the new certificate fingerprint: {e:#} (done at the next registration)");
                    conn.failed(&e).await;
                }
            }
        });
    }

    fn start(&self) {
        let id = self.me().id;
        tokio::spawn(keep_registered(
            self.conn.clone(),
            self.node_key(&id),
            self.me.clone(),
            self.me_json.clone(),
            self.options.ttl,
            self.lease.clone(),
            self.claimed.clone(),
            self.stop.subscribe(),
        ));
        tokio::spawn(watch_members(
            self.conn.clone(),
            format!("{}nodes/", self.options.prefix),
            self.members.clone(),
            self.stop.subscribe(),
        ));
    }

    fn members(&self) -> watch::Receiver<Members> {
        self.members.subscribe()
    }

    fn claim<'a>(&'a self, ns: &'a TrackNamespace) -> BoxFuture<'a, anyhow::Result<Claim>> {
        Box::pin(async move {
            // Just started, or registering again: wait for it a little
            // rather than refuse the publisher at once.
            let since = tokio::time::Instant::now();
            let lease = loop {
                let lease = self.lease.load(Relaxed);
                if lease != 0 {
                    break lease;
                }
                anyhow::ensure!(
                    since.elapsed() < REQUEST_TIMEOUT,
                    "not registered in etcd (unreachable?)"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let key = self.namespace_key(ns);
            let me = self.me();
            // A second try only after etcd forgot this relay's
            // authentication (a restart): the publisher need not wait for
            // a retry interval because of it.
            let mut tries = 0;
            let (claim, rev) = loop {
                tries += 1;
                let claimed = async {
                    let mut client = self.conn.client().await?;
                    Self::claim_key(&mut client, &key, &me, &self.me_json, lease).await
                }
                .await;
                match claimed {
                    Ok(c) => break c,
                    Err(e) => {
                        if !self.conn.failed(&e).await || tries > 1 {
                            return Err(e);
                        }
                    }
                }
            };
            if claim == Claim::Ours {
                self.claimed.lock().expect("claimed").insert(key, rev);
            }
            Ok(claim)
        })
    }

    fn release(&self, ns: &TrackNamespace) {
        let key = self.namespace_key(ns);
        let Some(rev) = self.claimed.lock().expect("claimed").remove(&key) else {
            return;
        };
        let conn = self.conn.clone();
        tokio::spawn(async move {
            // Only if unchanged since our write: it may have expired and
            // been claimed by another relay, or claimed again here.
            let txn = Txn::new()
                .when(vec![Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    rev,
                )])
                .and_then(vec![TxnOp::delete(key.as_str(), None)]);
            let released = async { conn.client().await?.txn(txn).await.etcd("release") }.await;
            if let Err(e) = released {
                tracing::warn!(%key, "etcd: releasing a namespace: {e:#} (it expires with the lease)");
                conn.failed(&e).await;
            }
        });
    }

    fn leave(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.stop.send_replace(true);
            let lease = self.lease.swap(0, Relaxed);
            if lease != 0 {
                // Revoking deletes every key on the lease: the node and its claims.
                let revoked = async {
                    self.conn
                        .client()
                        .await?
                        .lease_revoke(lease)
                        .await
                        .etcd("revoke")
                }
                .await;
                if let Err(e) = revoked {
                    tracing::warn!("etcd: leaving the cluster: {e:#} (the lease expires instead)");
                }
            }
        })
    }
}

/// Registers the relay on a lease and renews it; after a lost lease,
/// registers again and claims again what it held.
#[allow(clippy::too_many_arguments)]
async fn keep_registered(
    conn: Conn,
    key: String,
    me: Arc<RwLock<Node>>,
    me_json: String,
    ttl: Duration,
    lease: Arc<AtomicI64>,
    claimed: Arc<Mutex<BTreeMap<String, i64>>>,
    mut stop: watch::Receiver<bool>,
) {
    let renew = ttl / 3;
    let mut was_down = false;
    while !*stop.borrow() {
        let node = me.read().expect("me").clone();
        let registered = async {
            let record = serde_json::to_string(&node)?;
            let mut client = conn.client().await?;
            let id = client
                .lease_grant(ttl.as_secs() as i64, None)
                .await
                .etcd("lease")?
                .id();
            client
                .put(key.as_str(), record, Some(PutOptions::new().with_lease(id)))
                .await
                .etcd("registration")?;
            anyhow::Ok((client, id))
        }
        .await;
        let (mut client, id) = match registered {
            Ok(r) => r,
            Err(e) => {
                conn.failed(&e).await;
                if !was_down {
                    tracing::warn!("etcd: cannot register: {e:#} (retrying every second)");
                    was_down = true;
                }
                tokio::select! {
                    _ = tokio::time::sleep(RETRY) => continue,
                    _ = stop.changed() => return,
                }
            }
        };
        tracing::info!(node = %node.id, lease = id, "etcd: registered");
        was_down = false;
        lease.store(id, Relaxed);
        // Claims made on an earlier lease move to this one.
        let keys: Vec<String> = claimed.lock().expect("claimed").keys().cloned().collect();
        for k in keys {
            match EtcdRegistry::claim_key(&mut client, &k, &node, &me_json, id).await {
                Ok((Claim::Ours, rev)) => {
                    if let Some(r) = claimed.lock().expect("claimed").get_mut(&k) {
                        *r = rev;
                    }
                }
                Ok((Claim::HeldBy(n), _)) => {
                    tracing::warn!(key = %k, holder = %n.id, "etcd: a namespace published here was claimed by another relay while this one was away");
                    claimed.lock().expect("claimed").remove(&k);
                }
                Err(e) => tracing::warn!(key = %k, "etcd: claiming again: {e:#}"),
            }
        }
        // Renewals until the lease is gone.
        let mut keeper = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(renew) => {}
                _ = stop.changed() => return,
            }
            if keeper.is_none() {
                if let Ok(c) = conn.client().await {
                    client = c;
                }
                keeper = match client.lease_keep_alive(id).await.etcd("lease renewal") {
                    Ok(k) => Some(k),
                    Err(e) => {
                        conn.failed(&e).await;
                        None
                    }
                };
            }
            let Some((k, s)) = keeper.as_mut() else {
                if !was_down {
                    tracing::warn!(
                        "etcd: unreachable; established flows go on (renewing every {renew:?})"
                    );
                    was_down = true;
                }
                continue;
            };
            let ttl_left = tokio::time::timeout(REQUEST_TIMEOUT, async {
                k.keep_alive().await?;
                s.message().await.map(|m| m.map(|m| m.ttl()))
            })
            .await;
            let ttl_left = ttl_left.unwrap_or(Ok(None)).etcd("lease renewal");
            if let Err(e) = &ttl_left {
                conn.failed(e).await;
            }
            match ttl_left {
                Ok(Some(t)) if t > 0 => {
                    if was_down {
                        tracing::info!("etcd: reachable again, lease renewed");
                        was_down = false;
                    }
                }
                Ok(Some(_)) => {
                    tracing::warn!(lease = id, "etcd: the lease expired; registering again");
                    break;
                }
                Ok(None) | Err(_) => {
                    keeper = None;
                    if !was_down {
                        tracing::warn!(
                            "etcd: unreachable; established flows go on (renewing every {renew:?})"
                        );
                        was_down = true;
                    }
                }
            }
        }
        lease.store(0, Relaxed);
    }
}

/// Lists the members, then follows their changes; lists again after any
/// failure. Members are kept as last seen while etcd is unreachable.
async fn watch_members(
    conn: Conn,
    prefix: String,
    members: watch::Sender<Members>,
    mut stop: watch::Receiver<bool>,
) {
    // Told once per streak of refusals; reset by a watch established.
    let was_refused = std::sync::atomic::AtomicBool::new(false);
    while !*stop.borrow() {
        let r = async {
            let mut client = conn.client().await?;
            let list = client
                .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
                .await
                .etcd("member list")?;
            let rev = list.header().map_or(0, |h| h.revision());
            let mut now = Members::new();
            for kv in list.kvs() {
                if let Ok(n) = serde_json::from_slice::<Node>(kv.value()) {
                    now.insert(n.id.clone(), n);
                }
            }
            members.send_if_modified(|m| {
                let changed = *m != now;
                *m = now;
                changed
            });
            let opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(rev + 1);
            let (_watcher, mut stream) = client
                .watch(prefix.as_str(), Some(opts))
                .await
                .etcd("member watch")?;
            was_refused.store(false, Relaxed);
            while let Some(resp) = stream.message().await.etcd("member watch")? {
                if resp.canceled() {
                    break;
                }
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    match ev.event_type() {
                        EventType::Put => {
                            if let Ok(n) = serde_json::from_slice::<Node>(kv.value()) {
                                members.send_modify(|m| {
                                    m.insert(n.id.clone(), n);
                                });
                            }
                        }
                        EventType::Delete => {
                            let id = kv
                                .key_str()
                                .ok()
                                .and_then(|k| k.strip_prefix(prefix.as_str()))
                                .and_then(|k| {
                                    percent_encoding::percent_decode_str(k).decode_utf8().ok()
                                })
                                .map(|k| k.into_owned());
                            if let Some(id) = id {
                                members.send_if_modified(|m| m.remove(&id).is_some());
                            }
                        }
                    }
                }
            }
            anyhow::Ok(())
        };
        tokio::select! {
            r = r => {
                if let Err(e) = r {
                    // Unreachable is keep_registered's to tell; refused
                    // credentials or permissions are told here too, as
                    // the members then stay as last seen.
                    let refused = etcd_error(&e).is_some_and(|e| e.failure() != EtcdFailure::Other);
                    if refused && !was_refused.swap(true, Relaxed) {
                        tracing::warn!("etcd: {e:#} (retrying every second)");
                    } else {
                        tracing::debug!("etcd: member watch: {e:#}");
                    }
                    conn.failed(&e).await;
                }
            }
            _ = stop.changed() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_urls() {
        let ttl = Duration::from_secs(10);
        let o = EtcdOptions::from_url("etcd://127.0.0.1:2379", ttl).unwrap();
        assert_eq!(o.endpoints, ["http://127.0.0.1:2379"]);
        assert_eq!(o.prefix, "/quichub/");
        let o = EtcdOptions::from_url("etcd://a:1,b:2/prod/eu/", ttl).unwrap();
        assert_eq!(o.endpoints, ["http://a:1", "http://b:2"]);
        assert_eq!(o.prefix, "/prod/eu/");
        assert!(EtcdOptions::from_url("http://a:1", ttl).is_err());
        assert!(EtcdOptions::from_url("etcd:///x", ttl).is_err());
        assert!(EtcdOptions::from_url("etcd://a:1", Duration::from_secs(1)).is_err());
        let o = EtcdOptions::from_url("etcds://a:1,b:2/p", ttl).unwrap();
        assert_eq!(o.endpoints, ["https://a:1", "https://b:2"]);
        assert_eq!(o.tls, Some(EtcdTls::default()));
        let e = EtcdOptions::from_url("etcd://root:hunter2@a:1", ttl).unwrap_err();
        assert!(!format!("{e:#}").contains("hunter2"), "{e:#}");
    }

    #[test]
    fn tls_and_a_user_are_options_the_password_never_shown() {
        let ttl = Duration::from_secs(10);
        let ca = EtcdTls {
            ca: Some("/etc/etcd/ca.pem".into()),
            identity: None,
        };
        let o = EtcdOptions::from_url("etcd://a:1", ttl)
            .unwrap()
            .with_tls(ca.clone())
            .with_user(EtcdUser {
                name: "relay".into(),
                password: "hunter2".into(),
            });
        assert_eq!(o.endpoints, ["https://a:1"]);
        assert_eq!(o.tls, Some(ca));
        let shown = format!("{o:?}");
        assert!(
            shown.contains("relay") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn pem_files_are_checked_before_use() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let ttl = Duration::from_secs(10);
        let with = |tls: EtcdTls| {
            EtcdOptions::from_url("etcd://a:1", ttl)
                .unwrap()
                .with_tls(tls)
                .connect_options()
                .map(|_| ())
        };
        let e = with(EtcdTls {
            ca: Some(junk.clone()),
            identity: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let e = with(EtcdTls {
            ca: Some(dir.path().join("missing.pem")),
            identity: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("missing.pem"), "{e}");
    }

    #[test]
    fn refusals_are_told_apart() {
        let status = |code, msg: &str| EtcdError {
            what: "read",
            error: etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg)),
        };
        use tonic::Code;
        let wrong = status(
            Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password",
        );
        assert_eq!(wrong.failure(), EtcdFailure::Credentials);
        assert!(
            wrong.to_string().contains("cluster.etcd_password_file"),
            "{wrong}"
        );
        let none = status(Code::InvalidArgument, "etcdserver: user name is empty");
        assert_eq!(none.failure(), EtcdFailure::Credentials);
        let denied = status(Code::PermissionDenied, "etcdserver: permission denied");
        assert_eq!(denied.failure(), EtcdFailure::Permission);
        assert!(!denied.needs_authentication());
        let stale = status(Code::Unauthenticated, "etcdserver: invalid auth token");
        assert_eq!(stale.failure(), EtcdFailure::Other);
        assert!(stale.needs_authentication());
        let old = status(
            Code::InvalidArgument,
            "etcdserver: revision of auth store is old",
        );
        assert!(old.needs_authentication());
        let down = status(Code::Unavailable, "etcdserver: no leader");
        assert_eq!(down.failure(), EtcdFailure::Other);
        assert!(!down.needs_authentication());
        assert!(down.answered() && !down.unreachable());
        let closed = status(Code::Unknown, "transport error");
        assert!(!closed.answered() && !closed.unreachable());
    }

    #[test]
    fn node_keys_are_one_segment() {
        assert_eq!(
            node_key("/q/", "moqt://a:4443/"),
            "/q/nodes/moqt%3A%2F%2Fa%3A4443%2F"
        );
    }
}
