//! The transport-independent core of the HTTP API: a request with its whole
//! body in, a response out whose body is complete or a stream of chunks.
//! HTTP/1.1, HTTP/2 ([`super::tcp`]) and HTTP/3 all drive [`Api::handle`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_METHOD, ALLOW, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER, VARY,
};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use quichub_auth::Access;
use quichub_mqtt::{QoS, SubscriptionOptions};
use tokio::sync::{mpsc, watch};

use super::auth;
use super::origin::{Listener, OriginPolicy, Refusal};
use super::route::{route, Route, TIME_METHODS, TOPIC_METHODS};
use super::sse;
use crate::bridge::Bridge;
use crate::broker::{Broker, Delivery, Message, Outbox, Source, SubOptions};
use crate::store::Durability;

/// `X-History-Length`: replay the last N messages before the live ones.
pub const HISTORY_LENGTH: HeaderName = HeaderName::from_static("x-history-length");
/// `X-Retain: 1`: the published message is retained (MQTT RETAIN).
pub const RETAIN: HeaderName = HeaderName::from_static("x-retain");
/// Response header of `POST`: how many subscribers (of every protocol) the
/// message matched.
pub const MATCHED: HeaderName = HeaderName::from_static("x-matched-subscribers");

/// Limits of the API.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Largest request body (a published message), bytes: beyond it 413.
    pub max_body: usize,
    /// Most topics in the registry: beyond it `PUT` answers 507.
    pub max_topics: usize,
    /// Most concurrent `GET` streams: beyond it 503.
    pub max_subscribers: usize,
    /// Largest `X-History-Length`: beyond it 400.
    pub max_history: usize,
    /// Deliveries queued for one stream that the client has not read yet:
    /// beyond it the broker drops messages for that stream (and counts them).
    pub queue: usize,
    /// A comment line is sent on an idle stream this often, so proxies keep
    /// it open and a client gone is noticed.
    pub keepalive: Duration,
    /// Longest wait for the broker's durable store before `POST` answers
    /// (only when the message was persisted: retained, or queued for a
    /// persistent MQTT session).
    pub durable_timeout: Duration,
    /// Publishes (`POST`) per second from one client address (IPv6: one
    /// /64), after a burst of `publish_burst`: beyond it 429 (see
    /// [`super::rate`]); 0: no limit.
    pub publish_rate: u64,
    /// Publishes one address may make at once (0: one second's worth).
    pub publish_burst: u64,
    /// Origins (`scheme://host[:port]`) whose pages may make state-changing
    /// requests and WebSocket upgrades, besides the relay's own; `"*"`:
    /// any (see [`super::origin`]).
    pub allowed_origins: Vec<String>,
    /// Host names loopback listeners answer for besides loopback addresses
    /// and `localhost`; `"*"`: any.
    pub allowed_hosts: Vec<String>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            max_body: 1024 * 1024,
            max_topics: 10_000,
            max_subscribers: 1_000,
            max_history: 1_000,
            queue: 1_024,
            keepalive: Duration::from_secs(15),
            durable_timeout: Duration::from_secs(5),
            // Far above what a device posts, or the tests and labs from
            // loopback; a single host's flood is cut to it. Behind a
            // reverse proxy every client is the proxy's address.
            publish_rate: 1_000,
            publish_burst: 1_000,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
        }
    }
}

/// The body of a response.
#[derive(Debug)]
pub enum ApiBody {
    /// The whole body.
    Full(Bytes),
    /// A stream of chunks (Server-Sent Events): the response ends when the
    /// sender is dropped; dropping the receiver (client gone) ends the
    /// subscription.
    Stream(mpsc::Receiver<Bytes>),
}

impl ApiBody {
    /// An empty body.
    pub fn empty() -> Self {
        ApiBody::Full(Bytes::new())
    }
}

/// Counters of the API.
#[derive(Debug, Default)]
pub struct ApiMetrics {
    /// Requests handled.
    pub requests: AtomicU64,
    /// Messages published by `POST`.
    pub published: AtomicU64,
    /// Events written to streams (history and live).
    pub events: AtomicU64,
    /// HTTP/3 requests run from 0-RTT data, before the handshake completed.
    pub early: AtomicU64,
    /// HTTP/3 requests from 0-RTT data held until the handshake completed.
    pub early_held: AtomicU64,
    /// Requests and WebSocket upgrades refused for their `Origin`.
    pub refused_origin: AtomicU64,
    /// Requests refused for their `Host` (loopback listeners).
    pub refused_host: AtomicU64,
}

impl ApiMetrics {
    /// The Prometheus text of the refusals.
    pub fn render(&self) -> String {
        format!(
            "# HELP quichub_http_refused_total HTTP requests and WebSocket upgrades refused before routing: from a web page of an origin not allowed (origin), or for a Host a loopback listener does not answer for (host).\n\
             # TYPE quichub_http_refused_total counter\n\
             quichub_http_refused_total{{reason=\"origin\"}} {}\n\
             quichub_http_refused_total{{reason=\"host\"}} {}\n",
            self.refused_origin.load(Relaxed),
            self.refused_host.load(Relaxed),
        )
    }
}

/// The HTTP pub/sub API on a broker (and the MoQT bridge, for history).
pub struct Api {
    broker: Arc<Broker>,
    bridge: Option<Arc<Bridge>>,
    config: ApiConfig,
    /// Topics created with `PUT`; dropping a sender ends the streams of that
    /// topic (`DELETE`).
    topics: Mutex<HashMap<Arc<str>, watch::Sender<()>>>,
    subscribers: AtomicUsize,
    next_stream: AtomicU64,
    /// Makes stream client ids unguessable by MQTT clients (which could
    /// otherwise take their sessions over).
    nonce: u64,
    /// The dashboard and player pages, once [`Api::serve_web`] set them.
    web: std::sync::OnceLock<super::web::Web>,
    /// MoQT over WebSocket, once [`Api::serve_websocket`] set it.
    websocket: std::sync::OnceLock<super::websocket::WebSocketMoqt>,
    /// Who clients are and what they may do (open to all until
    /// [`Api::set_auth`]).
    auth: Mutex<Arc<quichub_auth::SharedAuth>>,
    /// Which pages may use the API, and which names it answers for.
    origins: OriginPolicy,
    /// Publishes per client address.
    publish_rate: super::rate::PublishRate,
    /// Counters.
    pub metrics: ApiMetrics,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("config", &self.config)
            .field("subscribers", &self.subscribers)
            .finish_non_exhaustive()
    }
}

