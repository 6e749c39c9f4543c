//! `quichub interop-client`: the moq-interop-runner test client
//! (shared/specs/interop/TEST-CLIENT-INTERFACE.md): TAP 14 on stdout, exit 0
//! when every requested test passed, 1 when one failed, 127 for an unknown test.

use std::time::{Duration, Instant};

use moqt::error::request_error;
use moqt::{FullTrackName, TrackNamespace};
use quichub_client::{ClientSession, ConnectOptions, SubscribeOptions, TrackMode};

/// Interop client options (environment variables take precedence over defaults,
/// explicit flags over environment).
#[derive(clap::Args, Debug)]
pub struct InteropArgs {
    /// Relay URL (`https://` WebTransport, `moqt://` raw QUIC, `ws://` or
    /// `wss://` WebSocket); env RELAY_URL.
    #[arg(short, long)]
    pub relay: Option<String>,
    /// Run one test; env TESTCASE.
    #[arg(short, long)]
    pub test: Option<String>,
    /// List the tests.
    #[arg(short, long)]
    pub list: bool,
    /// Verbose output; env VERBOSE=1.
    #[arg(short, long)]
    pub verbose: bool,
    /// Skip certificate verification; env TLS_DISABLE_VERIFY=1.
    #[arg(long)]
    pub tls_disable_verify: bool,
    /// Pin the relay certificate by SHA-256 (hex) instead.
    #[arg(long)]
    pub fingerprint: Option<String>,
    /// MoQT draft to speak: 18 (native), 16 or 14 (through quichub's
    /// translating bridge; `moqt://` and `https://` only).
    #[arg(long, value_parser = crate::parse_draft, default_value = "18")]
    pub draft: crate::Draft,
}

/// The moq-interop-runner's control-plane cases, then quichub's data-plane
/// and request cases (each on a track of its own under `moq-test/interop`).
const TESTS: &[&str] = &[
    "setup-only",
    "announce-only",
    "publish-namespace-done",
    "subscribe-error",
    "announce-subscribe",
    "subscribe-before-announce",
    "subgroup-objects",
    "datagram-objects",
    "object-properties",
    "forward-zero",
    "fetch-standalone",
    "fetch-joining",
    "track-status",
    "subscribe-namespace",
    "subscribe-tracks",
];

const NS: &str = "moq-test/interop";
const TRACK: &str = "test-track";

struct Ctx {
    url: String,
    opts: ConnectOptions,
    /// Sessions a case opened, closed when it ends (so no track or
    /// namespace of it outlives it at the relay).
    opened: std::sync::Mutex<Vec<ClientSession>>,
    /// Tells this run's tracks from another run's on a shared relay.
    run_id: String,
}

impl Ctx {
    async fn connect(&self) -> anyhow::Result<ClientSession> {
        let s = ClientSession::connect(&self.url, self.opts.clone()).await?;
        self.opened.lock().expect("opened").push(s.clone());
        Ok(s)
    }

