//! Bad input closes only the offending session, with PROTOCOL_VIOLATION,
//! while a concurrent healthy session keeps receiving.

use quichub_testkit as common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use common::{close_code, within, TestRelay};
use moqt::coding::put_vi64;
use moqt::message::{Message, Publish};
use moqt::session::make_setup;
use moqt::{FullTrackName, Parameters};
use quichub_client::{SubscribeOptions, SubscriptionEvent, TrackMode};

const PROTOCOL_VIOLATION: u64 = 0x3;

fn setup_bytes() -> Bytes {
    Message::Setup(make_setup("bad-client", Some("127.0.0.1"), Some("/test"))).to_bytes()
}

/// Starts a publisher sending a datagram every 5 ms and a healthy subscriber
/// counting them; returns the count.
async fn healthy_flow(relay: &TestRelay) -> Arc<AtomicU64> {
    let publisher = relay.client("moqt").await;
    let track = publisher
        .create_track(FullTrackName::new("ok", "beat"), 1, TrackMode::Push)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _keep = &publisher;
        for n in 0.. {
            track.send_datagram(n, 0, Bytes::from_static(b"beat"));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let sub = relay.client("https").await;
    let mut s = sub
        .subscribe(
            FullTrackName::new("ok", "beat"),
            SubscribeOptions::default(),
        )
        .await
        .unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        let _keep = sub;
        while let Some(ev) = s.next().await {
            if let SubscriptionEvent::Object(_) = ev {
                c.fetch_add(1, Relaxed);
            }
        }
    });
    count
}

