//! Sessions whose transport does not name their draft (WebTransport without
//! a subprotocol, ALPN `moq-00`), and the deviations of widely used peers
//! that the relay accepts (`crates/moqt/INTEROP.md`), with hand-made bytes:
//! the real peers (moq-clock, aiomoqt) run in `tests/interop`.

use quichub_testkit as common;

use std::time::Duration;

use bytes::Bytes;
use common::{close_code, within, TestRelay};
use moqt::legacy::control::{Control, LegacyFrameReader};
use moqt::legacy::{Draft, VERSION_D14};
use moqt::message::{Message, NamespaceRequest, Setup, Subscribe};
use moqt::{FullTrackName, KeyValue, SessionErrorCode, TrackNamespace};
use quichub_client::{SubscribeOptions, SubscriptionEvent, TrackMode};
use quichub_net::io::MessageReader;

/// A CLIENT_SETUP as drafts 14 and moq-lite-01/02 write it, offering
/// `versions`, granting 100 Request IDs.
fn client_setup(versions: Vec<u64>) -> Bytes {
    Control::ClientSetup {
        versions,
        options: vec![KeyValue::int(2, 100)],
    }
    .to_bytes(Draft::D14)
    .unwrap()
}

/// The relay's closing code and reason.
async fn closed(s: &quichub_net::Session) -> (u64, String) {
    let e = within(5, s.closed()).await;
    let (code, reason) = e.application_close().unwrap_or_else(|| panic!("{e}"));
    (code.into(), reason)
}

fn metric(relay: &TestRelay, line: &str) -> bool {
    relay.relay.metrics.render().lines().any(|l| l == line)
}

/// A draft-14 client over WebTransport that offers no subprotocol (draft
/// 14 negotiated in CLIENT_SETUP alone): the relay does not speak first,
/// reads its CLIENT_SETUP, and bridges it as it does `moq-00`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_14_client_without_subprotocol_is_bridged() {
    let relay = TestRelay::start().await;
    let s = relay.raw_webtransport(&[]).await;
    let (mut send, mut recv) = s.open_bi().await.unwrap();
    // Draft 14 only, as aiomoqt offers (with moq-lite listed first, as
    // moq-net lists it, the client's first choice would win).
    send.write_all(&client_setup(vec![0xff00_000c, VERSION_D14]))
        .await
        .unwrap();
    let ns = Control::Request(Message::PublishNamespace(NamespaceRequest {
        request_id: 0,
        namespace: TrackNamespace::from_path("bare/14"),
        params: Default::default(),
    }));
    send.write_all(&ns.to_bytes(Draft::D14).unwrap())
        .await
        .unwrap();
    let mut frames = LegacyFrameReader::new(Draft::D14);
    let mut got = Vec::new();
    within(5, async {
        while got.len() < 2 {
            let chunk = recv.read_chunk(4096).await.unwrap().unwrap();
            frames.push(&chunk);
            while let Some(m) = frames.next().unwrap() {
                got.push(m);
            }
        }
    })
    .await;
    assert!(
        matches!(
            &got[0],
            Control::ServerSetup {
                version: Some(VERSION_D14),
                ..
            }
        ),
        "{got:?}"
    );
    assert!(
        matches!(
            &got[1],
            Control::Reply {
                request_id: 0,
                msg: Message::RequestOk(_),
                ..
            }
        ),
        "{got:?}"
    );
    // Nothing came on a unidirectional stream first: a draft-14 client
    // takes the relay's draft-18 SETUP stream for a data stream it cannot
    // read (the case this is for).
    assert!(
        tokio::time::timeout(Duration::from_millis(200), s.accept_uni())
            .await
            .is_err()
    );
    assert!(metric(
        &relay,
        "quichub_legacy_sessions_total{draft=\"14\"} 1"
    ));
    // The namespace reached the relay's core, as from any draft.
    let watcher = relay.client("moqt").await;
    let mut w = watcher
        .subscribe_namespace(TrackNamespace::from_path("bare"))
        .await
        .unwrap();
    assert_eq!(
        within(5, w.next()).await,
        Some(Message::Namespace(TrackNamespace::from_path("14")))
    );
}

