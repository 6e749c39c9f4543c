//! Decoder configurations: ISO BMFF sample entries (`avc1`/`avc3` with
//! `avcC`, `hvc1`/`hev1` with `hvcC`, `mp4a` with `esds`, `Opus` with `dOps`)
//! to WebCodecs codec strings and `description`s, and back.
//!
//! The codec strings follow the WebCodecs codec registry: RFC 6381 for AVC
//! and AAC, ISO/IEC 14496-15 Annex E for HEVC, and `opus` for Opus (whose
//! `description` is the OpusHead of RFC 7845, little-endian, where `dOps` is
//! big-endian).

use bytes::{Bytes, BytesMut};
use mp4_atom::{Atom, Audio, Avcc, Codec, Dops, Esds, Hvcc, OpusChannelMapping, Visual};

use crate::{Error, TrackInfo, TrackKind};

/// `avc1.PPCCLL`: profile, constraint flags and level of an `avcC`.
pub fn avc_codec_string(avcc: &Avcc) -> String {
    format!(
        "avc1.{:02x}{:02x}{:02x}",
        avcc.avc_profile_indication, avcc.profile_compatibility, avcc.avc_level_indication
    )
}

/// `hvc1.…` / `hev1.…` of an `hvcC` (ISO/IEC 14496-15 Annex E.3).
pub fn hevc_codec_string(prefix: &str, h: &Hvcc) -> String {
    let space = match h.general_profile_space {
        1 => "A",
        2 => "B",
        3 => "C",
        _ => "",
    };
    // The 32 compatibility flags, in reverse bit order, as hex without
    // leading zeros.
    let flags = u32::from_be_bytes(h.general_profile_compatibility_flags).reverse_bits();
    let tier = if h.general_tier_flag { 'H' } else { 'L' };
    let mut s = format!(
        "{prefix}.{space}{}.{flags:x}.{tier}{}",
        h.general_profile_idc, h.general_level_idc
    );
    // Constraint bytes, trailing zero bytes omitted.
    let c = &h.general_constraint_indicator_flags;
    let used = c.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    for b in &c[..used] {
        s.push_str(&format!(".{b:X}"));
    }
    s
}

/// `mp4a.40.N`, N the audio object type of an AudioSpecificConfig.
pub fn aac_codec_string(asc: &[u8]) -> Result<String, Error> {
    Ok(format!("mp4a.40.{}", aac_object_type(asc)?))
}

/// The audio object type (5 bits, or 32 + 6 more bits when the first five
/// are all ones) at the start of an AudioSpecificConfig.
pub fn aac_object_type(asc: &[u8]) -> Result<u8, Error> {
    let Some(&b0) = asc.first() else {
        return Err(Error::malformed("AudioSpecificConfig", "empty"));
    };
    let aot = b0 >> 3;
    if aot == 31 {
        let b1 = *asc
            .get(1)
            .ok_or_else(|| Error::malformed("AudioSpecificConfig", "truncated"))?;
        return Ok(32 + (((b0 & 0x07) << 3) | (b1 >> 5)));
    }
    Ok(aot)
}

/// (sample rate, channels) an AudioSpecificConfig declares; 0 where it
/// leaves them to the container (channel configuration 0) or is too short.
pub fn aac_rate_channels(asc: &[u8]) -> (u32, u32) {
    let bits = asc
        .iter()
        .take(8)
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
        << (8 * (8 - asc.len().min(8)));
    let mut at = 5;
    if bits >> 59 == 31 {
        at += 6;
    }
    let field = |at: u32, n: u32| ((bits << at) >> (64 - n)) as u32;
    let idx = field(at, 4);
    at += 4;
    let rate = if idx == 15 {
        at += 24;
        field(at - 24, 24)
    } else {
        AAC_SAMPLE_RATES.get(idx as usize).copied().unwrap_or(0)
    };
    if asc.len() * 8 < (at + 4) as usize {
        return (0, 0);
    }
    (rate, field(at, 4))
}

/// The sample rates an AudioSpecificConfig or ADTS header indexes.
pub const AAC_SAMPLE_RATES: [u32; 13] = [
    96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350,
];

