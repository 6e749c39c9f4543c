//! A small hang publisher for the web tests: media made by Debian's ffmpeg
//! (H.264 Annex B or fragmented MP4, VP8 in IVF, Opus in Ogg), cut into
//! frames, and published live over MoQT in the hang format: a
//! `catalog.json` track and one track per rendition, each object a QUIC
//! varint timestamp and the frame ("legacy") or a moof+mdat fragment
//! ("cmaf"); timestamps are wall-clock microseconds since the Unix epoch,
//! so the player can show its latency.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use moqt::{FullTrackName, TrackNamespace};
use quichub_client::{ClientSession, LocalTrack, TrackMode};

/// One coded frame.
pub struct Frame {
    pub key: bool,
    pub data: Vec<u8>,
}

/// A coded clip: its frames and what the catalog says of it.
pub struct Clip {
    pub frames: Vec<Frame>,
    /// Frame duration.
    pub interval: Duration,
    /// The catalog's rendition entry.
    pub rendition: serde_json::Value,
    /// `Some(timescale)` for the "cmaf" container (frames are moof+mdat
    /// fragments whose `tfdt` is rewritten to the wall clock), `None` for
    /// "legacy".
    pub cmaf_timescale: Option<u64>,
}

fn ffmpeg(args: &[&str]) {
    let out = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(args)
        .output()
        .expect("run ffmpeg (Debian's ffmpeg package)");
    assert!(
        out.status.success(),
        "ffmpeg {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Splits an Annex B stream into NAL units (without start codes).
fn nal_units(b: &[u8]) -> Vec<&[u8]> {
    let mut starts = Vec::new();
    let mut i = 0;
    while i + 3 <= b.len() {
        if b[i] == 0 && b[i + 1] == 0 && b[i + 2] == 1 {
            starts.push(i + 3);
            i += 3;
        } else {
            i += 1;
        }
    }
    let mut out = Vec::new();
    for (k, &s) in starts.iter().enumerate() {
        let mut end = starts.get(k + 1).map_or(b.len(), |n| n - 3);
        // A 4-byte start code leaves a zero before the next 3-byte one.
        while end > s && b[end - 1] == 0 {
            end -= 1;
        }
        out.push(&b[s..end]);
    }
    out
}

/// Two seconds of 640x360 H.264 (constrained baseline, a keyframe every
/// 30 frames, no B-frames) at 30 fps.
pub fn h264(dir: &Path) -> Clip {
    let path = dir.join("clip.h264");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=640x360:rate=30",
        "-t",
        "2",
        "-c:v",
        "libx264",
        "-profile:v",
        "baseline",
        "-pix_fmt",
        "yuv420p",
        "-g",
        "30",
        "-bf",
        "0",
        "-tune",
        "zerolatency",
        "-x264-params",
        "aud=1",
        "-f",
        "h264",
        path.to_str().unwrap(),
    ]);
    let b = std::fs::read(&path).unwrap();
    let (mut sps, mut pps) = (None, None);
    let mut frames: Vec<Frame> = Vec::new();
    let mut cur: Option<Frame> = None;
    for nal in nal_units(&b) {
        if nal.is_empty() {
            continue;
        }
        match nal[0] & 0x1f {
            9 => {
                if let Some(f) = cur.take() {
                    frames.push(f);
                }
                cur = Some(Frame {
                    key: false,
                    data: Vec::new(),
                });
            }
            7 => sps = Some(nal.to_vec()),
            8 => pps = Some(nal.to_vec()),
            t => {
                let f = cur.get_or_insert(Frame {
                    key: false,
                    data: Vec::new(),
                });
                if t == 5 {
                    f.key = true;
                }
                f.data.extend_from_slice(&(nal.len() as u32).to_be_bytes());
                f.data.extend_from_slice(nal);
            }
        }
    }
    frames.extend(cur);
    frames.retain(|f| !f.data.is_empty());
    let (sps, pps) = (sps.expect("SPS"), pps.expect("PPS"));
    let mut avcc = vec![1, sps[1], sps[2], sps[3], 0xff, 0xe1];
    avcc.extend_from_slice(&(sps.len() as u16).to_be_bytes());
    avcc.extend_from_slice(&sps);
    avcc.push(1);
    avcc.extend_from_slice(&(pps.len() as u16).to_be_bytes());
    avcc.extend_from_slice(&pps);
    assert!(frames[0].key, "the clip starts with an IDR frame");
    Clip {
        frames,
        interval: Duration::from_micros(33_333),
        rendition: serde_json::json!({
            "codec": format!("avc1.{}", hex(&sps[1..4])),
            "description": hex(&avcc),
            "codedWidth": 640,
            "codedHeight": 360,
            "bitrate": 1_000_000,
            "framerate": 30.0,
            "container": {"kind": "legacy"},
        }),
        cmaf_timescale: None,
    }
}