/// A draft-18 client that offers no subprotocol (an older browser): its
/// SETUP stream comes first, and the session is draft 18.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_18_client_without_subprotocol_is_served_as_before() {
    let relay = TestRelay::start().await;
    // SETUP first, as clients do.
    let s = relay.raw_webtransport(&[]).await;
    let ctl = send_setup(&s).await;
    let relays = within(5, s.accept_uni()).await.unwrap();
    let mut r = MessageReader::new(relays, &[]);
    assert!(matches!(within(5, r.next()).await, Ok(Message::Setup(_))));
    let mut answer = send_subscribe_namespace(&s).await;
    assert!(matches!(
        within(5, answer.next()).await,
        Ok(Message::RequestOk(_))
    ));

    // A request may overtake the SETUP stream: it is served all the same
    // (once SETUP is there).
    let s = relay.raw_webtransport(&[]).await;
    let mut answer = send_subscribe_namespace(&s).await;
    let ctl2 = send_setup(&s).await;
    assert!(matches!(
        within(5, answer.next()).await,
        Ok(Message::RequestOk(_))
    ));
    let relays = within(5, s.accept_uni()).await.unwrap();
    let mut r = MessageReader::new(relays, &[]);
    assert!(matches!(within(5, r.next()).await, Ok(Message::Setup(_))));
    assert!(metric(
        &relay,
        "quichub_legacy_sessions_total{draft=\"14\"} 0"
    ));
    std::mem::forget((ctl, ctl2));
}

/// Opens the control stream and writes an empty SETUP.
async fn send_setup(s: &quichub_net::Session) -> quichub_net::SendStream {
    let mut ctl = s.open_uni().await.unwrap();
    ctl.write_all(&Message::Setup(Setup::default()).to_bytes())
        .await
        .unwrap();
    ctl
}

/// Sends SUBSCRIBE_NAMESPACE (Request ID 0); returns the reader of its
/// answers.
async fn send_subscribe_namespace(s: &quichub_net::Session) -> MessageReader {
    let (mut send, recv) = s.open_bi().await.unwrap();
    let m = Message::SubscribeNamespace(NamespaceRequest {
        request_id: 0,
        namespace: TrackNamespace::from_path("nothing/here"),
        params: Default::default(),
    });
    send.write_all(&m.to_bytes()).await.unwrap();
    std::mem::forget(send);
    MessageReader::new(recv, &[])
}

/// A CLIENT_SETUP offering no version served here, over WebTransport
/// without a subprotocol and on ALPN `moq-00`, is refused with
/// VERSION_NEGOTIATION_FAILED, naming what it offered. (moq-lite-01/02,
/// offered the same way, go to the moq-lite bridge: its own tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_versions_in_client_setup_are_refused_by_name() {
    let relay = TestRelay::start().await;
    for s in [
        relay.raw_webtransport(&[]).await,
        relay.raw_alpn("moq-00").await,
    ] {
        let (mut send, _recv) = s.open_bi().await.unwrap();
        send.write_all(&client_setup(vec![0xff00_000c, 0xff00_0010]))
            .await
            .unwrap();
        let (code, reason) = closed(&s).await;
        assert_eq!(
            code,
            u64::from(SessionErrorCode::VersionNegotiationFailed.code())
        );
        assert!(reason.contains("0xff00000c, 0xff000010"), "{reason}");
    }
    assert!(metric(
        &relay,
        "quichub_sessions_refused_total{limit=\"draft\"} 2"
    ));
}

/// A session that never opens a stream is closed at the SETUP timeout,
/// whether or not its transport named the draft.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_session_without_subprotocol_is_closed_at_the_setup_timeout() {
    let relay = TestRelay::with_config(quichub_relay::config::Config {
        setup_timeout_ms: 300,
        ..Default::default()
    })
    .await;
    for s in [
        relay.raw_webtransport(&[]).await,
        relay.raw_alpn("moq-00").await,
    ] {
        let err = within(5, s.closed()).await;
        assert_eq!(
            close_code(&err),
            Some(SessionErrorCode::ControlMessageTimeout.code().into()),
            "{err}"
        );
    }
    assert!(metric(&relay, "quichub_setup_timeouts_total 2"));
}

