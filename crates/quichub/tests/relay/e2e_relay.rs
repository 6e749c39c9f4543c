//! Relay features end to end: announce/subscribe with one upstream per track,
//! PUBLISH_DONE when a publisher leaves, namespace discovery, SUBSCRIBE_TRACKS,
//! FORWARD=0 and REQUEST_UPDATE, TRACK_STATUS, RENDEZVOUS_TIMEOUT, duplicate
//! subscriptions, request limits, and the metrics endpoint.

use quichub_testkit as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{within, TestRelay};
use moqt::message::Message;
use moqt::{FullTrackName, Location, Parameters, TrackNamespace};
use quichub_client::{SubscribeOptions, Subscription, SubscriptionEvent, TrackMode};
use quichub_relay::Config;

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
async fn announce_then_subscribe_uses_one_upstream_subscription() {
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("live/room1", "cam");
    let track = publisher
        .create_track(name.clone(), 3, TrackMode::Announce)
        .await
        .unwrap();
    let _ns = publisher
        .publish_namespace(TrackNamespace::from_path("live"))
        .await
        .unwrap();

    let a = relay.client("moqt").await;
    let b = relay.client("https").await;
    let mut sa = a
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    let mut sb = b
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    assert_eq!(
        track.subscriptions_served(),
        1,
        "one upstream SUBSCRIBE for two subscribers"
    );
    assert!(track.is_forwarding());
    let mut w = track.open_subgroup(0, 0).await.unwrap().unwrap();
    w.write(0, Bytes::from_static(b"hello")).await.unwrap();
    w.finish();
    assert_eq!(
        next_object(&mut sa).await.payload,
        Bytes::from_static(b"hello")
    );
    assert_eq!(
        next_object(&mut sb).await.payload,
        Bytes::from_static(b"hello")
    );
}

