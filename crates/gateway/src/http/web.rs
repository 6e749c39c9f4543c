//! The pages the relay serves beside the HTTP API: the live dashboard (`/`),
//! the player (`/watch/{broadcast}`), their scripts and styles
//! (`/assets/...`, built from `web/` and embedded in the binary), the relay's
//! certificate hash (`/certificate.sha256`, for WebTransport's
//! `serverCertificateHashes`) and the dashboard's JSON (`/v1/relay`).
//!
//! The broadcast name in `/watch/{broadcast}` is never written into the
//! page: the page is the same static file for every broadcast and its script
//! reads the name from `location.pathname` (and only ever sets it as text).

use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::{Method, Response, StatusCode};
use quichub_auth::{Access, Identity};
use quichub_relay::core::Origin;
use quichub_relay::Relay;
use serde_json::json;

use super::api::{error, ApiBody};
use super::auth::Refusal;

/// The dashboard route.
pub const DASHBOARD_PATH: &str = "/";
/// Prefix of the player route: `/watch/{broadcast}`.
pub const WATCH_PREFIX: &str = "/watch/";
/// Prefix of the embedded scripts and styles.
pub const ASSETS_PREFIX: &str = "/assets/";
/// The certificate hash route: 64 lowercase hex digits and a newline.
pub const CERTIFICATE_PATH: &str = "/certificate.sha256";
/// The dashboard's JSON route.
pub const RELAY_PATH: &str = "/v1/relay";
/// Browsers ask for it; answered 204 rather than logged as a 404.
const FAVICON_PATH: &str = "/favicon.ico";

/// `Content-Security-Policy` of the pages: scripts and styles from this
/// origin only, WebTransport (and `fetch`) to this origin or any `https:`
/// origin (the relay's UDP port is another origin than this TCP port).
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
                   img-src 'self' data:; connect-src 'self' https:; \
                   object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

/// One embedded file of `web/dist`.
struct Asset {
    name: &'static str,
    body: &'static [u8],
    content_type: &'static str,
}

macro_rules! asset {
    ($name:literal, $ct:literal) => {
        Asset {
            name: $name,
            body: include_bytes!(concat!("../../../../web/dist/", $name)),
            content_type: $ct,
        }
    };
}

const DASHBOARD_HTML: Asset = asset!("index.html", "text/html; charset=utf-8");
const WATCH_HTML: Asset = asset!("watch.html", "text/html; charset=utf-8");
const ASSETS: &[Asset] = &[
    asset!("dashboard.js", "text/javascript; charset=utf-8"),
    asset!("player.js", "text/javascript; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("uPlot.min.css", "text/css; charset=utf-8"),
];

/// What the pages need from the running relay: its routing core (for
/// `/v1/relay`), the UDP port WebTransport reaches it on, and the SHA-256
/// of the certificate it presents now (renewal replaces it).
pub struct Web {
    relay: Arc<Relay>,
    quic_port: u16,
    fingerprint: Arc<RwLock<String>>,
    /// Whether the HTTP port takes MoQT over WebSocket (the player's
    /// fallback without WebTransport).
    websocket: bool,
}

impl std::fmt::Debug for Web {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Web")
            .field("quic_port", &self.quic_port)
            .finish_non_exhaustive()
    }
}

impl Web {
    /// Pages for `relay`, reachable over WebTransport on UDP `quic_port` of
    /// the host the page was loaded from, presenting the certificate whose
    /// SHA-256 (hex) `fingerprint` holds.
    pub fn new(relay: Arc<Relay>, quic_port: u16, fingerprint: Arc<RwLock<String>>) -> Self {
        Self {
            relay,
            quic_port,
            fingerprint,
            websocket: false,
        }
    }

    /// Tells the pages (`/v1/relay`'s `websocket`) whether MoQT over
    /// WebSocket is served on this port.
    pub fn with_websocket(mut self, on: bool) -> Self {
        self.websocket = on;
        self
    }