async fn still_flowing(count: &AtomicU64) {
    let before = count.load(Relaxed);
    within(5, async {
        while count.load(Relaxed) < before + 20 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Opens a raw session, sends SETUP, then `bad`; asserts the relay closes it
/// with PROTOCOL_VIOLATION.
async fn expect_violation<F, Fut>(relay: &TestRelay, bad: F)
where
    F: FnOnce(quichub_net::Session, quichub_net::SendStream) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let s = relay.raw("moqt").await;
    let mut ctl = s.open_uni().await.unwrap();
    ctl.write_all(&setup_bytes()).await.unwrap();
    bad(s.clone(), ctl).await;
    let err = within(5, s.closed()).await;
    assert_eq!(close_code(&err), Some(PROTOCOL_VIOLATION), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_closes_only_that_session() {
    let relay = TestRelay::start().await;
    let count = healthy_flow(&relay).await;
    still_flowing(&count).await;

    // 1. Garbage on the control stream (a GOAWAY whose body is not a GOAWAY).
    expect_violation(&relay, |_, mut ctl| async move {
        ctl.write_all(&[0x10, 0x00, 0x03, 0xff, 0xff, 0xff])
            .await
            .unwrap();
        std::mem::forget(ctl);
    })
    .await;
    still_flowing(&count).await;

    // 2. An oversized length: a namespace field of 5000 bytes (limit 4096).
    expect_violation(&relay, |s, ctl| async move {
        let mut body = BytesMut::new();
        put_vi64(&mut body, 0); // request id
        put_vi64(&mut body, 1); // one namespace field
        put_vi64(&mut body, 5000);
        body.put_bytes(b'a', 5000);
        put_vi64(&mut body, 0); // empty track name
        put_vi64(&mut body, 0); // no parameters
        let mut msg = BytesMut::new();
        put_vi64(&mut msg, 0x3);
        msg.put_u16(body.len() as u16);
        msg.extend_from_slice(&body);
        let (mut send, recv) = s.open_bi().await.unwrap();
        send.write_all(&msg).await.unwrap();
        std::mem::forget((send, recv, ctl));
    })
    .await;
    still_flowing(&count).await;

    // 3. An unknown message type on the control stream.
    expect_violation(&relay, |_, mut ctl| async move {
        ctl.write_all(&[0x55, 0x00, 0x00]).await.unwrap();
        std::mem::forget(ctl);
    })
    .await;
    still_flowing(&count).await;

    // 4. A truncated object: the subgroup stream ends inside an object.
    expect_violation(&relay, |s, ctl| async move {
        let (mut send, recv) = s.open_bi().await.unwrap();
        let publish = Message::Publish(Publish {
            request_id: 0,
            track: FullTrackName::new("bad", "truncated"),
            track_alias: 7,
            params: Parameters::default(),
            properties: vec![],
        });
        send.write_all(&publish.to_bytes()).await.unwrap();
        let mut data = s.open_uni().await.unwrap();
        // SUBGROUP_HEADER type 0x10: alias 7, group 0, priority 0; then an
        // object promising 100 bytes and carrying 10.
        data.write_all(&[0x10, 7, 0, 0, 0, 100]).await.unwrap();
        data.write_all(&[1u8; 10]).await.unwrap();
        data.finish().unwrap();
        std::mem::forget((send, recv, ctl, data));
    })
    .await;
    still_flowing(&count).await;

    // 5. A second SETUP on the control stream.
    expect_violation(&relay, |_, mut ctl| async move {
        ctl.write_all(&setup_bytes()).await.unwrap();
        std::mem::forget(ctl);
    })
    .await;
    still_flowing(&count).await;

    // 6. A second control stream (another SETUP on a new stream).
    expect_violation(&relay, |s, ctl| async move {
        let mut c2 = s.open_uni().await.unwrap();
        c2.write_all(&setup_bytes()).await.unwrap();
        std::mem::forget((ctl, c2));
    })
    .await;
    still_flowing(&count).await;

    // 7. A request stream opened with a message that cannot open one.
    expect_violation(&relay, |s, ctl| async move {
        let (mut send, recv) = s.open_bi().await.unwrap();
        send.write_all(&Message::RequestOk(Default::default()).to_bytes())
            .await
            .unwrap();
        std::mem::forget((send, recv, ctl));
    })
    .await;
    still_flowing(&count).await;

    assert!(relay.relay.metrics.protocol_violations.load(Relaxed) >= 7);
}

/// A Request ID with the wrong parity closes the session with INVALID_REQUEST_ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_request_id_parity() {
    let relay = TestRelay::start().await;
    let s = relay.raw("moqt").await;
    let mut ctl = s.open_uni().await.unwrap();
    ctl.write_all(&setup_bytes()).await.unwrap();
    let (mut send, _recv) = s.open_bi().await.unwrap();
    let m = Message::Subscribe(moqt::message::Subscribe {
        request_id: 1,
        track: FullTrackName::new("a", "b"),
        params: Parameters::default(),
    });
    send.write_all(&m.to_bytes()).await.unwrap();
    let err = within(5, s.closed()).await;
    assert_eq!(close_code(&err), Some(0x4), "{err}");
}

/// A client of draft 14 or 16 opens its session with CLIENT_SETUP (0x20) on
/// a bidirectional stream, over WebTransport (where the CONNECT does not
/// name the draft): told VERSION_NEGOTIATION_FAILED, not PROTOCOL_VIOLATION,
/// and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_drafts_client_setup_is_refused_as_such() {
    let relay = TestRelay::start().await;
    let s = relay.raw("https").await;
    let (mut send, _recv) = s.open_bi().await.unwrap();
    // Draft-14 CLIENT_SETUP: type 0x20, 16-bit length, one version
    // (0xff00000e), no parameters.
    let mut body = BytesMut::new();
    put_vi64(&mut body, 1);
    put_vi64(&mut body, 0xff00_000e);
    put_vi64(&mut body, 0);
    let mut msg = BytesMut::new();
    put_vi64(&mut msg, 0x20);
    msg.put_u16(body.len() as u16);
    msg.extend_from_slice(&body);
    send.write_all(&msg).await.unwrap();
    let err = within(5, s.closed()).await;
    assert_eq!(
        close_code(&err),
        Some(
            moqt::SessionErrorCode::VersionNegotiationFailed
                .code()
                .into()
        ),
        "{err}"
    );
    assert!(relay
        .relay
        .metrics
        .render()
        .contains("quichub_sessions_refused_total{limit=\"draft\"} 1"));
}

/// Draft-16 CLIENT_SETUP: no versions; MAX_REQUEST_ID 100, PATH `/test`.
fn client_setup_16() -> Bytes {
    use moqt::legacy::control::Control;
    use moqt::KeyValue;
    Control::ClientSetup {
        versions: vec![],
        options: vec![KeyValue::bytes(1, "/test"), KeyValue::int(2, 100)],
    }
    .to_bytes(moqt::legacy::Draft::D16)
    .unwrap()
}

/// Bad input from a draft-16 peer (through the relay's translating bridge)
/// closes that session with the draft's code and nothing else: the healthy
/// draft-18 flow keeps going, and the session is counted by draft.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_legacy_input_closes_only_that_session() {
    let relay = TestRelay::start().await;
    let count = healthy_flow(&relay).await;
    still_flowing(&count).await;

    // 1. An unknown message type after CLIENT_SETUP.
    let s = relay.raw_alpn("moqt-16").await;
    let (mut send, _recv) = s.open_bi().await.unwrap();
    send.write_all(&client_setup_16()).await.unwrap();
    send.write_all(&[0x3f, 0x00, 0x00]).await.unwrap();
    let err = within(5, s.closed()).await;
    assert_eq!(close_code(&err), Some(PROTOCOL_VIOLATION), "{err}");
    still_flowing(&count).await;

    // 2. A length that runs past the message (UNSUBSCRIBE with two bytes
    //    where the payload holds one varint).
    let s = relay.raw_alpn("moqt-16").await;
    let (mut send, _recv) = s.open_bi().await.unwrap();
    send.write_all(&client_setup_16()).await.unwrap();
    send.write_all(&[0x0a, 0x00, 0x02, 0x04, 0x00])
        .await
        .unwrap();
    let err = within(5, s.closed()).await;
    assert_eq!(close_code(&err), Some(PROTOCOL_VIOLATION), "{err}");

    // 3. A request with the server's Request ID parity.
    let s = relay.raw_alpn("moqt-16").await;
    let (mut send, _recv) = s.open_bi().await.unwrap();
    send.write_all(&client_setup_16()).await.unwrap();
    let sub =
        moqt::legacy::control::Control::Request(Message::Subscribe(moqt::message::Subscribe {
            request_id: 1,
            track: FullTrackName::new("ok", "beat"),
            params: Parameters::default(),
        }));
    send.write_all(&sub.to_bytes(moqt::legacy::Draft::D16).unwrap())
        .await
        .unwrap();
    let err = within(5, s.closed()).await;
    assert_eq!(
        close_code(&err),
        Some(moqt::SessionErrorCode::InvalidRequestId.code().into()),
        "{err}"
    );

    // 4. Something other than CLIENT_SETUP first.
    let s = relay.raw_alpn("moqt-16").await;
    let (mut send, _recv) = s.open_bi().await.unwrap();
    send.write_all(&sub.to_bytes(moqt::legacy::Draft::D16).unwrap())
        .await
        .unwrap();
    let err = within(5, s.closed()).await;
    assert_eq!(close_code(&err), Some(PROTOCOL_VIOLATION), "{err}");

    // 5. A garbage data stream (a stream type that does not exist).
    let s = relay.raw_alpn("moqt-16").await;
    let (mut send, _recv) = s.open_bi().await.unwrap();
    send.write_all(&client_setup_16()).await.unwrap();
    let mut data = s.open_uni().await.unwrap();
    data.write_all(&[0x3f, 1, 2, 3]).await.unwrap();
    let err = within(5, s.closed()).await;
    assert_eq!(close_code(&err), Some(PROTOCOL_VIOLATION), "{err}");

    still_flowing(&count).await;
    let metrics = relay.relay.metrics.render();
    assert!(
        metrics.contains("quichub_legacy_sessions_total{draft=\"16\"} 5"),
        "{metrics}"
    );
}

/// A draft-14 client whose CLIENT_SETUP offers no version the relay serves
/// is told VERSION_NEGOTIATION_FAILED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_14_client_without_a_served_version_is_refused() {
    use moqt::legacy::control::Control;
    let relay = TestRelay::start().await;
    let s = relay.raw_alpn("moq-00").await;
    let (mut send, _recv) = s.open_bi().await.unwrap();
    let setup = Control::ClientSetup {
        versions: vec![0xff00_000c],
        options: vec![],
    };
    send.write_all(&setup.to_bytes(moqt::legacy::Draft::D14).unwrap())
        .await
        .unwrap();
    let err = within(5, s.closed()).await;
    assert_eq!(
        close_code(&err),
        Some(
            moqt::SessionErrorCode::VersionNegotiationFailed
                .code()
                .into()
        ),
        "{err}"
    );
}

