//! Real media through the real binary: Debian's ffmpeg makes the input,
//! `quichub pub --broadcast` publishes it, a `quichub relay` process relays
//! it, `quichub sub --broadcast --output` writes fragmented MP4, and ffprobe
//! and ffmpeg check that every frame arrived and decodes to the same picture.
//!
//! Without ffmpeg these tests pass with a note, unless `QUICHUB_MEDIA_TESTS=1`
//! (set by `scripts/test.sh`), where a missing ffmpeg fails them.

use quichub_testkit as common;

use common::media::{count_frames, picture_md5s, run};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_quichub");
const CMAF: &str = "cmaf+separate_moof+delay_moov+skip_trailer+frag_every_frame";
/// Frames in the standard input: 5 s at 30 fps.
const FRAMES: usize = 150;

fn have_ffmpeg() -> bool {
    let ok = Command::new("ffmpeg")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("QUICHUB_MEDIA_TESTS").as_deref() != Ok("1"),
            "QUICHUB_MEDIA_TESTS=1 but ffmpeg is not installed"
        );
        eprintln!("ffmpeg not installed: skipped");
    }
    ok
}

/// A directory of its own for each test, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("quichub-media-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// ffmpeg's test pattern and a sine, `secs` long, H.264 (GOP 30, B frames)
/// and AAC, as the ingest command writes it.
fn make_input(path: &Path, secs: u32, video: &[&str], audio: &[&str], container: &[&str]) {
    let t = secs.to_string();
    let mut args = vec![
        "-hide_banner",
        "-loglevel",
        "error",
        "-y",
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=640x360:rate=30",
        "-f",
        "lavfi",
        "-i",
        "sine=frequency=440:sample_rate=48000",
        "-t",
        &t,
    ];
    args.extend_from_slice(video);
    args.extend_from_slice(audio);
    args.extend_from_slice(container);
    let p = path.to_str().unwrap();
    args.push(p);
    run("ffmpeg", &args);
}

fn h264_aac(path: &Path, secs: u32) {
    make_input(
        path,
        secs,
        &[
            "-c:v", "libx264", "-preset", "veryfast", "-g", "30", "-bf", "2", "-pix_fmt", "yuv420p",
        ],
        &["-c:a", "aac"],
        &["-f", "mp4", "-movflags", CMAF],
    );
}