    /// Answers `path` if it is one of the pages' routes (`None`: not ours,
    /// the API routes it). Only `GET` and `HEAD` are allowed on them. The
    /// pages, assets and certificate hash hold no data and are public;
    /// `/v1/relay` is the relay's state as `who` (called for that route
    /// only; `Err` is the refusal to send) may read it.
    pub fn handle(
        &self,
        method: &Method,
        path: &str,
        who: impl FnOnce() -> Result<Identity, Refusal>,
    ) -> Option<Response<ApiBody>> {
        let ours = path == DASHBOARD_PATH
            || path == CERTIFICATE_PATH
            || path == RELAY_PATH
            || path == FAVICON_PATH
            || path.starts_with(WATCH_PREFIX)
            || path.starts_with(ASSETS_PREFIX);
        if !ours {
            return None;
        }
        if method != Method::GET && method != Method::HEAD {
            let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
            r.headers_mut()
                .insert(http::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return Some(r);
        }
        Some(match path {
            DASHBOARD_PATH => page(&DASHBOARD_HTML),
            FAVICON_PATH => {
                let mut r = Response::new(ApiBody::empty());
                *r.status_mut() = StatusCode::NO_CONTENT;
                r
            }
            CERTIFICATE_PATH => {
                let hex = self.fingerprint.read().expect("fingerprint lock").clone();
                let mut r = body(format!("{hex}\n").into(), "text/plain; charset=utf-8");
                no_store(&mut r);
                r
            }
            RELAY_PATH => {
                let who = match who() {
                    Ok(id) => id,
                    Err(r) => return Some(r.response()),
                };
                let mut r = body(self.relay_json(&who).into(), "application/json");
                no_store(&mut r);
                r
            }
            p if p.starts_with(WATCH_PREFIX) => {
                if p.len() == WATCH_PREFIX.len() {
                    error(
                        StatusCode::NOT_FOUND,
                        "no broadcast named: /watch/{broadcast}",
                    )
                } else {
                    page(&WATCH_HTML)
                }
            }
            p => {
                let name = &p[ASSETS_PREFIX.len()..];
                match ASSETS.iter().find(|a| a.name == name) {
                    Some(a) => {
                        let mut r = body(Bytes::from_static(a.body), a.content_type);
                        r.headers_mut()
                            .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                        r
                    }
                    None => error(StatusCode::NOT_FOUND, "no such asset"),
                }
            }
        })
    }

    /// The dashboard's JSON: the relay's QUIC port and certificate hash
    /// (what a page needs to open WebTransport), sessions, published
    /// namespaces, and tracks with their subscribers and rates: only the
    /// namespaces and tracks `who` may read.
    pub fn relay_json(&self, who: &Identity) -> String {
        let snap = self.relay.snapshot();
        let fields = |ns: &moqt::TrackNamespace| -> Vec<String> {
            ns.fields()
                .iter()
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .collect()
        };
        let namespaces: Vec<_> = snap
            .namespaces
            .iter()
            .filter(|n| who.may_prefix(Access::Read, n.namespace.fields()))
            .map(|n| json!({ "namespace": fields(&n.namespace), "session": n.session }))
            .collect();
        let tracks: Vec<_> = snap
            .tracks
            .iter()
            .filter(|t| {
                who.may_track(
                    Access::Read,
                    t.name.namespace.fields(),
                    Some(&t.name.name[..]),
                )
            })
            .map(|t| {
                json!({
                    "namespace": fields(&t.name.namespace),
                    "name": String::from_utf8_lossy(&t.name.name),
                    "id": t.id,
                    "origin": match t.origin {
                        Origin::Subscribed => "subscribed",
                        Origin::Published => "published",
                    },
                    "subscribers": t.subscribers,
                    "objects_per_sec": t.stats.objects_per_sec,
                    "bytes_per_sec": t.stats.bytes_per_sec,
                    "objects": t.stats.objects,
                    "bytes": t.stats.bytes,
                    "largest": t.stats.largest.map(|l| json!({"group": l.group, "object": l.object})),
                    "ended": t.ended,
                })
            })
            .collect();
        json!({
            "quic_port": self.quic_port,
            "websocket": self.websocket,
            "certificate_sha256": *self.fingerprint.read().expect("fingerprint lock"),
            "sessions": snap.sessions,
            "namespaces": namespaces,
            "tracks": tracks,
        })
        .to_string()
    }
}

fn body(b: Bytes, content_type: &'static str) -> Response<ApiBody> {
    let mut r = Response::new(ApiBody::Full(b));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn page(a: &Asset) -> Response<ApiBody> {
    let mut r = body(Bytes::from_static(a.body), a.content_type);
    let h = r.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

fn no_store(r: &mut Response<ApiBody>) {
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn web() -> Web {
        Web::new(
            Relay::new(quichub_relay::Config::default()),
            4443,
            Arc::new(RwLock::new("ab".repeat(32))),
        )
    }

    /// Anyone, while nothing is configured.
    fn everyone() -> Result<Identity, Refusal> {
        Ok(quichub_auth::SharedAuth::open()
            .get()
            .anonymous("")
            .unwrap())
    }

    fn text(r: &Response<ApiBody>) -> String {
        match r.body() {
            ApiBody::Full(b) => String::from_utf8_lossy(b).into_owned(),
            ApiBody::Stream(_) => panic!("stream"),
        }
    }

    #[test]
    fn routes() {
        let w = web();
        assert!(w.handle(&Method::GET, "/v1/time", everyone).is_none());
        assert!(w.handle(&Method::GET, "/v1/t/x", everyone).is_none());
        let r = w.handle(&Method::GET, "/", everyone).unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("script-src 'self'"));
        let r = w.handle(&Method::GET, CERTIFICATE_PATH, everyone).unwrap();
        assert_eq!(text(&r), format!("{}\n", "ab".repeat(32)));
        let r = w
            .handle(&Method::GET, "/assets/player.js", everyone)
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            w.handle(&Method::GET, "/assets/../Cargo.toml", everyone)
                .unwrap()
                .status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            w.handle(&Method::POST, "/", everyone).unwrap().status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            w.handle(&Method::GET, "/watch/", everyone)
                .unwrap()
                .status(),
            StatusCode::NOT_FOUND
        );
    }

    /// The broadcast name never reaches the page: it is the same bytes for
    /// every name, however hostile.
    #[test]
    fn watch_page_does_not_reflect_the_name() {
        let w = web();
        let plain = text(
            &w.handle(&Method::GET, "/watch/live/demo", everyone)
                .unwrap(),
        );
        for hostile in [
            "/watch/%3Cscript%3Ealert(1)%3C%2Fscript%3E",
            "/watch/<img src=x onerror=alert(1)>",
            "/watch/\"'><svg/onload=alert(1)>",
        ] {
            assert_eq!(
                text(&w.handle(&Method::GET, hostile, everyone).unwrap()),
                plain
            );
        }
    }

    #[test]
    fn relay_json_shape() {
        let w = web();
        let v: serde_json::Value =
            serde_json::from_str(&w.relay_json(&everyone().unwrap())).unwrap();
        assert_eq!(v["quic_port"], 4443);
        assert_eq!(v["certificate_sha256"], "ab".repeat(32));
        assert!(v["tracks"].as_array().unwrap().is_empty());
        assert!(v["namespaces"].as_array().unwrap().is_empty());
    }
}
