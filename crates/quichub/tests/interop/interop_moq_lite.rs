//! moq-dev's own tools speaking moq-lite to quichub (through its lite bridge,
//! `crates/net/src/lite`, `docs/moq-lite.md`), with no moq-relay between
//! unless it is the point:
//!
//! ```text
//! moq-clock publish ──lite-04 (or lite-02)──► quichub ──lite-04 (lite-02)──► moq-clock subscribe
//! moq import fmp4 ──lite-06──► quichub ─┬─moqt-18──► quichub sub --output
//!                                        └─lite-06──► moq export fmp4
//! quichub pub --broadcast ──moqt-18──► quichub ──lite-06──► moq export fmp4
//! moq-clock ──► moq-relay ◄──lite-06, moq-relay dials── quichub ◄── moq-clock (each way)
//! ```
//!
//! Each over raw QUIC (`moqt://`, ALPN `moq-lite-0N`; lite-01/02 choose
//! their version in a CLIENT_SETUP) and WebTransport (`https://`). Tools: moq-clock 0.10.21 (moq-net 0.1.3),
//! `moq` 0.14.10 and moq-relay 0.17.10 (moq-net 0.3.18), installed by
//! `scripts/install-moq-dev.sh --with-cli`; without `QUICHUB_MOQ_DEV_BIN`
//! the tests are skipped, with it (`scripts/test.sh`) a missing tool fails.
//!
//! Every wait is for an event (ticks printed, a metric, a process ending)
//! with a generous deadline: moq-clock starts a group a minute, so a
//! subscriber that misses the start of one may wait for the next.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::interop_moq_media::{moq_publishes, moq_subscribes, one_at_a_time};
use crate::moq_dev_kit::{
    clock, metric, moq_dev_tools, output_within, spawn_on_udp_port, ticks, url, wait_until,
    ClockSubscriber, Dir, Proc, Relay, QUICHUB,
};

/// What a moq-clock subscriber may take to print its ticks: a first group
/// from its start (the bridge's joining FETCH), or the next minute's.
const TICKS_BUDGET: Duration = Duration::from_secs(90);

fn lite_sessions(version: &str) -> String {
    format!("quichub_lite_sessions_total{{version=\"{version}\"}}")
}

/// A moq-clock subscriber of `broadcast` at `url`, started again whenever it
/// exits (moq-clock's own discovery races).
fn subscriber(
    bin: &Path,
    dir: &Dir,
    url: &str,
    broadcast: &'static str,
    version: Option<&'static str>,
    log: &'static str,
) -> ClockSubscriber {
    // ClockSubscriber starts it again after it exits: the closure owns
    // copies of what it needs.
    let (bin, dir, url) = (bin.to_path_buf(), dir.root().to_path_buf(), url.to_string());
    ClockSubscriber::start(move || clock(&bin, &dir, &url, broadcast, version, "subscribe", log))
}

