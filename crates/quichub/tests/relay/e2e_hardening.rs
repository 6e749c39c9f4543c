//! What an attacker (or a careless client) can make the relay hold: silent
//! connections, stalled SETUPs, data before SETUP, handshake floods; and what a
//! departing client leaves behind.

use quichub_testkit as common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::{close_code, within, TestRelay};
use moqt::data::ObjectDatagram;
use moqt::message::{Message, Publish};
use moqt::session::make_setup;
use moqt::{FullTrackName, Location, Parameters};
use quichub_client::{ClientSession, SubscribeOptions, TrackMode};
use quichub_net::QuicConfig;
use quichub_relay::Config;

const INTERNAL_ERROR: u64 = 0x1;
const CONTROL_MESSAGE_TIMEOUT: u64 = 0x11;

async fn wait_until(secs: u64, mut f: impl FnMut() -> bool) {
    within(secs, async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// Connections that never send CLIENT_SETUP (or stall inside it) take
/// half-open slots, not session slots, and are closed at the setup timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_do_not_take_session_slots() {
    let relay = TestRelay::with_config(Config {
        max_sessions: 2,
        max_half_open_sessions: 4,
        setup_timeout_ms: 800,
        ..Default::default()
    })
    .await;
    let m = relay.relay.metrics.clone();
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(relay.raw("moqt").await);
    }
    // One that starts a SETUP claiming 65 535 bytes and stalls.
    let stalled = relay.raw("moqt").await;
    let mut ctl = stalled.open_uni().await.unwrap();
    let setup = Message::Setup(make_setup("x", Some("127.0.0.1"), Some("/"))).to_bytes();
    let type_len = setup[0].leading_ones() as usize + 1; // a vi64
    ctl.write_all(&setup[..type_len]).await.unwrap();
    ctl.write_all(&[0xff, 0xff, 1, 2, 3]).await.unwrap();
    silent.push(stalled);
    wait_until(5, || m.sessions_half_open.load(Relaxed) == 3).await;

    // With max_sessions = 2, both healthy clients still get in.
    let a = relay.client("moqt").await;
    let b = relay.client("https").await;
    wait_until(5, || m.sessions.load(Relaxed) == 2).await;

    // With a session slot free again, the half-open pool (4) fills and the
    // next connection is closed at once.
    b.shutdown(0, "bye").await;
    wait_until(5, || m.sessions.load(Relaxed) == 1).await;
    silent.push(relay.raw("moqt").await);
    wait_until(5, || m.sessions_half_open.load(Relaxed) == 4).await;
    let refused = relay.raw("moqt").await;
    let e = within(5, refused.closed()).await;
    assert_eq!(close_code(&e), Some(INTERNAL_ERROR), "{e}");
    assert_eq!(m.sessions_refused_half_open.load(Relaxed), 1);

    // At the setup timeout every silent one is closed with CONTROL_MESSAGE_TIMEOUT.
    for s in &silent {
        let e = within(5, s.closed()).await;
        assert_eq!(close_code(&e), Some(CONTROL_MESSAGE_TIMEOUT), "{e}");
    }
    assert_eq!(m.setup_timeouts.load(Relaxed), 4);
    wait_until(5, || m.sessions_half_open.load(Relaxed) == 0).await;
    let b = relay.client("https").await;
    wait_until(5, || m.sessions.load(Relaxed) == 2).await;

    // A third real session finds max_sessions reached and is told so.
    let opts = quichub_client::ConnectOptions {
        timeout: Duration::from_secs(1),
        ..relay.opts()
    };
    let third = ClientSession::connect(&relay.url("moqt"), opts).await;
    assert!(third.is_err());
    assert_eq!(m.sessions_refused_full.load(Relaxed), 1);
    // The healthy ones were never disturbed.
    assert!(a.session().close_reason().is_none());
    assert!(b.session().close_reason().is_none());
    assert_eq!(m.protocol_violations.load(Relaxed), 0);
}

