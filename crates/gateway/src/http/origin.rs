//! Which web pages may use the HTTP port, against cross-site request forgery
//! and DNS rebinding.
//!
//! A browser lets any page send a WebSocket upgrade, or a `POST` with a
//! text body, to any address, the operator's loopback relay included;
//! WebSocket has no CORS, and the answer to such a `POST` need not be read
//! for the message to be published. What tells these apart is the `Origin`
//! header, which browsers always send on them. So:
//!
//! - **Origin.** A WebSocket upgrade, a request with a state-changing method
//!   (anything but `GET`, `HEAD` and `OPTIONS`) and a CORS preflight whose
//!   `Origin` is not allowed is refused with 403. Allowed: the relay's own
//!   origins (each listener's `scheme://address:port`, with `localhost`,
//!   `127.0.0.1` and `[::1]` for one on loopback or on every address, and
//!   the names of [`allowed_hosts`](OriginPolicy::new)), the page of the
//!   request's own `Host` (same origin), and the configured
//!   `allowed_origins` (`"*"`: any). A request without `Origin` (curl,
//!   mosquitto, native clients) is not a browser's cross-site request and
//!   is let through; so is a `GET` from another origin, which the browser
//!   does not let its page read without CORS.
//! - **Host.** On a loopback listener, a `Host` that is not a loopback IP
//!   address, `localhost` or an `allowed_hosts` name is refused with 421
//!   Misdirected Request: a page at `evil.example` whose name the attacker
//!   made resolve to 127.0.0.1 is same-origin with the relay as far as the
//!   browser knows, so only the name it sends tells it apart.
//! - **CORS.** A request from an allowed origin gets
//!   `Access-Control-Allow-Origin` (its preflight a 204 with the methods and
//!   headers the API takes); any other gets none, so its page cannot read
//!   the answer.
//!
//! WebTransport sessions on the UDP port are the relay endpoint's, not the
//! API's, and are not screened here.

use std::net::{IpAddr, SocketAddr};
use std::sync::RwLock;

use http::header::{HeaderMap, HeaderValue, ACCESS_CONTROL_REQUEST_METHOD, HOST, ORIGIN};
use http::{Method, Uri};

/// Names a loopback address answers to, whatever the configuration.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// What the policy needs to know of the listener a request came in on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Listener {
    /// TLS (HTTPS, HTTP/3): its pages' origins are `https:`.
    pub secure: bool,
    /// Bound to a loopback address: `Host` is checked.
    pub loopback: bool,
}

impl Listener {
    /// A listener bound to `addr`, over TLS or not.
    pub fn new(secure: bool, addr: SocketAddr) -> Self {
        Self {
            secure,
            loopback: is_loopback(addr.ip()),
        }
    }

    fn scheme(self) -> &'static str {
        if self.secure {
            "https"
        } else {
            "http"
        }
    }
}

/// Why a request was refused before routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A cross-origin request from an origin not allowed.
    Origin,
    /// A `Host` a loopback listener does not answer for.
    Host,
}

/// The allowed origins and host names.
#[derive(Debug)]
pub struct OriginPolicy {
    any_origin: bool,
    /// Configured and own origins, as [`normalize_origin`] writes them.
    origins: RwLock<Vec<String>>,
    any_host: bool,
    /// Configured names, as [`normalize_host`] writes them.
    hosts: Vec<String>,
}

impl OriginPolicy {
    /// Allows `allowed_origins` (besides the relay's own, added by
    /// [`OriginPolicy::add_listener`]; `"*"`: every origin) and, on loopback
    /// listeners, the host names `allowed_hosts` (besides loopback
    /// addresses and `localhost`; `"*"`: every name). Entries that are not
    /// origins or host names are left out: the configuration checks them
    /// first (`normalize_origin`, `normalize_host`).
    pub fn new(allowed_origins: &[String], allowed_hosts: &[String]) -> Self {
        let origins: Vec<String> = allowed_origins
            .iter()
            .filter_map(|o| normalize_origin(o))
            .collect();
        let hosts: Vec<String> = allowed_hosts
            .iter()
            .filter_map(|h| normalize_host(h))
            .collect();
        Self {
            any_origin: origins.iter().any(|o| o == "*"),
            origins: RwLock::new(origins),
            any_host: hosts.iter().any(|h| h == "*"),
            hosts,
        }
    }

