//! MoQT over WebSocket (QMux framing, subprotocol `qmux-01.moqt-18`) on the
//! HTTP port: a subscriber over WebSocket gets what a QUIC publisher sends
//! (streams and datagrams), a publisher over WebSocket reaches QUIC and
//! WebTransport subscribers, upgrades without the MoQT subprotocol are
//! refused, and a WebSocket session that sends garbage is closed alone.

use quichub_testkit as common;

use std::time::Duration;

use bytes::Bytes;
use common::{test_config, within, TestRelay};
use moqt::{FullTrackName, TrackNamespace};
use quichub_client::{ClientSession, SubscribeOptions, Subscription, SubscriptionEvent, TrackMode};

async fn relay() -> (TestRelay, String) {
    let mut c = test_config();
    c.http.address = "127.0.0.1:0".into();
    let relay = TestRelay::with_hub_config(c).await;
    let http = relay.hub.http_addr().expect("HTTP on");
    (relay, format!("ws://{http}/test"))
}

async fn ws_client(relay: &TestRelay, url: &str) -> ClientSession {
    ClientSession::connect(url, relay.opts()).await.unwrap()
}

async fn next_object(sub: &mut Subscription) -> quichub_client::ReceivedObject {
    within(5, async {
        loop {
            match sub.next().await {
                Some(SubscriptionEvent::Object(o)) => return o,
                Some(_) => {}
                None => panic!("subscription ended"),
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_subscriber_gets_streams_and_datagrams_from_a_quic_publisher() {
    let (relay, ws) = relay().await;
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("ws/live", "cam");
    let track = publisher
        .create_track(name.clone(), 3, TrackMode::Announce)
        .await
        .unwrap();
    let _ns = publisher
        .publish_namespace(TrackNamespace::from_path("ws"))
        .await
        .unwrap();
    let viewer = ws_client(&relay, &ws).await;
    let mut sub = viewer
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    common::until_forwarding(&track).await;
    for g in 0..3u64 {
        let mut w = track.open_subgroup(g, 0).await.unwrap().unwrap();
        for o in 0..4u64 {
            w.write(o, Bytes::from(format!("g{g}o{o}"))).await.unwrap();
        }
        w.finish();
    }
    let mut got = Vec::new();
    while got.len() < 12 {
        let o = next_object(&mut sub).await;
        got.push(String::from_utf8(o.payload.to_vec()).unwrap());
    }
    got.sort();
    let mut want: Vec<String> = (0..3)
        .flat_map(|g| (0..4).map(move |o| format!("g{g}o{o}")))
        .collect();
    want.sort();
    assert_eq!(got, want, "every object of every subgroup stream");

    // Datagrams: QMux carries them reliably over TCP, so none is lost here.
    for o in 0..5u64 {
        assert!(track.send_datagram(10, o, Bytes::from(format!("d{o}"))));
    }
    let mut datagrams = 0;
    while datagrams < 5 {
        let o = next_object(&mut sub).await;
        assert!(o.payload.starts_with(b"d"));
        datagrams += 1;
    }
    let metrics = relay.relay.metrics.render();
    assert!(
        metrics.contains("quichub_websocket_sessions_total{upgrade=\"accepted\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_publisher_reaches_quic_and_webtransport_subscribers() {
    let (relay, ws) = relay().await;
    let publisher = ws_client(&relay, &ws).await;
    let name = FullTrackName::new("wspub", "t");
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    let a = relay.client("moqt").await;
    let b = relay.client("https").await;
    let opts = || SubscribeOptions {
        rendezvous_ms: Some(3000),
        ..Default::default()
    };
    let mut sa = a.subscribe(name.clone(), opts()).await.unwrap();
    let mut sb = b.subscribe(name.clone(), opts()).await.unwrap();
    common::until_forwarding(&track).await;
    let mut w = track.open_subgroup(0, 0).await.unwrap().unwrap();
    w.write(0, Bytes::from_static(b"over tcp")).await.unwrap();
    w.finish();
    assert_eq!(next_object(&mut sa).await.payload, &b"over tcp"[..]);
    assert_eq!(next_object(&mut sb).await.payload, &b"over tcp"[..]);
}

/// Sends a raw HTTP/1.1 request and returns the response head.
async fn raw_http(addr: std::net::SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = within(5, s.read(&mut buf)).await.unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_without_the_moqt_subprotocol_are_refused() {
    let (relay, _) = relay().await;
    let http = relay.hub.http_addr().unwrap();
    let upgrade = |protocol: &str| {
        format!(
            "GET /moq HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{protocol}\r\n"
        )
    };
    // An unreleased moq-lite, another framing, or no subprotocol at all
    // (moq-lite and draft 18 go over QMux: `qmux-0N.…`, or a bare `qmux-0N`).
    for p in [
        "Sec-WebSocket-Protocol: qmux-01.moq-lite-07-wip\r\n",
        "Sec-WebSocket-Protocol: webtransport\r\n",
        "",
    ] {
        let head = raw_http(http, &upgrade(p)).await;
        assert!(head.starts_with("HTTP/1.1 400"), "{head}");
        assert!(
            head.contains("qmux-01.moqt-18"),
            "says what to offer: {head}"
        );
    }
    let head = raw_http(
        http,
        &upgrade("Sec-WebSocket-Protocol: qmux-02.moqt-18, qmux-01.moqt-18\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // The client's first choice that is served.
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-protocol: qmux-02.moqt-18"),
        "{head}"
    );
    // RFC 6455 §1.3's example key and accept value.
    assert!(head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{head}");
    let metrics = relay.relay.metrics.render();
    assert!(
        metrics.contains("quichub_websocket_sessions_total{upgrade=\"refused\"} 3"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_session_that_sends_garbage_is_closed_alone() {
    let (relay, ws) = relay().await;
    let good = ws_client(&relay, &ws).await;
    let name = FullTrackName::new("calm", "t");
    let track = good
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    let sub = relay.client("moqt").await;
    let mut s = sub
        .subscribe(
            name.clone(),
            SubscribeOptions {
                rendezvous_ms: Some(3000),
                ..Default::default()
            },
        )
        .await
        .unwrap();

    // A raw WebSocket session whose control stream starts with an unknown
    // message type: a protocol violation.
    let client = quichub_net::client::Client::new(
        "127.0.0.1:0".parse().unwrap(),
        quichub_client::Verify::Insecure,
    )
    .unwrap();
    let bad = client
        .connect(&url::Url::parse(&ws).unwrap())
        .await
        .unwrap()
        .session;
    let mut control = bad.open_uni().await.unwrap();
    control.write_all(&[0x3f, 0x00, 0x00, 0x00]).await.unwrap();
    let why = within(10, bad.closed()).await;
    // Closed for its protocol violation, with the code (vendor/qmux keeps
    // the first close reason; qmux 0.5.3's teardown replaced it).
    assert_eq!(
        common::close_code(&why),
        Some(moqt::SessionErrorCode::ProtocolViolation.code().into()),
        "{why}"
    );
    assert!(
        relay
            .relay
            .metrics
            .render()
            .contains("quichub_protocol_violations_total 1"),
        "{}",
        relay.relay.metrics.render()
    );

    // The good WebSocket session keeps flowing.
    common::until_forwarding(&track).await;
    let mut w = track.open_subgroup(0, 0).await.unwrap().unwrap();
    w.write(0, Bytes::from_static(b"still here")).await.unwrap();
    w.finish();
    assert_eq!(next_object(&mut s).await.payload, &b"still here"[..]);
}

/// `[http] tls`: the HTTP port over TLS with the relay's certificate, and
/// MoQT over `wss://` on it (pinned here by the certificate's hash).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_on_the_https_port_carries_a_session() {
    let mut c = test_config();
    c.http.tls = "127.0.0.1:0".into();
    let relay = TestRelay::with_hub_config(c).await;
    let https = relay.hub.https_addr().expect("HTTPS on");
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("tls", "t");
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    let viewer = ws_client(&relay, &format!("wss://127.0.0.1:{}/test", https.port())).await;
    let mut sub = viewer
        .subscribe(
            name.clone(),
            SubscribeOptions {
                rendezvous_ms: Some(3000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    common::until_forwarding(&track).await;
    let mut w = track.open_subgroup(0, 0).await.unwrap().unwrap();
    w.write(0, Bytes::from_static(b"over tls")).await.unwrap();
    w.finish();
    assert_eq!(next_object(&mut sub).await.payload, &b"over tls"[..]);

    // A client that does not trust the certificate gets nowhere.
    let mut opts = relay.opts();
    opts.verify = quichub_client::Verify::Fingerprints(vec![vec![0; 32]]);
    let refused =
        ClientSession::connect(&format!("wss://127.0.0.1:{}/test", https.port()), opts).await;
    assert!(refused.is_err());
}

/// A WebSocket that upgrades and then says nothing (no QMux transport
/// parameters, so the relay may open no stream; no SETUP) is closed at the
/// setup timeout, like a QUIC peer that never speaks, and frees its
/// half-open slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_websocket_is_closed_at_the_setup_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = test_config();
    c.http.address = "127.0.0.1:0".into();
    c.relay.setup_timeout_ms = 300;
    c.relay.max_half_open_sessions = 1;
    let relay = TestRelay::with_hub_config(c).await;
    let http = relay.hub.http_addr().unwrap();
    let mut s = tokio::net::TcpStream::connect(http).await.unwrap();
    s.write_all(
        b"GET /silent HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Sec-WebSocket-Protocol: qmux-01.moqt-18\r\n\r\n",
    )
    .await
    .unwrap();
    // Read (the 101, pings, the close) until the relay hangs up.
    let mut buf = vec![0u8; 4096];
    within(5, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    // Its half-open slot is free again: a real session gets in.
    let ws = format!("ws://{http}/test");
    let _ok = within(5, ws_client(&relay, &ws)).await;
}

/// At shutdown a WebSocket session gets GOAWAY and, if it is still there
/// when the drain ends, is closed, as the endpoint's close ends QUIC ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_websocket_sessions_after_the_drain() {
    let mut c = test_config();
    c.http.address = "127.0.0.1:0".into();
    c.relay.goaway_timeout_ms = 300;
    let relay = TestRelay::with_hub_config(c).await;
    let http = relay.hub.http_addr().unwrap();
    let client = quichub_net::client::Client::new(
        "127.0.0.1:0".parse().unwrap(),
        quichub_client::Verify::Insecure,
    )
    .unwrap();
    // A raw session that sends SETUP and then ignores everything (a client
    // that never acts on GOAWAY).
    let s = client
        .connect(&url::Url::parse(&format!("ws://{http}/test")).unwrap())
        .await
        .unwrap()
        .session;
    let mut control = s.open_uni().await.unwrap();
    let setup = moqt::session::make_setup("raw", None, None);
    control
        .write_all(&moqt::message::Message::Setup(setup).to_bytes())
        .await
        .unwrap();
    within(5, async {
        while relay.relay.session_count() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let hub = relay.hub.clone();
    tokio::spawn(async move { hub.shutdown().await });
    within(5, s.closed()).await;
}