/// Data streams opened before SETUP wait unread; the connection-wide receive
/// window bounds what they can make the relay hold, however many there are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_before_setup_are_bounded_by_the_connection_window() {
    const WINDOW: u64 = 256 << 10;
    let relay = TestRelay::with_quic(
        Config::default(),
        QuicConfig {
            receive_window: WINDOW,
            stream_receive_window: 64 << 10,
            ..Default::default()
        },
    )
    .await;
    let s = relay.raw("moqt").await;
    // 32 subgroup streams of 1 MiB each: 2 MiB would fit their stream windows.
    for _ in 0..32 {
        let mut data = s.open_uni().await.unwrap();
        tokio::spawn(async move {
            let _ = data.write_all(&[0x10, 7, 0, 0]).await;
            let _ = data.write_all(&vec![0u8; 1 << 20]).await;
            std::mem::forget(data);
        });
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let sent = std::ops::Deref::deref(s.quic().unwrap())
        .stats()
        .udp_tx
        .bytes;
    assert!(
        sent < WINDOW + (128 << 10),
        "the client got {sent} bytes onto the wire; the window is {WINDOW}"
    );
    assert!(s.close_reason().is_none(), "still within the setup timeout");
}

/// Above `retry_above_handshakes` a new client must answer a stateless Retry
/// first; real clients do so and connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_is_required_above_the_threshold() {
    let relay = TestRelay::with_quic(
        Config::default(),
        QuicConfig {
            retry_above_handshakes: 0,
            ..Default::default()
        },
    )
    .await;
    let c = relay.client("moqt").await;
    let w = relay.client("https").await;
    assert_eq!(relay.server.stats().retries.load(Relaxed), 2);
    drop((c, w));
}