/// moq-clock publish → quichub → moq-clock subscribe, both speaking moq-lite:
/// the version moq-clock 0.10.21 picks among quichub's (lite-04) and forced
/// lite-02 (`--client-version moq-lite-02`: the version chosen in the
/// legacy CLIENT_SETUP), each with a raw QUIC publisher read over
/// WebTransport and the reverse. The sessions are counted by version in
/// `/metrics`.
#[test]
fn moq_clock_over_moq_lite_through_quichub() {
    let Some(bin) = moq_dev_tools(&["moq-clock"]) else {
        return;
    };
    let dir = Dir::new("quichub-lite-clock", "direct");
    let relay = Relay::start(&dir);
    let cases: [(&str, &str, &'static str, Option<&'static str>); 4] = [
        ("moqt", "https", "clock-q", None),
        ("https", "moqt", "clock-w", None),
        ("moqt", "https", "clock-q02", Some("moq-lite-02")),
        ("https", "moqt", "clock-w02", Some("moq-lite-02")),
    ];
    // Every publisher and subscriber at once: each case is a broadcast of
    // its own, and each needs a few seconds of ticks.
    let mut running = Vec::new();
    for (i, &(pub_scheme, sub_scheme, broadcast, version)) in cases.iter().enumerate() {
        let publisher = Proc(
            clock(
                &bin,
                dir.root(),
                &relay.url(pub_scheme),
                broadcast,
                version,
                "publish",
                ["pub-0.log", "pub-1.log", "pub-2.log", "pub-3.log"][i],
            )
            .spawn()
            .unwrap(),
        );
        let log = ["sub-0.log", "sub-1.log", "sub-2.log", "sub-3.log"][i];
        let sub = subscriber(&bin, &dir, &relay.url(sub_scheme), broadcast, version, log);
        running.push((publisher, sub));
    }
    for (i, (_, sub)) in running.iter_mut().enumerate() {
        let (pub_scheme, sub_scheme, broadcast, version) = cases[i];
        let out = sub.ticks(5, TICKS_BUDGET);
        assert!(
            ticks(&out) >= 5,
            "{broadcast}: {pub_scheme} publisher, {sub_scheme} subscriber, {}: {} ticks\n{out}\n{}{}",
            version.unwrap_or("moq-clock's choice"),
            ticks(&out),
            dir.tails(&[&format!("pub-{i}.log"), &format!("sub-{i}.log")]),
            dir.tails(&["relay.log"]),
        );
    }
    let m = relay.metrics();
    // A publisher and a subscriber per case, at least (a subscriber that
    // exited and came back is one more).
    assert!(metric(&m, &lite_sessions("moq-lite-04")) >= 4, "{m}");
    assert!(metric(&m, &lite_sessions("moq-lite-02")) >= 4, "{m}");
    assert_eq!(metric(&m, "quichub_protocol_violations_total"), 0, "{m}");
}

/// `moq import fmp4` over moq-lite-06 → quichub → `quichub sub` (draft 18)
/// and `moq export fmp4` (lite-06), frame-exact, over raw QUIC and
/// WebTransport: `interop_moq_media`'s case at another version.
#[test]
fn moq_cli_imports_fmp4_over_moq_lite_06() {
    let Some(bin) = crate::interop_moq_media::tools() else {
        return;
    };
    let _turn = one_at_a_time();
    for scheme in ["moqt", "https"] {
        // As over draft 18: one more try under load (interop_moq_media's
        // note on a subscriber joining mid-group), with every assertion.
        if std::panic::catch_unwind(|| moq_publishes(&bin, scheme, "moq-lite-06")).is_err() {
            eprintln!("moq import over {scheme} (moq-lite-06): failed once (see above); once more");
            moq_publishes(&bin, scheme, "moq-lite-06");
        }
    }
}

/// `quichub pub --broadcast` (draft 18, hang) → quichub → `moq export fmp4`
/// over moq-lite-06, frame-exact; and a late `moq export` from a keyframe.
#[test]
fn quichub_pub_plays_through_moq_cli_export_over_moq_lite_06() {
    let Some(bin) = crate::interop_moq_media::tools() else {
        return;
    };
    let _turn = one_at_a_time();
    moq_subscribes(&bin, "moqt", "moq-lite-06", "hang", "push");
    moq_subscribes(&bin, "https", "moq-lite-06", "hang-cmaf", "push");
    moq_subscribes(&bin, "moqt", "moq-lite-06", "hang", "announce");
}

/// moq-relay dialing quichub as a cluster peer over moq-lite-06.
fn moq_relay_peer(bin: &Path, dir: &Dir, quichub: &str, log: &str) -> (Proc, u16) {
    spawn_on_udp_port(|listen| {
        let out = dir.file(log);
        let mut c = Command::new(bin.join("moq-relay"));
        c.args(["--listen", &format!("127.0.0.1:{listen}")])
            .arg("--listen-tls-cert")
            .arg(dir.path("cert.pem"))
            .arg("--listen-tls-key")
            .arg(dir.path("key.pem"))
            .args(["--auth-public", "**", "--cluster-connect", quichub])
            .args(["--connect-version", "moq-lite-06"])
            .arg("--connect-tls-root")
            .arg(dir.path("cert.pem"))
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        c
    })
}