/// A draft-16 peer that never sends CLIENT_SETUP is closed by the relay's
/// SETUP timeout, as a draft-18 one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_legacy_peer_is_closed_by_the_setup_timeout() {
    let relay = TestRelay::with_config(quichub_relay::config::Config {
        setup_timeout_ms: 300,
        ..Default::default()
    })
    .await;
    let s = relay.raw_alpn("moqt-16").await;
    let err = within(5, s.closed()).await;
    assert_eq!(
        close_code(&err),
        Some(moqt::SessionErrorCode::ControlMessageTimeout.code().into()),
        "{err}"
    );
}

/// A draft-16 peer may have as many requests open through the bridge as the
/// relay grants request streams: past that, EXCESSIVE_LOAD (TIMEOUT, in
/// draft 16's codes) for the request,
/// and the session stays up (the bridge never waits for stream credit with
/// the peer's control stream unread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_peer_past_the_request_limit_gets_excessive_load() {
    use moqt::legacy::control::{Control, LegacyFrameReader};
    use moqt::legacy::Draft;
    let quic = quichub_net::QuicConfig {
        max_concurrent_bidi_streams: 4,
        ..Default::default()
    };
    let relay = TestRelay::with_quic(Default::default(), quic).await;
    let s = relay.raw_alpn("moqt-16").await;
    let (mut send, mut recv) = s.open_bi().await.unwrap();
    send.write_all(&client_setup_16()).await.unwrap();
    // Six PUBLISH_NAMESPACEs: each keeps its request stream to the relay
    // open for as long as the namespace is published.
    for i in 0..6u64 {
        let pn = Control::Request(Message::PublishNamespace(moqt::message::NamespaceRequest {
            request_id: 2 * i,
            namespace: moqt::TrackNamespace::from_path(&format!("limit/{i}")),
            params: Parameters::default(),
        }));
        send.write_all(&pn.to_bytes(Draft::D16).unwrap())
            .await
            .unwrap();
    }
    let mut frames = LegacyFrameReader::new(Draft::D16);
    let mut refused = Vec::new();
    within(5, async {
        while refused.len() < 2 {
            let chunk = recv.read_chunk(4096).await.unwrap().unwrap();
            frames.push(&chunk);
            while let Some(m) = frames.next().unwrap() {
                if let Control::Reply {
                    request_id,
                    msg: Message::RequestError(e),
                    ..
                } = m
                {
                    // Draft 16 has no EXCESSIVE_LOAD: its nearest is TIMEOUT.
                    if e.code == moqt::error::request_error::TIMEOUT {
                        refused.push(request_id);
                    }
                }
            }
        }
    })
    .await;
    refused.sort();
    assert_eq!(refused, [8, 10]);
    assert!(s.close_reason().is_none(), "the session stays up");
}

