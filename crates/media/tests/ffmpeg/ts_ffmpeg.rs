//! MPEG-TS made by Debian's ffmpeg, demuxed by `TsDemuxer` and checked
//! against what ffprobe reads from the same bytes: frame counts, timestamps,
//! keyframe flags, codec strings (profile and level), picture size.
//!
//! Without ffmpeg (or one of its encoders) a test prints `SKIPPED: reason`
//! and passes, unless `QUICHUB_MEDIA_TESTS=1`, where it fails: a CI that
//! installs ffmpeg must not pass by skipping.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use mp4_atom::{Atom, Avcc, Hvcc};
use quichub_media::ts::TsDemuxer;
use quichub_media::{to_micros, Demuxer, Event, Frame, TrackInfo, TrackKind};
use serde_json::Value;

/// Whether ffmpeg, ffprobe and the given encoders are here; panics instead
/// of skipping when the environment demands the tests.
fn have_tools(encoders: &[&str]) -> bool {
    let required = std::env::var("QUICHUB_MEDIA_TESTS").is_ok_and(|v| v == "1");
    let missing = |why: String| {
        if required {
            panic!("QUICHUB_MEDIA_TESTS=1 but {why}");
        }
        eprintln!("SKIPPED: {why}");
        false
    };
    for tool in ["ffmpeg", "ffprobe"] {
        let ok = Command::new(tool)
            .arg("-version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return missing(format!("{tool} is not installed (apt-get install ffmpeg)"));
        }
    }
    let out = Command::new("ffmpeg")
        .args(["-hide_banner", "-encoders"])
        .output()
        .expect("ffmpeg -encoders");
    let list = String::from_utf8_lossy(&out.stdout);
    for e in encoders {
        if !list.split_whitespace().any(|w| w == *e) {
            return missing(format!("ffmpeg has no {e} encoder"));
        }
    }
    true
}