/// moq-relay 0.17.10 clustered with quichub over moq-lite-06 (moq-relay
/// dials, `--cluster-connect`), over raw QUIC and WebTransport: a clock
/// published into moq-relay is read at quichub, and one published into
/// quichub is read at moq-relay, at the same time.
#[test]
fn moq_relay_clusters_with_quichub_over_moq_lite() {
    let Some(bin) = moq_dev_tools(&["moq-relay", "moq-clock"]) else {
        return;
    };
    for scheme in ["moqt", "https"] {
        let dir = Dir::new("quichub-lite-cluster", scheme);
        let relay = Relay::start(&dir);
        let (_moq_relay, moq_port) =
            moq_relay_peer(&bin, &dir, &relay.url(scheme), "moq-relay.log");
        // moq-relay's session with quichub is up: its broadcasts reach
        // quichub, and quichub's reach it, from here on.
        assert!(
            wait_until(Duration::from_secs(60), || {
                metric(&relay.metrics(), &lite_sessions("moq-lite-06")) >= 1
            }),
            "moq-relay did not reach quichub over moq-lite-06 ({scheme})\n{}",
            dir.tails(&["moq-relay.log", "relay.log"])
        );
        let at_moq_relay = url("moqt", moq_port);
        let at_quichub = relay.url(scheme);
        let _into_moq_relay = Proc(
            clock(
                &bin,
                dir.root(),
                &at_moq_relay,
                "clock-m",
                None,
                "publish",
                "pub-m.log",
            )
            .spawn()
            .unwrap(),
        );
        let _into_quichub = Proc(
            clock(
                &bin,
                dir.root(),
                &at_quichub,
                "clock-q",
                None,
                "publish",
                "pub-q.log",
            )
            .spawn()
            .unwrap(),
        );
        let mut read_at_quichub = subscriber(&bin, &dir, &at_quichub, "clock-m", None, "sub-q.log");
        let mut read_at_moq_relay =
            subscriber(&bin, &dir, &at_moq_relay, "clock-q", None, "sub-m.log");
        let out = read_at_quichub.ticks(5, TICKS_BUDGET);
        assert!(
            ticks(&out) >= 5,
            "moq-clock → moq-relay → quichub ({scheme}): {} ticks\n{out}\n{}",
            ticks(&out),
            dir.tails(&["pub-m.log", "sub-q.log", "moq-relay.log", "relay.log"])
        );
        let out = read_at_moq_relay.ticks(5, TICKS_BUDGET);
        assert!(
            ticks(&out) >= 5,
            "moq-clock → quichub → moq-relay ({scheme}): {} ticks\n{out}\n{}",
            ticks(&out),
            dir.tails(&["pub-q.log", "sub-m.log", "moq-relay.log", "relay.log"])
        );
        let m = relay.metrics();
        assert_eq!(metric(&m, "quichub_protocol_violations_total"), 0, "{m}");
    }
}