type Resp = Response<ApiBody>;

impl Api {
    /// An API publishing into `broker`; `bridge` serves `X-History-Length`
    /// from the relay's cache (without it history is always empty).
    pub fn new(broker: Arc<Broker>, bridge: Option<Arc<Bridge>>, config: ApiConfig) -> Arc<Self> {
        let nonce = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (std::process::id() as u64).rotate_left(32);
        let origins = OriginPolicy::new(&config.allowed_origins, &config.allowed_hosts);
        Arc::new(Self {
            broker,
            bridge,
            publish_rate: super::rate::PublishRate::new(config.publish_rate, config.publish_burst),
            config,
            origins,
            topics: Mutex::default(),
            subscribers: AtomicUsize::new(0),
            next_stream: AtomicU64::new(1),
            nonce,
            web: std::sync::OnceLock::new(),
            websocket: std::sync::OnceLock::new(),
            auth: Mutex::new(quichub_auth::SharedAuth::open()),
            metrics: ApiMetrics::default(),
        })
    }

    /// Authenticates and authorises requests with `auth` from now on.
    pub fn set_auth(&self, auth: Arc<quichub_auth::SharedAuth>) {
        *self.auth.lock().expect("auth lock") = auth;
    }

    /// The authentication in force.
    pub fn auth(&self) -> Arc<quichub_auth::SharedAuth> {
        self.auth.lock().expect("auth lock").clone()
    }

    /// Serves the dashboard and the player (see [`super::web`]) beside the
    /// API's routes, on every transport of this API. A second call is
    /// ignored.
    pub fn serve_web(&self, web: super::web::Web) {
        let _ = self.web.set(web);
    }

    /// Accepts MoQT sessions over WebSocket upgrades (see
    /// [`super::websocket`]) on the HTTP/1.1 port.
    pub fn serve_websocket(&self, ws: super::websocket::WebSocketMoqt) {
        let _ = self.websocket.set(ws);
    }

    /// Where WebSocket upgrades go, if they are served.
    pub fn websocket(&self) -> Option<&super::websocket::WebSocketMoqt> {
        self.websocket.get()
    }

    /// Which pages may use the API and which names it answers for; each
    /// listener adds its own origins
    /// ([`OriginPolicy::add_listener`]).
    pub fn origins(&self) -> &OriginPolicy {
        &self.origins
    }

    /// Screens a request that came in on `listener` (see
    /// [`super::origin`]), counting refusals: `Err` says why it is
    /// refused (answer [`refusal`]), `Ok` is the allowed `Origin` to answer
    /// with CORS headers, if any. `upgrade`: a WebSocket upgrade.
    pub fn screen(
        &self,
        listener: Listener,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        upgrade: bool,
    ) -> Result<Option<HeaderValue>, Refusal> {
        let screened = self.origins.screen(listener, method, uri, headers, upgrade);
        match screened {
            Err(Refusal::Origin) => self.metrics.refused_origin.fetch_add(1, Relaxed),
            Err(Refusal::Host) => self.metrics.refused_host.fetch_add(1, Relaxed),
            Ok(_) => 0,
        };
        screened
    }

    /// Publishes per client address, and those refused.
    pub fn publish_rate(&self) -> &super::rate::PublishRate {
        &self.publish_rate
    }

    /// The limits.
    pub fn config(&self) -> &ApiConfig {
        &self.config
    }

    /// Largest request body: a transport reads at most this many bytes and
    /// answers [`Api::payload_too_large`] beyond.
    pub fn max_body(&self) -> usize {
        self.config.max_body
    }

    /// Number of topics in the registry.
    pub fn topics(&self) -> usize {
        self.topics.lock().expect("topics lock").len()
    }

    /// Number of open `GET` streams.
    pub fn subscribers(&self) -> usize {
        self.subscribers.load(Relaxed)
    }

