//! Relays in a tree over MoQT (`[cluster] origins`): a publisher on relay A,
//! subscribers on relay B that follows A. Every object reaches every
//! subscriber on B, and A sends B one copy per track however many
//! subscribers B has.

use quichub_testkit as common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use common::{test_config, within, TestRelay};
use moqt::{FullTrackName, TrackNamespace};
use quichub_client::{SubscribeOptions, SubscriptionEvent, TrackMode};

/// A relay that follows `origin`'s namespaces under `prefix`.
async fn follower(origin: &TestRelay, prefix: &str) -> TestRelay {
    let mut c = test_config();
    c.cluster
        .origins
        .push(origin_entry(origin, vec![prefix.into()]));
    TestRelay::with_hub_config(c).await
}

/// Waits (at most 10 s) until `cond` holds.
async fn until(cond: impl Fn() -> bool) {
    within(10, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// An `[[cluster.origins]]` entry for `origin`, pinned by its fingerprint.
fn origin_entry(origin: &TestRelay, prefixes: Vec<String>) -> quichub_hub::OriginSection {
    quichub_hub::OriginSection {
        url: format!("moqt://127.0.0.1:{}/", origin.addr.port()),
        prefixes,
        fingerprint: Some(origin.hub.fingerprint()),
        ca: None,
    }
}

/// Waits until `relay` knows namespace `ns`.
async fn knows(relay: &TestRelay, ns: &str) {
    let ns = TrackNamespace::from_path(ns);
    until(|| {
        relay
            .relay
            .snapshot()
            .namespaces
            .iter()
            .any(|n| n.namespace == ns)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_on_a_follower_get_every_object_with_one_copy_per_track_between_relays() {
    let a = TestRelay::start().await;
    let b = follower(&a, "live").await;
    let publisher = a.client("moqt").await;
    let video_name = FullTrackName::new("live/show", "video");
    let audio_name = FullTrackName::new("live/show", "audio");
    let video = publisher
        .create_track(video_name.clone(), 2, TrackMode::Announce)
        .await
        .unwrap();
    let audio = publisher
        .create_track(audio_name.clone(), 1, TrackMode::Announce)
        .await
        .unwrap();
    let _ns = publisher
        .publish_namespace(TrackNamespace::from_path("live/show"))
        .await
        .unwrap();
    knows(&b, "live/show").await;
    assert_eq!(b.relay.metrics.origin_sessions.load(Relaxed), 1);

    const SUBS: usize = 3;
    const GROUPS: u64 = 3;
    const PER_GROUP: u64 = 10;
    const DATAGRAMS: u64 = 40;
    let mut tasks = Vec::new();
    for i in 0..SUBS {
        // Raw QUIC and WebTransport subscribers.
        let s = b.client(if i % 2 == 0 { "moqt" } else { "https" }).await;
        let mut v = s
            .subscribe(video_name.clone(), SubscribeOptions::default())
            .await
            .unwrap();
        let mut au = s
            .subscribe(audio_name.clone(), SubscribeOptions::default())
            .await
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let _keep = s;
            let (mut objects, mut datagrams) = (Vec::new(), 0u64);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while objects.len() < (GROUPS * PER_GROUP) as usize || datagrams < DATAGRAMS {
                let ev = tokio::select! {
                    e = v.next() => e,
                    e = au.next() => e,
                    _ = tokio::time::sleep_until(deadline) => break,
                };
                if let Some(SubscriptionEvent::Object(o)) = ev {
                    match o.subgroup {
                        Some(_) => objects.push((o.group, o.object_id, o.payload)),
                        None => datagrams += 1,
                    }
                }
            }
            (objects, datagrams)
        }));
    }
    until(|| video.is_forwarding() && audio.is_forwarding()).await;
    // One upstream subscription per track at the publisher, and one at the
    // origin relay (from the follower), for three subscribers.
    assert_eq!(video.subscriptions_served(), 1);
    assert_eq!(audio.subscriptions_served(), 1);
    assert_eq!(a.relay.metrics.subscriptions.load(Relaxed), 2);

    let send_video = async {
        for g in 0..GROUPS {
            let mut w = video
                .open_subgroup(g, 0)
                .await
                .unwrap()
                .expect("forwarding");
            for o in 0..PER_GROUP {
                w.write(o, Bytes::from(format!("{g}:{o}"))).await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            w.finish();
        }
    };
    let send_audio = async {
        for n in 0..DATAGRAMS {
            assert!(audio.send_datagram(n, 0, Bytes::from(vec![n as u8; 100])));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    within(30, async { tokio::join!(send_video, send_audio) }).await;
    for t in tasks {
        let (objects, datagrams) = within(30, t).await.unwrap();
        let want: Vec<_> = (0..GROUPS)
            .flat_map(|g| (0..PER_GROUP).map(move |o| (g, o, Bytes::from(format!("{g}:{o}")))))
            .collect();
        assert_eq!(objects, want, "every stream object, in order");
        assert_eq!(datagrams, DATAGRAMS, "every datagram (loopback)");
    }
    let objects = GROUPS * PER_GROUP + DATAGRAMS;
    // The origin relay sent one copy per object (to the follower) ...
    assert_eq!(a.relay.metrics.objects_out.load(Relaxed), objects);
    // ... which received each once and sent it to its three subscribers.
    assert_eq!(b.relay.metrics.objects_in.load(Relaxed), objects);
    assert_eq!(
        b.relay.metrics.objects_out.load(Relaxed),
        objects * SUBS as u64
    );
}

/// The follower learns namespaces as the origin gets them and forgets them
/// when they go; when the origin goes away it reconnects once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_tracks_the_origins_namespaces() {
    let a = TestRelay::start().await;
    let b = follower(&a, "").await;
    let publisher = a.client("moqt").await;
    let ns = publisher
        .publish_namespace(TrackNamespace::from_path("news/a"))
        .await
        .unwrap();
    knows(&b, "news/a").await;
    // Outside the followed prefix of another follower: not learnt there.
    let c = follower(&a, "sport").await;
    until(|| c.relay.metrics.origin_sessions.load(Relaxed) > 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(c.relay.snapshot().namespaces.is_empty());
    drop(ns);
    drop(publisher);
    until(|| b.relay.snapshot().namespaces.is_empty()).await;
}

/// A follower whose origin presents another certificate refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_checks_the_origins_certificate() {
    let a = TestRelay::start().await;
    let mut c = test_config();
    c.cluster.origins.push(quichub_hub::OriginSection {
        fingerprint: Some("00".repeat(32)),
        ..origin_entry(&a, vec![])
    });
    let b = TestRelay::with_hub_config(c).await;
    until(|| b.relay.metrics.origin_reconnects.load(Relaxed) > 0).await;
    assert_eq!(b.relay.metrics.origin_sessions.load(Relaxed), 0);
    assert_eq!(a.relay.metrics.sessions_total.load(Relaxed), 0);
    // Neither fingerprint nor CA: refused when the hub starts.
    let mut c = test_config();
    c.cluster.origins.push(quichub_hub::OriginSection {
        url: format!("moqt://127.0.0.1:{}/", a.addr.port()),
        ..Default::default()
    });
    let e = quichub_hub::Hub::start(c).await.err().expect("refused");
    assert!(format!("{e:#}").contains("fingerprint"), "{e:#}");
}

/// An origin that drains (GOAWAY) and comes back on the same address: the
/// follower leaves at once, forgets its namespaces, reconnects, and learns
/// them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_comes_back_when_its_origin_restarts() {
    let dir = std::env::temp_dir().join(format!("quichub-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let id = quichub_net::tls::Identity::self_signed(&["localhost"]).unwrap();
    id.write_pem(&cert, &key).unwrap();
    let origin_config = |bind: &str| {
        let mut c = test_config();
        c.quic.bind = bind.into();
        c.tls.cert = Some(cert.clone());
        c.tls.key = Some(key.clone());
        c
    };
    let a = TestRelay::with_hub_config(origin_config("127.0.0.1:0")).await;
    let bind = format!("127.0.0.1:{}", a.addr.port());
    let b = follower(&a, "").await;
    let publisher = a.client("moqt").await;
    let _ns = publisher
        .publish_namespace(TrackNamespace::from_path("x"))
        .await
        .unwrap();
    knows(&b, "x").await;
    within(10, a.hub.shutdown()).await;
    drop(publisher);
    drop(a);
    until(|| b.relay.snapshot().namespaces.is_empty()).await;
    // The old relay's sockets close as its threads end: until then the
    // port is refused.
    let hub = within(10, async {
        loop {
            match quichub_hub::Hub::start(origin_config(&bind)).await {
                Ok(h) => break h,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await;
    let a2 = TestRelay {
        addr: hub.addr(),
        relay: hub.relay().clone(),
        server: hub.server().clone(),
        fingerprint: quichub_net::tls::unhex(&hub.fingerprint()).unwrap(),
        hub: std::sync::Arc::new(hub),
    };
    let publisher = a2.client("moqt").await;
    let _ns = publisher
        .publish_namespace(TrackNamespace::from_path("x"))
        .await
        .unwrap();
    knows(&b, "x").await;
    assert!(b.relay.metrics.origin_reconnects.load(Relaxed) >= 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The follower's session to its origin is not a client: with room for one
/// client session, a client still gets in while the origin session is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_session_takes_no_clients_place() {
    let a = TestRelay::start().await;
    let mut c = test_config();
    c.relay.max_sessions = 1;
    c.cluster.origins.push(origin_entry(&a, vec![]));
    let b = TestRelay::with_hub_config(c).await;
    until(|| b.relay.metrics.origin_sessions.load(Relaxed) > 0 && a.relay.session_count() > 0)
        .await;
    let client = b.client("moqt").await;
    until(|| b.relay.session_count() > 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(b.relay.metrics.sessions_refused_full.load(Relaxed), 0);
    assert!(
        client.close_reason().is_none(),
        "{:?}",
        client.close_reason()
    );
    // Both sessions are sessions; only the client's is a client's.
    assert_eq!(b.relay.metrics.sessions.load(Relaxed), 2);
}

/// An origin that drains with a New Session URI (`[relay] goaway_uri`)
/// sends its followers to that relay at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_moves_where_its_origins_goaway_says() {
    let dir = std::env::temp_dir().join(format!("quichub-cluster-move-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    // Both relays present the same certificate: the follower pins it.
    let id = quichub_net::tls::Identity::self_signed(&["localhost"]).unwrap();
    id.write_pem(&cert, &key).unwrap();
    let config = || {
        let mut c = test_config();
        c.tls.cert = Some(cert.clone());
        c.tls.key = Some(key.clone());
        c
    };
    let a2 = TestRelay::with_hub_config(config()).await;
    let mut c = config();
    c.relay.goaway_uri = format!("moqt://127.0.0.1:{}/", a2.addr.port());
    let a = TestRelay::with_hub_config(c).await;
    let b = follower(&a, "").await;
    let p2 = a2.client("moqt").await;
    let _moved = p2
        .publish_namespace(TrackNamespace::from_path("moved"))
        .await
        .unwrap();
    let p = a.client("moqt").await;
    let _x = p
        .publish_namespace(TrackNamespace::from_path("x"))
        .await
        .unwrap();
    knows(&b, "x").await;
    assert_eq!(a2.relay.session_count(), 1, "only the publisher on a2");
    within(10, a.hub.shutdown()).await;
    knows(&b, "moved").await;
    assert_eq!(a2.relay.session_count(), 2, "the follower moved to a2");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A namespace a publisher holds on the follower stays its own when the
/// origin announces the same one (no hijack, no loop back through the
/// origin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_publisher_keeps_its_namespace() {
    let a = TestRelay::start().await;
    let b = follower(&a, "").await;
    until(|| b.relay.metrics.origin_sessions.load(Relaxed) == 1).await;
    let local = b.client("moqt").await;
    let _mine = local
        .publish_namespace(TrackNamespace::from_path("x"))
        .await
        .unwrap();
    knows(&b, "x").await;
    let owner = || {
        b.relay
            .snapshot()
            .namespaces
            .into_iter()
            .find(|n| n.namespace == TrackNamespace::from_path("x"))
            .map(|n| n.session)
    };
    let before = owner();
    let remote = a.client("moqt").await;
    let _theirs = remote
        .publish_namespace(TrackNamespace::from_path("x"))
        .await
        .unwrap();
    let _other = remote
        .publish_namespace(TrackNamespace::from_path("y"))
        .await
        .unwrap();
    // "y" arrives after "x" on the same stream: once it is here, "x" was seen.
    knows(&b, "y").await;
    assert_eq!(owner(), before, "the local publisher keeps x");
}

/// A track pushed at the origin (PUBLISH, no namespace announced) is pushed
/// on to the follower, whose subscribers get it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_gets_the_tracks_pushed_at_its_origin() {
    let a = TestRelay::start().await;
    let b = follower(&a, "").await;
    until(|| b.relay.metrics.origin_sessions.load(Relaxed) == 1).await;
    let publisher = a.client("moqt").await;
    let name = FullTrackName::new("pushed", "t");
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    until(|| b.relay.find_track(&name).is_some()).await;
    let s = b.client("https").await;
    let mut sub = s
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    let mut w = track
        .open_subgroup(3, 0)
        .await
        .unwrap()
        .expect("forwarding");
    w.write(0, Bytes::from_static(b"p")).await.unwrap();
    match within(10, sub.next()).await {
        Some(SubscriptionEvent::Object(o)) => assert_eq!((o.group, &o.payload[..]), (3, &b"p"[..])),
        e => panic!("{e:?}"),
    }
}

/// A follower whose only way to its origin is TCP (a network that blocks
/// UDP) follows it over MoQT over WebSocket: `ws://` to the origin's HTTP
/// port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_follows_its_origin_over_websocket() {
    let mut c = test_config();
    c.http.address = "127.0.0.1:0".into();
    let a = TestRelay::with_hub_config(c).await;
    let mut c = test_config();
    c.cluster.origins.push(quichub_hub::OriginSection {
        url: format!("ws://{}/", a.hub.http_addr().unwrap()),
        prefixes: vec![],
        fingerprint: None,
        ca: None,
    });
    let b = TestRelay::with_hub_config(c).await;
    until(|| b.relay.metrics.origin_sessions.load(Relaxed) == 1).await;
    let publisher = a.client("moqt").await;
    let name = FullTrackName::new("tcp-only", "t");
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    until(|| b.relay.find_track(&name).is_some()).await;
    let s = b.client("moqt").await;
    let mut sub = s
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    let mut w = track
        .open_subgroup(1, 0)
        .await
        .unwrap()
        .expect("forwarding");
    w.write(0, Bytes::from_static(b"via tcp")).await.unwrap();
    match within(10, sub.next()).await {
        Some(SubscriptionEvent::Object(o)) => {
            assert_eq!((o.group, &o.payload[..]), (1, &b"via tcp"[..]))
        }
        e => panic!("{e:?}"),
    }
    assert!(a
        .relay
        .metrics
        .render()
        .contains("quichub_websocket_sessions_total{upgrade=\"accepted\"} 1"));
}

/// Collects a FETCH's objects at `relay` as (group, object, payload).
async fn fetch_all(
    s: &quichub_client::ClientSession,
    kind: moqt::message::FetchKind,
    params: moqt::Parameters,
) -> Vec<(u64, u64, Bytes)> {
    let r = within(15, s.fetch(kind, params)).await.unwrap();
    r.objects
        .into_iter()
        .map(|o| (o.group, o.object_id, o.payload))
        .collect()
}

/// A FETCH on a follower for objects it does not hold goes to the origin:
/// whole for a track the follower does not hold, and for the part below its
/// cache for one it does (the rest from its cache). FILL_TIMEOUT 0 asks for
/// the cache only, the rest reported as an unknown range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_on_a_follower_gets_from_its_origin_what_it_does_not_hold() {
    use moqt::message::FetchKind;
    use moqt::{Location, Parameters};
    let a = TestRelay::start().await;
    let b = follower(&a, "vod").await;
    let publisher = a.client("moqt").await;
    let name = FullTrackName::new("vod/show", "video");
    let track = publisher
        .create_track(name.clone(), 2, TrackMode::Announce)
        .await
        .unwrap();
    let _ns = publisher
        .publish_namespace(TrackNamespace::from_path("vod/show"))
        .await
        .unwrap();
    knows(&b, "vod/show").await;
    // A subscriber on the origin keeps the track (and its cache) there.
    let at_a = a.client("moqt").await;
    let _keep = at_a
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    until(|| track.is_forwarding()).await;
    let payload = |g: u64, o: u64| Bytes::from(format!("{g}:{o}"));
    let publish = |groups: std::ops::Range<u64>| {
        let track = &track;
        async move {
            for g in groups {
                let mut w = track
                    .open_subgroup(g, 0)
                    .await
                    .unwrap()
                    .expect("forwarding");
                for o in 0..10 {
                    w.write(o, payload(g, o)).await.unwrap();
                }
                w.finish();
            }
        }
    };
    publish(0..4).await;
    until(|| {
        a.relay.find_track(&name).and_then(|e| e.track.largest()) == Some(Location::new(3, 9))
    })
    .await;
    let want = |groups: std::ops::Range<u64>| -> Vec<(u64, u64, Bytes)> {
        groups
            .flat_map(|g| (0..10).map(move |o| (g, o, payload(g, o))))
            .collect()
    };

    // The follower does not hold the track: the FETCH goes to the origin whole.
    let s = b.client("https").await;
    assert!(b.relay.find_track(&name).is_none());
    let standalone = |start: u64, end: u64| FetchKind::Standalone {
        track: name.clone(),
        start: Location::new(start, 0),
        end: Location::new(end, 0),
    };
    let got = fetch_all(&s, standalone(1, 2), Parameters::default()).await;
    assert_eq!(got, want(1..3));
    assert_eq!(b.relay.metrics.fetch_upstream.load(Relaxed), 1);
    assert_eq!(
        a.relay.metrics.fetch_upstream.load(Relaxed),
        0,
        "the origin had it all"
    );

    // Now the follower holds the track from group 4 on.
    let mut sub = s
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    publish(4..5).await;
    for _ in 0..10 {
        within(10, sub.next()).await.expect("object");
    }
    let entry = b.relay.find_track(&name).expect("held");
    assert_eq!(entry.track.complete_from(), 4);
    // A joining FETCH from group 0: everything before the subscription,
    // which the follower never had.
    let got = fetch_all(
        &s,
        FetchKind::AbsoluteJoining {
            joining_request_id: sub.request_id,
            joining_start: 0,
        },
        Parameters::default(),
    )
    .await;
    assert_eq!(got, want(0..4));
    assert_eq!(b.relay.metrics.fetch_upstream.load(Relaxed), 2);
    // Groups 1-3 from the origin, group 4 from the cache, in order ...
    let got = fetch_all(&s, standalone(1, 4), Parameters::default()).await;
    assert_eq!(got, want(1..5));
    assert_eq!(b.relay.metrics.fetch_upstream.load(Relaxed), 3);
    // ... and in descending group order.
    let got = fetch_all(
        &s,
        standalone(2, 4),
        Parameters {
            group_order: Some(moqt::GroupOrder::Descending),
            ..Parameters::default()
        },
    )
    .await;
    let mut desc = Vec::new();
    for g in [4, 3, 2] {
        desc.extend(want(g..g + 1));
    }
    assert_eq!(got, desc);
    // FILL_TIMEOUT 0: the cache only; groups 0-3 are an unknown range.
    let unknown = b.relay.metrics.fetch_unknown_ranges.load(Relaxed);
    let got = fetch_all(
        &s,
        standalone(0, 4),
        Parameters {
            fill_timeout: Some(0),
            ..Parameters::default()
        },
    )
    .await;
    assert_eq!(got, want(4..5));
    assert_eq!(
        b.relay.metrics.fetch_unknown_ranges.load(Relaxed),
        unknown + 1
    );
    assert_eq!(b.relay.metrics.fetch_upstream.load(Relaxed), 4);
    assert_eq!(b.relay.metrics.fetch_upstream_failed.load(Relaxed), 0);
}