/// Subscriptions that cannot be served are refused cleanly and nothing else
/// suffers: a moq-clock subscriber waiting for a broadcast nobody publishes
/// keeps its session; one subscribing to a track the publisher does not
/// have (`--track missing`) is refused (the publisher's refusal, through two
/// lite bridges) and exits with its error; `moq fetch` of a missing track
/// over moq-lite-06 ends with that refusal. Meanwhile a subscriber of the
/// live clock keeps receiving, and the relay keeps running.
#[test]
fn moq_lite_refusals_leave_other_sessions_alone() {
    let Some(bin) = moq_dev_tools(&["moq-clock", "moq"]) else {
        return;
    };
    let dir = Dir::new("quichub-lite-refusal", "clock");
    let mut relay = Relay::start(&dir);
    let quic = relay.url("moqt");
    let wt = relay.url("https");
    let _publisher = Proc(
        clock(&bin, dir.root(), &quic, "clock", None, "publish", "pub.log")
            .spawn()
            .unwrap(),
    );
    let mut live = subscriber(&bin, &dir, &wt, "clock", None, "sub-live.log");
    let out = live.ticks(3, TICKS_BUDGET);
    assert!(
        ticks(&out) >= 3,
        "the live subscriber: {out}\n{}",
        dir.tails(&["pub.log", "sub-live.log", "relay.log"])
    );
    // From here on it must not need starting again.
    let live_exits = live.exits;

    // Nobody publishes `nobody`: the subscriber waits, connected.
    let mut waiting = Proc(
        clock(
            &bin,
            dir.root(),
            &quic,
            "nobody",
            None,
            "subscribe",
            "sub-nobody.log",
        )
        .spawn()
        .unwrap(),
    );
    assert!(
        wait_until(Duration::from_secs(30), || dir
            .log("sub-nobody.log")
            .contains("waiting for broadcast to be online")),
        "{}",
        dir.tails(&["sub-nobody.log"])
    );

    // A track the publisher does not have: refused, and moq-clock exits.
    let mut missing_track = Command::new(bin.join("moq-clock"));
    missing_track
        .args(["--url", &wt, "--broadcast", "clock", "--track", "missing"])
        .arg("--tls-root")
        .arg(dir.path("cert.pem"))
        .args(["--log-level", "debug", "subscribe"])
        .env("MOQ_CLIENT_WEBSOCKET_ENABLED", "false");
    let refused = output_within(&mut missing_track, Duration::from_secs(60));
    let refused = refused.unwrap_or_else(|| {
        panic!(
            "a subscriber of a missing track was not refused\n{}",
            dir.tails(&["pub.log", "relay.log"])
        )
    });
    let (refused_out, refused_err) = (
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr),
    );
    assert!(
        !refused.status.success()
            && ticks(&refused_out) == 0
            && refused_err.contains("clock error"),
        "a subscriber of a missing track: {:?}\n{refused_out}\n{refused_err}",
        refused.status,
    );

    // moq-dev's newer stack (moq-net 0.3.18, lite-06): the same refusal,
    // over both transports, with its reason (stream reset NOT_FOUND, 0x33).
    // Over raw QUIC moq-dev's transports (web-transport-moq 1.3,
    // web-transport-quinn 0.11) read stream codes mapped into HTTP/3's range
    // as on WebTransport, and the bridge sends them so (unmapped, the
    // reason read "invalid RESET_STREAM: 51").
    for (url, reason) in [(&wt, "not found"), (&quic, "not found")] {
        let mut fetch = Command::new(bin.join("moq"));
        fetch
            .args(["--connect", url, "--connect-version", "moq-lite-06"])
            .args(["--connect-tls-fingerprint", &dir.fingerprint])
            .args(["--broadcast", "clock", "fetch", "missing"])
            .env("RUST_LOG", "info");
        // `moq fetch` gives up by itself after 30 s.
        let fetch = output_within(&mut fetch, Duration::from_secs(90))
            .unwrap_or_else(|| panic!("moq fetch of a missing track at {url} did not end"));
        let err = String::from_utf8_lossy(&fetch.stderr);
        assert!(
            !fetch.status.success()
                && err.contains("no group of `missing` found")
                && err.contains(reason),
            "moq fetch of a missing track at {url}: {:?}\n{err}",
            fetch.status
        );
    }

    // The rest goes on: the waiting subscriber still runs, the live one
    // still receives, the relay still serves.
    let before = ticks(&live.output());
    let out = live.ticks(before + 3, TICKS_BUDGET);
    assert!(
        ticks(&out) >= before + 3,
        "the live subscriber stopped after the refusals: {out}\n{}",
        dir.tails(&["sub-live.log", "relay.log"])
    );
    assert_eq!(
        live.exits,
        live_exits,
        "the live subscriber exited after the refusals\n{}",
        dir.tails(&["sub-live.log"])
    );
    assert!(
        waiting.0.try_wait().unwrap().is_none(),
        "the subscriber waiting for `nobody` exited\n{}",
        dir.tails(&["sub-nobody.log"])
    );
    assert!(relay.alive());
    let m = relay.metrics();
    assert_eq!(metric(&m, "quichub_protocol_violations_total"), 0, "{m}");
}