    /// Adds the origins pages served by a listener bound to `addr` have:
    /// `http(s)://ADDRESS:PORT`, for a loopback or unspecified address
    /// also the loopback names with that port, and the `allowed_hosts`
    /// names with that port.
    pub fn add_listener(&self, secure: bool, addr: SocketAddr) {
        let ip = addr.ip();
        let mut names: Vec<String> = Vec::new();
        if !ip.is_unspecified() {
            names.push(match ip {
                IpAddr::V4(a) => a.to_string(),
                IpAddr::V6(a) => format!("[{a}]"),
            });
        }
        if ip.is_unspecified() || is_loopback(ip) {
            names.extend(LOOPBACK_NAMES.iter().map(|n| n.to_string()));
        }
        names.extend(self.hosts.iter().filter(|h| *h != "*").cloned());
        let scheme = if secure { "https" } else { "http" };
        let mut origins = self.origins.write().expect("origins lock");
        for n in names {
            if let Some(o) = normalize_origin(&format!("{scheme}://{n}:{}", addr.port())) {
                if !origins.contains(&o) {
                    origins.push(o);
                }
            }
        }
    }

    /// The origins allowed by name (configured and own), `"*"` included.
    pub fn origins(&self) -> Vec<String> {
        self.origins.read().expect("origins lock").clone()
    }

    /// Screens a request that came in on `listener`: `Err` when it is
    /// refused, else the `Origin` to answer with CORS headers (an allowed
    /// one), if any. `upgrade`: a WebSocket upgrade.
    pub fn screen(
        &self,
        listener: Listener,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        upgrade: bool,
    ) -> Result<Option<HeaderValue>, Refusal> {
        // The target's authority: HTTP/2 and HTTP/3 carry it as
        // `:authority`, HTTP/1.1 as `Host`.
        let host = uri
            .authority()
            .map(|a| a.as_str())
            .or_else(|| headers.get(HOST).and_then(|h| h.to_str().ok()));
        if listener.loopback && !self.host_allowed(host) {
            return Err(Refusal::Host);
        }
        let values: Vec<&HeaderValue> = headers.get_all(ORIGIN).iter().collect();
        let Some(first) = values.first() else {
            return Ok(None);
        };
        let allowed = values.iter().all(|v| {
            v.to_str()
                .is_ok_and(|o| self.origin_allowed(listener, o, host))
        });
        if allowed {
            return Ok(Some((*first).clone()));
        }
        let preflight =
            *method == Method::OPTIONS && headers.contains_key(ACCESS_CONTROL_REQUEST_METHOD);
        let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        if upgrade || preflight || !safe {
            Err(Refusal::Origin)
        } else {
            Ok(None)
        }
    }

    fn host_allowed(&self, host: Option<&str>) -> bool {
        // Browsers always send one; a client that does not is no page.
        let Some(host) = host else {
            return true;
        };
        if self.any_host {
            return true;
        }
        let Some((name, _)) = split_host_port(host) else {
            return false;
        };
        let name = name.to_ascii_lowercase();
        let name = name.strip_suffix('.').unwrap_or(&name);
        let literal = name.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = literal.parse::<IpAddr>() {
            // An IP address is no name an attacker's DNS answers for.
            return is_loopback(ip) || self.hosts.iter().any(|h| h == name);
        }
        name == "localhost" || self.hosts.iter().any(|h| h == name)
    }