/// moq-net 0.1 (moq-clock 0.10.21) at draft 18, by its bytes: SETUP with
/// only its implementation name, SUBSCRIBE_NAMESPACE as type 0x11 with
/// Subscribe Options; the relay answers it as SUBSCRIBE_NAMESPACE and sends
/// it no LARGEST_OBJECT, which it cannot read; both counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moq_net_0_1_subscriber_is_served_its_dialect() {
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("clock", "seconds");
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    let _ns = publisher
        .publish_namespace(TrackNamespace::from_path("clock"))
        .await
        .unwrap();
    // An object, seen by a subscriber: the relay has a Largest Location.
    let first = relay.client("moqt").await;
    let mut sub = first
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    let mut w = track.open_subgroup(0, 0).await.unwrap().unwrap();
    w.write(0, Bytes::from_static(b"2026-01-01 00:00:"))
        .await
        .unwrap();
    within(5, async {
        while !matches!(sub.next().await, Some(SubscriptionEvent::Object(_))) {}
    })
    .await;

    let s = relay.raw("moqt").await;
    let mut ctl = s.open_uni().await.unwrap();
    let setup = Setup {
        options: vec![KeyValue::bytes(7, "moq-lite-rs")],
    };
    ctl.write_all(&Message::Setup(setup).to_bytes())
        .await
        .unwrap();
    // SUBSCRIBE_NAMESPACE (0x11): Request ID 0, empty prefix, Options 1.
    let (mut send, recv) = s.open_bi().await.unwrap();
    send.write_all(&[0x11, 0x00, 0x04, 0x00, 0x00, 0x01, 0x00])
        .await
        .unwrap();
    let mut r = MessageReader::new(recv, &[]);
    assert!(matches!(
        within(5, r.next()).await,
        Ok(Message::RequestOk(_))
    ));
    let Ok(Message::Namespace(ns)) = within(5, r.next()).await else {
        panic!("no NAMESPACE")
    };
    assert_eq!(ns, TrackNamespace::from_path("clock"));
    // Its SUBSCRIBE (as moq-net 0.1 writes it, Largest Object filter):
    // SUBSCRIBE_OK without LARGEST_OBJECT.
    let (mut send2, recv2) = s.open_bi().await.unwrap();
    let m = Message::Subscribe(Subscribe {
        request_id: 2,
        track: name,
        params: moqt::Parameters {
            forward: Some(true),
            subscriber_priority: Some(0),
            subscription_filter: Some(moqt::SubscriptionFilter::LargestObject),
            group_order: Some(moqt::GroupOrder::Descending),
            ..Default::default()
        },
    });
    send2.write_all(&m.to_bytes()).await.unwrap();
    let mut r2 = MessageReader::new(recv2, &[]);
    let Ok(Message::SubscribeOk(ok)) = within(5, r2.next()).await else {
        panic!("no SUBSCRIBE_OK")
    };
    assert_eq!(ok.params.largest_object, None);
    // Its alias is its Request ID: it reads a data stream that overtakes
    // SUBSCRIBE_OK under that.
    assert_eq!(ok.track_alias, 2);
    // It drops a subgroup stream that does not start at object 0: the group
    // under way comes from its start (the relay's cache), not after the
    // Largest Object.
    // (The relay's first unidirectional stream is its control stream.)
    let _control = within(5, s.accept_uni()).await.unwrap();
    let mut data = within(5, s.accept_uni()).await.unwrap();
    let bytes = within(5, async {
        let mut got = Vec::new();
        while !got.windows(17).any(|w| w == b"2026-01-01 00:00:") {
            match data.read_chunk(4096).await.unwrap() {
                Some(c) => got.extend_from_slice(&c),
                None => break,
            }
        }
        got
    })
    .await;
    assert!(
        bytes.windows(17).any(|w| w == b"2026-01-01 00:00:"),
        "{bytes:02x?}"
    );
    // A draft-18 peer gets it.
    let other = relay.raw("moqt").await;
    let mut ctl2 = other.open_uni().await.unwrap();
    ctl2.write_all(&Message::Setup(Setup::default()).to_bytes())
        .await
        .unwrap();
    let (mut send3, recv3) = other.open_bi().await.unwrap();
    let m = Message::Subscribe(Subscribe {
        request_id: 0,
        track: FullTrackName::new("clock", "seconds"),
        params: Default::default(),
    });
    send3.write_all(&m.to_bytes()).await.unwrap();
    let mut r3 = MessageReader::new(recv3, &[]);
    let Ok(Message::SubscribeOk(ok)) = within(5, r3.next()).await else {
        panic!("no SUBSCRIBE_OK")
    };
    assert!(ok.params.largest_object.is_some());
    assert!(metric(
        &relay,
        "quichub_interop_deviations_total{peer=\"moq-net\",kind=\"subscribe_namespace_0x11\"} 1"
    ));
    assert!(metric(
        &relay,
        "quichub_interop_deviations_total{peer=\"moq-net\",kind=\"largest_object_withheld\"} 1"
    ));
    assert!(metric(
        &relay,
        "quichub_interop_deviations_total{peer=\"moq-net\",kind=\"current_group_from_start\"} 1"
    ));
    assert!(metric(
        &relay,
        "quichub_interop_deviations_total{peer=\"moq-net\",kind=\"track_alias_is_request_id\"} 1"
    ));
    std::mem::forget((ctl, send, send2, ctl2, send3, w));
}

