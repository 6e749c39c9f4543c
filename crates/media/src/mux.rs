//! Fragmented-MP4 muxing: an init segment for a set of tracks, then one
//! `moof` + `mdat` per frame, which `ffprobe`, `ffplay -`, browsers' MSE and
//! the CMAF container of hang all read.
//!
//! Timestamps come in as microseconds and go out in each track's
//! [`TrackInfo::timescale`]. Composition offsets are signed (`trun` version
//! 1) so a frame may present before it decodes without an edit list.

use bytes::{BufMut, Bytes, BytesMut};
use mp4_atom::{
    Dinf, Dref, DrefEntry, Encode, FourCC, Ftyp, Hdlr, Mdhd, Mdia, Mfhd, Minf, Moof, Moov, Mvex,
    Mvhd, Smhd, Stbl, Stsd, Tfdt, Tfhd, Tkhd, Traf, Trak, Trex, Trun, TrunEntry, TrunSamples, Url,
    Vmhd,
};

use crate::codec::sample_entry;
use crate::{from_micros, Error, Frame, TrackInfo, TrackKind};

/// `sample_depends_on` = 2 (does not depend on others): a sync sample.
const SYNC_FLAGS: u32 = 0x0200_0000;
/// `sample_depends_on` = 1 and `sample_is_non_sync_sample`.
const NON_SYNC_FLAGS: u32 = 0x0101_0000;
/// `sample_is_depended_on` = 2.
const DISPOSABLE: u32 = 0x0080_0000;

fn encode(b: &mut BytesMut, atom: &impl Encode, what: &'static str) -> Result<(), Error> {
    atom.encode(b).map_err(|e| Error::malformed(what, e))
}

/// `ftyp` + `moov` describing `tracks` (each by its [`TrackInfo::id`]).
pub fn init_segment(tracks: &[TrackInfo]) -> Result<Bytes, Error> {
    let mut moov = Moov {
        mvhd: Mvhd {
            timescale: 1000,
            next_track_id: tracks.iter().map(|t| t.id).max().unwrap_or(0) + 1,
            ..Default::default()
        },
        mvex: Some(Mvex::default()),
        ..Default::default()
    };
    for t in tracks {
        let entry = sample_entry(t)?;
        let video = t.kind == TrackKind::Video;
        let trak = Trak {
            tkhd: Tkhd {
                track_id: t.id,
                enabled: true,
                in_movie: true,
                volume: if video { 0.into() } else { 1.into() },
                width: (t.width.min(u16::MAX.into()) as u16).into(),
                height: (t.height.min(u16::MAX.into()) as u16).into(),
                ..Default::default()
            },
            mdia: Mdia {
                mdhd: Mdhd {
                    timescale: t.timescale.max(1),
                    language: "und".into(),
                    ..Default::default()
                },
                hdlr: Hdlr {
                    handler: FourCC::new(if video { b"vide" } else { b"soun" }),
                    name: if video {
                        "VideoHandler"
                    } else {
                        "SoundHandler"
                    }
                    .into(),
                },
                minf: Minf {
                    vmhd: video.then(Vmhd::default),
                    smhd: (!video).then(Smhd::default),
                    dinf: Dinf {
                        dref: Dref {
                            entries: vec![DrefEntry::Url(Url::default())],
                        },
                    },
                    stbl: Stbl {
                        stsd: Stsd {
                            codecs: vec![entry],
                        },
                        ..Default::default()
                    },
                    ..Default::default()
                },
            },
            ..Default::default()
        };
        moov.trak.push(trak);
        if let Some(mvex) = moov.mvex.as_mut() {
            mvex.trex.push(Trex {
                track_id: t.id,
                default_sample_description_index: 1,
                ..Default::default()
            });
        }
    }
    let ftyp = Ftyp {
        major_brand: FourCC::new(b"iso6"),
        minor_version: 0,
        compatible_brands: vec![
            FourCC::new(b"iso6"),
            FourCC::new(b"cmfc"),
            FourCC::new(b"mp41"),
        ],
    };
    let mut b = BytesMut::new();
    encode(&mut b, &ftyp, "ftyp")?;
    encode(&mut b, &moov, "moov")?;
    Ok(b.freeze())
}

/// Writes fragments, numbering them.
#[derive(Debug, Default)]
pub struct Fragmenter {
    sequence: u32,
}