/// At most `max_connections_per_ip` connections from one address, over
/// every ALPN: the next one is closed as soon as it is accepted (counted),
/// the ones open go on, and once one closes the address may connect again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_address_are_capped() {
    let relay = TestRelay::with_quic(
        Config::default(),
        QuicConfig {
            max_connections_per_ip: 2,
            ..Default::default()
        },
    )
    .await;
    let stats = relay.server.stats();
    let first = relay.client("moqt").await;
    let second = relay.client("https").await;
    for scheme in ["moqt", "https"] {
        let third = within(10, ClientSession::connect(&relay.url(scheme), relay.opts())).await;
        let e = format!("{:#}", third.err().expect("a third connection"));
        // HTTP/3 is served from the ClientHello on, so its connection is
        // closed during the handshake, where the reason does not travel.
        assert!(
            e.contains("too many connections from this address")
                || scheme == "https" && e.contains("closed during the handshake"),
            "{scheme}: {e}"
        );
    }
    assert_eq!(stats.refused_connections_per_ip.load(Relaxed), 2);
    assert!(stats
        .render()
        .contains("quichub_quic_refused_per_ip_total{limit=\"connections\"} 2"));
    assert!(first.session().close_reason().is_none());
    assert!(second.session().close_reason().is_none());
    first.shutdown(0, "bye").await;
    within(10, async {
        loop {
            if ClientSession::connect(&relay.url("moqt"), relay.opts())
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    drop(second);
}

/// A flood of Initials that never complete: past `max_handshakes` further
/// attempts are refused, stalled handshakes end at the handshake timeout, and
/// then real clients connect again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_flood_is_capped_and_times_out() {
    let relay = TestRelay::with_quic(
        Config::default(),
        QuicConfig {
            max_handshakes: 8,
            retry_above_handshakes: 1000,
            handshake_timeout_ms: 600,
            ..Default::default()
        },
    )
    .await;
    let stats = relay.server.stats();
    let mut flood = quichub_net::flood::Flooder::new(relay.addr, b"moqt-18").unwrap();
    for _ in 0..20 {
        flood.send_one().unwrap();
    }
    // The endpoint holds at most 8 handshakes; the rest are refused (by
    // quinn's own queue bound or ours).
    for _ in 0..20 {
        assert!(stats.in_flight() <= 8, "{}", stats.render());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_until(5, || stats.timeouts.load(Relaxed) >= 8).await;
    // Every slot is free again: a real client gets in.
    let c = within(10, ClientSession::connect(&relay.url("moqt"), relay.opts()))
        .await
        .unwrap();
    drop(c);
    drop(flood);
}

/// A datagram that arrives before the PUBLISH naming its alias is held and
/// delivered once the alias is known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagram_before_its_alias_is_kept() {
    let relay = TestRelay::start().await;
    let s = relay.raw("moqt").await;
    let mut ctl = s.open_uni().await.unwrap();
    ctl.write_all(&Message::Setup(make_setup("raw", Some("127.0.0.1"), Some("/"))).to_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut d = BytesMut::new();
    ObjectDatagram {
        track_alias: 9,
        group: 3,
        object_id: 0,
        priority: Some(0),
        properties: Bytes::new(),
        end_of_group: false,
        status: None,
        payload: Bytes::from_static(b"early"),
    }
    .encode(&mut d);
    s.send_datagram(d.freeze()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let name = FullTrackName::new("early", "dg");
    let (mut send, recv) = s.open_bi().await.unwrap();
    let publish = Message::Publish(Publish {
        request_id: 0,
        track: name.clone(),
        track_alias: 9,
        params: Parameters::default(),
        properties: vec![],
    });
    send.write_all(&publish.to_bytes()).await.unwrap();
    wait_until(5, || {
        relay
            .relay
            .find_track(&name)
            .and_then(|e| e.track.largest())
            == Some(Location::new(3, 0))
    })
    .await;
    drop((send, recv, ctl));
}

/// A client that leaves closes its connection: the relay forgets it at once
/// (not at the idle timeout), its namespace goes with it, and nothing counts
/// as a protocol violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn departing_publisher_is_forgotten_at_once() {
    let relay = TestRelay::start().await;
    let m = relay.relay.metrics.clone();
    let publisher = relay.client("moqt").await;
    let ns = publisher
        .publish_namespace(moqt::TrackNamespace::from_strs(&["gone"]))
        .await
        .unwrap();
    let track = publisher
        .create_track(FullTrackName::new("gone", "t"), 1, TrackMode::Push)
        .await
        .unwrap();
    let sub = relay.client("moqt").await;
    wait_until(5, || m.sessions.load(Relaxed) == 2).await;
    publisher.shutdown(0, "bye").await;
    drop((ns, track, publisher));
    wait_until(3, || m.sessions.load(Relaxed) == 1).await;
    let e = within(
        3,
        sub.subscribe(FullTrackName::new("gone", "t"), SubscribeOptions::default()),
    )
    .await
    .err()
    .expect("no publisher any more");
    assert!(!e.to_string().contains("upstream did not answer"), "{e}");
    assert_eq!(m.protocol_violations.load(Relaxed), 0);
}

/// A data stream that does not deliver its type, or its SUBGROUP_HEADER, in
/// time is stopped; the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_stream_headers_are_stopped() {
    let relay = TestRelay::with_config(Config {
        stream_header_timeout_ms: 300,
        ..Default::default()
    })
    .await;
    let m = relay.relay.metrics.clone();
    let s = relay.raw("moqt").await;
    let mut ctl = s.open_uni().await.unwrap();
    ctl.write_all(&Message::Setup(make_setup("raw", Some("127.0.0.1"), Some("/"))).to_bytes())
        .await
        .unwrap();
    // Half a two-byte stream type (a vi64 starting 0b10).
    let mut half_type = s.open_uni().await.unwrap();
    half_type.write_all(&[0x80]).await.unwrap();
    // A subgroup stream type and only the Track Alias of its header.
    let mut half_header = s.open_uni().await.unwrap();
    half_header.write_all(&[0x10, 7]).await.unwrap();
    for stream in [&mut half_type, &mut half_header] {
        let code = within(5, stream.stopped()).await.unwrap();
        assert_eq!(code, Some(moqt::error::reset::CANCELLED));
    }
    assert_eq!(m.stream_header_timeouts.load(Relaxed), 2);
    assert!(s.close_reason().is_none());
    assert_eq!(m.protocol_violations.load(Relaxed), 0);
    drop(ctl);
}