    fn origin_allowed(&self, listener: Listener, origin: &str, host: Option<&str>) -> bool {
        if self.any_origin {
            return true;
        }
        let Some(origin) = normalize_origin(origin).filter(|o| o != "*") else {
            return false;
        };
        if self.origins.read().expect("origins lock").contains(&origin) {
            return true;
        }
        // The page of the name the request was sent to. On a loopback
        // listener that name passed the Host check; on another, a page
        // whose name was made to resolve to the relay can read it as its
        // own anyway, which is why those listeners need `[auth]`.
        host.and_then(|h| normalize_origin(&format!("{}://{h}", listener.scheme())))
            .is_some_and(|own| own == origin)
    }
}

/// `scheme://host[:port]` in the form browsers send in `Origin`: lowercase,
/// without the scheme's default port or a trailing `/`; `"*"` stays `"*"`.
/// `None` for anything else (a path, a query, user information, `null`).
pub fn normalize_origin(s: &str) -> Option<String> {
    let s = s.trim();
    if s == "*" {
        return Some(s.to_string());
    }
    let s = s.strip_suffix('/').unwrap_or(s);
    let (scheme, authority) = s.split_once("://")?;
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    let authority_ok = !authority.is_empty()
        && authority
            .chars()
            .all(|c| c.is_ascii_graphic() && !"/?#@\\".contains(c));
    if !scheme_ok || !authority_ok {
        return None;
    }
    let scheme = scheme.to_ascii_lowercase();
    let authority = authority.to_ascii_lowercase();
    let (host, port) = split_host_port(&authority)?;
    if host.is_empty() {
        return None;
    }
    let default = match scheme.as_str() {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    };
    Some(match port.filter(|p| Some(*p) != default) {
        Some(p) => format!("{scheme}://{host}:{p}"),
        None => format!("{scheme}://{host}"),
    })
}

/// A host name or IP address (IPv6 in brackets or not) as the `Host` check
/// compares it: lowercase, without a trailing dot, IPv6 in brackets; `"*"`
/// stays `"*"`. `None` for anything else (a port, a scheme, a path).
pub fn normalize_host(s: &str) -> Option<String> {
    let s = s.trim().to_ascii_lowercase();
    if s == "*" {
        return Some(s);
    }
    if let Ok(std::net::IpAddr::V6(a)) = s.trim_start_matches('[').trim_end_matches(']').parse() {
        return Some(format!("[{a}]"));
    }
    let s = s.strip_suffix('.').unwrap_or(&s);
    let ok = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_');
    ok.then(|| s.to_string())
}