/// Two seconds of 640x360 VP8 at 30 fps, a keyframe every 30 frames.
pub fn vp8(dir: &Path) -> Clip {
    let path = dir.join("clip.ivf");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=640x360:rate=30",
        "-t",
        "2",
        "-c:v",
        "libvpx",
        "-deadline",
        "realtime",
        "-g",
        "30",
        "-b:v",
        "1M",
        "-f",
        "ivf",
        path.to_str().unwrap(),
    ]);
    let b = std::fs::read(&path).unwrap();
    let header = u16::from_le_bytes([b[6], b[7]]) as usize;
    let mut i = header;
    let mut frames = Vec::new();
    while i + 12 <= b.len() {
        let n = u32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as usize;
        let data = b[i + 12..i + 12 + n].to_vec();
        frames.push(Frame {
            key: data[0] & 1 == 0,
            data,
        });
        i += 12 + n;
    }
    Clip {
        frames,
        interval: Duration::from_micros(33_333),
        rendition: serde_json::json!({
            "codec": "vp8",
            "codedWidth": 640,
            "codedHeight": 360,
            "bitrate": 1_000_000,
            "framerate": 30.0,
            "container": {"kind": "legacy"},
        }),
        cmaf_timescale: None,
    }
}

/// Two seconds of a 440 Hz tone in Opus, 20 ms packets, 48 kHz stereo.
pub fn opus(dir: &Path) -> Clip {
    let path = dir.join("clip.ogg");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "sine=frequency=440:sample_rate=48000",
        "-t",
        "2",
        "-ac",
        "2",
        "-c:a",
        "libopus",
        "-b:a",
        "64k",
        "-frame_duration",
        "20",
        "-f",
        "ogg",
        path.to_str().unwrap(),
    ]);
    let b = std::fs::read(&path).unwrap();
    // Ogg pages: "OggS", 27-byte header, segment table; packets are runs of
    // segments ending with one shorter than 255 bytes.
    let mut packets = Vec::new();
    let mut cur = Vec::new();
    let mut i = 0;
    while i + 27 <= b.len() {
        assert_eq!(&b[i..i + 4], b"OggS");
        let nseg = b[i + 26] as usize;
        let table = &b[i + 27..i + 27 + nseg];
        let mut p = i + 27 + nseg;
        for &len in table {
            cur.extend_from_slice(&b[p..p + len as usize]);
            p += len as usize;
            if len < 255 {
                packets.push(std::mem::take(&mut cur));
            }
        }
        i = p;
    }
    assert!(packets[0].starts_with(b"OpusHead"));
    let frames = packets
        .into_iter()
        .skip(2) // OpusHead, OpusTags
        .map(|data| Frame { key: true, data })
        .collect();
    Clip {
        frames,
        interval: Duration::from_millis(20),
        rendition: serde_json::json!({
            "codec": "opus",
            "sampleRate": 48000,
            "numberOfChannels": 2,
            "bitrate": 64000,
            "container": {"kind": "legacy"},
        }),
        cmaf_timescale: None,
    }
}

/// QUIC varint (RFC 9000 §16).
fn put_quic_varint(b: &mut BytesMut, v: u64) {
    if v < 1 << 6 {
        b.put_u8(v as u8);
    } else if v < 1 << 14 {
        b.put_u16(v as u16 | 0x4000);
    } else if v < 1 << 30 {
        b.put_u32(v as u32 | 0x8000_0000);
    } else {
        b.put_u64(v | 0xc000_0000_0000_0000);
    }
}