/// moq-net 0.1 as a publisher answers the relay's SUBSCRIBE with
/// SUBSCRIBE_OK carrying GROUP_ORDER, which draft 18 does not allow there:
/// accepted, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moq_net_0_1_publisher_subscribe_ok_with_group_order() {
    let relay = TestRelay::start().await;
    let s = relay.raw("moqt").await;
    let mut ctl = s.open_uni().await.unwrap();
    let setup = Setup {
        options: vec![KeyValue::bytes(7, "moq-lite-rs")],
    };
    ctl.write_all(&Message::Setup(setup).to_bytes())
        .await
        .unwrap();
    let (mut send, recv) = s.open_bi().await.unwrap();
    let pn = Message::PublishNamespace(NamespaceRequest {
        request_id: 0,
        namespace: TrackNamespace::from_path("pub01"),
        params: Default::default(),
    });
    send.write_all(&pn.to_bytes()).await.unwrap();
    let mut r = MessageReader::new(recv, &[]);
    assert!(matches!(
        within(5, r.next()).await,
        Ok(Message::RequestOk(_))
    ));
    // The relay's SUBSCRIBE arrives once someone subscribes.
    let answer = {
        let s = s.clone();
        tokio::spawn(async move {
            let (mut send, recv) = s.accept_bi().await.unwrap();
            let mut r = MessageReader::new(recv, &[]);
            let Ok(Message::Subscribe(_)) = r.next().await else {
                panic!("no SUBSCRIBE")
            };
            // moq-net 0.1.3's SUBSCRIBE_OK: alias 7, GROUP_ORDER 2.
            send.write_all(&[0x04, 0x00, 0x04, 0x07, 0x01, 0x22, 0x02])
                .await
                .unwrap();
            (send, r)
        })
    };
    let c = relay.client("https").await;
    let subscribed = c
        .subscribe(
            FullTrackName::new("pub01", "t"),
            SubscribeOptions::default(),
        )
        .await;
    assert!(subscribed.is_ok(), "{:?}", subscribed.err());
    let _keep = within(5, answer).await.unwrap();
    assert!(metric(
        &relay,
        "quichub_interop_deviations_total{peer=\"moq-net\",kind=\"subscribe_ok_group_order\"} 1"
    ));
    std::mem::forget((ctl, send));
}

/// @moq/watch 0.4.6 (@moq/net 0.2.8) writes SUBSCRIBER_PRIORITY, a uint8,
/// as a varint: 155 is two bytes, 0x80 0x9b. The SUBSCRIBE it sends for a
/// catalog is taken for what it means, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moq_net_js_uint8_parameters_as_varints() {
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let _track = publisher
        .create_track(
            FullTrackName::new("live/demo", "catalog.json"),
            1,
            TrackMode::Push,
        )
        .await
        .unwrap();
    let s = relay.raw("https").await;
    let mut ctl = s.open_uni().await.unwrap();
    let setup = Setup {
        options: vec![KeyValue::bytes(7, "moq-lite-js")],
    };
    ctl.write_all(&Message::Setup(setup).to_bytes())
        .await
        .unwrap();
    let (mut send, recv) = s.open_bi().await.unwrap();
    // INTEROP.md's bytes: FORWARD 1, SUBSCRIBER_PRIORITY 155 (0x809b),
    // SUBSCRIPTION_FILTER Largest Object, GROUP_ORDER 2.
    let mut m = vec![0x03, 0x00, 0x24, 0x00, 0x02, 0x04];
    m.extend_from_slice(b"live");
    m.push(0x04);
    m.extend_from_slice(b"demo");
    m.push(0x0c);
    m.extend_from_slice(b"catalog.json");
    m.extend_from_slice(&[
        0x04, 0x10, 0x01, 0x10, 0x80, 0x9b, 0x01, 0x01, 0x02, 0x01, 0x02,
    ]);
    assert_eq!(m.len(), 3 + 0x24);
    send.write_all(&m).await.unwrap();
    let mut r = MessageReader::new(recv, &[]);
    assert!(
        matches!(within(5, r.next()).await, Ok(Message::SubscribeOk(_))),
        "SUBSCRIBE answered"
    );
    assert!(metric(
        &relay,
        "quichub_interop_deviations_total{peer=\"@moq/net\",kind=\"uint8_parameters_as_varints\"} 1"
    ));
    assert!(metric(&relay, "quichub_protocol_violations_total 0"));
    std::mem::forget((ctl, send));
}
