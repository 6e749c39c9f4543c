//! The fMP4 demuxer and muxer against real files that Debian's ffmpeg makes
//! here: codec strings equal what ffprobe reads, every frame comes out, and
//! what is muxed again decodes to the same pictures.
//!
//! Without ffmpeg these tests pass with a note, unless `QUICHUB_MEDIA_TESTS=1`
//! (set by `scripts/test.sh`), where a missing ffmpeg fails them.

use std::io::Write;
use std::process::{Command, Stdio};

use quichub_media::fmp4::{demux_all, Fmp4Demuxer};
use quichub_media::mux::{init_segment, Fragmenter};
use quichub_media::{Demuxer, Error, Event, Frame, TrackInfo, TrackKind};

/// The flags of the ingest command: one fragment per frame.
const CMAF: &str = "cmaf+separate_moof+delay_moov+skip_trailer+frag_every_frame";

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

/// Runs ffmpeg with `args` (output to stdout) and returns what it wrote.
fn ffmpeg(args: &[&str]) -> Vec<u8> {
    let out = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-nostdin"])
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("run ffmpeg");
    assert!(out.status.success(), "ffmpeg {args:?} failed");
    out.stdout
}

/// Runs ffmpeg/ffprobe reading `input` on stdin.
fn with_stdin(prog: &str, args: &[&str], input: &[u8]) -> String {
    let mut child = Command::new(prog)
        .args(["-hide_banner", "-loglevel", "error"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(out.status.success(), "{prog} {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

fn ffprobe(args: &[&str], input: &[u8]) -> String {
    with_stdin("ffprobe", args, input)
}

/// The md5 of every decoded video frame, in presentation order.
fn video_md5s(input: &[u8]) -> Vec<String> {
    with_stdin(
        "ffmpeg",
        &["-i", "-", "-map", "0:v", "-f", "framemd5", "-"],
        input,
    )
    .lines()
    .filter(|l| !l.starts_with('#'))
    .filter_map(|l| l.rsplit(',').next().map(|s| s.trim().to_string()))
    .collect()
}

fn split(events: Vec<Event>) -> (Vec<TrackInfo>, Vec<Frame>) {
    let mut tracks = Vec::new();
    let mut frames = Vec::new();
    for e in events {
        match e {
            Event::Tracks(t) => tracks = t,
            Event::Frame(f) => frames.push(f),
        }
    }
    (tracks, frames)
}

fn source(video: &[&str], audio: &[&str]) -> Vec<u8> {
    let mut args = vec![
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=320x240:rate=30",
        "-f",
        "lavfi",
        "-i",
        "sine=frequency=440:sample_rate=48000",
        "-t",
        "2",
    ];
    args.extend_from_slice(video);
    args.extend_from_slice(audio);
    args.extend_from_slice(&["-f", "mp4", "-movflags", CMAF, "-"]);
    ffmpeg(&args)
}

#[test]
fn h264_and_aac_from_ffmpeg() {
    if !have_ffmpeg() {
        return;
    }
    let input = source(
        &[
            "-c:v",
            "libx264",
            "-profile:v",
            "high",
            "-level",
            "3.1",
            "-g",
            "30",
            "-bf",
            "2",
            "-pix_fmt",
            "yuv420p",
        ],
        &["-c:a", "aac", "-b:a", "96k"],
    );
    let (tracks, frames) = split(demux_all(&input).unwrap());
    let video = tracks.iter().find(|t| t.kind == TrackKind::Video).unwrap();
    let audio = tracks.iter().find(|t| t.kind == TrackKind::Audio).unwrap();
    // High profile (0x64), no constraint flags, level 3.1 (0x1f).
    assert_eq!(video.codec, "avc1.64001f");
    assert_eq!((video.width, video.height), (320, 240));
    assert_eq!(audio.codec, "mp4a.40.2");
    assert_eq!((audio.sample_rate, audio.channels), (48_000, 1));
    let probe = ffprobe(
        &[
            "-show_entries",
            "stream=codec_name,profile,level",
            "-of",
            "csv=p=0",
            "-",
        ],
        &input,
    );
    assert!(probe.contains("h264,High,31"), "{probe}");
    assert!(probe.contains("aac,LC"), "{probe}");

    let v: Vec<_> = frames.iter().filter(|f| f.track == video.id).collect();
    assert_eq!(v.len(), 60);
    let keys: Vec<_> = v
        .iter()
        .enumerate()
        .filter(|(_, f)| f.keyframe)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(keys, vec![0, 30]);
    assert!(
        v.windows(2).all(|w| w[0].dts < w[1].dts),
        "dts not increasing"
    );
    // Presentation order differs from decode order with B frames, and the
    // disposable (non-reference) ones are marked.
    assert!(v.windows(2).any(|w| w[0].pts > w[1].pts));
    assert!(v.iter().any(|f| f.disposable));
    // The first frame presents at 0 (the edit list is applied).
    assert_eq!(v.iter().map(|f| f.pts).min(), Some(0));
    let a: Vec<_> = frames.iter().filter(|f| f.track == audio.id).collect();
    assert!((90..=96).contains(&a.len()), "{} AAC frames", a.len());

    // Muxed again, one fragment per frame, it decodes to the same pictures.
    let mut out = init_segment(&tracks).unwrap().to_vec();
    let mut frag = Fragmenter::new();
    for f in &frames {
        let t = tracks.iter().find(|t| t.id == f.track).unwrap();
        out.extend_from_slice(&frag.fragment(t, f).unwrap());
    }
    let counted = ffprobe(
        &[
            "-count_frames",
            "-select_streams",
            "v",
            "-show_entries",
            "stream=nb_read_frames",
            "-of",
            "csv=p=0",
            "-",
        ],
        &out,
    );
    assert_eq!(counted.trim(), "60");
    let (a, b) = (video_md5s(&input), video_md5s(&out));
    assert_eq!(a.len(), 60);
    assert_eq!(a, b, "decoded pictures differ after remuxing");
}

#[test]
fn h265_and_opus_from_ffmpeg() {
    if !have_ffmpeg() {
        return;
    }
    let input = source(
        &[
            "-c:v",
            "libx265",
            "-x265-params",
            "log-level=error:keyint=30:min-keyint=30",
            "-tag:v",
            "hvc1",
        ],
        &["-c:a", "libopus", "-b:a", "64k"],
    );
    let (tracks, frames) = split(demux_all(&input).unwrap());
    let video = tracks.iter().find(|t| t.kind == TrackKind::Video).unwrap();
    let audio = tracks.iter().find(|t| t.kind == TrackKind::Audio).unwrap();
    // Main profile (1), compatibility flags 0x60 reversed = 6, level 2.1 for 320x240.
    assert!(video.codec.starts_with("hvc1.1.6.L"), "{}", video.codec);
    assert_eq!(audio.codec, "opus");
    let head = audio.description.as_ref().unwrap();
    assert_eq!(&head[..8], b"OpusHead");
    let v: Vec<_> = frames.iter().filter(|f| f.track == video.id).collect();
    assert_eq!(v.len(), 60);
    // Keyframes where the GOP says, in presentation order.
    let mut by_pts = v.clone();
    by_pts.sort_by_key(|f| f.pts);
    let keys: Vec<_> = by_pts
        .iter()
        .enumerate()
        .filter(|(_, f)| f.keyframe)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(keys, vec![0, 30]);

    let mut out = init_segment(&tracks).unwrap().to_vec();
    let mut frag = Fragmenter::new();
    for f in &frames {
        let t = tracks.iter().find(|t| t.id == f.track).unwrap();
        out.extend_from_slice(&frag.fragment(t, f).unwrap());
    }
    assert_eq!(video_md5s(&input), video_md5s(&out));
}

#[test]
fn bad_input_is_a_clear_error() {
    if !have_ffmpeg() {
        return;
    }
    let input = source(&["-c:v", "libx264", "-g", "30"], &["-c:a", "aac"]);

    // Truncated: every frame before the cut comes out, then an error.
    let mut d = Fmp4Demuxer::default();
    d.push(&input[..input.len() / 2]);
    d.end();
    let mut frames = 0;
    let err = loop {
        match d.next() {
            Ok(Some(Event::Frame(_))) => frames += 1,
            Ok(Some(_)) => {}
            Ok(None) => panic!("truncation not reported"),
            Err(e) => break e,
        }
    };
    assert!(frames > 10, "{frames}");
    assert!(err.to_string().contains("input ends inside a box"), "{err}");

    // A 1 GB mdat length is refused from its header, before any allocation.
    let mut huge = input.clone();
    let at = find(&huge, b"mdat") - 4;
    huge[at..at + 4].copy_from_slice(&0x4000_0000u32.to_be_bytes());
    let err = demux_all(&huge).unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");

    // Corrupt bytes inside the moov.
    let mut bad = input.clone();
    let at = find(&bad, b"avcC");
    for b in &mut bad[at + 4..at + 12] {
        *b = 0xff;
    }
    assert!(demux_all(&bad).is_err());

    // A plain (non-fragmented) MP4 is refused with the command that fixes it.
    let plain = ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=160x120:rate=10",
        "-t",
        "1",
        "-c:v",
        "libx264",
        "-f",
        "mp4",
        "-movflags",
        "frag_keyframe",
        "-",
    ]);
    let mut flat = Vec::new();
    // Rewrite the fragmented file as ftyp + mdat (what a plain MP4 starts with).
    flat.extend_from_slice(&plain[..find(&plain, b"moov") - 4]);
    flat.extend_from_slice(&[0, 0, 0, 16]);
    flat.extend_from_slice(b"mdat01234567");
    let err = demux_all(&flat).unwrap_err();
    assert!(err.to_string().contains("ffmpeg"), "{err}");

    // Not MP4 at all.
    let err = demux_all(b"\x47\x40\x00\x10 this is MPEG-TS-ish").unwrap_err();
    assert!(
        matches!(err, Error::WrongFormat { .. } | Error::Malformed { .. }),
        "{err}"
    );

    // An unknown codec (MPEG-4 Part 2 is not one this pipeline describes) is named.
    let vp8 = ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=160x120:rate=10",
        "-t",
        "1",
        "-c:v",
        "mpeg4",
        "-f",
        "mp4",
        "-movflags",
        CMAF,
        "-",
    ]);
    let err = demux_all(&vp8).unwrap_err();
    assert!(err.to_string().contains("unsupported codec"), "{err}");
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("box present")
}

#[test]
fn fed_byte_by_byte_gives_the_same_events() {
    if !have_ffmpeg() {
        return;
    }
    let input = source(&["-c:v", "libx264", "-g", "15"], &["-c:a", "aac"]);
    let whole = demux_all(&input).unwrap();
    let mut d = Fmp4Demuxer::default();
    let mut got = Vec::new();
    for chunk in input.chunks(97) {
        d.push(chunk);
        while let Some(e) = d.next().unwrap() {
            got.push(e);
        }
    }
    d.end();
    while let Some(e) = d.next().unwrap() {
        got.push(e);
    }
    assert_eq!(got, whole);
}