struct Relay {
    child: Child,
    url: String,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn relay() -> Relay {
    let mut child = Command::new(BIN)
        .args([
            "relay",
            "--bind",
            "127.0.0.1:0",
            "--metrics",
            "off",
            "--mqtt",
            "off",
            "--http",
            "off",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn relay");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("relay printed nothing").unwrap();
    let addr = first
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    std::thread::spawn(move || for _ in lines {});
    Relay {
        child,
        url: format!("moqt://{addr}/"),
    }
}

/// Starts `quichub sub --broadcast NAME --output OUT` (waiting for the
/// publisher), and returns it.
fn sub(relay: &Relay, broadcast: &str, out: &Path, extra: &[&str]) -> Child {
    Command::new(BIN)
        .args([
            "sub",
            &relay.url,
            "--broadcast",
            broadcast,
            "--output",
            out.to_str().unwrap(),
        ])
        .args(["--duration", "60"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sub")
}

fn finish(child: Child, what: &str) -> String {
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what} failed: {err}");
    err
}

/// Publishes `input` (a file) and waits for the publisher to end.
fn publish(relay: &Relay, broadcast: &str, input: &Path, extra: &[&str]) -> Output {
    Command::new(BIN)
        .args([
            "pub",
            &relay.url,
            "--broadcast",
            broadcast,
            "--input",
            input.to_str().unwrap(),
        ])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("run pub")
}

/// (pts, dts, keyframe) of every video packet, in file order.
fn video_packets(path: &Path) -> Vec<(i64, i64, bool)> {
    let out = run(
        "ffprobe",
        &[
            "-loglevel",
            "error",
            "-select_streams",
            "v",
            "-show_entries",
            "packet=pts,dts,flags",
            "-of",
            "csv=p=0",
            path.to_str().unwrap(),
        ],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split(',');
            let pts = f.next()?.parse().ok()?;
            let dts = f.next()?.parse().ok()?;
            Some((pts, dts, f.next()?.starts_with('K')))
        })
        .collect()
}

/// What every test of a complete stream checks of the output.
fn assert_same_video(input: &Path, output: &Path, frames: usize) {
    let counted = count_frames(output);
    assert!(counted.contains(&("h264".into(), frames)), "{counted:?}");
    let packets = video_packets(output);
    assert_eq!(packets.len(), frames);
    assert!(
        packets.windows(2).all(|w| w[0].1 < w[1].1),
        "decode times not increasing"
    );
    // Keyframes where the GOP put them: every 30th picture.
    let mut by_pts = packets.clone();
    by_pts.sort();
    let keys: Vec<usize> = by_pts
        .iter()
        .enumerate()
        .filter(|(_, p)| p.2)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(keys, (0..frames).step_by(30).collect::<Vec<_>>());
    let (a, b) = (picture_md5s(input), picture_md5s(output));
    assert_eq!(a.len(), frames);
    assert_eq!(a, b, "decoded pictures differ");
}

#[test]
fn ffmpeg_to_ffprobe_through_the_relay_frame_for_frame() {
    if !have_ffmpeg() {
        return;
    }
    let dir = Dir::new("e2e");
    let input = dir.path("in.mp4");
    h264_aac(&input, 5);
    let relay = relay();
    let out = dir.path("out.mp4");
    let s = sub(&relay, "live/e2e", &out, &[]);
    let p = publish(&relay, "live/e2e", &input, &[]);
    let log = String::from_utf8_lossy(&p.stderr);
    assert!(p.status.success(), "{log}");
    assert!(
        log.contains("track video: avc1.64") && log.contains("track audio: mp4a.40.2"),
        "{log}"
    );
    let log = finish(s, "sub");
    assert!(log.contains(&format!("video {FRAMES} frames")), "{log}");
    assert_same_video(&input, &out, FRAMES);
    // Audio arrives whole too: as many AAC frames decode as from the input.
    let a_in = count_frames(&input);
    let a_out = count_frames(&out);
    let aac = |v: &[(String, usize)]| v.iter().find(|(c, _)| c == "aac").map(|x| x.1);
    assert_eq!(aac(&a_out), aac(&a_in));
}

#[test]
fn stdin_with_a_paused_encoder_cmaf_objects_and_frame_type_subgroups() {
    if !have_ffmpeg() {
        return;
    }
    let dir = Dir::new("stdin");
    let input = dir.path("in.mp4");
    h264_aac(&input, 3);
    let data = std::fs::read(&input).unwrap();
    let relay = relay();
    for (name, extra) in [
        ("live/legacy-pause", &[][..]),
        ("live/cmaf", &["--format", "hang-cmaf"][..]),
        ("live/layered", &["--delivery", "frame-type"][..]),
    ] {
        let out = dir.path(&format!("{}.mp4", name.replace('/', "-")));
        let s = sub(&relay, name, &out, &[]);
        let mut p = Command::new(BIN)
            .args(["pub", &relay.url, "--broadcast", name, "--input", "-"])
            .args(extra)
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = p.stdin.take().unwrap();
        if name.ends_with("pause") {
            // The encoder stalls for 3 s mid-stream, then goes on.
            stdin.write_all(&data[..data.len() / 2]).unwrap();
            stdin.flush().unwrap();
            std::thread::sleep(Duration::from_secs(3));
            stdin.write_all(&data[data.len() / 2..]).unwrap();
        } else {
            stdin.write_all(&data).unwrap();
        }
        drop(stdin);
        finish(p, "pub");
        let log = finish(s, "sub");
        assert!(log.contains("video 90 frames"), "{name}: {log}");
        assert_same_video(&input, &out, 90);
    }
}

#[test]
fn mpeg_ts_on_stdin() {
    if !have_ffmpeg() {
        return;
    }
    let dir = Dir::new("ts");
    let input = dir.path("in.ts");
    make_input(
        &input,
        3,
        &[
            "-c:v", "libx264", "-preset", "veryfast", "-g", "30", "-bf", "2", "-pix_fmt", "yuv420p",
        ],
        &["-c:a", "aac"],
        &["-f", "mpegts"],
    );
    let relay = relay();
    let out = dir.path("out.mp4");
    let s = sub(&relay, "live/ts", &out, &[]);
    let mut p = Command::new(BIN)
        .args(["pub", &relay.url, "--broadcast", "live/ts"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    p.stdin
        .take()
        .unwrap()
        .write_all(&std::fs::read(&input).unwrap())
        .unwrap();
    let log = finish(p, "pub");
    assert!(
        log.contains("track video: avc1.64") && log.contains("track audio: mp4a.40.2"),
        "{log}"
    );
    let log = finish(s, "sub");
    assert!(log.contains("video 90 frames"), "{log}");
    assert_same_video(&input, &out, 90);
}

#[test]
fn bad_input_fails_clearly_and_other_broadcasts_keep_flowing() {
    if !have_ffmpeg() {
        return;
    }
    let dir = Dir::new("bad");
    let good = dir.path("good.mp4");
    h264_aac(&good, 4);
    let data = std::fs::read(&good).unwrap();
    let relay = relay();
    // A healthy broadcast runs throughout.
    let good_out = dir.path("good-out.mp4");
    let s = sub(&relay, "live/good", &good_out, &[]);
    let mut healthy = Command::new(BIN)
        .args([
            "pub",
            &relay.url,
            "--broadcast",
            "live/good",
            "--input",
            good.to_str().unwrap(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let find = |needle: &[u8]| data.windows(4).position(|w| w == needle).unwrap();
    // Truncated in the middle of a fragment.
    let cut = write("cut.mp4", &data[..data.len() / 2 + 7]);
    // A 1 GB mdat length.
    let mut huge = data.clone();
    let at = find(b"mdat") - 4;
    huge[at..at + 4].copy_from_slice(&0x4000_0000u32.to_be_bytes());
    let huge = write("huge.mp4", &huge);
    // Corrupt codec configuration.
    let mut corrupt = data.clone();
    let at = find(b"avcC");
    corrupt[at + 4..at + 16].fill(0xff);
    let corrupt = write("corrupt.mp4", &corrupt);
    // Not media at all.
    let junk = write("junk.bin", &[0x5a; 4096]);
    // A codec the pipeline cannot describe to a player.
    let mpeg4 = dir.path("mpeg4.mp4");
    make_input(
        &mpeg4,
        1,
        &["-c:v", "mpeg4"],
        &["-an"],
        &["-f", "mp4", "-movflags", CMAF],
    );
    for (file, want) in [
        (&cut, "input ends inside a box"),
        (&huge, "exceeds the limit"),
        (&corrupt, "malformed"),
        (&junk, "not fragmented MP4"),
        (&mpeg4, "unsupported codec"),
    ] {
        let p = publish(
            &relay,
            &format!("live/{}", file.file_name().unwrap().to_string_lossy()),
            file,
            &["--no-pace"],
        );
        let log = String::from_utf8_lossy(&p.stderr);
        assert!(!p.status.success(), "{file:?} was accepted: {log}");
        assert!(log.contains(want), "{file:?}: want {want:?} in {log}");
    }

    // A stream that starts without a keyframe: frames before the first
    // keyframe are dropped (no subscriber could decode them), the rest play.
    let mut moofs = data
        .windows(4)
        .enumerate()
        .filter(|(_, w)| w == b"moof")
        .map(|(i, _)| i - 4);
    let moov_end = moofs.next().unwrap();
    // Skip the first video fragment (the keyframe) and whatever follows it
    // until the 10th fragment.
    let tenth = moofs.nth(9).unwrap();
    let mut nokey = data[..moov_end].to_vec();
    nokey.extend_from_slice(&data[tenth..]);
    let nokey = write("nokey.mp4", &nokey);
    let out = dir.path("nokey-out.mp4");
    let s2 = sub(&relay, "live/nokey", &out, &[]);
    let p = publish(&relay, "live/nokey", &nokey, &[]);
    let log = String::from_utf8_lossy(&p.stderr);
    assert!(p.status.success(), "{log}");
    assert!(log.contains("before the first keyframe"), "{log}");
    finish(s2, "sub");
    let counted = count_frames(&out);
    assert!(counted.contains(&("h264".into(), 90)), "{counted:?}");

    // The healthy broadcast was not disturbed.
    let _ = healthy.wait();
    let log = finish(s, "sub");
    assert!(log.contains("video 120 frames"), "{log}");
    assert_same_video(&good, &good_out, 120);
}

#[test]
fn msf_loc_and_cmsf_through_the_relay_frame_for_frame() {
    if !have_ffmpeg() {
        return;
    }
    let dir = Dir::new("msf");
    let input = dir.path("in.mp4");
    h264_aac(&input, 3);
    let relay = relay();
    for (name, format) in [("live/msf", "msf"), ("live/cmsf", "cmsf")] {
        let out = dir.path(&format!("{format}.mp4"));
        let s = sub(&relay, name, &out, &[]);
        let p = publish(&relay, name, &input, &["--format", format]);
        let log = String::from_utf8_lossy(&p.stderr);
        assert!(p.status.success(), "{format}: {log}");
        let log = finish(s, "sub");
        // The subscriber found the MSF catalog by itself, played both
        // tracks, and saw the catalog update that ends the broadcast.
        assert!(log.contains("catalog: MSF"), "{format}: {log}");
        assert!(log.contains("video 90 frames"), "{format}: {log}");
        assert!(log.contains("broadcast complete"), "{format}: {log}");
        assert_same_video(&input, &out, 90);
        let aac = |v: &[(String, usize)]| v.iter().find(|(c, _)| c == "aac").map(|x| x.1);
        assert_eq!(
            aac(&count_frames(&out)),
            aac(&count_frames(&input)),
            "{format}"
        );
    }
    // hang is still found as hang.
    let out = dir.path("hang.mp4");
    let s = sub(&relay, "live/hang", &out, &[]);
    assert!(publish(&relay, "live/hang", &input, &[]).status.success());
    let log = finish(s, "sub");
    assert!(
        log.contains("catalog: hang") && log.contains("video 90 frames"),
        "{log}"
    );
}

/// Object properties (LOC's metadata) cross the relay unchanged: on
/// subgroup streams, in datagrams, and in FETCH from the relay's cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_properties_cross_the_relay_unchanged() {
    use bytes::Bytes;
    use moqt::message::FetchKind;
    use moqt::{FullTrackName, Parameters};
    use quichub_client::{ClientSession, ConnectOptions, SubscribeOptions, SubscriptionEvent};
    use quichub_media::loc::{FrameMarking, LocProperties};

    let relay = relay();
    let connect = || ClientSession::connect(&relay.url, ConnectOptions::default());
    let publisher = connect().await.unwrap();
    let subscriber = connect().await.unwrap();
    let name = FullTrackName::new("props", "t");
    let track = publisher
        .create_track(name.clone(), 1, quichub_client::TrackMode::Push)
        .await
        .unwrap();
    let mut sub = subscriber
        .subscribe(name.clone(), SubscribeOptions::default())
        .await
        .unwrap();
    let loc = |ts: u64, key: bool| {
        LocProperties {
            timestamp: Some(ts),
            timescale: Some(1_000_000),
            video_config: key.then(|| Bytes::from_static(b"\x01\x64\x00\x1f\xff")),
            frame_marking: Some(FrameMarking::frame(key, !key)),
            ..Default::default()
        }
        .encode()
    };
    let sent = [
        (0, loc(0, true), Bytes::from_static(b"key")),
        (1, Bytes::new(), Bytes::from_static(b"bare")),
        (2, loc(66_666, false), Bytes::from_static(b"delta")),
    ];
    let mut w = track
        .open_subgroup_with_properties(0, 0, 1)
        .await
        .unwrap()
        .unwrap();
    for (id, props, payload) in &sent {
        w.write_with_properties(*id, props.clone(), payload.clone())
            .await
            .unwrap();
    }
    w.finish();
    // A writer without the PROPERTIES bit refuses properties.
    let mut plain = track.open_subgroup(1, 0).await.unwrap().unwrap();
    assert!(plain
        .write_with_properties(0, loc(1, true), Bytes::new())
        .await
        .is_err());
    let dg_props = loc(100_000, true);
    assert!(track.send_datagram_with_properties(2, 0, dg_props.clone(), Bytes::from_static(b"dg")));

    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while got.len() < 4 {
        match tokio::time::timeout_at(deadline, sub.next()).await {
            Ok(Some(SubscriptionEvent::Object(o))) => {
                got.push((o.group, o.object_id, o.properties, o.payload))
            }
            Ok(Some(_)) => {}
            other => panic!("objects missing ({got:?}): {other:?}"),
        }
    }
    got.sort_by_key(|g| (g.0, g.1));
    for (i, (id, props, payload)) in sent.iter().enumerate() {
        assert_eq!((got[i].0, got[i].1), (0, *id));
        assert_eq!(&got[i].2, props, "object {id}");
        assert_eq!(&got[i].3, payload);
    }
    assert_eq!(got[3].2, dg_props);
    let p = LocProperties::decode(&got[2].2).unwrap();
    assert_eq!(p.pts_micros(), Some(66_666));
    assert_eq!(p.frame_marking, Some(FrameMarking::frame(false, true)));

    // From the cache: FETCH returns the properties too.
    let r = subscriber
        .fetch(
            FetchKind::Standalone {
                track: name.clone(),
                start: moqt::Location::new(0, 0),
                end: moqt::Location::new(0, 3),
            },
            Parameters::default(),
        )
        .await
        .unwrap();
    let fetched: Vec<_> = r.objects.iter().map(|o| o.properties.clone()).collect();
    assert_eq!(
        fetched,
        sent.iter().map(|s| s.1.clone()).collect::<Vec<_>>()
    );
}

#[test]
fn announce_mode_serves_the_catalog_to_a_subscriber_that_comes_after_it() {
    if !have_ffmpeg() {
        return;
    }
    let dir = Dir::new("announce");
    let input = dir.path("in.mp4");
    h264_aac(&input, 3);
    let relay = relay();
    // With `--mode announce` objects flow only while the relay subscribes:
    // the catalog, written with the first frame, reaches no one.
    let p = Command::new(BIN)
        .args(["pub", &relay.url, "--mode", "announce"])
        .args(["--broadcast", "live/announce", "--input"])
        .arg(&input)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1300));
    // A subscriber that comes later still gets the catalog (written again
    // for it) and plays from the next keyframe on.
    let out = dir.path("out.mp4");
    let s = sub(&relay, "live/announce", &out, &[]);
    finish(p, "pub");
    let log = finish(s, "sub");
    let played = video_packets(&out).len();
    assert!((30..90).contains(&played), "{played} frames\n{log}");
    let (a, b) = (picture_md5s(&input), picture_md5s(&out));
    assert_eq!(b[..], a[a.len() - b.len()..], "decoded pictures differ");
}