/// PUBLISH_DONE can overtake the last objects of a stream still being
/// written: the relay waits for the streams its Stream Count announces
/// before it ends the track, so nothing sent before the end is lost, in push
/// (PUBLISH) and announce (the relay's upstream SUBSCRIBE) modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_done_waits_for_the_streams_it_counts() {
    for mode in [TrackMode::Push, TrackMode::Announce] {
        let relay = TestRelay::start().await;
        let publisher = relay.client("moqt").await;
        let name = FullTrackName::new(&format!("late-{mode:?}"), "t");
        let track = publisher.create_track(name.clone(), 1, mode).await.unwrap();
        let _ns = match mode {
            TrackMode::Announce => Some(
                publisher
                    .publish_namespace(name.namespace.clone())
                    .await
                    .unwrap(),
            ),
            TrackMode::Push => None,
        };
        let s = relay.client("moqt").await;
        let mut sub = s
            .subscribe(
                name.clone(),
                SubscribeOptions {
                    rendezvous_ms: Some(2000),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        common::until_forwarding(&track).await;
        let mut w = track.open_subgroup(0, 0).await.unwrap().unwrap();
        w.write(0, Bytes::from_static(b"first")).await.unwrap();
        // The end is announced while the stream is still open ...
        track.finish(1).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        // ... and its last object comes after.
        w.write(1, Bytes::from_static(b"last")).await.unwrap();
        w.finish();
        let mut got = Vec::new();
        let status = within(5, async {
            loop {
                match sub.next().await {
                    Some(SubscriptionEvent::Object(o)) => got.push(o.payload),
                    Some(SubscriptionEvent::Done { status, .. }) => return status,
                    Some(_) => {}
                    None => panic!("subscription ended without PUBLISH_DONE"),
                }
            }
        })
        .await;
        assert_eq!(
            got,
            vec![Bytes::from_static(b"first"), Bytes::from_static(b"last")],
            "{mode:?}"
        );
        assert_eq!(status, moqt::error::publish_done::TRACK_ENDED);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_leaving_sends_publish_done() {
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("gone", "t");
    let _track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    let s = relay.client("moqt").await;
    let mut sub = s
        .subscribe(name, SubscribeOptions::default())
        .await
        .unwrap();
    publisher.close(0, "bye");
    let done = within(5, async {
        loop {
            if let Some(SubscriptionEvent::Done { status, .. }) = sub.next().await {
                return status;
            }
        }
    })
    .await;
    assert_eq!(done, moqt::error::publish_done::TRACK_ENDED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_namespace_sees_namespaces_come_and_go() {
    let relay = TestRelay::start().await;
    let watcher = relay.client("moqt").await;
    let mut ns = watcher
        .subscribe_namespace(TrackNamespace::from_path("org"))
        .await
        .unwrap();
    // A second, overlapping prefix in the same session is refused.
    let e = watcher
        .subscribe_namespace(TrackNamespace::from_path("org/a"))
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("0x30"), "{e}");

    let publisher = relay.client("moqt").await;
    let h = publisher
        .publish_namespace(TrackNamespace::from_path("org/a/b"))
        .await
        .unwrap();
    let _other = publisher
        .publish_namespace(TrackNamespace::from_path("elsewhere"))
        .await
        .unwrap();
    match within(5, ns.next()).await {
        Some(Message::Namespace(suffix)) => assert_eq!(suffix, TrackNamespace::from_path("a/b")),
        other => panic!("expected NAMESPACE, got {other:?}"),
    }
    h.withdraw();
    match within(5, ns.next()).await {
        Some(Message::NamespaceDone(suffix)) => {
            assert_eq!(suffix, TrackNamespace::from_path("a/b"))
        }
        other => panic!("expected NAMESPACE_DONE, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_tracks_receives_publish_for_pushed_tracks() {
    let relay = TestRelay::start().await;
    let watcher = relay.client("moqt").await;
    let _st = watcher
        .subscribe_tracks(TrackNamespace::from_path("sensors"), true)
        .await
        .unwrap();
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("sensors/imu", "accel");
    let track = publisher
        .create_track(name.clone(), 0, TrackMode::Push)
        .await
        .unwrap();
    let (got, mut sub) = within(5, watcher.next_publish()).await.unwrap();
    assert_eq!(got, name);
    // Let PUBLISH_OK reach the relay before publishing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(track.send_datagram(0, 0, Bytes::from_static(b"x=1")));
    assert_eq!(
        next_object(&mut sub).await.payload,
        Bytes::from_static(b"x=1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_zero_then_request_update() {
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("fw", "t");
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    let s = relay.client("moqt").await;
    let mut sub = s
        .subscribe(
            name.clone(),
            SubscribeOptions {
                forward: Some(false),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    track.send_datagram(0, 0, Bytes::from_static(b"held"));
    let nothing = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
    assert!(
        nothing.is_err(),
        "FORWARD=0 must not deliver objects: {nothing:?}"
    );
    sub.update(Parameters {
        forward: Some(true),
        ..Default::default()
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    track.send_datagram(1, 0, Bytes::from_static(b"flowing"));
    assert_eq!(
        next_object(&mut sub).await.payload,
        Bytes::from_static(b"flowing")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn track_status_reports_the_largest_location() {
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("ts", "t");
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    for g in 0..3 {
        track.send_datagram(g, 0, Bytes::from_static(b"."));
    }
    let s = relay.client("moqt").await;
    let ok = within(5, async {
        loop {
            let ok = s.track_status(name.clone()).await.unwrap();
            if ok.params.largest_object == Some(Location::new(2, 0)) {
                return ok;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(ok.params.largest_object, Some(Location::new(2, 0)));
    let e = s
        .track_status(FullTrackName::new("nope", "t"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("0x10"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendezvous_timeout_and_does_not_exist() {
    let relay = TestRelay::start().await;
    let s = relay.client("moqt").await;
    let started = Instant::now();
    let e = s
        .subscribe(
            FullTrackName::new("later", "t"),
            SubscribeOptions {
                rendezvous_ms: Some(300),
                ..Default::default()
            },
        )
        .await
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("TIMEOUT (0x2)"),
        "TIMEOUT expected: {e}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "the relay must wait for the rendezvous"
    );
    let e = s
        .subscribe(
            FullTrackName::new("later", "t"),
            SubscribeOptions::default(),
        )
        .await
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("0x10"),
        "DOES_NOT_EXIST expected: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_subscription_and_request_limit() {
    let relay = TestRelay::with_config(Config {
        max_requests_per_session: 2,
        ..Config::default()
    })
    .await;
    // The limit applies to publishers too: two tracks fit in one session, a
    // third needs another session.
    let p1 = relay.client("moqt").await;
    for t in ["a", "b"] {
        p1.create_track(FullTrackName::new("lim", t), 1, TrackMode::Push)
            .await
            .unwrap();
    }
    let e = p1
        .create_track(FullTrackName::new("lim", "x"), 1, TrackMode::Push)
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("0x9"), "{e}");
    let p2 = relay.client("moqt").await;
    p2.create_track(FullTrackName::new("lim", "c"), 1, TrackMode::Push)
        .await
        .unwrap();
    let s = relay.client("moqt").await;
    let _a = s
        .subscribe(FullTrackName::new("lim", "a"), SubscribeOptions::default())
        .await
        .unwrap();
    let e = s
        .subscribe(FullTrackName::new("lim", "a"), SubscribeOptions::default())
        .await
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("0x19"),
        "DUPLICATE_SUBSCRIPTION expected: {e}"
    );
    let _b = s
        .subscribe(FullTrackName::new("lim", "b"), SubscribeOptions::default())
        .await
        .unwrap();
    let e = s
        .subscribe(FullTrackName::new("lim", "c"), SubscribeOptions::default())
        .await
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("0x9"),
        "EXCESSIVE_LOAD expected: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_prometheus_text() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let relay = TestRelay::start().await;
    let listener = quichub_net::metrics_http::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let m = relay.relay.metrics.clone();
    tokio::spawn(quichub_net::metrics_http::serve(
        listener,
        Arc::new(move || m.render()),
    ));
    let publisher = relay.client("moqt").await;
    let track = publisher
        .create_track(FullTrackName::new("m", "t"), 1, TrackMode::Push)
        .await
        .unwrap();
    track.send_datagram(0, 0, Bytes::from_static(b"12345"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    sock.read_to_string(&mut body).await.unwrap();
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    for needle in [
        "quichub_sessions 1",
        "quichub_tracks 1",
        "quichub_objects_total{direction=\"in\"} 1",
        "quichub_bytes_total{direction=\"in\"} 5",
        "quichub_drops_total{reason=\"lagged\"} 0",
        "quichub_cache_bytes",
        "quichub_subscriptions 0",
    ] {
        assert!(body.contains(needle), "missing {needle} in\n{body}");
    }
}

fn object(
    group: u64,
    subgroup: Option<u64>,
    id: u64,
    payload: &'static [u8],
    age: Duration,
) -> quichub_relay::object::Object {
    quichub_relay::object::Object {
        group,
        subgroup,
        object_id: id,
        priority: 1,
        properties: Bytes::new(),
        status: moqt::data::ObjectStatus::Normal,
        payload: Bytes::from_static(payload),
        end_of_group: false,
        received: Instant::now() - age,
        datagram: Default::default(),
    }
}

/// OBJECT_DELIVERY_TIMEOUT: an object older than the subscriber's timeout is
/// not sent (a datagram is dropped; a subgroup is given up), while a subscriber
/// without a timeout still gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_delivery_timeout_drops_late_objects() {
    use std::sync::atomic::Ordering::Relaxed;
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("dt", "t");
    let _track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    let a = relay.client("moqt").await;
    let mut strict = a
        .subscribe(
            name.clone(),
            SubscribeOptions {
                object_timeout_ms: Some(500),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let b = relay.client("moqt").await;
    let mut lenient = b
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();

    // Objects as if they had reached the relay two seconds ago, then fresh ones.
    let t = relay.relay.find_track(&name).unwrap().track.clone();
    t.publish(object(0, None, 0, b"old datagram", Duration::from_secs(2)));
    t.publish(object(
        1,
        Some(0),
        0,
        b"old in subgroup",
        Duration::from_secs(2),
    ));
    t.publish(object(
        1,
        Some(0),
        1,
        b"fresh, same subgroup",
        Duration::ZERO,
    ));
    t.publish(object(2, None, 0, b"fresh datagram", Duration::ZERO));
    t.publish(object(3, Some(0), 0, b"fresh subgroup", Duration::ZERO));

    let mut got = Vec::new();
    while got.len() < 2 {
        got.push(next_object(&mut strict).await.payload);
    }
    got.sort();
    assert_eq!(
        got,
        [
            Bytes::from_static(b"fresh datagram"),
            Bytes::from_static(b"fresh subgroup")
        ]
    );
    let nothing_more =
        tokio::time::timeout(Duration::from_millis(300), next_object(&mut strict)).await;
    assert!(
        nothing_more.is_err(),
        "a subgroup cut by a timeout must not resume mid-way"
    );

    let mut all = Vec::new();
    while all.len() < 5 {
        all.push(next_object(&mut lenient).await.payload);
    }
    assert!(all.contains(&Bytes::from_static(b"old datagram")));
    assert!(relay.relay.metrics.drops_timeout.load(Relaxed) >= 2);
}

/// A subscriber too far behind gets PUBLISH_DONE with TOO_FAR_BEHIND.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_subscriber_gets_too_far_behind() {
    use quichub_net::io::MessageReader;
    let relay = TestRelay::with_config(Config {
        fanout_buffer: 16,
        max_lag_objects: 20,
        write_stall_ms: 100,
        ..Config::default()
    })
    .await;
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("lag", "t");
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();

    // A subscriber that reads its request stream but never its data streams.
    let stuck = relay.raw_subscriber(name.clone()).await;
    let recv = stuck.recv;
    let mut reader = MessageReader::new(recv, &[]);
    assert!(matches!(
        within(5, reader.next()).await,
        Ok(Message::SubscribeOk(_))
    ));

    let mut w = track.open_subgroup(0, 0).await.unwrap().unwrap();
    static BIG: [u8; 20_000] = [7u8; 20_000];
    for o in 0..300 {
        w.write(o, Bytes::from_static(&BIG)).await.unwrap();
    }
    match within(10, reader.next()).await {
        Ok(Message::PublishDone(d)) => {
            assert_eq!(d.status, moqt::error::publish_done::TOO_FAR_BEHIND)
        }
        other => panic!("expected PUBLISH_DONE, got {other:?}"),
    }
    drop((stuck.control, stuck.send, stuck.session));
}

/// The session limit refuses sessions beyond it without disturbing the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_limit() {
    let relay = TestRelay::with_config(Config {
        max_sessions: 1,
        ..Config::default()
    })
    .await;
    let first = relay.client("moqt").await;
    // The relay counts a session once its CLIENT_SETUP is in, which may be
    // just after the client has the relay's SETUP.
    common::within(5, async {
        while relay
            .relay
            .metrics
            .sessions
            .load(std::sync::atomic::Ordering::Relaxed)
            < 1
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let opts = quichub_client::ConnectOptions {
        timeout: Duration::from_secs(1),
        ..relay.opts()
    };
    let second = quichub_client::ClientSession::connect(&relay.url("moqt"), opts).await;
    assert!(second.is_err(), "a second session must be refused");
    assert!(
        first
            .track_status(FullTrackName::new("x", "y"))
            .await
            .is_err(),
        "first session still answers"
    );
    assert!(first.peer_setup().is_some());
}

/// Track Properties the relay could not forward within a control message are
/// refused, instead of making a message it cannot encode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_track_properties_are_refused() {
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let big = moqt::KeyValue::bytes(0x39, Bytes::from(vec![b'p'; 20_000]));
    let e = publisher
        .create_track_with(
            FullTrackName::new("big", "t"),
            1,
            TrackMode::Push,
            vec![big],
        )
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("NOT_SUPPORTED (0x3)"), "{e}");
    // The session is still usable.
    publisher
        .create_track(FullTrackName::new("big", "ok"), 1, TrackMode::Push)
        .await
        .unwrap();
}

/// A subscriber waiting (RENDEZVOUS_TIMEOUT) for a track whose publisher
/// announces the namespace before it pushes the track: the publisher has no
/// such track when the relay's upstream SUBSCRIBE arrives (DOES_NOT_EXIST),
/// and the subscriber keeps waiting until the PUBLISH comes instead of being
/// refused (`quichub pub --broadcast` publishes the catalog, then the media
/// tracks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_subscriber_outlasts_a_namespace_announced_before_its_track() {
    let relay = TestRelay::start().await;
    let name = FullTrackName::new("bcast/late", "video");
    let s = relay.client("moqt").await;
    let waiting = {
        let name = name.clone();
        tokio::spawn(async move {
            let sub = s
                .subscribe(
                    name,
                    SubscribeOptions {
                        rendezvous_ms: Some(10_000),
                        ..Default::default()
                    },
                )
                .await;
            (s, sub)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let publisher = relay.client("moqt").await;
    let _ns = publisher
        .publish_namespace(name.namespace.clone())
        .await
        .unwrap();
    // The relay asks this publisher for the track before it exists.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    let (_s, sub) = within(10, waiting).await.unwrap();
    let mut sub = sub.expect("the waiting subscription is served once the track is pushed");
    common::until_forwarding(&track).await;
    let mut w = track.open_subgroup(0, 0).await.unwrap().unwrap();
    w.write(0, Bytes::from_static(b"frame")).await.unwrap();
    w.finish();
    assert_eq!(
        next_object(&mut sub).await.payload,
        Bytes::from_static(b"frame")
    );
    assert_eq!(
        relay
            .relay
            .metrics
            .rendezvous_retries
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

/// A publisher that announces a namespace again from a new session (it
/// reconnected; the old one may be dead but not yet timed out) takes its
/// tracks over: a subscriber of the old session's track gets PUBLISH_DONE,
/// and a new subscriber gets the new session's objects, not a track bound
/// to the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnecting_publisher_takes_its_tracks_over() {
    let relay = TestRelay::start().await;
    let name = FullTrackName::new("re/pub", "t");
    let ns = TrackNamespace::from_path("re/pub");
    let old = relay.client("moqt").await;
    let old_track = old
        .create_track(name.clone(), 1, TrackMode::Announce)
        .await
        .unwrap();
    let _old_ns = old.publish_namespace(ns.clone()).await.unwrap();
    let viewer = relay.client("moqt").await;
    let mut first = viewer
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    assert_eq!(old_track.subscriptions_served(), 1);

    // The same publisher again, from a new session; the old one stays open.
    let new = relay.client("moqt").await;
    let new_track = new
        .create_track(name.clone(), 1, TrackMode::Announce)
        .await
        .unwrap();
    let _new_ns = new.publish_namespace(ns.clone()).await.unwrap();
    within(10, async {
        loop {
            match first.next().await {
                Some(SubscriptionEvent::Done { .. }) | None => break,
                Some(_) => {}
            }
        }
    })
    .await;
    let viewer2 = relay.client("moqt").await;
    let mut second = viewer2
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    assert_eq!(new_track.subscriptions_served(), 1);
    let mut w = new_track
        .open_subgroup(5, 0)
        .await
        .unwrap()
        .expect("forwarding");
    w.write(0, Bytes::from_static(b"new")).await.unwrap();
    match within(10, second.next()).await {
        Some(SubscriptionEvent::Object(o)) => assert_eq!(o.payload, "new"),
        e => panic!("{e:?}"),
    }
}

/// NEW_GROUP_REQUEST (draft-18): carried by the relay's upstream SUBSCRIBE
/// when a subscriber creates the track; for an established track passed on
/// by REQUEST_UPDATE only when the track has DYNAMIC_GROUPS, asks for a
/// group after the largest, and no request as large is outstanding (until
/// the largest group grows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_group_requests_reach_the_publisher_once_per_group() {
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let dynamic = FullTrackName::new("ngr", "dynamic");
    let fixed = FullTrackName::new("ngr", "fixed");
    let track = publisher
        .create_track_with(
            dynamic.clone(),
            1,
            TrackMode::Announce,
            vec![moqt::KeyValue::int(0x30, 1)],
        )
        .await
        .unwrap();
    let plain = publisher
        .create_track(fixed.clone(), 1, TrackMode::Announce)
        .await
        .unwrap();
    let _ns = publisher
        .publish_namespace(TrackNamespace::from_path("ngr"))
        .await
        .unwrap();
    let requests = track.new_group_requests();
    let until_count = |rx: &tokio::sync::watch::Receiver<u64>, n: u64| {
        let mut rx = rx.clone();
        async move {
            within(10, rx.wait_for(|c| *c >= n)).await.unwrap();
        }
    };
    let subscribe = |name: FullTrackName, ngr: u64| {
        let relay = &relay;
        async move {
            let s = relay.client("moqt").await;
            let sub = s
                .subscribe(
                    name,
                    SubscribeOptions {
                        rendezvous_ms: Some(2000),
                        new_group_request: Some(ngr),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            (s, sub)
        }
    };
    let publish_group = |g: u64| {
        let track = &track;
        async move {
            let mut w = track
                .open_subgroup(g, 0)
                .await
                .unwrap()
                .expect("forwarding");
            w.write(0, Bytes::from_static(b"k")).await.unwrap();
            w.finish();
        }
    };
    let largest_group = |g: u64| {
        let relay = &relay;
        let dynamic = &dynamic;
        async move {
            within(10, async {
                while relay
                    .relay
                    .find_track(dynamic)
                    .and_then(|e| e.track.largest())
                    .map(|l| l.group)
                    != Some(g)
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
        }
    };

    // The first subscriber's request rides on the relay's SUBSCRIBE.
    let (_s1, _sub1) = subscribe(dynamic.clone(), 0).await;
    until_count(&requests, 1).await;
    publish_group(0).await;
    largest_group(0).await;
    // A request for group 1 goes on by REQUEST_UPDATE ...
    let (_s2, _sub2) = subscribe(dynamic.clone(), 1).await;
    until_count(&requests, 2).await;
    // ... once: another for group 1 (or one naming no group) while it is
    // outstanding, or one for a group already there, stays at the relay.
    let (_s3, mut sub3) = subscribe(dynamic.clone(), 1).await;
    let (_s4, _sub4) = subscribe(dynamic.clone(), 0).await;
    publish_group(1).await;
    largest_group(1).await;
    let ngr = |v: u64| Parameters {
        new_group_request: Some(v),
        ..Parameters::default()
    };
    sub3.update(ngr(1)).await.unwrap();
    // Group 1 came: a request for group 2 goes on.
    sub3.update(ngr(2)).await.unwrap();
    until_count(&requests, 3).await;

    // A track without DYNAMIC_GROUPS: only the SUBSCRIBE carries it.
    let plain_requests = plain.new_group_requests();
    let (_p1, _psub1) = subscribe(fixed.clone(), 0).await;
    until_count(&plain_requests, 1).await;
    let (_p2, _psub2) = subscribe(fixed.clone(), 0).await;

    // No waiting for what must not come: a request that should come, sent
    // after everything above, marks the end. The relay decides while it
    // handles each SUBSCRIBE and REQUEST_UPDATE, so by the marker's turn
    // any extra request is on its way ahead of it (on the dynamic track's
    // upstream stream, in order).
    publish_group(2).await;
    largest_group(2).await;
    sub3.update(ngr(3)).await.unwrap();
    until_count(&requests, 4).await;
    assert_eq!(*requests.borrow(), 4, "exactly one request per new group");
    assert_eq!(*plain_requests.borrow(), 1);
}

/// The next message on a namespace request's stream.
async fn next(req: &mut quichub_client::NamespaceSubscription) -> Message {
    within(5, req.next()).await.expect("message")
}

/// REQUEST_UPDATE with TRACK_NAMESPACE_PREFIX moves a SUBSCRIBE_NAMESPACE
/// wider or narrower: announcements follow the new prefix (suffixes
/// relative to it, nothing announced twice), and a prefix overlapping the
/// session's other request is refused. A SUBSCRIBE_TRACKS moved wider
/// pushes what the new prefix adds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_requests_move_to_a_wider_or_narrower_prefix() {
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let ns = TrackNamespace::from_path;
    let publish = |path: &'static str| {
        let publisher = &publisher;
        async move { publisher.publish_namespace(ns(path)).await.unwrap() }
    };
    let a_x = publish("w/a/x").await;
    let b_y = publish("w/b/y").await;
    let _other = publish("other/z").await;
    let sub = relay.client("moqt").await;
    let mut req = sub.subscribe_namespace(ns("w/a")).await.unwrap();
    assert_eq!(next(&mut req).await, Message::Namespace(ns("x")));
    // Wider: only what was not announced yet, relative to the new prefix.
    req.update_prefix(ns("w")).await.unwrap();
    assert!(matches!(next(&mut req).await, Message::RequestOk(_)));
    assert_eq!(next(&mut req).await, Message::Namespace(ns("b/y")));
    let _c = publish("w/c").await;
    assert_eq!(next(&mut req).await, Message::Namespace(ns("c")));
    // Narrower: what is outside is no longer this request's.
    req.update_prefix(ns("w/b")).await.unwrap();
    assert!(matches!(next(&mut req).await, Message::RequestOk(_)));
    a_x.withdraw();
    b_y.withdraw();
    assert_eq!(next(&mut req).await, Message::NamespaceDone(ns("y")));
    let _q = publish("w/b/q").await;
    assert_eq!(next(&mut req).await, Message::Namespace(ns("q")));
    // Onto a prefix overlapping the session's other request: refused, ended.
    let _second = sub.subscribe_namespace(ns("other")).await.unwrap();
    req.update_prefix(ns("")).await.unwrap();
    match next(&mut req).await {
        Message::RequestError(e) => {
            assert_eq!(e.code, moqt::error::request_error::PREFIX_OVERLAP)
        }
        m => panic!("{m:?}"),
    }

    // SUBSCRIBE_TRACKS moved wider pushes the tracks it adds.
    let _t1 = publisher
        .create_track(FullTrackName::new("t/a", "1"), 1, TrackMode::Push)
        .await
        .unwrap();
    let _t2 = publisher
        .create_track(FullTrackName::new("t/b", "2"), 1, TrackMode::Push)
        .await
        .unwrap();
    let pushed = relay.client("moqt").await;
    let mut tracks = pushed.subscribe_tracks(ns("t/a"), true).await.unwrap();
    let (name, _s1) = within(5, pushed.next_publish()).await.unwrap();
    assert_eq!(name, FullTrackName::new("t/a", "1"));
    tracks.update_prefix(ns("t")).await.unwrap();
    assert!(matches!(next(&mut tracks).await, Message::RequestOk(_)));
    let (name, _s2) = within(5, pushed.next_publish()).await.unwrap();
    assert_eq!(name, FullTrackName::new("t/b", "2"));
    // Narrower and wider again: nothing is pushed twice (a second PUBLISH
    // of a track would give it a second alias).
    tracks.update_prefix(ns("t/a")).await.unwrap();
    assert!(matches!(next(&mut tracks).await, Message::RequestOk(_)));
    tracks.update_prefix(ns("t")).await.unwrap();
    assert!(matches!(next(&mut tracks).await, Message::RequestOk(_)));
    let again = tokio::time::timeout(Duration::from_millis(300), pushed.next_publish()).await;
    assert!(
        again.is_err(),
        "pushed again: {:?}",
        again.map(|p| p.map(|p| p.0))
    );
}

/// A pushed track (PUBLISH) gets its subscribers' NEW_GROUP_REQUESTs by
/// REQUEST_UPDATE on the PUBLISH stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_group_requests_reach_a_pushed_tracks_publisher() {
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("ngr", "pushed");
    let track = publisher
        .create_track_with(
            name.clone(),
            1,
            TrackMode::Push,
            vec![moqt::KeyValue::int(0x30, 1)],
        )
        .await
        .unwrap();
    let mut requests = track.new_group_requests();
    let s = relay.client("moqt").await;
    let _sub = s
        .subscribe(
            name.clone(),
            SubscribeOptions {
                new_group_request: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    within(10, requests.wait_for(|n| *n == 1)).await.unwrap();
}

/// A SUBSCRIBE_TRACKS subscriber is pushed a track again when its
/// publisher comes back and pushes it anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_track_pushed_again_reaches_subscribe_tracks_again() {
    let relay = TestRelay::start().await;
    let name = FullTrackName::new("again", "t");
    let sub = relay.client("moqt").await;
    let _tracks = sub
        .subscribe_tracks(TrackNamespace::from_path("again"), true)
        .await
        .unwrap();
    for _ in 0..2 {
        let publisher = relay.client("moqt").await;
        let _t = publisher
            .create_track(name.clone(), 1, TrackMode::Push)
            .await
            .unwrap();
        let (got, _s) = within(5, sub.next_publish()).await.unwrap();
        assert_eq!(got, name);
        drop(_t);
        publisher.session().close(0u32, b"bye");
        within(5, async {
            while relay.relay.find_track(&name).is_some() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }
}

/// A track pushed for SUBSCRIBE_TRACKS: its PUBLISH tells the subscriber
/// the Largest Location (none yet), and an object the publisher sends
/// while the subscriber's PUBLISH_OK is still on its way comes after it,
/// so a PUBLISH_OK asking for what follows the largest object (as draft-14
/// peers say through the bridge) gets it. (The relay used to apply the
/// filter to the largest object at PUBLISH_OK time, and dropped it: the
/// draft-14 subscribe-tracks case of interop-client failed when the
/// PUBLISH_OK came late.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_sent_before_publish_ok_is_delivered() {
    use moqt::data::SubgroupReader;
    use moqt::message::{NamespaceRequest, RequestOk};
    use moqt::SubscriptionFilter;
    use quichub_net::io::MessageReader;

    let relay = TestRelay::start().await;
    let raw = relay.raw("moqt").await;
    let mut control = raw.open_uni().await.unwrap();
    let setup = moqt::session::make_setup("raw", Some("127.0.0.1"), Some("/"));
    control
        .write_all(&Message::Setup(setup).to_bytes())
        .await
        .unwrap();
    let (mut send, recv) = raw.open_bi().await.unwrap();
    let m = Message::SubscribeTracks(NamespaceRequest {
        request_id: 0,
        namespace: TrackNamespace::from_path("early"),
        params: Parameters::default(),
    });
    send.write_all(&m.to_bytes()).await.unwrap();
    let mut replies = MessageReader::new(recv, &[]);
    let ok = within(10, replies.next()).await.unwrap();
    assert!(matches!(ok, Message::RequestOk(_)), "{ok:?}");

    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("early", "t");
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    let (mut publish_send, publish_recv) = within(10, raw.accept_bi()).await.unwrap();
    let mut publish_reader = MessageReader::new(publish_recv, &[]);
    match within(10, publish_reader.next()).await.unwrap() {
        Message::Publish(p) => {
            assert_eq!(p.track, name);
            assert_eq!(p.params.largest_object, None);
        }
        other => panic!("{other:?}"),
    }
    // The object reaches the relay before the PUBLISH_OK does.
    common::until_forwarding(&track).await;
    let mut w = track
        .open_subgroup(0, 0)
        .await
        .unwrap()
        .expect("forwarding");
    w.write(0, Bytes::from_static(b"early")).await.unwrap();
    w.finish();
    within(10, async {
        while relay
            .relay
            .find_track(&name)
            .and_then(|e| e.track.largest())
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let ok = Message::PublishOk(RequestOk {
        params: Parameters {
            subscription_filter: Some(SubscriptionFilter::LargestObject),
            ..Default::default()
        },
        properties: Vec::new(),
    });
    publish_send.write_all(&ok.to_bytes()).await.unwrap();
    // The object on its subgroup stream.
    // (The relay's control stream comes first: skip what is no subgroup.)
    let (mut uni, mut reader) = within(10, async {
        loop {
            let mut uni = raw.accept_uni().await.unwrap();
            let first = uni.read_chunk(usize::MAX).await.unwrap().expect("data");
            let mut reader = SubgroupReader::new(first[0], 1 << 20);
            reader.push(first.slice(1..));
            if reader.read_header().is_ok() {
                break (uni, reader);
            }
        }
    })
    .await;
    let object = within(10, async {
        loop {
            if let Some(read) = reader.next_object().unwrap() {
                break read.object;
            }
            match uni.read_chunk(usize::MAX).await.unwrap() {
                Some(c) => reader.push(c),
                None => reader.finish(),
            }
        }
    })
    .await;
    assert_eq!(reader.header().expect("a subgroup header").group, 0);
    assert_eq!((object.object_id, &object.payload[..]), (0, &b"early"[..]));
}