    /// The 413 answer, for a transport whose request body ran over
    /// [`Api::max_body`].
    pub fn payload_too_large(&self) -> Resp {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("body over {} bytes", self.config.max_body),
        )
    }

    /// Handles one request. It is screened first ([`Api::screen`], for the
    /// [`Listener`] in its extensions, which each transport puts there;
    /// without one, `Host` is not checked). The URI's path routes it (its
    /// query is ignored but for `jwt`, see [`auth`]); the body is the whole
    /// request body. Topic routes and `/v1/relay` are authenticated with
    /// the [`Api::auth`] in force: one token verification per request.
    pub async fn handle(self: &Arc<Self>, req: Request<Bytes>) -> Resp {
        self.metrics.requests.fetch_add(1, Relaxed);
        let listener = req
            .extensions()
            .get::<Listener>()
            .copied()
            .unwrap_or_default();
        let cors = match self.screen(listener, req.method(), req.uri(), req.headers(), false) {
            Ok(cors) => cors,
            Err(why) => return refusal(why),
        };
        let preflight = req.method() == Method::OPTIONS
            && req.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD);
        let mut resp = match (&cors, preflight) {
            (Some(origin), true) => preflight_answer(origin.clone()),
            _ => {
                let head = req.method() == Method::HEAD;
                let mut resp = self.dispatch(req).await;
                if head {
                    // Same status and headers as GET, no body.
                    *resp.body_mut() = ApiBody::empty();
                }
                resp
            }
        };
        let h = resp.headers_mut();
        // Answers differ by Origin: caches must not give one origin's to another.
        h.append(VARY, HeaderValue::from_static("origin"));
        if let Some(origin) = cors {
            h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            h.insert(
                ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static(CORS_EXPOSED),
            );
        }
        resp
    }

    async fn dispatch(self: &Arc<Self>, req: Request<Bytes>) -> Resp {
        let (parts, body) = req.into_parts();
        if let Some(r) = self.web.get().and_then(|w| {
            // Only the dashboard's JSON holds data: the pages, assets and
            // certificate hash are public, the JSON shows what the
            // requester may read.
            w.handle(&parts.method, parts.uri.path(), || {
                auth::authenticate(&self.auth(), &parts)
            })
        }) {
            return r;
        }
        match route(parts.uri.path()) {
            Route::NotFound => error(StatusCode::NOT_FOUND, "no such route"),
            Route::Time => match parts.method {
                Method::GET | Method::HEAD => time(),
                _ => not_allowed(TIME_METHODS),
            },
            Route::BadTopic(why) => {
                if is_topic_method(&parts.method) {
                    error(StatusCode::BAD_REQUEST, why)
                } else {
                    not_allowed(TOPIC_METHODS)
                }
            }
            Route::Topic(topic) => {
                if parts.method == Method::POST {
                    if let Err(wait) = self.publish_rate.check(&parts.extensions) {
                        return super::rate::too_many(wait);
                    }
                }
                let access = match parts.method {
                    Method::GET | Method::HEAD => Access::Read,
                    Method::PUT | Method::DELETE | Method::POST => Access::Write,
                    _ => return not_allowed(TOPIC_METHODS),
                };
                let shared = self.auth();
                let recheck = auth::Recheck::new(shared.clone(), &parts);
                let id = match auth::authenticate(&shared, &parts) {
                    Ok(id) => id,
                    Err(r) => return r.response(),
                };
                if !id.may_topic(access, &topic) {
                    return auth::forbidden(&shared, &id).response();
                }
                match parts.method {
                    Method::PUT => self.create(&topic),
                    Method::HEAD => self.exists(&topic),
                    Method::DELETE => self.delete(&topic),
                    Method::POST => self.publish(&topic, &parts.headers, body).await,
                    _ => self.subscribe(&topic, &parts.headers, id.expires(), recheck),
                }
            }
        }
    }

    fn create(&self, topic: &str) -> Resp {
        let mut topics = self.topics.lock().expect("topics lock");
        if topics.contains_key(topic) {
            return status(StatusCode::OK);
        }
        if topics.len() >= self.config.max_topics {
            return error(StatusCode::INSUFFICIENT_STORAGE, "topic limit reached");
        }
        topics.insert(topic.into(), watch::channel(()).0);
        status(StatusCode::CREATED)
    }

    fn exists(&self, topic: &str) -> Resp {
        if self.topics.lock().expect("topics lock").contains_key(topic) {
            status(StatusCode::OK)
        } else {
            status(StatusCode::NOT_FOUND)
        }
    }

    fn delete(&self, topic: &str) -> Resp {
        // Dropping the sender ends every stream of the topic.
        match self.topics.lock().expect("topics lock").remove(topic) {
            Some(_) => status(StatusCode::NO_CONTENT),
            None => error(StatusCode::NOT_FOUND, "no such topic"),
        }
    }

    async fn publish(&self, topic: &str, headers: &HeaderMap, body: Bytes) -> Resp {
        if body.len() > self.config.max_body {
            return self.payload_too_large();
        }
        if !self.topics.lock().expect("topics lock").contains_key(topic) {
            return error(StatusCode::NOT_FOUND, "no such topic (create it with PUT)");
        }
        let retain = match headers.get(RETAIN).map(|v| v.as_bytes()) {
            None | Some(b"0") | Some(b"false") => false,
            Some(b"1") | Some(b"true") => true,
            Some(_) => return error(StatusCode::BAD_REQUEST, "X-Retain must be 0 or 1"),
        };
        let mut m = Message::new(topic, body, QoS::AtLeastOnce, retain, Source::Http);
        if let Some(ct) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
            m.properties.content_type = Some(ct.to_string());
        }
        let (matched, ticket) = self.broker.publish_durable(m);
        self.metrics.published.fetch_add(1, Relaxed);
        if ticket > 0 {
            if let Some((mut synced, store)) = self.broker.durable() {
                // Woken by a failure too: refused at once, not at the timeout.
                let waited = tokio::time::timeout(
                    self.config.durable_timeout,
                    synced.wait_for(|v| store.durability(ticket, *v) != Durability::Pending),
                )
                .await;
                let durable = matches!(&waited, Ok(Ok(v)) if **v >= ticket);
                if !durable {
                    return error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the broker's store did not persist the message",
                    );
                }
            }
        }
        let mut r = status(StatusCode::NO_CONTENT);
        r.headers_mut().insert(MATCHED, HeaderValue::from(matched));
        r
    }

    /// A stream of `topic`'s messages; it ends at `expires` (the token's
    /// `exp`), as a MoQT session does, and when a reload of the auth means
    /// `recheck`'s request may no longer read the topic.
    fn subscribe(
        self: &Arc<Self>,
        topic: &str,
        headers: &HeaderMap,
        expires: Option<SystemTime>,
        recheck: auth::Recheck,
    ) -> Resp {
        let history = match headers.get(HISTORY_LENGTH) {
            None => 0,
            Some(v) => match v.to_str().ok().and_then(|s| s.trim().parse::<usize>().ok()) {
                Some(n) if n <= self.config.max_history => n,
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        &format!(
                            "X-History-Length must be an integer from 0 to {}",
                            self.config.max_history
                        ),
                    )
                }
            },
        };
        let Some(deleted) = self
            .topics
            .lock()
            .expect("topics lock")
            .get(topic)
            .map(|s| s.subscribe())
        else {
            return error(StatusCode::NOT_FOUND, "no such topic (create it with PUT)");
        };
        let Some(slot) = Slot::take(self) else {
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, "too many subscribers");
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("5"));
            return r;
        };
        let n = self.next_stream.fetch_add(1, Relaxed);
        let client: Arc<str> = format!("$http/{:016x}/{n}", self.nonce).into();
        let (tx, mut rx) = mpsc::channel(self.config.queue.max(1));
        let (kick, kicked) = mpsc::channel(1);
        let conn = self.broker.next_conn_id();
        if self
            .broker
            .connect(
                &client,
                true,
                Some(Duration::ZERO),
                Outbox { tx, conn, kick },
            )
            .is_err()
        {
            return error(StatusCode::SERVICE_UNAVAILABLE, "broker session limit");
        }
        let session = Session {
            broker: self.broker.clone(),
            client,
            conn,
            _slot: slot,
        };
        let opts = SubOptions {
            options: SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                no_local: false,
                retain_as_published: false,
                retain_handling: 2,
            },
            id: None,
        };
        if self.broker.subscribe(&session.client, topic, opts).is_err() {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "broker subscription refused",
            );
        }
        // Live deliveries queue from here; the history is read after, so no
        // message falls between the two. A message in both is dropped from
        // the live side (see `Dedupe`).
        let past = match (&self.bridge, history) {
            (Some(b), n) if n > 0 => b.history(topic, n),
            _ => Vec::new(),
        };
        let dedupe = Dedupe::new(&past, rx.len());
        let (out, body) = mpsc::channel(16);
        let api = self.clone();
        let topic: Arc<str> = topic.into();
        tokio::spawn(async move {
            let _session = session;
            let mut stream = Stream {
                out,
                seq: 0,
                api: &api,
            };
            if stream.send(sse::comment("subscribed")).await.is_err() {
                return;
            }
            for p in &past {
                if stream.message(p).await.is_err() {
                    return;
                }
            }
            drop(past);
            let expiry = expires.map(|at| {
                let left = at.duration_since(SystemTime::now()).unwrap_or_default();
                tokio::time::Instant::now() + left
            });
            stream
                .live(&mut rx, dedupe, deleted, kicked, expiry, recheck, &topic)
                .await;
        });
        let mut r = Response::new(ApiBody::Stream(body));
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    }
}

