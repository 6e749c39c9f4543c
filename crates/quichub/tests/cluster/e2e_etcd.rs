//! A cluster of relays on a real etcd (started here on loopback with a
//! temporary data directory): relays register on leases, claim what their
//! publishers announce, and follow each other over MoQT.

use quichub_testkit as common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use common::etcd::{etcd_binary, Etcd};
use common::{knows, test_config, until_async, within, TestRelay};
use moqt::{FullTrackName, TrackNamespace};
use quichub_client::{SubscribeOptions, SubscriptionEvent, TrackMode};

/// A relay of the cluster under `prefix` in `etcd`.
async fn member(etcd: &Etcd, prefix: &str) -> TestRelay {
    let mut c = test_config();
    c.cluster.registry = etcd.url(prefix);
    c.cluster.lease_ttl_s = 6;
    TestRelay::with_hub_config(c).await
}

fn node_url(r: &TestRelay) -> String {
    format!("moqt://{}/", r.addr)
}

/// Publisher on A, subscribers over raw QUIC and WebTransport on B and C:
/// every object reaches every subscriber; A serves one subscription per
/// track to each other relay; a second publisher of the namespace on B is
/// sent to A (REDIRECT); withdrawn, the namespace is free in etcd; a relay
/// that shuts down leaves the registry at once (its lease revoked), and
/// once every relay has left nothing of theirs stays in etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_share_a_broadcast_with_one_copy_per_track_between_relays() {
    let Some(bin) = etcd_binary() else { return };
    let etcd = Etcd::start(bin).await;
    let (a, b, c) = (
        member(&etcd, "t1").await,
        member(&etcd, "t1").await,
        member(&etcd, "t1").await,
    );
    until_async(15, || async { etcd.keys("/t1/nodes/").await.len() == 3 }).await;

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
    let ns = publisher
        .publish_namespace(TrackNamespace::from_path("live/show"))
        .await
        .unwrap();
    assert_eq!(
        etcd.keys("/t1/namespaces/").await,
        ["/t1/namespaces/live/show"]
    );
    knows(&b, "live/show").await;
    knows(&c, "live/show").await;

    const GROUPS: u64 = 3;
    const PER_GROUP: u64 = 10;
    const DATAGRAMS: u64 = 30;
    let mut tasks = Vec::new();
    for (relay, scheme) in [(&b, "moqt"), (&b, "https"), (&c, "moqt"), (&c, "https")] {
        let s = relay.client(scheme).await;
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
    // One upstream subscription per track at the publisher; at A one per
    // track from each of B and C, for four subscribers (and B's and C's
    // subscriptions to A's MQTT messages).
    until_async(10, || async {
        video.is_forwarding()
            && audio.is_forwarding()
            && a.relay.metrics.subscriptions.load(Relaxed) == 4 + 2
    })
    .await;
    assert_eq!(video.subscriptions_served(), 1);
    assert_eq!(audio.subscriptions_served(), 1);
    for r in [&b, &c] {
        let up = r.relay.upstream_by_origin();
        let to_a: Vec<_> = up
            .iter()
            .filter(|(u, _)| **u == *node_url(&a))
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(to_a, [2 + 1], "two tracks (and MQTT) upstream at A: {up:?}");
    }
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
    let want: Vec<_> = (0..GROUPS)
        .flat_map(|g| (0..PER_GROUP).map(move |o| (g, o, Bytes::from(format!("{g}:{o}")))))
        .collect();
    for t in tasks {
        let (objects, datagrams) = within(30, t).await.unwrap();
        assert_eq!(objects, want, "every stream object, in order");
        assert_eq!(datagrams, DATAGRAMS, "every datagram (loopback)");
    }
    // A sent each object once to B and once to C.
    let objects = GROUPS * PER_GROUP + DATAGRAMS;
    assert_eq!(a.relay.metrics.objects_out.load(Relaxed), 2 * objects);

    // First come, first served: a publisher of the same namespace on B is
    // sent to A.
    let rival = b.client("moqt").await;
    let e = rival
        .publish_namespace(TrackNamespace::from_path("live/show"))
        .await
        .err()
        .expect("refused");
    let e = format!("{e:#}");
    assert!(e.contains("REDIRECT") && e.contains(&node_url(&a)), "{e}");

    // Withdrawn: free in etcd, and forgotten by the others.
    drop(ns);
    until_async(10, || async {
        etcd.keys("/t1/namespaces/").await.is_empty()
    })
    .await;
    until_async(10, || async {
        b.relay
            .snapshot()
            .namespaces
            .iter()
            .all(|n| n.namespace.fields()[0] == ".quichub")
    })
    .await;
    // Now B may have it.
    let _ns_b = rival
        .publish_namespace(TrackNamespace::from_path("live/show"))
        .await
        .unwrap();
    knows(&c, "live/show").await;

    // A graceful stop sends C's clients to another member (GOAWAY) and
    // leaves the registry at once (not after the TTL).
    let client_of_c = c.client("moqt").await;
    let (_, goaway) = tokio::join!(
        within(10, c.hub.shutdown()),
        within(10, client_of_c.goaway())
    );
    let to = String::from_utf8(goaway.expect("GOAWAY").new_session_uri.to_vec()).unwrap();
    assert!(to == node_url(&a) || to == node_url(&b), "GOAWAY to {to}");
    let c_key = etcd
        .keys("/t1/nodes/")
        .await
        .into_iter()
        .filter(|k| k.contains(&c.addr.port().to_string()))
        .count();
    assert_eq!(c_key, 0, "C still registered");
    drop(rival);
    drop(publisher);
    // The others follow it no more; once all have left nothing remains.
    until_async(10, || async {
        a.relay
            .upstream_by_origin()
            .iter()
            .all(|(u, _)| **u != *node_url(&c))
    })
    .await;
    within(10, a.hub.shutdown()).await;
    within(10, b.hub.shutdown()).await;
    assert_eq!(etcd.keys("/t1/").await, Vec::<String>::new());
}