/// Runs ffmpeg with two seconds of test pattern and tone, `video` and
/// `audio` giving the encoder options, and returns the TS (also written to a
/// file for ffprobe).
fn encode(name: &str, video: &[&str], audio: &[&str]) -> (Vec<u8>, PathBuf) {
    let mut cmd = Command::new("ffmpeg");
    cmd.args(["-hide_banner", "-loglevel", "error", "-nostdin"])
        .args(["-f", "lavfi", "-i", "testsrc2=size=320x240:rate=30"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
        .args(["-t", "2"])
        .args(video)
        .args(audio)
        .args(["-f", "mpegts", "-"]);
    let out = cmd.output().expect("run ffmpeg");
    assert!(
        out.status.success(),
        "ffmpeg failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = std::env::temp_dir().join(format!("quichub-ts-{}-{name}.ts", std::process::id()));
    std::fs::write(&path, &out.stdout).expect("write temp file");
    (out.stdout, path)
}

fn probe(path: &PathBuf, entries: &str, extra: &[&str]) -> Value {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-of", "json", "-show_entries", entries])
        .args(extra)
        .arg(path)
        .output()
        .expect("run ffprobe");
    assert!(out.status.success(), "ffprobe failed");
    serde_json::from_slice(&out.stdout).expect("ffprobe json")
}

/// One stream as ffprobe sees it, with its packets in decode order.
struct Probed {
    pid: u32,
    codec: String,
    profile: String,
    level: i64,
    width: u32,
    height: u32,
    frames: u64,
    /// (pts, dts, keyframe) in 90 kHz units.
    packets: Vec<(i64, i64, bool)>,
}

fn probed(path: &PathBuf) -> Vec<Probed> {
    let s = probe(
        path,
        "stream=index,id,codec_name,profile,level,width,height,nb_read_frames",
        &["-count_frames"],
    );
    let p = probe(path, "packet=stream_index,pts,dts,flags", &[]);
    let num = |v: &Value| -> i64 {
        v.as_i64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap_or(-1)
    };
    s["streams"]
        .as_array()
        .expect("streams")
        .iter()
        .map(|st| {
            let index = num(&st["index"]);
            let id = st["id"].as_str().expect("stream id");
            let packets = p["packets"]
                .as_array()
                .expect("packets")
                .iter()
                .filter(|pk| num(&pk["stream_index"]) == index)
                .map(|pk| {
                    let pts = num(&pk["pts"]);
                    let dts = if pk["dts"].is_null() {
                        pts
                    } else {
                        num(&pk["dts"])
                    };
                    let key = pk["flags"].as_str().unwrap_or("").starts_with('K');
                    (pts, dts, key)
                })
                .collect();
            Probed {
                pid: u32::from_str_radix(id.trim_start_matches("0x"), 16).expect("hex PID"),
                codec: st["codec_name"].as_str().unwrap_or("").to_string(),
                profile: st["profile"].as_str().unwrap_or("").to_string(),
                level: num(&st["level"]),
                width: num(&st["width"]).max(0) as u32,
                height: num(&st["height"]).max(0) as u32,
                frames: num(&st["nb_read_frames"]).max(0) as u64,
                packets,
            }
        })
        .collect()
}

/// Feeds `data` in uneven chunks (a packet split across pushes, several
/// packets in one) and collects everything.
fn demux(data: &[u8]) -> (Vec<Vec<TrackInfo>>, Vec<Frame>) {
    let mut d = TsDemuxer::default();
    let (mut tracks, mut frames) = (Vec::new(), Vec::new());
    let sizes = [1, 187, 188, 1000, 4096, 7];
    let mut rest = data;
    let mut i = 0;
    let mut drain = |d: &mut TsDemuxer| {
        while let Some(ev) = d.next().expect("demux") {
            match ev {
                Event::Tracks(t) => {
                    assert!(
                        frames.is_empty() || !tracks.is_empty(),
                        "a frame came before the tracks"
                    );
                    tracks.push(t)
                }
                Event::Frame(f) => frames.push(f),
            }
        }
    };
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()].min(rest.len());
        d.push(&rest[..n]);
        rest = &rest[n..];
        i += 1;
        drain(&mut d);
    }
    d.end();
    drain(&mut d);
    assert_eq!(d.stats().garbage_bytes, 0);
    assert_eq!(d.stats().continuity_errors, 0);
    (tracks, frames)
}

/// The NAL unit types in an AVCC frame; panics when its lengths do not add up.
fn nal_types(data: &[u8], h265: bool) -> Vec<u8> {
    let mut types = Vec::new();
    let mut p = data;
    while !p.is_empty() {
        let len = u32::from_be_bytes(p[..4].try_into().unwrap()) as usize;
        let nal = &p[4..4 + len];
        types.push(if h265 {
            (nal[0] >> 1) & 0x3F
        } else {
            nal[0] & 0x1F
        });
        p = &p[4 + len..];
    }
    types
}

/// What every track must satisfy: ffprobe's frame count and timestamps,
/// its keyframes, monotonic decode times, durations from the next frame.
fn check_track(frames: &[Frame], pid: u32, pr: &Probed) -> Vec<Frame> {
    let mine: Vec<Frame> = frames.iter().filter(|f| f.track == pid).cloned().collect();
    assert_eq!(mine.len(), pr.packets.len(), "PID {pid}: frame count");
    for (i, (f, &(pts, dts, key))) in mine.iter().zip(&pr.packets).enumerate() {
        assert_eq!(f.pts, to_micros(pts, 90_000), "PID {pid} frame {i}: pts");
        assert_eq!(f.dts, to_micros(dts, 90_000), "PID {pid} frame {i}: dts");
        assert_eq!(f.keyframe, key, "PID {pid} frame {i}: keyframe");
    }
    for w in mine.windows(2) {
        assert!(w[1].dts > w[0].dts, "PID {pid}: dts not increasing");
        assert_eq!(i64::from(w[0].duration), w[1].dts - w[0].dts);
    }
    assert_eq!(mine.last().map(|f| f.duration), Some(0));
    mine
}

fn avc_profile(name: &str) -> u8 {
    match name {
        "Baseline" | "Constrained Baseline" => 66,
        "Main" => 77,
        "High" => 100,
        other => panic!("unexpected H.264 profile {other}"),
    }
}

fn run_video(
    name: &str,
    video: &[&str],
    audio: &[&str],
    h265: bool,
) -> (Vec<Probed>, Vec<TrackInfo>) {
    let (data, path) = encode(name, video, audio);
    let probes = probed(&path);
    let _ = std::fs::remove_file(&path);
    let (tracks, frames) = demux(&data);
    assert_eq!(tracks.len(), 1, "one Tracks event: {tracks:?}");
    let tracks = tracks[0].clone();
    assert_eq!(tracks.len(), probes.len());

    let pv = probes
        .iter()
        .find(|p| p.codec == if h265 { "hevc" } else { "h264" })
        .expect("video stream");
    let tv = tracks.iter().find(|t| t.id == pv.pid).expect("video track");
    assert_eq!(tv.kind, TrackKind::Video);
    assert_eq!((tv.width, tv.height), (pv.width, pv.height));
    assert_eq!((tv.width, tv.height), (320, 240));
    assert_eq!(tv.timescale, 90_000);
    let desc = tv.description.clone().expect("video description");
    if h265 {
        let h = Hvcc::decode_body(&mut desc.as_ref()).expect("hvcC parses");
        assert_eq!(pv.profile, "Main");
        assert_eq!(h.general_profile_idc, 1);
        assert_eq!(i64::from(h.general_level_idc), pv.level);
        assert!(
            tv.codec.starts_with(&format!("hvc1.1.6.L{}.", pv.level)),
            "{}",
            tv.codec
        );
        assert_eq!(h.arrays.len(), 3);
    } else {
        let a = Avcc::decode_body(&mut desc.as_ref()).expect("avcC parses");
        assert_eq!(a.sequence_parameter_sets.len(), 1);
        assert_eq!(a.picture_parameter_sets.len(), 1);
        let want = format!(
            "avc1.{:02x}{:02x}{:02x}",
            avc_profile(&pv.profile),
            a.profile_compatibility,
            pv.level
        );
        assert_eq!(tv.codec, want);
    }
    assert_eq!(pv.frames, 60);
    let v = check_track(&frames, pv.pid, pv);
    // Every 30th frame in presentation order; in decode order the keyframe
    // comes before the B-frames shown just before it.
    let mut shown = v.clone();
    shown.sort_by_key(|f| f.pts);
    let keys: Vec<usize> = (0..shown.len()).filter(|&i| shown[i].keyframe).collect();
    assert_eq!(keys, [0, 30], "keyframes every 30th frame");
    for f in &v {
        let types = nal_types(&f.data, h265);
        let params: &[u8] = if h265 { &[32, 33, 34, 35] } else { &[7, 8, 9] };
        assert!(
            !types.iter().any(|t| params.contains(t)),
            "parameter sets or AUD left in a frame: {types:?}"
        );
    }
    for p in &probes {
        if p.pid != pv.pid {
            check_track(&frames, p.pid, p);
        }
    }
    (probes, tracks)
}

#[test]
fn h264_and_aac() {
    if !have_tools(&["libx264", "aac"]) {
        return;
    }
    let (probes, tracks) = run_video(
        "h264-aac",
        &[
            "-c:v",
            "libx264",
            "-g",
            "30",
            "-bf",
            "2",
            "-sc_threshold",
            "0",
        ],
        &["-c:a", "aac"],
        false,
    );
    let pa = probes.iter().find(|p| p.codec == "aac").expect("aac");
    assert_eq!(pa.packets.len() as u64, pa.frames);
    let ta = tracks.iter().find(|t| t.id == pa.pid).expect("aac track");
    assert_eq!(ta.codec, "mp4a.40.2");
    assert_eq!((ta.sample_rate, ta.channels), (48_000, 1));
    assert_eq!(ta.description.as_deref(), Some(&[0x11, 0x88][..]));
}

#[test]
fn h265_and_aac() {
    if !have_tools(&["libx265", "aac"]) {
        return;
    }
    run_video(
        "h265-aac",
        &[
            "-c:v",
            "libx265",
            "-x265-params",
            "keyint=30:min-keyint=30:scenecut=0:bframes=2:log-level=error",
        ],
        &["-c:a", "aac"],
        true,
    );
}

#[test]
fn h264_and_opus() {
    if !have_tools(&["libx264", "libopus"]) {
        return;
    }
    let (data, path) = encode(
        "h264-opus",
        &[
            "-c:v",
            "libx264",
            "-g",
            "30",
            "-bf",
            "2",
            "-sc_threshold",
            "0",
        ],
        &["-c:a", "libopus"],
    );
    let probes = probed(&path);
    let _ = std::fs::remove_file(&path);
    let (tracks, frames) = demux(&data);
    let po = probes.iter().find(|p| p.codec == "opus").expect("opus");
    let to = tracks[0]
        .iter()
        .find(|t| t.id == po.pid)
        .expect("opus track");
    assert_eq!(to.codec, "opus");
    assert_eq!(to.sample_rate, 48_000);
    let head = to.description.as_ref().expect("OpusHead");
    assert_eq!(&head[..8], b"OpusHead");
    let o = check_track(&frames, po.pid, po);
    assert!(o.len() >= 99, "two seconds of 20 ms packets: {}", o.len());
}