/// Top-level MP4 boxes of `b[start..end]`: (type, start of body, end).
fn boxes(b: &[u8], start: usize, end: usize) -> Vec<([u8; 4], usize, usize)> {
    let mut out = Vec::new();
    let mut p = start;
    while p + 8 <= end {
        let size = u32::from_be_bytes(b[p..p + 4].try_into().unwrap()) as usize;
        let ty: [u8; 4] = b[p + 4..p + 8].try_into().unwrap();
        assert!(size >= 8 && p + size <= end, "bad box at {p}");
        out.push((ty, p + 8, p + size));
        p += size;
    }
    out
}

fn find(b: &[u8], start: usize, end: usize, path: &[&[u8; 4]]) -> Option<(usize, usize)> {
    let (first, rest) = path.split_first()?;
    let (_, s, e) = boxes(b, start, end)
        .into_iter()
        .find(|(t, _, _)| t == *first)?;
    if rest.is_empty() {
        Some((s, e))
    } else {
        find(b, s, e, rest)
    }
}

/// Two seconds of 640x360 H.264 as fragmented MP4, one frame per fragment
/// (the hang "cmaf" container): the init segment (ftyp+moov) goes in the
/// catalog, each moof+mdat is one object.
pub fn h264_cmaf(dir: &Path) -> Clip {
    let path = dir.join("clip.mp4");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=640x360:rate=30",
        "-t",
        "2",
        "-c:v",
        "libx264",
        "-profile:v",
        "baseline",
        "-pix_fmt",
        "yuv420p",
        "-g",
        "30",
        "-sc_threshold",
        "0",
        "-bf",
        "0",
        "-tune",
        "zerolatency",
        "-movflags",
        "frag_every_frame+empty_moov+default_base_moof",
        "-f",
        "mp4",
        path.to_str().unwrap(),
    ]);
    let b = std::fs::read(&path).unwrap();
    let top = boxes(&b, 0, b.len());
    let moov = top.iter().find(|(t, _, _)| t == b"moov").expect("moov");
    let init = b[..moov.2].to_vec();
    let (mdhd, _) = find(&b, 0, moov.2, &[b"moov", b"trak", b"mdia", b"mdhd"]).expect("mdhd");
    let timescale = if b[mdhd] == 1 {
        u32::from_be_bytes(b[mdhd + 20..mdhd + 24].try_into().unwrap())
    } else {
        u32::from_be_bytes(b[mdhd + 12..mdhd + 16].try_into().unwrap())
    } as u64;
    let (avcc, _) = find(
        &b,
        0,
        moov.2,
        &[b"moov", b"trak", b"mdia", b"minf", b"stbl", b"stsd"],
    )
    .and_then(|(s, e)| find(&b, s + 8, e, &[b"avc1"]))
    .and_then(|(s, e)| find(&b, s + 78, e, &[b"avcC"]))
    .expect("avcC");
    let profile = &b[avcc + 1..avcc + 4];
    let mut frames = Vec::new();
    let mut i = 0;
    while i < top.len() {
        if &top[i].0 == b"moof" && i + 1 < top.len() && &top[i + 1].0 == b"mdat" {
            let start = top[i].1 - 8;
            let end = top[i + 1].2;
            frames.push(Frame {
                key: frames.len() % 30 == 0,
                data: b[start..end].to_vec(),
            });
            i += 2;
        } else {
            i += 1;
        }
    }
    assert!(frames.len() >= 59, "{} fragments", frames.len());
    use base64::Engine;
    Clip {
        frames,
        interval: Duration::from_micros(33_333),
        rendition: serde_json::json!({
            "codec": format!("avc1.{}", hex(profile)),
            "codedWidth": 640,
            "codedHeight": 360,
            "bitrate": 1_000_000,
            "framerate": 30.0,
            "container": {
                "kind": "cmaf",
                "init": base64::engine::general_purpose::STANDARD.encode(&init),
            },
        }),
        cmaf_timescale: Some(timescale),
    }
}