/// A two-byte AudioSpecificConfig for `object_type` (≤ 30), a rate from
/// [`AAC_SAMPLE_RATES`] and 1–7 channels.
pub fn aac_config(object_type: u8, sample_rate: u32, channels: u8) -> Result<Bytes, Error> {
    let idx = AAC_SAMPLE_RATES
        .iter()
        .position(|&r| r == sample_rate)
        .ok_or_else(|| Error::malformed("AudioSpecificConfig", "sample rate not indexable"))?
        as u16;
    if object_type == 0 || object_type > 30 || channels == 0 || channels > 7 {
        return Err(Error::malformed(
            "AudioSpecificConfig",
            "object type or channels",
        ));
    }
    let v: u16 = (u16::from(object_type) << 11) | (idx << 7) | (u16::from(channels) << 3);
    Ok(Bytes::copy_from_slice(&v.to_be_bytes()))
}

/// OpusHead (RFC 7845 §5.1) from a `dOps` box.
pub fn opus_head(d: &Dops) -> Bytes {
    let mut b = Vec::with_capacity(21);
    b.extend_from_slice(b"OpusHead");
    b.push(1);
    b.push(d.output_channel_count);
    b.extend_from_slice(&d.pre_skip.to_le_bytes());
    b.extend_from_slice(&d.input_sample_rate.to_le_bytes());
    b.extend_from_slice(&d.output_gain.to_le_bytes());
    match &d.channel_mapping {
        None => b.push(0),
        Some(m) => {
            b.push(m.family);
            b.push(m.stream_count);
            b.push(m.coupled_count);
            b.extend_from_slice(&m.channel_mapping);
        }
    }
    Bytes::from(b)
}

/// A `dOps` box from an OpusHead.
pub fn dops_from_head(h: &[u8]) -> Result<Dops, Error> {
    if h.len() < 19 || &h[..8] != b"OpusHead" {
        return Err(Error::malformed("OpusHead", "too short or wrong magic"));
    }
    let channels = h[9];
    let family = h[18];
    let channel_mapping = if family == 0 {
        None
    } else {
        let table = h
            .get(21..21 + channels as usize)
            .ok_or_else(|| Error::malformed("OpusHead", "channel mapping table truncated"))?;
        Some(OpusChannelMapping {
            family,
            stream_count: h[19],
            coupled_count: h[20],
            channel_mapping: table.to_vec(),
        })
    };
    Ok(Dops {
        output_channel_count: channels,
        pre_skip: u16::from_le_bytes([h[10], h[11]]),
        input_sample_rate: u32::from_le_bytes([h[12], h[13], h[14], h[15]]),
        output_gain: i16::from_le_bytes([h[16], h[17]]),
        channel_mapping,
    })
}

fn body<A: Atom>(a: &A) -> Result<Bytes, Error> {
    let mut b = BytesMut::new();
    a.encode_body(&mut b)
        .map_err(|e| Error::malformed("sample entry", e))?;
    Ok(b.freeze())
}