impl Fragmenter {
    /// A fragmenter whose first fragment is number 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// One `moof` + `mdat` holding `frame` of `track`.
    pub fn fragment(&mut self, track: &TrackInfo, frame: &Frame) -> Result<Bytes, Error> {
        self.sequence = self.sequence.wrapping_add(1);
        let ts = track.timescale.max(1);
        let dts = from_micros(frame.dts, ts);
        let pts = from_micros(frame.pts, ts);
        let duration = from_micros(frame.duration.into(), ts).clamp(0, u32::MAX.into()) as u32;
        let size = u32::try_from(frame.data.len())
            .map_err(|_| Error::malformed("frame", "larger than 4 GiB"))?;
        let mut flags = if frame.keyframe || track.kind == TrackKind::Audio {
            SYNC_FLAGS
        } else {
            NON_SYNC_FLAGS
        };
        if frame.disposable {
            flags |= DISPOSABLE;
        }
        let moof = |data_offset: i32| Moof {
            mfhd: Mfhd {
                sequence_number: self.sequence,
            },
            traf: vec![Traf {
                tfhd: Tfhd {
                    track_id: track.id,
                    default_base_is_moof: true,
                    ..Default::default()
                },
                tfdt: Some(Tfdt {
                    // A negative decode time (B frames before the first
                    // presentation) cannot be written; clamp at zero.
                    base_media_decode_time: dts.max(0) as u64,
                }),
                trun: vec![Trun {
                    data_offset: Some(data_offset),
                    samples: TrunSamples::Explicit(vec![TrunEntry {
                        duration: Some(duration),
                        size: Some(size),
                        flags: Some(flags),
                        cts: Some(pts.saturating_sub(dts.max(0))),
                    }]),
                }],
                ..Default::default()
            }],
        };
        // The data offset counts from the moof's first byte to the sample's:
        // the moof's own size, then the mdat header. The moof's size does not
        // depend on the offset's value, so measure once and write again.
        let mut probe = BytesMut::new();
        encode(&mut probe, &moof(0), "moof")?;
        let offset = probe.len() + 8;
        let mut b = BytesMut::with_capacity(offset + frame.data.len());
        encode(&mut b, &moof(offset as i32), "moof")?;
        b.put_u32(8 + size);
        b.put_slice(b"mdat");
        b.put_slice(&frame.data);
        Ok(b.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fmp4::demux_all;
    use crate::Event;

    fn avc_track() -> TrackInfo {
        let avcc = mp4_atom::Avcc {
            configuration_version: 1,
            avc_profile_indication: 0x42,
            profile_compatibility: 0xc0,
            avc_level_indication: 0x1e,
            length_size: 4,
            sequence_parameter_sets: vec![vec![0x67, 0x42, 0xc0, 0x1e, 0xda, 0x02, 0x80]],
            picture_parameter_sets: vec![vec![0x68, 0xce, 0x3c, 0x80]],
            ext: None,
        };
        let mut d = BytesMut::new();
        mp4_atom::Atom::encode_body(&avcc, &mut d).unwrap();
        let mut t = TrackInfo::video(1, "avc1.42c01e", 640, 360);
        t.description = Some(d.freeze());
        t
    }

    #[test]
    fn what_is_muxed_demuxes_the_same() {
        let v = avc_track();
        let mut a = TrackInfo::audio(2, "mp4a.40.2", 48_000, 2);
        a.description = Some(crate::codec::aac_config(2, 48_000, 2).unwrap());
        let mut out = init_segment(&[v.clone(), a.clone()]).unwrap().to_vec();
        let mut f = Fragmenter::new();
        let frames = [
            (
                &v,
                Frame {
                    track: 1,
                    pts: 66_666,
                    dts: 0,
                    duration: 33_333,
                    keyframe: true,
                    disposable: false,
                    data: Bytes::from_static(b"\0\0\0\x01\x65"),
                },
            ),
            (
                &a,
                Frame {
                    track: 2,
                    pts: 0,
                    dts: 0,
                    duration: 21_333,
                    keyframe: true,
                    disposable: false,
                    data: Bytes::from_static(b"aac"),
                },
            ),
            (
                &v,
                Frame {
                    track: 1,
                    pts: 33_333,
                    dts: 33_333,
                    duration: 33_333,
                    keyframe: false,
                    disposable: true,
                    data: Bytes::from_static(b"\0\0\0\x01\x01"),
                },
            ),
        ];
        for (t, fr) in &frames {
            out.extend_from_slice(&f.fragment(t, fr).unwrap());
        }
        let ev = demux_all(&out).unwrap();
        let Event::Tracks(tracks) = &ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!(tracks[0].codec, "avc1.42c01e");
        assert_eq!(tracks[0].description, v.description);
        assert_eq!((tracks[0].width, tracks[0].height), (640, 360));
        assert_eq!(tracks[1].codec, "mp4a.40.2");
        assert_eq!(tracks[1].description, a.description);
        assert_eq!((tracks[1].sample_rate, tracks[1].channels), (48_000, 2));
        let got: Vec<_> = ev[1..]
            .iter()
            .map(|e| match e {
                Event::Frame(f) => f.clone(),
                e => panic!("{e:?}"),
            })
            .collect();
        assert_eq!(got.len(), 3);
        for (g, (_, want)) in got.iter().zip(&frames) {
            assert_eq!(g.track, want.track);
            assert_eq!(g.data, want.data);
            assert_eq!(g.keyframe, want.keyframe);
            assert_eq!(g.disposable, want.disposable);
            // Rounding to the track's timescale loses at most a microsecond.
            assert!((g.pts - want.pts).abs() <= 1, "{g:?} {want:?}");
            assert!((g.dts - want.dts).abs() <= 1, "{g:?} {want:?}");
        }
    }

    #[test]
    fn opus_init_segment_round_trips() {
        let t = TrackInfo::audio(7, "opus", 48_000, 2);
        let init = init_segment(&[t]).unwrap();
        let ev = demux_all(&init).unwrap();
        let Event::Tracks(tracks) = &ev[0] else {
            panic!()
        };
        assert_eq!(tracks[0].codec, "opus");
        assert_eq!(tracks[0].channels, 2);
    }
}