/// A cmaf fragment with its `tfdt` set to `timestamp_us` in `timescale`.
fn cmaf(timestamp_us: u64, fragment: &[u8], timescale: u64) -> Bytes {
    let mut f = fragment.to_vec();
    let (s, e) = find(&f, 0, f.len(), &[b"moof", b"traf", b"tfdt"]).expect("tfdt");
    let t = (timestamp_us as u128 * timescale as u128 / 1_000_000) as u64;
    if f[s] == 1 {
        f[s + 4..s + 12].copy_from_slice(&t.to_be_bytes());
    } else {
        // A version-0 tfdt holds 32 bits: the low ones (wraps; ffmpeg writes version 1).
        assert!(e - s >= 8);
        f[s + 4..s + 8].copy_from_slice(&(t as u32).to_be_bytes());
    }
    Bytes::from(f)
}

fn legacy(timestamp_us: u64, frame: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(frame.len() + 8);
    put_quic_varint(&mut b, timestamp_us);
    b.put_slice(frame);
    b.freeze()
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Publishes `clip` on `track` in real time, looping, until dropped: one
/// group per keyframe (video) or per 50 frames (audio), on one subgroup
/// stream each, or with `split` on two (the keyframe on subgroup 0, the
/// other frames on subgroup 1, like `pub --delivery frame-type`);
/// timestamps are the wall clock at the frame's due time.
async fn play(track: Arc<LocalTrack>, clip: Clip, video: bool, split: bool) {
    let start = tokio::time::Instant::now();
    let start_us = now_us();
    let mut group = 0u64;
    let mut object = 0u64;
    let mut first = true;
    let mut writer: Option<quichub_client::SubgroupWriter<'_>> = None;
    let mut rest: Option<quichub_client::SubgroupWriter<'_>> = None;
    let mut n = 0u64;
    loop {
        for f in &clip.frames {
            let due = clip.interval * n as u32;
            tokio::time::sleep_until(start + due).await;
            let new_group = if video { f.key } else { object == 50 };
            if new_group || first {
                for w in [writer.take(), rest.take()].into_iter().flatten() {
                    w.finish();
                }
                if !first {
                    group += 1;
                }
                first = false;
                object = 0;
                writer = track.open_subgroup(group, 0).await.ok().flatten();
            }
            let ts = start_us + due.as_micros() as u64;
            let payload = match clip.cmaf_timescale {
                Some(scale) => cmaf(ts, &f.data, scale),
                None => legacy(ts, &f.data),
            };
            let w = if split && object > 0 {
                if rest.is_none() {
                    rest = track.open_subgroup(group, 1).await.ok().flatten();
                }
                rest.as_mut()
            } else {
                writer.as_mut()
            };
            if let Some(w) = w {
                let _ = w.write(object, payload).await;
            }
            object += 1;
            n += 1;
        }
    }
}

/// A live hang broadcast `name` (video, optional audio) on `session`:
/// publishes the catalog, then the media until the returned tasks are
/// aborted; `split` spreads each video group over two subgroup streams.
pub async fn publish(
    session: &ClientSession,
    name: &str,
    video: Clip,
    audio: Option<Clip>,
    split: bool,
) -> Vec<tokio::task::JoinHandle<()>> {
    let ns = TrackNamespace::from_path(name);
    let full = |track: &str| FullTrackName {
        namespace: ns.clone(),
        name: Bytes::copy_from_slice(track.as_bytes()),
    };
    let mut catalog = serde_json::json!({
        "video": {"renditions": {"video": video.rendition}},
    });
    if let Some(a) = &audio {
        catalog["audio"] = serde_json::json!({"renditions": {"audio": a.rendition}});
    }
    let cat = session
        .create_track(full("catalog.json"), 100, TrackMode::Push)
        .await
        .expect("PUBLISH catalog.json");
    let mut w = cat.open_subgroup(0, 0).await.unwrap().expect("forwarding");
    w.write(0, Bytes::from(catalog.to_string())).await.unwrap();
    w.finish();
    let vt = session
        .create_track(full("video"), 2, TrackMode::Push)
        .await
        .expect("PUBLISH video");
    let mut tasks = vec![tokio::spawn(play(vt, video, true, split))];
    if let Some(a) = audio {
        let at = session
            .create_track(full("audio"), 1, TrackMode::Push)
            .await
            .expect("PUBLISH audio");
        tasks.push(tokio::spawn(play(at, a, false, false)));
    }
    // The catalog track lives as long as the tasks: keep it in one.
    tasks.push(tokio::spawn(async move {
        let _cat = cat;
        std::future::pending::<()>().await;
    }));
    tasks
}