fn is_topic_method(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::POST | Method::PUT | Method::DELETE
    )
}

/// A place among [`ApiConfig::max_subscribers`], given back on drop.
struct Slot(Arc<Api>);

impl Slot {
    fn take(api: &Arc<Api>) -> Option<Slot> {
        api.subscribers
            .fetch_update(Relaxed, Relaxed, |n| {
                (n < api.config.max_subscribers).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(api.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.subscribers.fetch_sub(1, Relaxed);
    }
}

/// A stream's broker session, ended on drop (the session does not outlive
/// its stream: expiry 0).
struct Session {
    broker: Arc<Broker>,
    client: Arc<str>,
    conn: u64,
    _slot: Slot,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.broker
            .disconnect(&self.client, self.conn, Vec::new(), None, None);
    }
}

/// Drops live deliveries of messages already replayed from history.
///
/// The broker routes a message to its subscribers before the bridge writes
/// it to the relay's cache, so a message of the history snapshot that is
/// also live was queued before the snapshot: among the first `pending`
/// deliveries. Messages that MoQT publishers send take the other way (cache
/// first, then the broker), so the check also stays on for [`Dedupe::GRACE`].
/// A message is recognised by its payload buffer (the same `Bytes` in the
/// cache and in the delivery, never copied); empty payloads are not
/// deduplicated.
struct Dedupe {
    seen: Vec<Bytes>,
    pending: usize,
    until: Instant,
}

impl Dedupe {
    const GRACE: Duration = Duration::from_secs(1);

    fn new(past: &[Bytes], pending: usize) -> Self {
        Self {
            seen: past.iter().filter(|p| !p.is_empty()).cloned().collect(),
            pending,
            until: Instant::now() + Self::GRACE,
        }
    }

    /// Whether `payload` was already sent from history.
    fn replayed(&mut self, payload: &Bytes) -> bool {
        if self.seen.is_empty() {
            return false;
        }
        self.pending = self.pending.saturating_sub(1);
        let hit = self
            .seen
            .iter()
            .position(|s| s.as_ptr() == payload.as_ptr() && s.len() == payload.len());
        if let Some(i) = hit {
            self.seen.swap_remove(i);
        }
        if self.pending == 0 && Instant::now() >= self.until {
            self.seen = Vec::new();
        }
        hit.is_some() && !payload.is_empty()
    }
}

struct Stream<'a> {
    out: mpsc::Sender<Bytes>,
    seq: u64,
    api: &'a Api,
}

struct Gone;

impl Stream<'_> {
    async fn send(&mut self, chunk: Bytes) -> Result<(), Gone> {
        self.out.send(chunk).await.map_err(|_| Gone)
    }