/// Describes a track from its `stsd` sample entry: codec string,
/// description, size or rate. `id` and `timescale` come from the `trak`.
pub fn track_from_sample_entry(id: u32, timescale: u32, entry: &Codec) -> Result<TrackInfo, Error> {
    let video = |codec: String, v: &Visual, desc: Bytes, nal: u8| {
        let mut t = TrackInfo::video(id, &codec, v.width.into(), v.height.into());
        t.description = Some(desc);
        t.timescale = timescale;
        t.nal_length_size = nal;
        t
    };
    let audio = |codec: String, a: &Audio, desc: Option<Bytes>| {
        let mut t = TrackInfo::audio(
            id,
            &codec,
            u32::from(a.sample_rate.integer()),
            a.channel_count.into(),
        );
        t.description = desc;
        t.timescale = timescale;
        t
    };
    Ok(match entry {
        Codec::Avc1(c) => video(
            avc_codec_string(&c.avcc),
            &c.visual,
            body(&c.avcc)?,
            c.avcc.length_size,
        ),
        // avc3 keeps SPS/PPS in band; WebCodecs still takes the avcC.
        Codec::Avc3(c) => {
            let mut t = video(
                avc_codec_string(&c.avcc).replacen("avc1", "avc3", 1),
                &c.visual,
                body(&c.avcc)?,
                c.avcc.length_size,
            );
            if c.avcc.sequence_parameter_sets.is_empty() {
                t.description = None;
            }
            t
        }
        Codec::Hvc1(c) => video(
            hevc_codec_string("hvc1", &c.hvcc),
            &c.visual,
            body(&c.hvcc)?,
            c.hvcc.length_size_minus_one + 1,
        ),
        Codec::Hev1(c) => video(
            hevc_codec_string("hev1", &c.hvcc),
            &c.visual,
            body(&c.hvcc)?,
            c.hvcc.length_size_minus_one + 1,
        ),
        Codec::Mp4a(c) => {
            let dc = &c.esds.es_desc.dec_config;
            if dc.object_type_indication != 0x40 {
                return Err(Error::UnsupportedCodec(format!(
                    "mp4a with object type indication {:#x} (only AAC, 0x40)",
                    dc.object_type_indication
                )));
            }
            let asc = dc
                .dec_specific
                .as_ref()
                .map(|d| Bytes::copy_from_slice(&d.raw))
                .filter(|r| !r.is_empty())
                .ok_or_else(|| Error::malformed("esds", "no AudioSpecificConfig"))?;
            let (rate, channels) = aac_rate_channels(&asc);
            let mut t = audio(aac_codec_string(&asc)?, &c.audio, Some(asc));
            // The AudioSpecificConfig is what the decoder obeys; the sample
            // entry's fields are often left at 2 channels by muxers.
            if channels > 0 {
                t.channels = channels;
            }
            if rate > 0 {
                t.sample_rate = rate;
            }
            // The sample entry's rate field is 16.16 and wrong above 65535 Hz;
            // the timescale is the true rate in ffmpeg's output.
            if t.sample_rate == 0 {
                t.sample_rate = timescale;
            }
            t
        }
        Codec::Opus(c) => {
            let mut t = audio("opus".into(), &c.audio, Some(opus_head(&c.dops)));
            t.sample_rate = 48_000;
            t.channels = c.dops.output_channel_count.into();
            t
        }
        other => {
            let name = format!("{other:?}");
            let name = name.split('(').next().unwrap_or("unknown").to_lowercase();
            return Err(Error::UnsupportedCodec(name));
        }
    })
}

