//! End to end through an in-process relay: fan-out to 50 subscribers, joining
//! FETCH from the cache, and a stuck subscriber that must not cost the others.

use quichub_testkit as common;

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use common::{within, TestRelay};
use moqt::message::FetchKind;
use moqt::{FullTrackName, Location, Parameters, SubscriptionFilter};
use quichub_client::{SubscribeOptions, SubscriptionEvent, TrackMode};
use quichub_relay::Config;

fn payload(g: u64, o: u64, size: usize) -> Bytes {
    let mut v = format!("{g}:{o}:").into_bytes();
    v.resize(size, b'x');
    Bytes::from(v)
}

/// 1 publisher, 50 subscribers: every object of a stream track arrives exactly
/// once and in order within its subgroup; a datagram track arrives without loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_to_50_subscribers() {
    fanout_to_50(TestRelay::start().await).await;
}

/// The same through a relay with 4 QUIC endpoints on its port (a thread
/// each): sessions land on several shards, and each datagram object crosses
/// to another shard once, not once per subscriber there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_to_50_subscribers_over_4_endpoint_shards() {
    let quic = quichub_net::QuicConfig {
        endpoints: 4,
        ..Default::default()
    };
    let relay = TestRelay::with_quic(Config::default(), quic).await;
    assert_eq!(relay.server.shards(), 4);
    let metrics = relay.relay.metrics.clone();
    fanout_to_50(relay).await;
    let handoffs = metrics.shard_handoffs.load(Relaxed);
    // 100 datagrams, 50 subscribers on up to 3 shards besides the
    // publisher's: at least one hand-off per datagram (the 50 did not all
    // land on the publisher's shard), at most 3, never one per subscriber.
    assert!(
        (100..=300).contains(&handoffs),
        "{handoffs} hand-offs for 100 datagrams"
    );
    // Stream subscribers on other shards are woken through their shard's
    // worker: at most one wake-up per event (100 objects, 5 subgroup ends)
    // and shard.
    let wakeups = metrics.shard_wakeups.load(Relaxed);
    assert!(
        (1..=315).contains(&wakeups),
        "{wakeups} wake-ups for 105 stream events"
    );
    assert_eq!(metrics.drops_datagram.load(Relaxed), 0);
}