/// moq-lite peers (through the lite bridge) as an attacker would be one:
/// a stream of an unknown type loses only that stream, and the session
/// then serves a SUBSCRIBE; a message longer than the bridge accepts closes
/// that session with PROTOCOL_VIOLATION; the healthy flow goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_moq_lite_closes_only_that_session() {
    let relay = TestRelay::start().await;
    let count = healthy_flow(&relay).await;
    still_flowing(&count).await;

    // An unknown bidi stream type: refused (reset), the session goes on.
    let s = relay.raw_alpn("moq-lite-04").await;
    let (mut send, mut recv) = s.open_bi().await.unwrap();
    send.write_all(&[0x3f, 0x01, 0x00]).await.unwrap();
    assert!(within(5, recv.read_chunk(64)).await.is_err());
    // ... and a SUBSCRIBE to the healthy track is answered (SUBSCRIBE_OK:
    // type 0, then its body).
    let (mut send, mut recv) = s.open_bi().await.unwrap();
    let mut sub = BytesMut::new();
    moqt::legacy::varint::put_varint(&mut sub, moqt::lite::stream::SUBSCRIBE);
    moqt::lite::message::Subscribe {
        id: 0,
        broadcast: "ok".into(),
        track: "beat".into(),
        priority: 128,
        max_age_ms: None,
        start_group: None,
        end_group: None,
        start_frame: 0,
        end_frame: None,
    }
    .encode(moqt::lite::Version::Lite04, &mut sub);
    send.write_all(&sub).await.unwrap();
    let first = within(5, recv.read_chunk(64)).await.unwrap().unwrap();
    assert_eq!(
        first.first(),
        Some(&0x00),
        "SUBSCRIBE_OK expected: {first:?}"
    );
    assert!(s.close_reason().is_none());
    still_flowing(&count).await;

    // A SUBSCRIBE whose length is past the bridge's limit (64 KiB).
    let s = relay.raw_alpn("moq-lite-04").await;
    let (mut send, _recv) = s.open_bi().await.unwrap();
    let mut huge = BytesMut::new();
    moqt::legacy::varint::put_varint(&mut huge, moqt::lite::stream::SUBSCRIBE);
    moqt::legacy::varint::put_varint(&mut huge, 1 << 20);
    huge.put_bytes(b'a', 1024);
    send.write_all(&huge).await.unwrap();
    let err = within(5, s.closed()).await;
    assert_eq!(close_code(&err), Some(PROTOCOL_VIOLATION), "{err}");
    still_flowing(&count).await;
}