/// The ISO BMFF sample entry that [`track_from_sample_entry`] read, rebuilt
/// from a [`TrackInfo`] (as a subscriber knows it from a catalog).
pub fn sample_entry(t: &TrackInfo) -> Result<Codec, Error> {
    let visual = Visual {
        data_reference_index: 1,
        width: t.width.min(u16::MAX.into()) as u16,
        height: t.height.min(u16::MAX.into()) as u16,
        ..Visual::default()
    };
    let audio = |channels: u32| Audio {
        data_reference_index: 1,
        channel_count: channels.min(u16::MAX.into()) as u16,
        sample_size: 16,
        sample_rate: (t.sample_rate.min(u16::MAX.into()) as u16).into(),
    };
    let desc = || {
        t.description
            .clone()
            .ok_or_else(|| Error::malformed("catalog", format!("{} needs a description", t.codec)))
    };
    let family = t.codec.split('.').next().unwrap_or("");
    Ok(match family {
        "avc1" | "avc3" => {
            let avcc = Avcc::decode_body(&mut desc()?.as_ref())
                .map_err(|e| Error::malformed("avcC", e))?;
            let c = mp4_atom::Avc1 {
                visual,
                avcc,
                ..Default::default()
            };
            if family == "avc3" {
                Codec::Avc3(mp4_atom::Avc3 {
                    visual: c.visual,
                    avcc: c.avcc,
                    ..Default::default()
                })
            } else {
                Codec::Avc1(c)
            }
        }
        "hvc1" | "hev1" => {
            let hvcc = Hvcc::decode_body(&mut desc()?.as_ref())
                .map_err(|e| Error::malformed("hvcC", e))?;
            if family == "hvc1" {
                Codec::Hvc1(mp4_atom::Hvc1 {
                    visual,
                    hvcc,
                    ..Default::default()
                })
            } else {
                Codec::Hev1(mp4_atom::Hev1 {
                    visual,
                    hvcc,
                    ..Default::default()
                })
            }
        }
        "mp4a" => {
            let asc = match &t.description {
                Some(d) => d.clone(),
                None => {
                    let aot = t
                        .codec
                        .rsplit('.')
                        .next()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(2);
                    aac_config(aot, t.sample_rate, t.channels.min(7) as u8)?
                }
            };
            let (b0, b1) = (
                asc.first().copied().unwrap_or(0),
                asc.get(1).copied().unwrap_or(0),
            );
            let esds = Esds {
                es_desc: mp4_atom::esds::EsDescriptor {
                    es_id: 1,
                    dec_config: mp4_atom::esds::DecoderConfig {
                        object_type_indication: 0x40,
                        stream_type: 5,
                        up_stream: 0,
                        dec_specific: Some(mp4_atom::esds::DecoderSpecific {
                            profile: b0 >> 3,
                            freq_index: ((b0 & 0x07) << 1) | (b1 >> 7),
                            chan_conf: (b1 >> 3) & 0x0f,
                            raw: asc.to_vec(),
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            };
            Codec::Mp4a(mp4_atom::Mp4a {
                audio: audio(t.channels),
                esds,
                btrt: None,
                taic: None,
            })
        }
        "opus" => {
            let dops = match &t.description {
                Some(d) => dops_from_head(d)?,
                None => Dops {
                    output_channel_count: t.channels.clamp(1, 2) as u8,
                    pre_skip: 312,
                    input_sample_rate: t.sample_rate,
                    output_gain: 0,
                    channel_mapping: None,
                },
            };
            let mut a = audio(dops.output_channel_count.into());
            a.sample_rate = 48_000u16.into();
            Codec::Opus(mp4_atom::Opus {
                audio: a,
                dops,
                btrt: None,
            })
        }
        _ => return Err(Error::UnsupportedCodec(t.codec.clone())),
    })
}

/// Whether an H.264 or H.265 access unit (length-prefixed NAL units of
/// `nal_len` bytes) is one no other picture references: every H.264 slice
/// has `nal_ref_idc` 0, or every H.265 slice is a sub-layer non-reference
/// picture (the even NAL types below 16). Such frames can be dropped under
/// congestion without breaking the frames after them. `false` for other
/// codecs and for anything that does not parse.
pub fn is_disposable(codec: &str, data: &[u8], nal_len: u8) -> bool {
    let hevc = match codec.split('.').next() {
        Some("avc1" | "avc3") => false,
        Some("hvc1" | "hev1") => true,
        _ => return false,
    };
    let n = usize::from(nal_len.clamp(1, 4));
    let mut rest = data;
    let mut slices = 0;
    while rest.len() > n {
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, &b| (a << 8) | usize::from(b));
        rest = &rest[n..];
        let Some(nal) = rest.get(..len) else {
            return false;
        };
        rest = &rest[len..];
        let Some(&h) = nal.first() else { continue };
        if hevc {
            let t = (h >> 1) & 0x3f;
            if t < 32 {
                slices += 1;
                if t >= 16 || t % 2 == 1 {
                    return false;
                }
            }
        } else {
            let t = h & 0x1f;
            if (1..=5).contains(&t) {
                slices += 1;
                if h & 0x60 != 0 {
                    return false;
                }
            }
        }
    }
    slices > 0 && rest.is_empty()
}

/// Whether a track's kind matches its codec string's family.
pub fn kind_of(codec: &str) -> Option<TrackKind> {
    match codec.split('.').next()? {
        "avc1" | "avc3" | "hvc1" | "hev1" | "vp09" | "vp8" | "av01" => Some(TrackKind::Video),
        "mp4a" | "opus" | "flac" => Some(TrackKind::Audio),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avc_string() {
        let avcc = Avcc {
            configuration_version: 1,
            avc_profile_indication: 0x64,
            profile_compatibility: 0,
            avc_level_indication: 0x1f,
            length_size: 4,
            ..Default::default()
        };
        assert_eq!(avc_codec_string(&avcc), "avc1.64001f");
    }

    #[test]
    fn hevc_string_matches_the_spec_examples() {
        // ISO/IEC 14496-15 E.3: Main profile, level 3.1, progressive source.
        let h = Hvcc {
            general_profile_idc: 1,
            general_profile_compatibility_flags: [0x60, 0, 0, 0],
            general_constraint_indicator_flags: [0xb0, 0, 0, 0, 0, 0],
            general_level_idc: 93,
            ..Default::default()
        };
        assert_eq!(hevc_codec_string("hvc1", &h), "hvc1.1.6.L93.B0");
        let h = Hvcc {
            general_profile_space: 0,
            general_tier_flag: true,
            general_profile_idc: 2,
            general_profile_compatibility_flags: [0x20, 0, 0, 0],
            general_constraint_indicator_flags: [0xb0, 0, 0, 0, 0, 0],
            general_level_idc: 120,
            ..Default::default()
        };
        assert_eq!(hevc_codec_string("hev1", &h), "hev1.2.4.H120.B0");
    }

    #[test]
    fn aac_strings_and_configs() {
        assert_eq!(aac_codec_string(&[0x12, 0x10]).unwrap(), "mp4a.40.2");
        assert_eq!(
            aac_codec_string(&[0x2b, 0x92, 0x08, 0]).unwrap(),
            "mp4a.40.5"
        );
        // Escape: 31 then 6 bits (42 = 32 + 10, USAC).
        assert_eq!(aac_object_type(&[0xf9, 0x40]).unwrap(), 42);
        assert!(aac_codec_string(&[]).is_err());
        assert!(aac_object_type(&[0xf8]).is_err());
        // AAC-LC, 48 kHz, stereo is 0x1190.
        assert_eq!(aac_config(2, 48_000, 2).unwrap().as_ref(), &[0x11, 0x90]);
        assert_eq!(aac_config(2, 44_100, 2).unwrap().as_ref(), &[0x12, 0x10]);
        assert!(aac_config(2, 12_345, 2).is_err());
        assert_eq!(aac_rate_channels(&[0x11, 0x90]), (48_000, 2));
        assert_eq!(aac_rate_channels(&[0x11, 0x88]), (48_000, 1));
        assert_eq!(aac_rate_channels(&[0x12]), (0, 0));
        // Explicit 24-bit rate (index 15).
        assert_eq!(
            aac_rate_channels(&[0x17, 0x80, 0x5d, 0xc0, 0x10]),
            (48_000, 2)
        );
    }

    #[test]
    fn opus_head_round_trips() {
        let d = Dops {
            output_channel_count: 2,
            pre_skip: 312,
            input_sample_rate: 48_000,
            output_gain: -3,
            channel_mapping: None,
        };
        let head = opus_head(&d);
        assert_eq!(head.len(), 19);
        assert_eq!(&head[..8], b"OpusHead");
        assert_eq!(dops_from_head(&head).unwrap(), d);
        assert!(dops_from_head(b"OpusHea").is_err());
        let mut bad = head.to_vec();
        bad[18] = 1; // family 1 needs a table
        assert!(dops_from_head(&bad).is_err());
    }

    #[test]
    fn disposable_frames_are_found_from_nal_headers() {
        // nal_ref_idc 0, slice type 1: a non-reference B.
        let b = [0, 0, 0, 2, 0x01, 0xaa];
        assert!(is_disposable("avc1.64001f", &b, 4));
        // nal_ref_idc 2: referenced.
        assert!(!is_disposable("avc1.64001f", &[0, 0, 0, 2, 0x41, 0xaa], 4));
        // SEI (6) then a non-reference slice: still disposable.
        assert!(is_disposable(
            "avc1.64001f",
            &[0, 0, 0, 1, 0x06, 0, 0, 0, 1, 0x01],
            4
        ));
        // Truncated: not claimed.
        assert!(!is_disposable("avc1.64001f", &[0, 0, 0, 9, 0x01], 4));
        // H.265 TRAIL_N (0) vs TRAIL_R (1).
        assert!(is_disposable(
            "hvc1.1.6.L93.B0",
            &[0, 0, 0, 2, 0x00, 0x01],
            4
        ));
        assert!(!is_disposable(
            "hvc1.1.6.L93.B0",
            &[0, 0, 0, 2, 0x02, 0x01],
            4
        ));
        assert!(!is_disposable("opus", &[0, 0, 0, 1, 1], 4));
    }

    #[test]
    fn unknown_codec_is_named() {
        let t = TrackInfo::video(1, "theora", 1, 1);
        assert_eq!(
            sample_entry(&t).unwrap_err(),
            Error::UnsupportedCodec("theora".into())
        );
    }
}