    async fn message(&mut self, payload: &[u8]) -> Result<(), Gone> {
        self.seq += 1;
        self.api.metrics.events.fetch_add(1, Relaxed);
        self.send(sse::message(self.seq, payload)).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn live(
        &mut self,
        rx: &mut mpsc::Receiver<Delivery>,
        mut dedupe: Dedupe,
        mut deleted: watch::Receiver<()>,
        mut kicked: mpsc::Receiver<u8>,
        expiry: Option<tokio::time::Instant>,
        mut recheck: auth::Recheck,
        topic: &str,
    ) {
        // No expiry: a deadline that never comes (the branch is disabled).
        let expired = tokio::time::sleep_until(
            expiry.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(1)),
        );
        tokio::pin!(expired);
        let period = self.api.config.keepalive.max(Duration::from_millis(10));
        let mut keepalive = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                // The topic's sender is dropped by DELETE.
                _ = deleted.changed() => {
                    let data = serde_json::json!({ "topic": topic }).to_string();
                    let _ = self.send(sse::event(sse::DELETED_EVENT, &data)).await;
                    return;
                }
                _ = kicked.recv() => return,
                _ = &mut expired, if expiry.is_some() => {
                    let _ = self.send(sse::comment("token expired")).await;
                    return;
                }
                () = recheck.changed() => {
                    if !recheck.allows(Access::Read, topic) {
                        let _ = self.send(sse::comment("credentials revoked")).await;
                        return;
                    }
                }
                _ = self.out.closed() => return,
                d = rx.recv() => {
                    let Some(d) = d else { return };
                    if dedupe.replayed(&d.message.payload) {
                        continue;
                    }
                    if self.message(&d.message.payload).await.is_err() {
                        return;
                    }
                }
                _ = keepalive.tick() => {
                    if self.send(sse::comment("keep-alive")).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// The answer to a request [`Api::screen`] refused.
pub fn refusal(why: Refusal) -> Resp {
    match why {
        Refusal::Origin => error(
            StatusCode::FORBIDDEN,
            "cross-origin request refused: the page's origin is not in [http] allowed_origins",
        ),
        // 421: this server is not the one for that name (RFC 9110
        // §15.5.20), which is what a rebound name is.
        Refusal::Host => error(
            StatusCode::MISDIRECTED_REQUEST,
            "this relay does not answer for that Host on a loopback listener: add the name to [http] allowed_hosts",
        ),
    }
}

/// The request headers a page may send (CORS preflight).
const CORS_HEADERS: &str = "authorization, content-type, x-retain, x-history-length, last-event-id";
/// The response headers a page may read besides the safelisted ones.
const CORS_EXPOSED: &str = "x-matched-subscribers, retry-after, www-authenticate, allow";

/// 204 to a CORS preflight from an allowed origin: every method and header
/// the API takes, for 10 minutes.
fn preflight_answer(origin: HeaderValue) -> Resp {
    let mut r = status(StatusCode::NO_CONTENT);
    let h = r.headers_mut();
    h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(
        ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(TOPIC_METHODS),
    );
    h.insert(
        ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(CORS_HEADERS),
    );
    h.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    r
}

fn status(s: StatusCode) -> Resp {
    let mut r = Response::new(ApiBody::empty());
    *r.status_mut() = s;
    r
}

/// An error answer: `{"error": "..."}`.
pub fn error(s: StatusCode, message: &str) -> Response<ApiBody> {
    let body = serde_json::json!({ "error": message }).to_string();
    let mut r = Response::new(ApiBody::Full(body.into()));
    *r.status_mut() = s;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn not_allowed(allow: &'static str) -> Resp {
    let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    r
}

fn time() -> Resp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let body = serde_json::json!({ "unix_ms": ms }).to_string();
    let mut r = Response::new(ApiBody::Full(body.into()));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BrokerConfig;

    fn api(config: ApiConfig) -> Arc<Api> {
        Api::new(Broker::new(BrokerConfig::default()), None, config)
    }

    fn req(method: Method, path: &str, body: &'static [u8]) -> Request<Bytes> {
        Request::builder()
            .method(method)
            .uri(path)
            .body(Bytes::from_static(body))
            .unwrap()
    }

    async fn call(api: &Arc<Api>, method: Method, path: &str) -> Resp {
        api.handle(req(method, path, b"")).await
    }

    fn body_text(r: Resp) -> String {
        match r.into_body() {
            ApiBody::Full(b) => String::from_utf8(b.to_vec()).unwrap(),
            ApiBody::Stream(_) => panic!("stream"),
        }
    }

    async fn next(rx: &mut mpsc::Receiver<Bytes>) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("stream stalled")
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
    }

    fn stream(r: Resp) -> mpsc::Receiver<Bytes> {
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[CONTENT_TYPE], "text/event-stream");
        match r.into_body() {
            ApiBody::Stream(rx) => rx,
            ApiBody::Full(b) => panic!("not a stream: {b:?}"),
        }
    }

    #[tokio::test]
    async fn topic_lifecycle() {
        let api = api(ApiConfig::default());
        let t = "/v1/t/a%2Fb";
        assert_eq!(call(&api, Method::HEAD, t).await.status(), 404);
        assert_eq!(call(&api, Method::PUT, t).await.status(), 201);
        assert_eq!(call(&api, Method::PUT, "/v1/t/a/b").await.status(), 200);
        assert_eq!(call(&api, Method::HEAD, "/v1/t/a/b").await.status(), 200);
        assert_eq!(api.topics(), 1);
        assert_eq!(call(&api, Method::DELETE, t).await.status(), 204);
        assert_eq!(call(&api, Method::DELETE, t).await.status(), 404);
        assert_eq!(call(&api, Method::HEAD, t).await.status(), 404);
        assert_eq!(call(&api, Method::POST, t).await.status(), 404);
        assert_eq!(call(&api, Method::GET, t).await.status(), 404);
    }

    #[tokio::test]
    async fn errors_and_methods() {
        let api = api(ApiConfig::default());
        let r = call(&api, Method::PATCH, "/v1/t/x").await;
        assert_eq!(r.status(), 405);
        assert_eq!(r.headers()[ALLOW], TOPIC_METHODS);
        let r = call(&api, Method::POST, "/v1/time").await;
        assert_eq!(r.status(), 405);
        assert_eq!(r.headers()[ALLOW], TIME_METHODS);
        let r = call(&api, Method::GET, "/nope").await;
        assert_eq!(r.status(), 404);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
        assert!(body_text(r).contains("\"error\""));
        assert_eq!(call(&api, Method::PUT, "/v1/t/a/%2B").await.status(), 400);
        assert_eq!(call(&api, Method::PUT, "/v1/t/").await.status(), 400);
        let r = call(&api, Method::GET, "/v1/time?x=1").await;
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = serde_json::from_str(&body_text(r)).unwrap();
        assert!(v["unix_ms"].as_u64().unwrap() > 1_600_000_000_000);
        let r = call(&api, Method::HEAD, "/v1/time").await;
        assert_eq!(r.status(), 200);
        assert!(body_text(r).is_empty());
    }

    #[tokio::test]
    async fn limits() {
        let api = api(ApiConfig {
            max_body: 4,
            max_topics: 2,
            max_subscribers: 1,
            max_history: 10,
            ..ApiConfig::default()
        });
        assert_eq!(call(&api, Method::PUT, "/v1/t/1").await.status(), 201);
        assert_eq!(call(&api, Method::PUT, "/v1/t/2").await.status(), 201);
        assert_eq!(call(&api, Method::PUT, "/v1/t/3").await.status(), 507);
        assert_eq!(call(&api, Method::PUT, "/v1/t/2").await.status(), 200);
        let r = api.handle(req(Method::POST, "/v1/t/1", b"12345")).await;
        assert_eq!(r.status(), 413);
        let r = api.handle(req(Method::POST, "/v1/t/1", b"1234")).await;
        assert_eq!(r.status(), 204);
        let mut h = req(Method::GET, "/v1/t/1", b"");
        h.headers_mut()
            .insert(HISTORY_LENGTH, HeaderValue::from_static("11"));
        assert_eq!(api.handle(h).await.status(), 400);
        let mut h = req(Method::GET, "/v1/t/1", b"");
        h.headers_mut()
            .insert(HISTORY_LENGTH, HeaderValue::from_static("many"));
        assert_eq!(api.handle(h).await.status(), 400);
        let first = stream(call(&api, Method::GET, "/v1/t/1").await);
        assert_eq!(api.subscribers(), 1);
        let r = call(&api, Method::GET, "/v1/t/2").await;
        assert_eq!(r.status(), 503);
        assert!(r.headers().contains_key(RETRY_AFTER));
        // The client goes: its place and broker session are given back.
        drop(first);
        for _ in 0..100 {
            if api.subscribers() == 0 && api.broker.sessions() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(api.subscribers(), 0);
        assert_eq!(api.broker.sessions(), 0);
        stream(call(&api, Method::GET, "/v1/t/2").await);
    }

    #[tokio::test]
    async fn publish_reaches_stream_and_delete_ends_it() {
        let api = api(ApiConfig::default());
        assert_eq!(call(&api, Method::PUT, "/v1/t/s/1").await.status(), 201);
        let mut rx = stream(call(&api, Method::GET, "/v1/t/s/1").await);
        assert_eq!(next(&mut rx).await.unwrap(), ": subscribed\n\n");
        let r = api
            .handle(req(Method::POST, "/v1/t/s/1", b"one\ntwo"))
            .await;
        assert_eq!(r.status(), 204);
        assert_eq!(r.headers()[MATCHED], "1");
        assert_eq!(
            next(&mut rx).await.unwrap(),
            "id: 1\nevent: message\ndata: one\ndata: two\n\n"
        );
        api.handle(req(Method::POST, "/v1/t/s/1", b"\xff")).await;
        assert_eq!(
            next(&mut rx).await.unwrap(),
            "id: 2\nevent: message-base64\ndata: /w==\n\n"
        );
        // A message from another protocol, with a retained one first.
        api.broker.publish(Message::new(
            "s/1",
            Bytes::from_static(b"mqtt"),
            QoS::AtMostOnce,
            true,
            Source::Mqtt("c".into()),
        ));
        assert_eq!(
            next(&mut rx).await.unwrap(),
            "id: 3\nevent: message\ndata: mqtt\n\n"
        );
        assert_eq!(call(&api, Method::DELETE, "/v1/t/s/1").await.status(), 204);
        assert_eq!(
            next(&mut rx).await.unwrap(),
            "event: deleted\ndata: {\"topic\":\"s/1\"}\n\n"
        );
        assert_eq!(next(&mut rx).await, None);
        // A new stream does not get the retained message (history is explicit).
        call(&api, Method::PUT, "/v1/t/s/1").await;
        let mut rx = stream(call(&api, Method::GET, "/v1/t/s/1").await);
        assert_eq!(next(&mut rx).await.unwrap(), ": subscribed\n\n");
        assert!(tokio::time::timeout(Duration::from_millis(100), rx.recv())
            .await
            .is_err());
    }

    #[tokio::test]
    async fn durable_publish_is_refused_at_once_while_the_store_fails_then_works() {
        use crate::store::{Fsync, Recovery, Store};
        let dir = std::env::temp_dir().join(format!("quichub-api-failing-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (store, rec) = Store::open(&dir, Fsync::Never, Recovery::Salvage).unwrap();
        let broker = Broker::with_store(BrokerConfig::default(), store.clone(), rec);
        // A persistent session subscribed with QoS 1: a publish to `p` needs
        // a durable record.
        let c: Arc<str> = "dev".into();
        let (tx, _rx) = mpsc::channel(16);
        let (kick, _kick) = mpsc::channel(1);
        broker
            .connect(&c, true, None, Outbox { tx, conn: 1, kick })
            .unwrap();
        let options = quichub_mqtt::SubscriptionOptions {
            qos: QoS::AtLeastOnce,
            ..Default::default()
        };
        broker
            .subscribe(&c, "p", SubOptions { options, id: None })
            .unwrap();
        let config = ApiConfig {
            durable_timeout: Duration::from_secs(60),
            ..ApiConfig::default()
        };
        let api = Api::new(broker, None, config);
        call(&api, Method::PUT, "/v1/t/p").await;
        store.fail_next_writes(u32::MAX);
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            api.handle(req(Method::POST, "/v1/t/p", b"1")),
        )
        .await
        .expect("refused at once, not at the timeout");
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        // Space is back: the store's retry succeeds and publishes work.
        store.fail_next_writes(0);
        let mut synced = store.synced();
        tokio::time::timeout(Duration::from_secs(20), async {
            while store.failed() {
                synced.changed().await.unwrap();
            }
        })
        .await
        .unwrap();
        let r = tokio::time::timeout(
            Duration::from_secs(20),
            api.handle(req(Method::POST, "/v1/t/p", b"2")),
        )
        .await
        .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        assert!(!store.failed());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn post_headers_become_message_fields() {
        let api = api(ApiConfig::default());
        call(&api, Method::PUT, "/v1/t/r").await;
        let mut r = req(Method::POST, "/v1/t/r", b"{}");
        r.headers_mut()
            .insert(RETAIN, HeaderValue::from_static("1"));
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert_eq!(api.handle(r).await.status(), 204);
        let m = api.broker.retained("r").expect("retained");
        assert_eq!(&m.payload[..], b"{}");
        assert_eq!(m.qos, QoS::AtLeastOnce);
        assert_eq!(m.source, Source::Http);
        assert_eq!(
            m.properties.content_type.as_deref(),
            Some("application/json")
        );
        let mut r = req(Method::POST, "/v1/t/r", b"x");
        r.headers_mut()
            .insert(RETAIN, HeaderValue::from_static("yes"));
        assert_eq!(api.handle(r).await.status(), 400);
    }

    #[tokio::test]
    async fn keepalive_comments_on_idle_streams() {
        let api = api(ApiConfig {
            keepalive: Duration::from_millis(20),
            ..ApiConfig::default()
        });
        call(&api, Method::PUT, "/v1/t/k").await;
        let mut rx = stream(call(&api, Method::GET, "/v1/t/k").await);
        assert_eq!(next(&mut rx).await.unwrap(), ": subscribed\n\n");
        assert_eq!(next(&mut rx).await.unwrap(), ": keep-alive\n\n");
    }

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-api-test";

    /// An API whose auth verifies HS256 tokens signed with [`SECRET`] and
    /// lets anonymous clients read and write `pub/...`; the key signing.
    fn authed(dir: &str) -> (Arc<Api>, quichub_auth::jwt::Key) {
        let dir = std::env::temp_dir().join(format!("quichub-api-{dir}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key.secret");
        std::fs::write(&key, SECRET).unwrap();
        let cfg = quichub_auth::AuthConfig {
            key: Some(key),
            public: vec!["mqtt/pub".into()],
            // Streams end at the tokens' `exp`, not a minute later.
            leeway_s: 0,
            ..Default::default()
        };
        let auth = quichub_auth::Auth::load(&cfg).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let api = api(ApiConfig::default());
        api.set_auth(quichub_auth::SharedAuth::new(auth));
        (api, quichub_auth::jwt::Key::from_secret(SECRET).unwrap())
    }

    fn token(key: &quichub_auth::jwt::Key, put: &[&str], get: &[&str], ttl: i64) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let claims = quichub_auth::jwt::Claims {
            root: "mqtt".into(),
            put: put.iter().map(|s| s.to_string()).collect(),
            get: get.iter().map(|s| s.to_string()).collect(),
            exp: Some((now + ttl) as u64),
            ..Default::default()
        };
        key.sign(&claims, None).unwrap()
    }

    async fn call_with(api: &Arc<Api>, method: Method, path: &str, bearer: &str) -> Resp {
        let mut r = req(method, path, b"");
        r.headers_mut().insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {bearer}")).unwrap(),
        );
        api.handle(r).await
    }

    fn challenge(r: &Resp) -> &str {
        r.headers()[http::header::WWW_AUTHENTICATE]
            .to_str()
            .unwrap()
    }

    #[tokio::test]
    async fn topic_routes_need_the_right_grant() {
        let (api, key) = authed("grants");
        let rw = token(&key, &["s"], &["s"], 60);
        let ro = token(&key, &[], &["s"], 60);
        // No credentials, a non-public topic: 401 with a bare challenge.
        let r = call(&api, Method::PUT, "/v1/t/s/1").await;
        assert_eq!(r.status(), 401);
        assert_eq!(challenge(&r), "Bearer");
        // Public prefix: anonymous clients may.
        assert_eq!(call(&api, Method::PUT, "/v1/t/pub/x").await.status(), 201);
        // A bad token: 401 invalid_token, whatever the route.
        for bad in [
            "nope",
            &rw[..rw.len() - 2],
            &token(&key, &["s"], &["s"], -10),
        ] {
            let r = call_with(&api, Method::PUT, "/v1/t/pub/x", bad).await;
            assert_eq!(r.status(), 401, "{bad}");
            assert!(
                challenge(&r).starts_with("Bearer error=\"invalid_token\", error_description=\"")
            );
        }
        // Read-only: GET/HEAD yes, PUT/POST/DELETE 403.
        assert_eq!(
            call_with(&api, Method::PUT, "/v1/t/s/1", &rw)
                .await
                .status(),
            201
        );
        assert_eq!(
            call_with(&api, Method::HEAD, "/v1/t/s/1", &ro)
                .await
                .status(),
            200
        );
        for m in [Method::PUT, Method::POST, Method::DELETE] {
            let r = call_with(&api, m.clone(), "/v1/t/s/1", &ro).await;
            assert_eq!(r.status(), 403, "{m}");
            assert!(challenge(&r).contains("insufficient_scope"));
        }
        // Outside the grant: 403; a non-topic method: still 405.
        assert_eq!(
            call_with(&api, Method::HEAD, "/v1/t/t/1", &rw)
                .await
                .status(),
            403
        );
        assert_eq!(
            call_with(&api, Method::HEAD, "/v1/t/sx", &rw)
                .await
                .status(),
            403
        );
        assert_eq!(
            call_with(&api, Method::PATCH, "/v1/t/s/1", &rw)
                .await
                .status(),
            405
        );
        // The clock stays open; another scheme is a bad request.
        assert_eq!(call(&api, Method::GET, "/v1/time").await.status(), 200);
        let mut r = req(Method::GET, "/v1/t/s/1", b"");
        r.headers_mut().insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_static("Basic dXNlcjpwYXNz"),
        );
        assert_eq!(api.handle(r).await.status(), 400);
        // The query token, for EventSource.
        let r = call(&api, Method::GET, &format!("/v1/t/s/1?a=b&jwt={ro}")).await;
        stream(r);
        assert_eq!(
            call_with(&api, Method::DELETE, "/v1/t/s/1", &rw)
                .await
                .status(),
            204
        );
        let m = &api.auth().metrics;
        assert_eq!(m.get("http", true, "jwt"), 9);
        assert_eq!(m.get("http", false, "expired"), 1);
        assert_eq!(m.get("http", false, "not_authorized"), 6);
    }

    #[tokio::test]
    async fn a_stream_ends_when_its_token_expires() {
        let (api, key) = authed("expiry");
        let t = token(&key, &["e"], &["e"], 2);
        assert_eq!(
            call_with(&api, Method::PUT, "/v1/t/e", &t).await.status(),
            201
        );
        let mut rx = stream(call_with(&api, Method::GET, "/v1/t/e", &t).await);
        assert_eq!(next(&mut rx).await.unwrap(), ": subscribed\n\n");
        assert_eq!(next(&mut rx).await.unwrap(), ": token expired\n\n");
        assert_eq!(next(&mut rx).await, None);
    }

    #[tokio::test]
    async fn streams_end_when_a_reload_revokes_their_credentials() {
        let (api, key) = authed("revoke");
        let t = token(&key, &["s"], &["s"], 60);
        for (topic, bearer) in [("/v1/t/s/1", Some(&t)), ("/v1/t/pub/x", None)] {
            let r = match bearer {
                Some(b) => call_with(&api, Method::PUT, topic, b).await,
                None => call(&api, Method::PUT, topic).await,
            };
            assert_eq!(r.status(), 201, "{topic}");
        }
        let mut by_token = stream(call(&api, Method::GET, &format!("/v1/t/s/1?jwt={t}")).await);
        let mut anonymous = stream(call(&api, Method::GET, "/v1/t/pub/x").await);
        for rx in [&mut by_token, &mut anonymous] {
            assert_eq!(next(rx).await.unwrap(), ": subscribed\n\n");
        }
        let dir = std::env::temp_dir().join(format!("quichub-api-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let reload = |public: &[&str]| {
            let key = dir.join("key.secret");
            std::fs::write(&key, b"another-secret-another-secret-another-secret").unwrap();
            let cfg = quichub_auth::AuthConfig {
                key: Some(key),
                public: public.iter().map(|p| p.to_string()).collect(),
                ..Default::default()
            };
            api.auth().reload(&cfg).unwrap();
        };
        // The key changes: the token's stream ends; the anonymous one, whose
        // public prefix stays, goes on.
        reload(&["mqtt/pub"]);
        assert_eq!(
            next(&mut by_token).await.unwrap(),
            ": credentials revoked\n\n"
        );
        assert_eq!(next(&mut by_token).await, None);
        let r = api.handle(req(Method::POST, "/v1/t/pub/x", b"still")).await;
        assert!(r.status().is_success(), "{}", r.status());
        assert!(next(&mut anonymous).await.unwrap().contains("data: still"));
        // The public prefix goes too.
        reload(&[]);
        assert_eq!(
            next(&mut anonymous).await.unwrap(),
            ": credentials revoked\n\n"
        );
        assert_eq!(next(&mut anonymous).await, None);
        let _ = std::fs::remove_dir_all(&dir);
        let m = &api.auth().metrics;
        assert_eq!(m.get("http", false, "bad_signature"), 1);
        assert_eq!(m.get("http", false, "no_credentials"), 1);
    }

    /// A request on a loopback listener with `headers`.
    fn on_loopback(method: Method, path: &str, headers: &[(&'static str, &str)]) -> Request<Bytes> {
        let mut r = req(method, path, b"x");
        r.extensions_mut().insert(Listener {
            secure: false,
            loopback: true,
        });
        for (n, v) in headers {
            r.headers_mut()
                .append(*n, HeaderValue::from_str(v).unwrap());
        }
        r
    }

    #[tokio::test]
    async fn foreign_pages_are_refused_and_allowed_ones_get_cors() {
        let api = api(ApiConfig {
            allowed_origins: vec!["https://app.example".into()],
            ..ApiConfig::default()
        });
        api.origins()
            .add_listener(false, "127.0.0.1:8080".parse().unwrap());
        let host = ("host", "127.0.0.1:8080");
        call(&api, Method::PUT, "/v1/t/c").await;
        let evil = ("origin", "https://evil.example");
        let r = api
            .handle(on_loopback(Method::POST, "/v1/t/c", &[host, evil]))
            .await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(!r.headers().contains_key(ACCESS_CONTROL_ALLOW_ORIGIN));
        assert_eq!(api.metrics.published.load(Relaxed), 0);
        // Its preflight gets no CORS either.
        let pre = [host, evil, ("access-control-request-method", "POST")];
        let r = api
            .handle(on_loopback(Method::OPTIONS, "/v1/t/c", &pre))
            .await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(!r.headers().contains_key(ACCESS_CONTROL_ALLOW_ORIGIN));
        // A GET is served without CORS, so the page cannot read it.
        let r = api
            .handle(on_loopback(Method::GET, "/v1/time", &[host, evil]))
            .await;
        assert_eq!(r.status(), StatusCode::OK);
        assert!(!r.headers().contains_key(ACCESS_CONTROL_ALLOW_ORIGIN));
        assert_eq!(r.headers()[VARY], "origin");
        // The configured origin and the relay's own.
        for origin in ["https://app.example", "http://localhost:8080"] {
            let o = ("origin", origin);
            let pre = [host, o, ("access-control-request-method", "PUT")];
            let r = api
                .handle(on_loopback(Method::OPTIONS, "/v1/t/c", &pre))
                .await;
            assert_eq!(r.status(), StatusCode::NO_CONTENT, "{origin}");
            assert_eq!(r.headers()[ACCESS_CONTROL_ALLOW_ORIGIN], origin);
            assert_eq!(r.headers()[ACCESS_CONTROL_ALLOW_METHODS], TOPIC_METHODS);
            assert!(r.headers()[ACCESS_CONTROL_ALLOW_HEADERS]
                .to_str()
                .unwrap()
                .contains("authorization"));
            let r = api
                .handle(on_loopback(Method::POST, "/v1/t/c", &[host, o]))
                .await;
            assert_eq!(r.status(), StatusCode::NO_CONTENT, "{origin}");
            assert_eq!(r.headers()[ACCESS_CONTROL_ALLOW_ORIGIN], origin);
        }
        assert_eq!(api.metrics.published.load(Relaxed), 2);
        // No Origin: no browser page, served.
        let r = api
            .handle(on_loopback(Method::POST, "/v1/t/c", &[host]))
            .await;
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        // A rebound name.
        let r = api
            .handle(on_loopback(
                Method::GET,
                "/v1/time",
                &[("host", "evil.example:8080")],
            ))
            .await;
        assert_eq!(r.status(), StatusCode::MISDIRECTED_REQUEST);
        let text = api.metrics.render();
        assert!(
            text.contains("quichub_http_refused_total{reason=\"origin\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("quichub_http_refused_total{reason=\"host\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn dedupe_recognises_the_same_buffer_only() {
        let a = Bytes::from(b"same".to_vec());
        let b = Bytes::from(b"same".to_vec());
        let mut d = Dedupe::new(std::slice::from_ref(&a), 2);
        assert!(!d.replayed(&b), "equal bytes, other message");
        assert!(d.replayed(&a.clone()));
        assert!(!d.replayed(&a), "dropped once only");
        let empty = Bytes::new();
        let mut d = Dedupe::new(std::slice::from_ref(&empty), 1);
        assert!(!d.replayed(&empty));
    }
}