async fn fanout_to_50(relay: TestRelay) {
    let publisher = relay.client("moqt").await;
    let video = publisher
        .create_track(FullTrackName::new("e2e", "video"), 2, TrackMode::Push)
        .await
        .unwrap();
    let audio = publisher
        .create_track(FullTrackName::new("e2e", "audio"), 1, TrackMode::Push)
        .await
        .unwrap();

    const SUBS: usize = 50;
    const GROUPS: u64 = 5;
    const PER_GROUP: u64 = 20;
    const DATAGRAMS: u64 = 100;
    let (sent_tx, sent_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for i in 0..SUBS {
        // Half over raw QUIC, half over WebTransport.
        let scheme = if i % 2 == 0 { "moqt" } else { "https" };
        let s = relay.client(scheme).await;
        let mut v = s
            .subscribe(
                FullTrackName::new("e2e", "video"),
                SubscribeOptions::default(),
            )
            .await
            .unwrap();
        let mut a = s
            .subscribe(
                FullTrackName::new("e2e", "audio"),
                SubscribeOptions::default(),
            )
            .await
            .unwrap();
        let mut sent = sent_rx.clone();
        tasks.push(tokio::spawn(async move {
            let _keep = s;
            let mut stream_objs: Vec<(u64, u64, u64)> = Vec::new();
            let mut datagrams = std::collections::HashSet::new();
            let mut deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while stream_objs.len() < (GROUPS * PER_GROUP) as usize
                || datagrams.len() < DATAGRAMS as usize
            {
                let ev = tokio::select! {
                    e = v.next() => e,
                    e = a.next() => e,
                    // Once everything is sent, a datagram that has not come
                    // within a second was lost on the way (below).
                    _ = sent.wait_for(|s| *s), if !*sent.borrow() => {
                        deadline = deadline.min(tokio::time::Instant::now() + Duration::from_secs(1));
                        continue;
                    }
                    _ = tokio::time::sleep_until(deadline) => break,
                };
                if let Some(SubscriptionEvent::Object(o)) = ev {
                    match o.subgroup {
                        Some(sg) => stream_objs.push((o.group, sg, o.object_id)),
                        None => {
                            datagrams.insert((o.group, o.object_id));
                        }
                    }
                }
            }
            (stream_objs, datagrams.len())
        }));
    }

    let send_video = async {
        for g in 0..GROUPS {
            let mut w = video
                .open_subgroup(g, 0)
                .await
                .unwrap()
                .expect("forwarding");
            for o in 0..PER_GROUP {
                w.write(o, payload(g, o, 800)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            w.finish();
        }
    };
    let send_audio = async {
        for n in 0..DATAGRAMS {
            assert!(audio.send_datagram(n, 0, payload(n, 0, 120)));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    within(30, async { tokio::join!(send_video, send_audio) }).await;
    sent_tx.send_replace(true);

    let mut received_datagrams = 0;
    for t in tasks {
        let (objs, dgrams) = within(30, t).await.unwrap();
        assert_eq!(
            objs.len(),
            (GROUPS * PER_GROUP) as usize,
            "every stream object exactly once"
        );
        let unique: std::collections::HashSet<_> = objs.iter().collect();
        assert_eq!(unique.len(), objs.len(), "no duplicates");
        let mut last: HashMap<(u64, u64), u64> = HashMap::new();
        for (g, sg, o) in objs {
            if let Some(prev) = last.insert((g, sg), o) {
                assert!(
                    o > prev,
                    "in order within subgroup ({g},{sg}): {o} after {prev}"
                );
            }
        }
        // Datagrams are unreliable below the relay too: a busy machine's
        // loopback socket buffer or a QUIC datagram queue may drop one. What
        // the relay does is checked below (every datagram handed to every
        // subscriber's session); here only that they flow to each one.
        assert!(
            (1..=DATAGRAMS as usize).contains(&dgrams),
            "{dgrams} of {DATAGRAMS} datagrams"
        );
        received_datagrams += dgrams as u64;
    }
    let m = &relay.relay.metrics;
    assert_eq!(m.drops_datagram.load(Relaxed), 0, "the relay dropped none");
    assert_eq!(
        m.objects_out.load(Relaxed),
        SUBS as u64 * (GROUPS * PER_GROUP + DATAGRAMS),
        "every object handed to every subscriber's session"
    );
    if received_datagrams < SUBS as u64 * DATAGRAMS {
        eprintln!(
            "{} of {} datagrams lost below the relay (loopback)",
            SUBS as u64 * DATAGRAMS - received_datagrams,
            SUBS as u64 * DATAGRAMS
        );
    }
    // One upstream per track however many subscribers.
    assert_eq!(
        relay.relay.metrics.objects_in.load(Relaxed),
        GROUPS * PER_GROUP + DATAGRAMS
    );
}

/// A joining FETCH returns the current group from the relay's cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_fetch_serves_current_group_from_cache() {
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("e2e", "cam");
    let track = publisher
        .create_track(name.clone(), 2, TrackMode::Push)
        .await
        .unwrap();
    for (g, n) in [(0u64, 10u64), (1, 5)] {
        let mut w = track.open_subgroup(g, 0).await.unwrap().unwrap();
        for o in 0..n {
            w.write(o, payload(g, o, 300)).await.unwrap();
        }
        if g == 0 {
            w.finish();
        } else {
            // Group 1 is still being published: leave its stream open.
            std::mem::forget(w);
        }
    }
    within(5, async {
        loop {
            if relay
                .relay
                .find_track(&name)
                .and_then(|e| e.track.largest())
                == Some(Location::new(1, 4))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    let sub = relay.client("https").await;
    let s = sub
        .subscribe(
            name.clone(),
            SubscribeOptions {
                filter: Some(SubscriptionFilter::LargestObject),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(s.largest, Some(Location::new(1, 4)));
    let r = within(
        5,
        sub.fetch(
            FetchKind::RelativeJoining {
                joining_request_id: s.request_id,
                joining_start: 0,
            },
            Parameters::default(),
        ),
    )
    .await
    .unwrap();
    let got: Vec<(u64, u64)> = r.objects.iter().map(|o| (o.group, o.object_id)).collect();
    assert_eq!(
        got,
        (0..5).map(|o| (1, o)).collect::<Vec<_>>(),
        "current group, in order"
    );
    for o in &r.objects {
        assert_eq!(o.payload, payload(o.group, o.object_id, 300));
    }
    assert_eq!(r.ok.end_location, Location::new(1, 5));

    // An absolute joining fetch from group 0 returns both groups.
    let r = sub
        .fetch(
            FetchKind::AbsoluteJoining {
                joining_request_id: s.request_id,
                joining_start: 0,
            },
            Parameters::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.objects.len(), 15);

    // A joining fetch naming no subscription is refused.
    let e = sub
        .fetch(
            FetchKind::RelativeJoining {
                joining_request_id: 998,
                joining_start: 0,
            },
            Parameters::default(),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("0x32"), "{e}");
}

/// A FETCH reaching below what the relay holds asks the publisher; one that
/// does not serve FETCH (quichub's client refuses it) leaves the subscriber
/// what the relay cached, the rest reported as an unknown range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_below_the_cache_gets_the_cache_when_the_publisher_refuses() {
    let relay = TestRelay::start().await;
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("e2e", "late");
    let track = publisher
        .create_track(name.clone(), 2, TrackMode::Announce)
        .await
        .unwrap();
    let _ns = publisher
        .publish_namespace(moqt::TrackNamespace::from_path("e2e"))
        .await
        .unwrap();
    let publish = |groups: std::ops::Range<u64>| {
        let track = &track;
        async move {
            for g in groups {
                let mut w = track
                    .open_subgroup(g, 0)
                    .await
                    .unwrap()
                    .expect("forwarding");
                for o in 0..5 {
                    w.write(o, payload(g, o, 50)).await.unwrap();
                }
                w.finish();
            }
        }
    };
    // Groups 0-2 go out while a first subscriber holds the track ...
    let first = relay.client("moqt").await;
    let s1 = first
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    common::until_forwarding(&track).await;
    publish(0..3).await;
    within(5, async {
        while relay
            .relay
            .find_track(&name)
            .and_then(|e| e.track.largest())
            != Some(Location::new(2, 4))
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // ... and the relay forgets them when it leaves.
    drop(s1);
    drop(first);
    within(5, async {
        while relay.relay.find_track(&name).is_some() || track.is_forwarding() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let sub = relay.client("https").await;
    let mut s = sub
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    publish(3..4).await;
    for _ in 0..5 {
        within(5, s.next()).await.expect("object");
    }
    assert_eq!(
        relay.relay.find_track(&name).unwrap().track.complete_from(),
        3
    );
    let r = within(
        10,
        sub.fetch(
            FetchKind::Standalone {
                track: name.clone(),
                start: Location::new(0, 0),
                end: Location::new(3, 0),
            },
            Parameters::default(),
        ),
    )
    .await
    .unwrap();
    let got: Vec<(u64, u64)> = r.objects.iter().map(|o| (o.group, o.object_id)).collect();
    assert_eq!(got, (0..5).map(|o| (3, o)).collect::<Vec<_>>());
    assert_eq!(r.ok.end_location, Location::new(3, 5));
    let m = &relay.relay.metrics;
    assert_eq!(m.fetch_upstream.load(Relaxed), 1);
    assert_eq!(m.fetch_upstream_failed.load(Relaxed), 1);
    assert_eq!(m.fetch_unknown_ranges.load(Relaxed), 1);
}

/// A subscriber that stops reading does not lower the count the others get.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_subscriber_does_not_slow_the_others() {
    let relay = TestRelay::with_config(Config {
        fanout_buffer: 256,
        write_stall_ms: 300,
        ..Config::default()
    })
    .await;
    let publisher = relay.client("moqt").await;
    let name = FullTrackName::new("e2e", "bulk");
    let track = publisher
        .create_track(name.clone(), 2, TrackMode::Push)
        .await
        .unwrap();

    // The stuck subscriber: subscribes, then never reads a data stream.
    let stuck = relay.raw_subscriber(name.clone()).await;
    const N: u64 = 800;
    let mut healthy = Vec::new();
    for _ in 0..3 {
        let s = relay.client("moqt").await;
        let mut sub = s
            .subscribe(name.clone(), SubscribeOptions::default())
            .await
            .unwrap();
        healthy.push(tokio::spawn(async move {
            let _keep = s;
            let mut n = 0u64;
            while n < N {
                match tokio::time::timeout(Duration::from_secs(20), sub.next()).await {
                    Ok(Some(SubscriptionEvent::Object(_))) => n += 1,
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
            n
        }));
    }
    // Wait until the stuck subscription is established at the relay.
    within(5, async {
        while relay.relay.metrics.subscriptions.load(Relaxed) < 4 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // One subgroup of 16 MB: beyond the stuck peer's stream window plus the
    // relay's per-connection send buffer (about 5 MB, some 260 objects), so
    // its forwarder must fall more than the 256-object ring behind.
    let mut w = track.open_subgroup(0, 0).await.unwrap().unwrap();
    for o in 0..N {
        w.write(o, payload(0, o, 20_000)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    w.finish();
    for h in healthy {
        assert_eq!(
            within(40, h).await.unwrap(),
            N,
            "a healthy subscriber lost objects"
        );
    }
    // The stuck subscriber's stream was given up and it skipped what it missed.
    let m = &relay.relay.metrics;
    within(10, async {
        while m.streams_reset.load(Relaxed) == 0 || m.drops_lagged.load(Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        m.objects_out.load(Relaxed) < 4 * N,
        "the stuck subscriber cannot have received everything"
    );
    drop(stuck);
}