/// etcd stopped mid-run: established flows keep going; a new namespace is
/// refused (retry later) while it is down; once it is back, registrations
/// resume and the others learn the new namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flows_survive_an_etcd_restart_and_registrations_resume() {
    let Some(bin) = etcd_binary() else { return };
    let mut etcd = Etcd::start(bin).await;
    let (a, b) = (member(&etcd, "t2").await, member(&etcd, "t2").await);
    let publisher = a.client("moqt").await;
    let name = FullTrackName::new("room/1", "imu");
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Announce)
        .await
        .unwrap();
    let _ns = publisher
        .publish_namespace(TrackNamespace::from_path("room/1"))
        .await
        .unwrap();
    knows(&b, "room/1").await;
    let s = b.client("moqt").await;
    let mut sub = s
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    until_async(10, || async { track.is_forwarding() }).await;
    let mut w = track
        .open_subgroup(0, 0)
        .await
        .unwrap()
        .expect("forwarding");
    let mut got = Vec::new();
    exchange(&mut w, &mut sub, &mut got, 0..10).await;

    etcd.stop();
    // Past the lease TTL: nothing established depends on etcd.
    tokio::time::sleep(Duration::from_secs(7)).await;
    exchange(&mut w, &mut sub, &mut got, 10..20).await;
    let e = publisher
        .publish_namespace(TrackNamespace::from_path("room/2"))
        .await
        .err()
        .expect("no claim without etcd");
    assert!(format!("{e:#}").contains("registry"), "{e:#}");

    etcd.restart().await;
    exchange(&mut w, &mut sub, &mut got, 20..30).await;
    assert_eq!(got, (0..30).collect::<Vec<_>>());
    // Claims go through again (the publisher retries, as told to).
    let _ns2 = within(15, async {
        loop {
            match publisher
                .publish_namespace(TrackNamespace::from_path("room/2"))
                .await
            {
                Ok(h) => break h,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    })
    .await;
    knows(&b, "room/2").await;
    // Both relays are registered again, and room/1's claim is back.
    until_async(15, || async {
        etcd.keys("/t2/nodes/").await.len() == 2 && etcd.keys("/t2/namespaces/").await.len() == 2
    })
    .await;
    // A relay that joins now finds the others.
    let c = member(&etcd, "t2").await;
    knows(&c, "room/1").await;
    knows(&c, "room/2").await;
}

/// Writes objects `ids` and waits until the subscriber has them all.
async fn exchange(
    w: &mut quichub_client::SubgroupWriter<'_>,
    sub: &mut quichub_client::Subscription,
    got: &mut Vec<u64>,
    ids: std::ops::Range<u64>,
) {
    let want = ids.end as usize;
    for o in ids {
        w.write(o, Bytes::from(o.to_string())).await.unwrap();
    }
    while got.len() < want {
        match within(10, sub.next()).await {
            Some(SubscriptionEvent::Object(o)) => got.push(o.object_id),
            Some(_) => {}
            None => panic!("subscription ended"),
        }
    }
}

const BIN: &str = env!("CARGO_BIN_EXE_quichub");

/// `quichub relay` in a process of its own, in the cluster of `registry`.
struct RelayProcess {
    child: std::process::Child,
    port: u16,
}

impl RelayProcess {
    fn start(config: &std::path::Path) -> RelayProcess {
        use std::io::BufRead;
        let mut child = std::process::Command::new(BIN)
            .arg("relay")
            .arg("--config")
            .arg(config)
            .args(["--bind", "127.0.0.1:0", "--metrics", "off", "--mqtt", "off"])
            .args(["--http", "off", "--data-dir", "off"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("spawn relay");
        let stdout = child.stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(stdout).lines();
        let first = lines.next().expect("relay printed nothing").unwrap();
        let addr = first
            .split_whitespace()
            .find(|w| w.starts_with("127.0.0.1:"))
            .unwrap_or_else(|| panic!("no address in {first:?}"));
        let port = addr.rsplit(':').next().unwrap().parse().unwrap();
        std::thread::spawn(move || for _ in lines {});
        RelayProcess { child, port }
    }

    /// SIGKILL: no goodbye to anyone, etcd included.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    async fn client(&self) -> quichub_client::ClientSession {
        quichub_client::ClientSession::connect(
            &format!("moqt://127.0.0.1:{}/", self.port),
            quichub_client::ConnectOptions {
                verify: quichub_client::Verify::Insecure,
                bind: "127.0.0.1:0".parse().unwrap(),
                timeout: Duration::from_secs(5),
                endpoint: None,
                draft: None,
            },
        )
        .await
        .unwrap()
    }

    /// Etcd keys of this relay's registration.
    fn node_key_part(&self) -> String {
        format!("127.0.0.1%3A{}", self.port)
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Publishes `name` (and its namespace) at `relay`, retrying while another
/// relay's claim on it has not expired.
async fn publish(
    relay: &RelayProcess,
    name: &FullTrackName,
) -> (
    quichub_client::ClientSession,
    std::sync::Arc<quichub_client::LocalTrack>,
    quichub_client::NamespaceHandle,
) {
    let p = relay.client().await;
    let track = p
        .create_track(name.clone(), 1, TrackMode::Announce)
        .await
        .unwrap();
    let ns = within(15, async {
        loop {
            match p.publish_namespace(name.namespace.clone()).await {
                Ok(ns) => break ns,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    })
    .await;
    (p, track, ns)
}

/// Subscribes to `name` at `relay`, retrying until the relay knows it.
async fn subscribe_when_known(
    s: &quichub_client::ClientSession,
    name: &FullTrackName,
) -> quichub_client::Subscription {
    within(20, async {
        loop {
            match s.subscribe(name.clone(), SubscribeOptions::default()).await {
                Ok(sub) => break sub,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    })
    .await
}

/// kill -9 of the relay that holds a publisher: its registration and claim
/// expire with its lease; the publisher publishes again at another relay,
/// and the edge's subscriber, subscribed once, gets it from there after a
/// gap; when the publisher leaves for good the subscription ends
/// (PUBLISH_DONE). kill -9 of the edge: it drops out too. Once all are killed, nothing of
/// theirs stays in etcd after the leases expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_relays_drop_out_and_their_publisher_moves() {
    let Some(bin) = etcd_binary() else { return };
    let etcd = Etcd::start(bin).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("relay.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nregistry = \"{}\"\nlease_ttl_s = 3\n",
            etcd.url("t3")
        ),
    )
    .unwrap();
    let mut a = RelayProcess::start(&config);
    let mut b = RelayProcess::start(&config);
    let c = RelayProcess::start(&config);
    until_async(15, || async { etcd.keys("/t3/nodes/").await.len() == 3 }).await;

    let name = FullTrackName::new("live/k", "video");
    let (p1, track1, ns1) = publish(&a, &name).await;
    let viewer = b.client().await;
    let mut sub = subscribe_when_known(&viewer, &name).await;
    until_async(10, || async { track1.is_forwarding() }).await;
    let mut w = track1
        .open_subgroup(0, 0)
        .await
        .unwrap()
        .expect("forwarding");
    w.write(0, Bytes::from_static(b"before")).await.unwrap();
    match within(10, sub.next()).await {
        Some(SubscriptionEvent::Object(o)) => assert_eq!(o.payload, "before"),
        e => panic!("{e:?}"),
    }

    a.kill();
    drop(w);
    drop((ns1, track1, p1));
    // Its lease expires: registration and claim gone.
    let a_part = a.node_key_part();
    until_async(15, || async {
        let keys = etcd.keys("/t3/").await;
        !keys
            .iter()
            .any(|k| k.contains(&a_part) || k.contains("namespaces/"))
    })
    .await;
    // The publisher comes back at C (its groups going on from where they
    // were); B moves the track there, and its subscriber, subscribed
    // once, sees a gap and the next group.
    let (p2, track2, ns2) = publish(&c, &name).await;
    until_async(15, || async { track2.is_forwarding() }).await;
    let mut w = track2
        .open_subgroup(1, 0)
        .await
        .unwrap()
        .expect("forwarding");
    w.write(0, Bytes::from_static(b"after")).await.unwrap();
    within(10, async {
        loop {
            match sub.next().await {
                Some(SubscriptionEvent::Object(o)) => {
                    assert_eq!((o.group, &o.payload[..]), (1, &b"after"[..]));
                    break;
                }
                Some(SubscriptionEvent::Done { .. }) | None => panic!("the subscription ended"),
                Some(_) => {}
            }
        }
    })
    .await;
    drop(w);

    // The publisher leaves for good: PUBLISH_DONE reaches the subscriber.
    p2.close(0, "gone");
    drop((ns2, track2, p2));
    within(10, async {
        loop {
            match sub.next().await {
                Some(SubscriptionEvent::Done { .. }) | None => break,
                Some(_) => {}
            }
        }
    })
    .await;

    // kill -9 of the edge: it drops out as well.
    b.kill();
    let b_part = b.node_key_part();
    until_async(15, || async {
        !etcd
            .keys("/t3/nodes/")
            .await
            .iter()
            .any(|k| k.contains(&b_part))
    })
    .await;
    drop(c);
    until_async(15, || async { etcd.keys("/t3/").await.is_empty() }).await;
}

/// MQTT across the cluster, with mosquitto's clients: a message published
/// on B reaches subscribers on C and A (QoS 1, MQTT 5 properties kept),
/// a retained one is retained on the others, and no message goes round:
/// each relay sends its own clients' messages once and nothing it got from
/// another relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_published_on_one_relay_reaches_subscribers_on_the_others() {
    let Some(bin) = etcd_binary() else { return };
    if common::mqtt_tools().is_none() {
        return;
    }
    let etcd = Etcd::start(bin).await;
    let mqtt_member = || async {
        let mut c = test_config();
        c.cluster.registry = etcd.url("t4");
        c.cluster.lease_ttl_s = 6;
        c.mqtt.tcp = "127.0.0.1:0".into();
        TestRelay::with_hub_config(c).await
    };
    let (a, b, c) = (
        mqtt_member().await,
        mqtt_member().await,
        mqtt_member().await,
    );
    let links = || [&a, &b, &c].map(|r| r.hub.cluster_mqtt().expect("linked").metrics.clone());
    // Each relay receives the others' messages once their sessions are up:
    // one upstream subscription per pair of relays.
    until_async(20, || async {
        [&a, &b, &c].iter().all(|r| {
            r.relay
                .upstream_by_origin()
                .iter()
                .filter(|(_, n)| *n == 1)
                .count()
                == 2
        })
    })
    .await;
    let port = |r: &TestRelay| r.hub.mqtt_addr().unwrap().port().to_string();
    let sub = |r: &TestRelay, id: &str| {
        tokio::process::Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port(r), "-i", id, "-V", "mqttv5"])
            .args(["-q", "1", "-t", "sensors/#", "-C", "2", "-F", "%t %p %r %C"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("mosquitto_sub")
    };
    let on_c = sub(&c, "viewer-c");
    let on_a = sub(&a, "viewer-a");
    until_async(10, || async {
        c.hub.broker().client_subscriptions("viewer-c") == 1
            && a.hub.broker().client_subscriptions("viewer-a") == 1
    })
    .await;
    for args in [
        &[
            "-t",
            "sensors/1",
            "-m",
            "21.5",
            "-q",
            "1",
            "-D",
            "publish",
            "content-type",
            "text/plain",
        ][..],
        &["-t", "sensors/2", "-m", "hello", "-q", "1", "-r"][..],
    ] {
        let out = within(
            10,
            tokio::process::Command::new("mosquitto_pub")
                .args(["-h", "127.0.0.1", "-p", &port(&b), "-V", "mqttv5"])
                .args(args)
                .output(),
        )
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for s in [on_c, on_a] {
        let out = within(15, s.wait_with_output()).await.unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            text, "sensors/1 21.5 0 text/plain\nsensors/2 hello 0 \n",
            "{text}"
        );
    }
    // Retained on the others too: a late subscriber on C gets it at once.
    let late = tokio::process::Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &port(&c), "-V", "mqttv5"])
        .args(["-t", "sensors/2", "-C", "1", "-F", "%t %p %r"])
        .output();
    let out = within(10, late).await.unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "sensors/2 hello 1\n"
    );
    // Sent once by B, received once by each of A and C, sent on by none.
    let [la, lb, lc] = links();
    assert_eq!(lb.sent.load(Relaxed), 2);
    assert_eq!(la.sent.load(Relaxed) + lc.sent.load(Relaxed), 0);
    assert_eq!(la.received.load(Relaxed), 2);
    assert_eq!(lc.received.load(Relaxed), 2);
    assert_eq!(lb.received.load(Relaxed), 0);
}

/// A relay whose certificate changes (reloaded, or a self-signed one
/// renewed) registers its new SHA-256: a relay that joins afterwards pins
/// the new one and follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_certificate_is_registered_and_pinned() {
    let Some(bin) = etcd_binary() else { return };
    let etcd = Etcd::start(bin).await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    quichub_net::tls::Identity::self_signed(&["localhost"])
        .unwrap()
        .write_pem(&cert, &key)
        .unwrap();
    let mut c = test_config();
    c.cluster.registry = etcd.url("t5");
    c.cluster.lease_ttl_s = 6;
    c.tls.cert = Some(cert.clone());
    c.tls.key = Some(key.clone());
    let a = TestRelay::with_hub_config(c).await;
    let registered = || async {
        let mut client = etcd.client().await.unwrap();
        let r = client
            .get(
                "/t5/nodes/",
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        r.kvs()
            .iter()
            .map(|kv| kv.value_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let old = a.hub.fingerprint();
    until_async(10, || async {
        registered().await.iter().any(|v| v.contains(&old))
    })
    .await;
    // (Connected before the reload: the test client pins the old hash.)
    let publisher = a.client("moqt").await;

    quichub_net::tls::Identity::self_signed(&["localhost"])
        .unwrap()
        .write_pem(&cert, &key)
        .unwrap();
    a.hub.reload().unwrap();
    let new = a.hub.fingerprint();
    assert_ne!(old, new);
    until_async(15, || async {
        registered().await.iter().any(|v| v.contains(&new))
    })
    .await;

    let _ns = publisher
        .publish_namespace(TrackNamespace::from_path("after/reload"))
        .await
        .unwrap();
    let d = member(&etcd, "t5").await;
    knows(&d, "after/reload").await;
}

/// A track a publisher pushes (PUBLISH, no PUBLISH_NAMESPACE) on A is
/// pushed on to B and C, which serve it to their subscribers; B does not
/// push it on to C (C has it from A), and the MQTT gateway's tracks are not
/// pushed at all (they travel as MQTT messages).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_tracks_reach_the_other_relays() {
    let Some(bin) = etcd_binary() else { return };
    let etcd = Etcd::start(bin).await;
    let (a, b, c) = (
        member(&etcd, "t6").await,
        member(&etcd, "t6").await,
        member(&etcd, "t6").await,
    );
    until_async(15, || async {
        [&a, &b, &c]
            .iter()
            .all(|r| r.relay.metrics.origin_sessions.load(Relaxed) == 2)
    })
    .await;
    let publisher = a.client("moqt").await;
    let name = FullTrackName::new("push/cam", "video");
    let track = publisher
        .create_track(name.clone(), 1, TrackMode::Push)
        .await
        .unwrap();
    let pushed_to = |r: &TestRelay| {
        r.relay
            .snapshot()
            .tracks
            .iter()
            .filter(|t| t.name == name)
            .count()
    };
    until_async(10, || async { pushed_to(&b) == 1 && pushed_to(&c) == 1 }).await;
    let mut subs = Vec::new();
    for r in [&b, &c] {
        let s = r.client("moqt").await;
        let sub = s
            .subscribe(name.clone(), SubscribeOptions::default())
            .await
            .unwrap();
        subs.push((s, sub));
    }
    let mut w = track
        .open_subgroup(0, 0)
        .await
        .unwrap()
        .expect("forwarding");
    w.write(0, Bytes::from_static(b"pushed")).await.unwrap();
    for (_s, sub) in &mut subs {
        match within(10, sub.next()).await {
            Some(SubscriptionEvent::Object(o)) => assert_eq!(o.payload, "pushed"),
            e => panic!("{e:?}"),
        }
    }
    // A sent it once to each; B and C sent it to their subscriber only,
    // not to each other.
    assert_eq!(a.relay.metrics.objects_out.load(Relaxed), 2);
    assert_eq!(b.relay.metrics.objects_out.load(Relaxed), 1);
    assert_eq!(c.relay.metrics.objects_out.load(Relaxed), 1);
}