    fn close_all(&self) {
        for s in self.opened.lock().expect("opened").drain(..) {
            s.close(0, "done");
        }
    }
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

pub async fn run(a: InteropArgs) -> anyhow::Result<u8> {
    if a.list {
        for t in TESTS {
            println!("{t}");
        }
        return Ok(0);
    }
    let url = a
        .relay
        .or_else(|| std::env::var("RELAY_URL").ok())
        .unwrap_or_else(|| "https://localhost:4443".into());
    let test = a
        .test
        .or_else(|| std::env::var("TESTCASE").ok().filter(|s| !s.is_empty()));
    let insecure = a.tls_disable_verify || env_flag("TLS_DISABLE_VERIFY");
    let verbose = a.verbose || env_flag("VERBOSE");
    let verify = match (&a.fingerprint, insecure) {
        (Some(f), _) => crate::verify_from(Some(f))?,
        (None, true) => quichub_client::Verify::Insecure,
        (None, false) => {
            anyhow::bail!("certificate verification needs --fingerprint, or --tls-disable-verify / TLS_DISABLE_VERIFY=1")
        }
    };
    let selected: Vec<&str> = match &test {
        Some(t) if TESTS.contains(&t.as_str()) => {
            vec![TESTS.iter().find(|x| **x == t).expect("listed")]
        }
        Some(t) => {
            println!("TAP version 14");
            println!("1..0 # SKIP test {t} not supported");
            return Ok(127);
        }
        None => TESTS.to_vec(),
    };
    let ctx = Ctx {
        url: url.clone(),
        opts: ConnectOptions {
            verify,
            draft: a.draft.0,
            ..Default::default()
        },
        opened: Default::default(),
        run_id: format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis())
        ),
    };
    println!("TAP version 14");
    println!("# quichub interop-client v{}", env!("CARGO_PKG_VERSION"));
    println!("# Relay: {url}");
    println!("# Draft: draft-ietf-moq-transport-18");
    println!("1..{}", selected.len());
    let mut failed = 0;
    for (i, name) in selected.iter().enumerate() {
        let started = Instant::now();
        let limit = match *name {
            "announce-subscribe" => Duration::from_secs(3),
            "subscribe-before-announce" => Duration::from_millis(3500),
            n if TESTS[..6].contains(&n) => Duration::from_secs(2),
            // quichub's own cases: several sessions and waits of their own.
            _ => Duration::from_secs(10),
        };
        // Connection setup is not part of the per-test budgets above.
        let outcome = tokio::time::timeout(limit + Duration::from_secs(3), run_one(&ctx, name))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("timeout after {} ms", limit.as_millis())));
        ctx.close_all();
        let ms = started.elapsed().as_millis();
        match outcome {
            Ok(note) => {
                println!("ok {} - {name}", i + 1);
                println!("  ---\n  duration_ms: {ms}");
                if verbose || !note.is_empty() {
                    println!("  message: {note:?}");
                }
                println!("  ...");
            }
            Err(e) => {
                failed += 1;
                println!("not ok {} - {name}", i + 1);
                println!(
                    "  ---\n  duration_ms: {ms}\n  message: {:?}\n  ...",
                    format!("{e:#}")
                );
            }
        }
    }
    // Let the last CONNECTION_CLOSEs leave before the process exits.
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(if failed == 0 { 0 } else { 1 })
}

async fn run_one(ctx: &Ctx, name: &str) -> anyhow::Result<String> {
    let ns = TrackNamespace::from_path(NS);
    let track = FullTrackName::new(NS, TRACK);
    match name {
        "setup-only" => {
            let s = ctx.connect().await?;
            let peer = s.peer_setup().ok_or_else(|| anyhow::anyhow!("no SETUP"))?;
            let imp = peer
                .implementation()
                .map(|b| String::from_utf8_lossy(b).into_owned());
            s.close(0, "done");
            Ok(format!(
                "peer implementation {}",
                imp.unwrap_or_else(|| "unknown".into())
            ))
        }
        "announce-only" => {
            let s = ctx.connect().await?;
            let h = s.publish_namespace(ns).await?;
            drop(h);
            s.close(0, "done");
            Ok(String::new())
        }
        "publish-namespace-done" => {
            let s = ctx.connect().await?;
            let h = s.publish_namespace(ns).await?;
            h.withdraw();
            // Let the cancellation reach the relay before closing.
            tokio::time::sleep(Duration::from_millis(50)).await;
            s.close(0, "done");
            Ok(String::new())
        }
        "subscribe-error" => {
            let s = ctx.connect().await?;
            let r = s
                .subscribe(
                    FullTrackName::new("nonexistent/namespace", TRACK),
                    SubscribeOptions::default(),
                )
                .await;
            s.close(0, "done");
            match r {
                Err(e) if e.to_string().contains("SUBSCRIBE refused") => {
                    Ok(format!("expected error: {e}"))
                }
                Err(e) => Err(e),
                Ok(_) => anyhow::bail!("expected REQUEST_ERROR, received SUBSCRIBE_OK"),
            }
        }
        "announce-subscribe" => {
            let publisher = ctx.connect().await?;
            let _track = publisher
                .create_track(track.clone(), 128, TrackMode::Announce)
                .await?;
            let _h = publisher.publish_namespace(ns).await?;
            let subscriber = ctx.connect().await?;
            let sub = subscriber
                .subscribe(track, SubscribeOptions::default())
                .await?;
            sub.cancel();
            subscriber.close(0, "done");
            publisher.close(0, "done");
            Ok(String::new())
        }
        "subscribe-before-announce" => {
            let subscriber = ctx.connect().await?;
            let sub_task = {
                let subscriber = subscriber.clone();
                let track = track.clone();
                tokio::spawn(async move {
                    subscriber
                        .subscribe(
                            track,
                            SubscribeOptions {
                                rendezvous_ms: Some(2500),
                                ..Default::default()
                            },
                        )
                        .await
                })
            };
            tokio::time::sleep(Duration::from_millis(500)).await;
            let publisher = ctx.connect().await?;
            let _track = publisher
                .create_track(track, 128, TrackMode::Announce)
                .await?;
            let _h = publisher.publish_namespace(ns).await?;
            let r = sub_task.await?;
            subscriber.close(0, "done");
            publisher.close(0, "done");
            match r {
                Ok(sub) => {
                    sub.cancel();
                    Ok("SUBSCRIBE_OK after the publisher arrived".into())
                }
                Err(e)
                    if e.to_string()
                        .contains(&format!("{:#x}", request_error::DOES_NOT_EXIST))
                        || e.to_string().contains("SUBSCRIBE refused") =>
                {
                    Ok(format!("relay does not hold pending subscriptions: {e}"))
                }
                Err(e) => Err(e),
            }
        }
        other => data_case(ctx, other).await,
    }
}