/// `host[:port]` or `[v6][:port]` into the host (brackets kept) and port;
/// `None` when the port is not one.
fn split_host_port(a: &str) -> Option<(&str, Option<u16>)> {
    if a.starts_with('[') {
        let end = a.find(']')?;
        let (host, rest) = a.split_at(end + 1);
        return match rest {
            "" => Some((host, None)),
            p => Some((host, Some(p.strip_prefix(':')?.parse().ok()?))),
        };
    }
    match a.rsplit_once(':') {
        Some((host, port)) => Some((host, Some(port.parse().ok()?))),
        None => Some((a, None)),
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v| v.is_loopback()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOPBACK: Listener = Listener {
        secure: false,
        loopback: true,
    };
    const PUBLIC: Listener = Listener {
        secure: false,
        loopback: false,
    };

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn screen(
        p: &OriginPolicy,
        l: Listener,
        method: Method,
        pairs: &[(&'static str, &str)],
    ) -> Result<Option<HeaderValue>, Refusal> {
        p.screen(
            l,
            &method,
            &Uri::from_static("/v1/t/x"),
            &headers(pairs),
            false,
        )
    }

    fn policy(origins: &[&str], hosts: &[&str]) -> OriginPolicy {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let p = OriginPolicy::new(&s(origins), &s(hosts));
        p.add_listener(false, "127.0.0.1:8080".parse().unwrap());
        p.add_listener(true, "127.0.0.1:8443".parse().unwrap());
        p
    }

    #[test]
    fn origins_are_normalized_as_browsers_send_them() {
        let n = |s| normalize_origin(s);
        assert_eq!(
            n("https://App.Example/").as_deref(),
            Some("https://app.example")
        );
        assert_eq!(
            n("https://a.example:443").as_deref(),
            Some("https://a.example")
        );
        assert_eq!(
            n("http://a.example:80").as_deref(),
            Some("http://a.example")
        );
        assert_eq!(
            n("http://a.example:443").as_deref(),
            Some("http://a.example:443")
        );
        assert_eq!(n("http://[::1]:8080").as_deref(), Some("http://[::1]:8080"));
        assert_eq!(
            n("chrome-extension://abcdef").as_deref(),
            Some("chrome-extension://abcdef")
        );
        assert_eq!(n("*").as_deref(), Some("*"));
        for bad in [
            "null",
            "app.example",
            "https://",
            "https://a.example/path",
            "https://a.example?q",
            "https://u@a.example",
            "https://a.example:port",
            "https://a.example:99999",
            "1http://a.example",
            "https://a .example",
        ] {
            assert_eq!(n(bad), None, "{bad}");
        }
        assert_eq!(normalize_host("Relay.LAN.").as_deref(), Some("relay.lan"));
        assert_eq!(normalize_host("::1").as_deref(), Some("[::1]"));
        for bad in ["relay.lan:8080", "http://relay.lan", "a/b", ""] {
            assert_eq!(normalize_host(bad), None, "{bad}");
        }
    }

    #[test]
    fn own_origins_of_each_listener() {
        let p = OriginPolicy::new(&[], &["relay.lan".into()]);
        p.add_listener(false, "127.0.0.1:8080".parse().unwrap());
        p.add_listener(true, "0.0.0.0:443".parse().unwrap());
        p.add_listener(true, "[2001:db8::1]:8443".parse().unwrap());
        assert_eq!(
            p.origins(),
            [
                "http://127.0.0.1:8080",
                "http://localhost:8080",
                "http://[::1]:8080",
                "http://relay.lan:8080",
                "https://localhost",
                "https://127.0.0.1",
                "https://[::1]",
                "https://relay.lan",
                "https://[2001:db8::1]:8443",
                "https://relay.lan:8443",
            ]
        );
    }

    #[test]
    fn state_changing_requests_and_upgrades_need_an_allowed_origin() {
        let p = policy(&["https://app.example"], &[]);
        let host = ("host", "127.0.0.1:8080");
        for m in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            // No Origin: not a browser's cross-site request.
            assert_eq!(screen(&p, LOOPBACK, m.clone(), &[host]), Ok(None));
            assert_eq!(
                screen(
                    &p,
                    LOOPBACK,
                    m.clone(),
                    &[host, ("origin", "https://evil.example")]
                ),
                Err(Refusal::Origin),
                "{m}"
            );
            for own in [
                "http://127.0.0.1:8080",
                "http://localhost:8080",
                "https://localhost:8443",
                "https://app.example",
                "https://APP.example:443",
            ] {
                let r = screen(&p, LOOPBACK, m.clone(), &[host, ("origin", own)]);
                assert_eq!(r.unwrap().unwrap(), own, "{m} {own}");
            }
            for foreign in [
                "null",
                "http://127.0.0.1:9999",
                "http://localhost",
                "https://app.example:8443",
                "http://app.example",
            ] {
                let r = screen(&p, LOOPBACK, m.clone(), &[host, ("origin", foreign)]);
                assert_eq!(r, Err(Refusal::Origin), "{m} {foreign}");
            }
        }
        // A cross-origin GET is served, without CORS.
        let r = screen(
            &p,
            LOOPBACK,
            Method::GET,
            &[host, ("origin", "https://evil.example")],
        );
        assert_eq!(r, Ok(None));
        // Its preflight and an upgrade are not.
        let pre = [
            host,
            ("origin", "https://evil.example"),
            ("access-control-request-method", "POST"),
        ];
        assert_eq!(
            screen(&p, LOOPBACK, Method::OPTIONS, &pre),
            Err(Refusal::Origin)
        );
        let h = headers(&[host, ("origin", "https://evil.example")]);
        let uri = Uri::from_static("/");
        assert_eq!(
            p.screen(LOOPBACK, &Method::GET, &uri, &h, true),
            Err(Refusal::Origin)
        );
        // One foreign value among several is enough to refuse.
        let two = [
            host,
            ("origin", "https://app.example"),
            ("origin", "https://evil.example"),
        ];
        assert_eq!(
            screen(&p, LOOPBACK, Method::POST, &two),
            Err(Refusal::Origin)
        );
    }

    #[test]
    fn the_page_of_the_requested_host_is_same_origin() {
        let p = policy(&[], &[]);
        let r = screen(
            &p,
            PUBLIC,
            Method::POST,
            &[
                ("host", "relay.example:8080"),
                ("origin", "http://relay.example:8080"),
            ],
        );
        assert!(r.unwrap().is_some());
        let r = screen(
            &p,
            PUBLIC,
            Method::POST,
            &[
                ("host", "relay.example:8080"),
                ("origin", "https://relay.example:8080"),
            ],
        );
        assert_eq!(r, Err(Refusal::Origin), "another scheme is another origin");
        let secure = Listener {
            secure: true,
            loopback: false,
        };
        let r = screen(
            &p,
            secure,
            Method::POST,
            &[
                ("host", "relay.example"),
                ("origin", "https://relay.example"),
            ],
        );
        assert!(r.unwrap().is_some());
    }

    #[test]
    fn any_origin() {
        let p = policy(&["*"], &[]);
        let r = screen(
            &p,
            LOOPBACK,
            Method::POST,
            &[
                ("host", "localhost:8080"),
                ("origin", "https://evil.example"),
            ],
        );
        assert_eq!(r.unwrap().unwrap(), "https://evil.example");
    }

    #[test]
    fn loopback_listeners_answer_only_for_their_names() {
        let p = policy(&[], &["relay.lan"]);
        for ok in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "127.1.2.3:8080",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:8080",
            "localhost:8080",
            "LOCALHOST.:8080",
            "relay.lan:8080",
            "Relay.Lan",
        ] {
            assert_eq!(
                screen(&p, LOOPBACK, Method::GET, &[("host", ok)]),
                Ok(None),
                "{ok}"
            );
        }
        for bad in [
            "evil.example:8080",
            "evil.example",
            "localhost.evil.example:8080",
            "0.0.0.0:8080",
            "192.168.1.10:8080",
            "localhost:http",
            "",
        ] {
            let r = screen(&p, LOOPBACK, Method::GET, &[("host", bad)]);
            assert_eq!(r, Err(Refusal::Host), "{bad:?}");
        }
        // The refusal comes first: a rebinding page is same-origin with the
        // name it sends.
        let r = screen(
            &p,
            LOOPBACK,
            Method::POST,
            &[
                ("host", "evil.example:8080"),
                ("origin", "http://evil.example:8080"),
            ],
        );
        assert_eq!(r, Err(Refusal::Host));
        // HTTP/2's :authority.
        let h = HeaderMap::new();
        let uri = Uri::from_static("http://evil.example:8080/v1/time");
        assert_eq!(
            p.screen(LOOPBACK, &Method::GET, &uri, &h, false),
            Err(Refusal::Host)
        );
        // No Host: no browser.
        assert_eq!(screen(&p, LOOPBACK, Method::GET, &[]), Ok(None));
        // Other listeners answer for any name.
        let r = screen(&p, PUBLIC, Method::GET, &[("host", "evil.example:8080")]);
        assert_eq!(r, Ok(None));
        // "*": any name.
        let any = policy(&[], &["*"]);
        let r = screen(
            &any,
            LOOPBACK,
            Method::GET,
            &[("host", "evil.example:8080")],
        );
        assert_eq!(r, Ok(None));
    }
}