/// moq-dev's tokens on lite sessions: a relay with a JWT key serves a
/// moq-clock publisher and subscriber that carry `?jwt=` in their
/// WebTransport URL, whose path is the session's root (the token's `root`),
/// as on moq-relay; a subscriber without a token, or with one that may only
/// publish, gets nothing.
#[test]
fn moq_lite_sessions_are_authorised_by_moq_dev_tokens() {
    let Some(bin) = moq_dev_tools(&["moq-clock"]) else {
        return;
    };
    let dir = Dir::new("quichub-lite-auth", "clock");
    let key = dir.path("hs.jwk");
    let ok = Command::new(QUICHUB)
        .args(["token", "generate-key", "--out"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(ok.success());
    let sign = |claims: &[&str]| {
        let out = Command::new(QUICHUB)
            .args(["token", "sign", "--key"])
            .arg(&key)
            .args(["--root", "demo"])
            .args(claims)
            .args(["--expires", "1h"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let (put, get) = (sign(&["--put", ""]), sign(&["--get", ""]));
    let relay = Relay::start_with(&dir, &["--auth-key", key.to_str().unwrap()]);
    let at = |jwt: Option<&str>| match jwt {
        Some(t) => format!("https://127.0.0.1:{}/demo?jwt={t}", relay.port),
        None => format!("https://127.0.0.1:{}/demo", relay.port),
    };
    let _publisher = Proc(
        clock(
            &bin,
            dir.root(),
            &at(Some(&put)),
            "clock",
            None,
            "publish",
            "pub.log",
        )
        .spawn()
        .unwrap(),
    );
    let mut allowed = subscriber(&bin, &dir, &at(Some(&get)), "clock", None, "sub-get.log");
    let out = allowed.ticks(3, TICKS_BUDGET);
    assert!(
        ticks(&out) >= 3,
        "a subscriber with a get token: {out}\n{}",
        dir.tails(&["pub.log", "sub-get.log", "relay.log"])
    );
    // No token, or one that may only publish: not a tick. (A subscriber
    // with a token prints the group under way at once, from the joining
    // FETCH: 15 s is ample for one that is wrongly let through.)
    for (name, jwt) in [("none", None), ("put-only", Some(put.as_str()))] {
        let (log, printed) = (
            format!("sub-{name}.log"),
            dir.path(&format!("sub-{name}.out")),
        );
        let mut child = clock(&bin, dir.root(), &at(jwt), "clock", None, "subscribe", &log)
            .stdout(std::fs::File::create(&printed).unwrap())
            .spawn()
            .unwrap();
        wait_until(Duration::from_secs(15), || {
            child.try_wait().unwrap().is_some()
        });
        let _ = child.kill();
        let _ = child.wait();
        let printed = std::fs::read_to_string(&printed).unwrap();
        assert_eq!(
            ticks(&printed),
            0,
            "a subscriber with {name}: {printed}\n{}",
            dir.tails(&[&log])
        );
    }
    let m = relay.metrics();
    assert!(metric(&m, &lite_sessions("moq-lite-04")) >= 2, "{m}");
    // Refused by the relay's authoriser, not lost on the way.
    assert!(
        metric(&m, "quichub_requests_unauthorized_total") >= 1,
        "{m}"
    );
}
