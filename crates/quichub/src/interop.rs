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
    /// Relay URL (`https://` WebTransport, `moqt://` raw QUIC); env RELAY_URL.
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
}

const TESTS: &[&str] = &[
    "setup-only",
    "announce-only",
    "publish-namespace-done",
    "subscribe-error",
    "announce-subscribe",
    "subscribe-before-announce",
];

const NS: &str = "moq-test/interop";
const TRACK: &str = "test-track";

struct Ctx {
    url: String,
    opts: ConnectOptions,
}

impl Ctx {
    async fn connect(&self) -> anyhow::Result<ClientSession> {
        ClientSession::connect(&self.url, self.opts.clone()).await
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
            ..Default::default()
        },
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
            _ => Duration::from_secs(2),
        };
        // Connection setup is not part of the per-test budgets above.
        let outcome = tokio::time::timeout(limit + Duration::from_secs(3), run_one(&ctx, name))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("timeout after {} ms", limit.as_millis())));
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
        _ => anyhow::bail!("unknown test"),
    }
}