/// A publisher holding `name` (announced in its namespace), forwarding to
/// the relay once a subscriber came.
struct Source {
    /// Held: the track lives as long as its session.
    _session: ClientSession,
    track: std::sync::Arc<quichub_client::LocalTrack>,
    _ns: quichub_client::NamespaceHandle,
}

impl Source {
    async fn start(ctx: &Ctx, name: &FullTrackName) -> anyhow::Result<Self> {
        let session = ctx.connect().await?;
        let track = session
            .create_track(name.clone(), 128, TrackMode::Announce)
            .await?;
        let ns = session.publish_namespace(name.namespace.clone()).await?;
        Ok(Self {
            _session: session,
            track,
            _ns: ns,
        })
    }

    async fn forwarding(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.track.is_forwarding() {
            anyhow::ensure!(Instant::now() < deadline, "the relay never subscribed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// Groups `groups`, `per` objects each, payload "g:o", one subgroup
    /// stream per group.
    async fn send(&self, groups: std::ops::Range<u64>, per: u64) -> anyhow::Result<()> {
        for g in groups {
            let mut w = self
                .track
                .open_subgroup(g, 0)
                .await?
                .ok_or_else(|| anyhow::anyhow!("not forwarding"))?;
            for o in 0..per {
                w.write(o, bytes::Bytes::from(format!("{g}:{o}"))).await?;
            }
            w.finish();
        }
        Ok(())
    }
}

/// The next `n` objects of `sub` as (group, object, payload), within 2 s.
async fn objects(
    sub: &mut quichub_client::Subscription,
    n: usize,
) -> anyhow::Result<Vec<(u64, u64, String)>> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while got.len() < n {
        match tokio::time::timeout_at(deadline, sub.next()).await {
            Ok(Some(quichub_client::SubscriptionEvent::Object(o))) => {
                got.push(seen(o.group, o.object_id, &o.payload))
            }
            Ok(Some(_)) => {}
            Ok(None) => anyhow::bail!("subscription ended after {} objects", got.len()),
            Err(_) => anyhow::bail!("{} of {n} objects arrived", got.len()),
        }
    }
    Ok(got)
}

/// An object as the cases compare it: (group, object, payload as text).
fn seen(group: u64, object: u64, payload: &[u8]) -> (u64, u64, String) {
    (group, object, String::from_utf8_lossy(payload).into_owned())
}

fn expected(groups: std::ops::Range<u64>, per: u64) -> Vec<(u64, u64, String)> {
    groups
        .flat_map(|g| (0..per).map(move |o| (g, o, format!("{g}:{o}"))))
        .collect()
}

/// quichub's data-plane and request cases.
async fn data_case(ctx: &Ctx, name: &str) -> anyhow::Result<String> {
    use moqt::message::FetchKind;
    use moqt::{Location, Parameters};
    let ns_path = format!("{NS}/{name}/{}", ctx.run_id);
    let track = FullTrackName::new(&ns_path, TRACK);
    match name {
        "subgroup-objects" => {
            let src = Source::start(ctx, &track).await?;
            let s = ctx.connect().await?;
            let mut sub = s.subscribe(track, SubscribeOptions::default()).await?;
            src.forwarding().await?;
            src.send(0..2, 5).await?;
            let mut got = objects(&mut sub, 10).await?;
            // In order within a subgroup; groups travel on streams of their own.
            let in_order = |g: u64| got.iter().filter(|o| o.0 == g).map(|o| o.1).is_sorted();
            anyhow::ensure!(in_order(0) && in_order(1), "out of order: {got:?}");
            got.sort();
            anyhow::ensure!(got == expected(0..2, 5), "objects differ: {got:?}");
            Ok("2 groups of 5 objects, in order within each".into())
        }
        "datagram-objects" => {
            let src = Source::start(ctx, &track).await?;
            let s = ctx.connect().await?;
            let mut sub = s.subscribe(track, SubscribeOptions::default()).await?;
            src.forwarding().await?;
            for g in 0..5u64 {
                let sent = src
                    .track
                    .send_datagram(g, 0, bytes::Bytes::from(format!("{g}:0")));
                anyhow::ensure!(sent, "datagram not sent");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Datagrams may be lost, even on loopback under load: most must
            // arrive, and each whole.
            let mut got = objects(&mut sub, 3).await?;
            while let Ok(Some(ev)) =
                tokio::time::timeout(Duration::from_millis(300), sub.next()).await
            {
                if let quichub_client::SubscriptionEvent::Object(o) = ev {
                    got.push(seen(o.group, o.object_id, &o.payload));
                }
            }
            let all = expected(0..5, 1);
            anyhow::ensure!(
                got.iter().all(|o| all.contains(o)),
                "datagrams differ: {got:?}"
            );
            Ok(format!("{} of 5 datagram objects", got.len()))
        }
        "object-properties" => {
            let src = Source::start(ctx, &track).await?;
            let s = ctx.connect().await?;
            let mut sub = s.subscribe(track, SubscribeOptions::default()).await?;
            src.forwarding().await?;
            let mut props = bytes::BytesMut::new();
            moqt::coding::put_kvps(&mut props, &[moqt::KeyValue::int(0x0A, 12345)]);
            let props = props.freeze();
            let mut w = src
                .track
                .open_subgroup_with_properties(0, 0, 128)
                .await?
                .ok_or_else(|| anyhow::anyhow!("not forwarding"))?;
            w.write_with_properties(0, props.clone(), bytes::Bytes::from_static(b"p"))
                .await?;
            w.finish();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
            loop {
                match tokio::time::timeout_at(deadline, sub.next()).await {
                    Ok(Some(quichub_client::SubscriptionEvent::Object(o))) => {
                        anyhow::ensure!(o.properties == props, "properties changed on the way");
                        return Ok("object properties forwarded unchanged".into());
                    }
                    Ok(Some(_)) => {}
                    _ => anyhow::bail!("no object"),
                }
            }
        }
        "forward-zero" => {
            let src = Source::start(ctx, &track).await?;
            let s = ctx.connect().await?;
            let mut sub = s
                .subscribe(
                    track,
                    SubscribeOptions {
                        forward: Some(false),
                        ..Default::default()
                    },
                )
                .await?;
            // A relay may subscribe upstream at once (and not forward to
            // us) or only at FORWARD 1: objects are sent if it asks.
            let _ = tokio::time::timeout(Duration::from_secs(1), src.forwarding()).await;
            if src.track.is_forwarding() {
                src.send(0..1, 3).await?;
            }
            if let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(300), sub.next()).await
            {
                anyhow::bail!("FORWARD 0 delivered {e:?}");
            }
            sub.update(Parameters {
                forward: Some(true),
                ..Default::default()
            })
            .await?;
            src.forwarding().await?;
            // Only what comes after FORWARD 1.
            tokio::time::sleep(Duration::from_millis(100)).await;
            src.send(1..2, 3).await?;
            let got = objects(&mut sub, 3).await?;
            anyhow::ensure!(got == expected(1..2, 3), "objects differ: {got:?}");
            Ok("nothing at FORWARD 0, objects after REQUEST_UPDATE FORWARD 1".into())
        }
        "fetch-standalone" | "fetch-joining" => {
            let src = Source::start(ctx, &track).await?;
            let s = ctx.connect().await?;
            let mut sub = s
                .subscribe(track.clone(), SubscribeOptions::default())
                .await?;
            src.forwarding().await?;
            src.send(0..3, 4).await?;
            objects(&mut sub, 12).await?;
            let late = ctx.connect().await?;
            let mut _joined = None;
            let (kind, want) = if name == "fetch-standalone" {
                let kind = FetchKind::Standalone {
                    track: track.clone(),
                    start: Location::new(1, 0),
                    end: Location::new(2, 0),
                };
                (kind, expected(1..3, 4))
            } else {
                let joined = late
                    .subscribe(
                        track.clone(),
                        SubscribeOptions {
                            filter: Some(moqt::SubscriptionFilter::LargestObject),
                            ..Default::default()
                        },
                    )
                    .await?;
                let kind = FetchKind::AbsoluteJoining {
                    joining_request_id: joined.request_id,
                    joining_start: 0,
                };
                _joined = Some(joined);
                (kind, expected(0..3, 4))
            };
            let r = late.fetch(kind, Parameters::default()).await?;
            let got: Vec<_> = r
                .objects
                .iter()
                .map(|o| seen(o.group, o.object_id, &o.payload))
                .collect();
            anyhow::ensure!(got == want, "fetched {got:?}");
            Ok(format!("{} objects fetched, in order", got.len()))
        }
        "track-status" => {
            let src = Source::start(ctx, &track).await?;
            let s = ctx.connect().await?;
            let mut sub = s
                .subscribe(track.clone(), SubscribeOptions::default())
                .await?;
            src.forwarding().await?;
            src.send(0..2, 3).await?;
            objects(&mut sub, 6).await?;
            let ok = s.track_status(track).await?;
            anyhow::ensure!(
                ok.params.largest_object == Some(Location::new(1, 2)),
                "largest {:?}",
                ok.params.largest_object
            );
            Ok("TRACK_STATUS gives the largest object".into())
        }
        "subscribe-namespace" => {
            let s = ctx.connect().await?;
            let mut req = s
                .subscribe_namespace(TrackNamespace::from_path(&ns_path))
                .await?;
            let _src = Source::start(ctx, &track).await?;
            match tokio::time::timeout(Duration::from_secs(2), req.next()).await {
                Ok(Some(moqt::Message::Namespace(suffix))) => {
                    anyhow::ensure!(suffix.fields().is_empty(), "suffix {suffix:?}");
                    Ok("NAMESPACE for the published namespace".into())
                }
                other => anyhow::bail!("expected NAMESPACE, got {other:?}"),
            }
        }
        "subscribe-tracks" => {
            let s = ctx.connect().await?;
            let _req = s
                .subscribe_tracks(TrackNamespace::from_path(&ns_path), true)
                .await?;
            let p = ctx.connect().await?;
            let pushed = p.create_track(track.clone(), 128, TrackMode::Push).await?;
            let (got, mut sub) = tokio::time::timeout(Duration::from_secs(2), s.next_publish())
                .await?
                .ok_or_else(|| anyhow::anyhow!("no PUBLISH"))?;
            anyhow::ensure!(got == track, "pushed {got:?}");
            let mut w = pushed
                .open_subgroup(0, 0)
                .await?
                .ok_or_else(|| anyhow::anyhow!("not forwarding"))?;
            w.write(0, bytes::Bytes::from_static(b"0:0")).await?;
            w.finish();
            let got = objects(&mut sub, 1).await?;
            anyhow::ensure!(got == expected(0..1, 1), "objects differ: {got:?}");
            Ok("PUBLISH for a pushed track, and its objects".into())
        }
        _ => anyhow::bail!("unknown test"),
    }
}
