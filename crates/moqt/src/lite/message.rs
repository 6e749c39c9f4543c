//! moq-lite control messages, every version (see `docs/lite-wire-notes.md`
//! for each layout, with moq-net's file and line).
//!
//! `encode` writes the message as it goes on its stream: the response type
//! where the version has one (subscribe responses on 03+, announcements on
//! 06), then the varint body length, then the body; never the stream type,
//! which the caller writes once at the start of the stream. `decode` reads
//! the same from the start of `buf`, advancing it only on success
//! ([`DecodeError::Short`] when incomplete). A body longer than its fields is
//! an error (`LengthMismatch`), and so is one that ends inside a field (the
//! body is complete, so more bytes cannot help), except where the version
//! allows a body to be skipped (lite-06's unknown announcement types). A
//! body length above [`MAX_MESSAGE_SIZE`] is `TooLong` as soon as it is read.
//!
//! A message the version does not have (GOAWAY before lite-04, say) encodes
//! to nothing and fails to decode with `Invalid`. Integers are QUIC varints;
//! values above 2^62 − 1, which no peer can have sent, are written as
//! 2^62 − 1 rather than panicking.

use bytes::{BufMut, Bytes, BytesMut};

use super::wire::{
    get_body, get_hops, get_msg, get_opt, get_path, get_str, get_u8, get_vi, put_hops, put_msg,
    put_opt, put_str, put_vi, within,
};
use super::{DecodeError, Version};
use crate::legacy::varint::VARINT_MAX;

/// Largest control message body accepted (moq-net allows 64 MiB; no message
/// a relay receives needs more than a path, a name and a few integers).
pub const MAX_MESSAGE_SIZE: usize = 64 * 1024;

/// Largest number of SETUP parameters (moq-net's limit).
pub const MAX_PARAMETERS: usize = 64;

/// Largest hop list (moq-net's MAX_HOPS).
pub const MAX_HOPS: usize = 32;

/// Largest GOAWAY URI.
pub const MAX_GOAWAY_URI: usize = 8192;

/// Largest number of versions in a legacy CLIENT_SETUP (`@moq/net`'s limit).
pub const MAX_SETUP_VERSIONS: usize = 128;

/// The type byte of the legacy CLIENT_SETUP (also lite-02's SessionCompat stream type).
pub const LEGACY_CLIENT_SETUP: u8 = 0x20;

/// The type byte of the legacy SERVER_SETUP.
pub const LEGACY_SERVER_SETUP: u8 = 0x21;

/// The route cost of a version without one (lite-01…05): warm 0, cold the
/// largest varint (moq-net's `Cost::UNKNOWN`).
pub const UNKNOWN_COST: (u64, u64) = (0, VARINT_MAX);

/// lite-06 announcement types.
mod announce_type {
    pub const START: u64 = 0x0;
    pub const END: u64 = 0x1;
    pub const RESTART: u64 = 0x2;
}

/// Reads the type of a typed message, then its size-prefixed body with
/// `f(type, body)`, advancing `buf` only on success.
fn get_typed<T>(
    buf: &mut &[u8],
    f: impl FnOnce(u64, &[u8]) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    let mut cur = *buf;
    let ty = get_vi(&mut cur)?;
    let body = get_body(&mut cur, MAX_MESSAGE_SIZE)?;
    let v = f(ty, body)?;
    *buf = cur;
    Ok(v)
}

/// Writes a typed message: `Type (i)`, then the size-prefixed body.
fn put_typed<B: BufMut + ?Sized>(out: &mut B, ty: u64, f: impl FnOnce(&mut Vec<u8>)) {
    put_vi(out, ty);
    put_msg(out, f);
}

/// Reads a size-prefixed message of at most [`MAX_MESSAGE_SIZE`].
fn get<T>(
    buf: &mut &[u8],
    f: impl FnOnce(&mut &[u8]) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    get_msg(buf, MAX_MESSAGE_SIZE, f)
}

/// The error for a message a version does not have.
fn absent(what: &'static str) -> DecodeError {
    DecodeError::Invalid(what)
}

/// SETUP parameter ids (lite-05+).
pub mod param {
    /// Probe: 0 none, 1 report, 2+ increase.
    pub const PROBE: u64 = 0x1;
    /// Path (`/path?query`), sent by clients on URI-less transports.
    pub const PATH: u64 = 0x2;
    /// Role: 1 publisher, 2 subscriber, other both.
    pub const ROLE: u64 = 0x3;
    /// Cost (lite-06 routing).
    pub const COST: u64 = 0x4;
    /// The sender's Hop ID ("Origin" in the draft).
    pub const HOP: u64 = 0x5;
}

/// The lite-01/02 CLIENT_SETUP (type 0x20, u16 length, draft-14 body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyClientSetup {
    /// Version codes in the client's order of preference.
    pub versions: Vec<u64>,
    /// The draft-14 Setup Parameters, undecoded (the lite session ignores them).
    pub parameters: Bytes,
}

impl LegacyClientSetup {
    /// Decodes it, type byte 0x20 included.
    pub fn decode(buf: &mut &[u8]) -> Result<Self, DecodeError> {
        let mut cur = *buf;
        let ty = get_u8(&mut cur)?;
        if ty != LEGACY_CLIENT_SETUP {
            return Err(DecodeError::UnknownMessage(u64::from(ty)));
        }
        if cur.len() < 2 {
            return Err(DecodeError::Short);
        }
        let len = usize::from(u16::from_be_bytes([cur[0], cur[1]]));
        cur = &cur[2..];
        if cur.len() < len {
            return Err(DecodeError::Short);
        }
        let (body, rest) = cur.split_at(len);
        let v = within(body, |b| {
            let n = get_vi(b)?;
            if n > MAX_SETUP_VERSIONS as u64 {
                return Err(DecodeError::TooMany);
            }
            let versions = (0..n).map(|_| get_vi(b)).collect::<Result<Vec<_>, _>>()?;
            let parameters = Bytes::copy_from_slice(b);
            *b = &[];
            Ok(Self {
                versions,
                parameters,
            })
        })?;
        *buf = rest;
        Ok(v)
    }

    /// Encodes it, type byte 0x20 included (for tests and a lite client).
    /// The body must fit the u16 length (a few versions and parameters do).
    pub fn encode(&self, out: &mut BytesMut) {
        let mut body = Vec::new();
        put_vi(&mut body, self.versions.len() as u64);
        for &v in &self.versions {
            put_vi(&mut body, v);
        }
        body.extend_from_slice(&self.parameters);
        out.put_u8(LEGACY_CLIENT_SETUP);
        out.put_u16(u16::try_from(body.len()).unwrap_or(u16::MAX));
        out.put_slice(&body);
    }
}

/// The lite-01/02 SERVER_SETUP: type 0x21, u16 length, the chosen version
/// code, an empty lite parameter bag (`00`), as moq-net sends it.
pub fn encode_legacy_server_setup(version: Version, out: &mut BytesMut) {
    let mut body = Vec::new();
    put_vi(&mut body, version.setup_code());
    put_vi(&mut body, 0);
    out.put_u8(LEGACY_SERVER_SETUP);
    out.put_u16(body.len() as u16);
    out.put_slice(&body);
}

/// SESSION_UPDATE on the lite-01/02 session stream (drained, ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionUpdate {
    /// Session bitrate, 0 unknown.
    pub bitrate: u64,
}

impl SessionUpdate {
    /// Decodes one.
    pub fn decode(buf: &mut &[u8]) -> Result<Self, DecodeError> {
        get(buf, |b| {
            Ok(Self {
                bitrate: get_vi(b)?,
            })
        })
    }

    /// Encodes it.
    pub fn encode(&self, out: &mut BytesMut) {
        put_msg(out, |b| put_vi(b, self.bitrate));
    }
}

/// SETUP (lite-05+, on the uni SETUP stream after its type byte): a
/// parameter bag, any order, unknown ids kept, duplicates refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Setup {
    /// `(id, value)` pairs.
    pub parameters: Vec<(u64, Bytes)>,
}

impl Setup {
    /// Encodes it, in the order of [`Self::parameters`].
    pub fn encode(&self, out: &mut BytesMut) {
        put_msg(out, |b| {
            put_vi(b, self.parameters.len() as u64);
            for (id, v) in &self.parameters {
                put_vi(b, *id);
                put_vi(b, v.len() as u64);
                b.extend_from_slice(v);
            }
        });
    }

    /// Decodes it (at most [`MAX_PARAMETERS`]; a repeated id is an error).
    pub fn decode(buf: &mut &[u8]) -> Result<Self, DecodeError> {
        get(buf, |b| {
            let n = get_vi(b)?;
            if n > MAX_PARAMETERS as u64 {
                return Err(DecodeError::TooMany);
            }
            let mut parameters: Vec<(u64, Bytes)> = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let id = get_vi(b)?;
                if parameters.iter().any(|(i, _)| *i == id) {
                    return Err(DecodeError::Invalid("repeated SETUP parameter"));
                }
                let v = get_body(b, MAX_MESSAGE_SIZE)?;
                parameters.push((id, Bytes::copy_from_slice(v)));
            }
            Ok(Self { parameters })
        })
    }

    fn get(&self, id: u64) -> Option<&Bytes> {
        self.parameters
            .iter()
            .find_map(|(i, v)| (*i == id).then_some(v))
    }

    /// The PATH parameter (`/path?query`), if present, non-empty and UTF-8.
    pub fn path(&self) -> Option<&str> {
        let v = self.get(param::PATH)?;
        std::str::from_utf8(v).ok().filter(|p| !p.is_empty())
    }

    /// A varint parameter (PROBE, ROLE, COST, HOP), if present and well formed
    /// (exactly one varint).
    pub fn int(&self, id: u64) -> Option<u64> {
        let v = self.get(id)?;
        let mut s = &v[..];
        let n = get_vi(&mut s).ok()?;
        s.is_empty().then_some(n)
    }

    /// Adds a varint parameter (replacing one with the same id).
    pub fn with_int(self, id: u64, v: u64) -> Self {
        let mut b = Vec::new();
        put_vi(&mut b, v);
        self.with_bytes(id, Bytes::from(b))
    }

    /// Adds a byte-string parameter, such as PATH (replacing one with the same id).
    pub fn with_bytes(mut self, id: u64, v: Bytes) -> Self {
        match self.parameters.iter_mut().find(|(i, _)| *i == id) {
            Some(slot) => slot.1 = v,
            None => self.parameters.push((id, v)),
        }
        self
    }
}

/// ANNOUNCE_REQUEST (ANNOUNCE_PLEASE): the first and only message of the
/// subscriber on an Announce stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnounceRequest {
    /// The prefix (a normalised path, "" for everything).
    pub prefix: String,
    /// lite-04/05: a Hop ID whose routes the subscriber does not want (0 none).
    pub exclude_hop: u64,
}

impl AnnounceRequest {
    /// Encodes it (the exclude hop only on 04/05, which carry it).
    pub fn encode(&self, v: Version, out: &mut BytesMut) {
        put_msg(out, |b| {
            put_str(b, &self.prefix);
            if has_exclude_hop(v) {
                put_vi(b, self.exclude_hop);
            }
        });
    }

    /// Decodes it (the prefix normalised as a path).
    pub fn decode(buf: &mut &[u8], v: Version) -> Result<Self, DecodeError> {
        get(buf, |b| {
            let prefix = get_path(b)?;
            let exclude_hop = if has_exclude_hop(v) { get_vi(b)? } else { 0 };
            Ok(Self {
                prefix,
                exclude_hop,
            })
        })
    }
}

/// What a publisher writes on an Announce stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Announce {
    /// lite-01/02, first: the suffixes active now.
    Init {
        /// Suffixes below the requested prefix.
        suffixes: Vec<String>,
    },
    /// lite-05+, first: the publisher's Hop ID (never 0 when we send it:
    /// `@moq/net` refuses 0) and how many `Active` follow as the initial set.
    Ok {
        /// Hop ID.
        hop: u64,
        /// Initial actives that follow.
        active: u64,
    },
    /// A broadcast became available (lite-06: ANNOUNCE_START, which takes
    /// the next announce id of the stream).
    Active {
        /// Path below the prefix ("" for the prefix itself).
        suffix: String,
        /// Hop chain, oldest first (lite-03: only its length is on the wire,
        /// decoded as that many zeros; 01/02: none).
        hops: Vec<u64>,
        /// lite-06 route cost (warm, cold); `(0, u64::MAX >> 2)` elsewhere.
        cost: (u64, u64),
    },
    /// lite-01…05: a broadcast ended.
    Ended {
        /// Path below the prefix.
        suffix: String,
    },
    /// lite-06: ANNOUNCE_END of an announce id.
    End {
        /// The id ANNOUNCE_START assigned.
        id: u64,
    },
    /// lite-06: ANNOUNCE_RESTART: same id, new route.
    Restart {
        /// The id.
        id: u64,
        /// New hop chain.
        hops: Vec<u64>,
        /// New cost.
        cost: (u64, u64),
    },
    /// lite-06: a message of an unknown type, skipped by its length.
    Unknown,
}

/// lite-04/05: ANNOUNCE_REQUEST carries an Exclude Hop.
fn has_exclude_hop(v: Version) -> bool {
    matches!(v, Version::Lite04 | Version::Lite05)
}

/// The hops of a pre-06 ANNOUNCE: nothing on 01/02, a count on 03, a list after.
fn put_legacy_hops(b: &mut Vec<u8>, v: Version, hops: &[u64]) {
    match v {
        Version::Lite01 | Version::Lite02 => {}
        Version::Lite03 => put_vi(b, hops.len() as u64),
        _ => put_hops(b, hops),
    }
}

fn get_legacy_hops(b: &mut &[u8], v: Version) -> Result<Vec<u64>, DecodeError> {
    match v {
        Version::Lite01 | Version::Lite02 => Ok(Vec::new()),
        Version::Lite03 => {
            // Only the chain's length travels: that many unknown (0) hops.
            let n = get_vi(b)?;
            if n > MAX_HOPS as u64 {
                return Err(DecodeError::TooMany);
            }
            Ok(vec![0; n as usize])
        }
        _ => get_hops(b, MAX_HOPS),
    }
}

/// lite-06 route cost: warm and cold, each saturating at 2^62 − 1.
fn put_cost(b: &mut Vec<u8>, cost: (u64, u64)) {
    put_vi(b, cost.0);
    put_vi(b, cost.1);
}

fn get_cost(b: &mut &[u8]) -> Result<(u64, u64), DecodeError> {
    Ok((get_vi(b)?, get_vi(b)?))
}

impl Announce {
    /// Encodes it for `v` (an `Active` on lite-06 is an ANNOUNCE_START).
    /// A message the version does not have writes nothing: `Ended` on
    /// lite-06 (callers send `End`), `Init` outside 01/02, `Ok` before 05,
    /// `End`/`Restart` before 06, and `Unknown` anywhere.
    pub fn encode(&self, v: Version, out: &mut BytesMut) {
        if v.has_announce_ids() {
            match self {
                Announce::Ok { hop, active } => put_msg(out, |b| {
                    put_vi(b, *hop);
                    put_vi(b, *active);
                }),
                Announce::Active { suffix, hops, cost } => {
                    put_typed(out, announce_type::START, |b| {
                        put_str(b, suffix);
                        put_hops(b, hops);
                        put_cost(b, *cost);
                    })
                }
                Announce::End { id } => put_typed(out, announce_type::END, |b| put_vi(b, *id)),
                Announce::Restart { id, hops, cost } => {
                    put_typed(out, announce_type::RESTART, |b| {
                        put_vi(b, *id);
                        put_hops(b, hops);
                        put_cost(b, *cost);
                    })
                }
                Announce::Init { .. } | Announce::Ended { .. } | Announce::Unknown => {}
            }
            return;
        }
        match self {
            Announce::Init { suffixes } if v <= Version::Lite02 => put_msg(out, |b| {
                put_vi(b, suffixes.len() as u64);
                for s in suffixes {
                    put_str(b, s);
                }
            }),
            Announce::Ok { hop, active } if v >= Version::Lite05 => put_msg(out, |b| {
                put_vi(b, *hop);
                put_vi(b, *active);
            }),
            Announce::Active { suffix, hops, .. } => put_msg(out, |b| {
                b.put_u8(1);
                put_str(b, suffix);
                put_legacy_hops(b, v, hops);
            }),
            // `ended` goes with an empty chain (moq-net sends it that way).
            Announce::Ended { suffix } => put_msg(out, |b| {
                b.put_u8(0);
                put_str(b, suffix);
                put_legacy_hops(b, v, &[]);
            }),
            _ => {}
        }
    }

    /// Decodes the next one; `first` says whether it is the stream's first
    /// message (`Init` on 01/02, `Ok` on 05+; 03/04 have no first message,
    /// so there `first` is ignored).
    pub fn decode(buf: &mut &[u8], v: Version, first: bool) -> Result<Self, DecodeError> {
        if first && v <= Version::Lite02 {
            return get(buf, |b| {
                let n = get_vi(b)?;
                // Every suffix takes at least a byte: the body bounds the count.
                let mut suffixes = Vec::with_capacity((n as usize).min(b.len()));
                for _ in 0..n {
                    suffixes.push(get_path(b)?);
                }
                Ok(Announce::Init { suffixes })
            });
        }
        if first && v >= Version::Lite05 {
            return get(buf, |b| {
                Ok(Announce::Ok {
                    hop: get_vi(b)?,
                    active: get_vi(b)?,
                })
            });
        }
        if v.has_announce_ids() {
            return get_typed(buf, |ty, body| match ty {
                announce_type::START => within(body, |b| {
                    Ok(Announce::Active {
                        suffix: get_path(b)?,
                        hops: get_hops(b, MAX_HOPS)?,
                        cost: get_cost(b)?,
                    })
                }),
                announce_type::END => within(body, |b| Ok(Announce::End { id: get_vi(b)? })),
                announce_type::RESTART => within(body, |b| {
                    Ok(Announce::Restart {
                        id: get_vi(b)?,
                        hops: get_hops(b, MAX_HOPS)?,
                        cost: get_cost(b)?,
                    })
                }),
                // Skipped by its length, so a newer lite-06 build does not
                // kill the stream; it takes no announce id.
                _ => Ok(Announce::Unknown),
            });
        }
        get(buf, |b| {
            let status = get_u8(b)?;
            let suffix = get_path(b)?;
            let hops = get_legacy_hops(b, v)?;
            match status {
                0 => Ok(Announce::Ended { suffix }),
                1 => Ok(Announce::Active {
                    suffix,
                    hops,
                    cost: UNKNOWN_COST,
                }),
                // The draft's explicit restart: lite-05 treats it as a
                // (repeated) active, as moq-net does.
                2 if v == Version::Lite05 => Ok(Announce::Active {
                    suffix,
                    hops,
                    cost: UNKNOWN_COST,
                }),
                _ => Err(DecodeError::Invalid("unknown announce status")),
            }
        })
    }
}

/// SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    /// Subscribe ID (the subscriber's, unique per session).
    pub id: u64,
    /// Broadcast path (normalised).
    pub broadcast: String,
    /// Track name.
    pub track: String,
    /// Subscriber priority, higher first (MoQT's is `255 - p`).
    pub priority: u8,
    /// Max latency / max age in milliseconds (03+; `None` on 01/02).
    pub max_age_ms: Option<u64>,
    /// First group to deliver; `None`: the latest (01…05), or the oldest
    /// within max age (06, where 0 on the wire means none).
    pub start_group: Option<u64>,
    /// Last group to deliver, inclusive.
    pub end_group: Option<u64>,
    /// lite-06: first frame within `start_group`.
    pub start_frame: u64,
    /// lite-06: last frame within `end_group`, inclusive.
    pub end_frame: Option<u64>,
}

/// lite-03…05 carry the retired Ordered byte (written 0, any value read).
fn has_ordered(v: Version) -> bool {
    matches!(v, Version::Lite03 | Version::Lite04 | Version::Lite05)
}

/// The delivery window shared by SUBSCRIBE (03+) and SUBSCRIBE_UPDATE, after
/// the priority: 03…05 `Ordered (8), Max Latency dur(i), Group Start opt(i),
/// Group End opt(i)`; 06 `Max Age dur(i), Group Start (i), Group End opt(i),
/// Frame Start (i), Frame End opt(i)`.
struct Window {
    max_age_ms: u64,
    start_group: Option<u64>,
    end_group: Option<u64>,
    start_frame: u64,
    end_frame: Option<u64>,
}

impl Window {
    fn encode(&self, v: Version, b: &mut Vec<u8>) {
        if v.has_announce_ids() {
            put_vi(b, self.max_age_ms);
            // The raw floor: 0 is "no floor" (from max age).
            put_vi(b, self.start_group.unwrap_or(0));
            put_opt(b, self.end_group);
            put_vi(b, self.start_frame);
            put_opt(b, self.end_frame);
        } else {
            b.put_u8(0);
            put_vi(b, self.max_age_ms);
            put_opt(b, self.start_group);
            put_opt(b, self.end_group);
        }
    }

    fn decode(b: &mut &[u8], v: Version) -> Result<Self, DecodeError> {
        if v.has_announce_ids() {
            let max_age_ms = get_vi(b)?;
            let start_group = get_vi(b)?;
            let end_group = get_opt(b)?;
            let start_frame = get_vi(b)?;
            let end_frame = get_opt(b)?;
            if end_frame.is_some() && end_group.is_none() {
                return Err(DecodeError::Invalid("frame end without a group end"));
            }
            // Group 0 with frame 0 is no floor at all (moq-net's canonical form).
            let start_group = (start_group != 0 || start_frame != 0).then_some(start_group);
            return Ok(Self {
                max_age_ms,
                start_group,
                end_group,
                start_frame,
                end_frame,
            });
        }
        let _ordered = get_u8(b)?;
        Ok(Self {
            max_age_ms: get_vi(b)?,
            start_group: get_opt(b)?,
            end_group: get_opt(b)?,
            start_frame: 0,
            end_frame: None,
        })
    }
}

impl Subscribe {
    /// Encodes it (03…05 write Ordered as 0; frame bounds only on 06; an
    /// absent max age is written 0).
    pub fn encode(&self, v: Version, out: &mut BytesMut) {
        put_msg(out, |b| {
            put_vi(b, self.id);
            put_str(b, &self.broadcast);
            put_str(b, &self.track);
            b.put_u8(self.priority);
            if v >= Version::Lite03 {
                Window {
                    max_age_ms: self.max_age_ms.unwrap_or(0),
                    start_group: self.start_group,
                    end_group: self.end_group,
                    start_frame: self.start_frame,
                    end_frame: self.end_frame,
                }
                .encode(v, b);
            }
        });
    }

    /// Decodes it (any Ordered byte accepted).
    pub fn decode(buf: &mut &[u8], v: Version) -> Result<Self, DecodeError> {
        get(buf, |b| {
            let id = get_vi(b)?;
            let broadcast = get_path(b)?;
            let track = get_str(b, MAX_MESSAGE_SIZE)?;
            let priority = get_u8(b)?;
            let (max_age_ms, w) = if v >= Version::Lite03 {
                let w = Window::decode(b, v)?;
                (Some(w.max_age_ms), w)
            } else {
                (
                    None,
                    Window {
                        max_age_ms: 0,
                        start_group: None,
                        end_group: None,
                        start_frame: 0,
                        end_frame: None,
                    },
                )
            };
            Ok(Self {
                id,
                broadcast,
                track,
                priority,
                max_age_ms,
                start_group: w.start_group,
                end_group: w.end_group,
                start_frame: w.start_frame,
                end_frame: w.end_frame,
            })
        })
    }
}

/// SUBSCRIBE_UPDATE (03+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeUpdate {
    /// New subscriber priority.
    pub priority: u8,
    /// New max age, milliseconds.
    pub max_age_ms: u64,
    /// As in [`Subscribe`].
    pub start_group: Option<u64>,
    /// As in [`Subscribe`].
    pub end_group: Option<u64>,
    /// As in [`Subscribe`].
    pub start_frame: u64,
    /// As in [`Subscribe`].
    pub end_frame: Option<u64>,
}

impl SubscribeUpdate {
    /// Encodes it (nothing on 01/02, which have none).
    pub fn encode(&self, v: Version, out: &mut BytesMut) {
        if v < Version::Lite03 {
            return;
        }
        put_msg(out, |b| {
            b.put_u8(self.priority);
            Window {
                max_age_ms: self.max_age_ms,
                start_group: self.start_group,
                end_group: self.end_group,
                start_frame: self.start_frame,
                end_frame: self.end_frame,
            }
            .encode(v, b);
        });
    }

    /// Decodes it (an error on 01/02, which have none).
    pub fn decode(buf: &mut &[u8], v: Version) -> Result<Self, DecodeError> {
        if v < Version::Lite03 {
            return Err(absent("no SUBSCRIBE_UPDATE before lite-03"));
        }
        get(buf, |b| {
            let priority = get_u8(b)?;
            let w = Window::decode(b, v)?;
            Ok(Self {
                priority,
                max_age_ms: w.max_age_ms,
                start_group: w.start_group,
                end_group: w.end_group,
                start_frame: w.start_frame,
                end_frame: w.end_frame,
            })
        })
    }
}

/// What a publisher writes on a Subscribe stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscribeResponse {
    /// 01…04, first and only: SUBSCRIBE_OK (01 carries the priority, 02 is
    /// empty, 03/04 carry priority, ordered 0, max latency 0, no bounds).
    Ok {
        /// Publisher priority (higher first).
        priority: u8,
    },
    /// 05+: SUBSCRIBE_START, the first group that will be served.
    Start {
        /// Group sequence.
        group: u64,
    },
    /// 05+: SUBSCRIBE_END, the first group that will never be served
    /// (exclusive); sent before the stream's FIN.
    End {
        /// Group sequence.
        group: u64,
    },
    /// 03+: SUBSCRIBE_DROP, groups `start..=end` will never come.
    Drop {
        /// First group.
        start: u64,
        /// Last group, inclusive.
        end: u64,
        /// Error code, 0 unavailable.
        code: u64,
    },
}

fn put_drop(b: &mut Vec<u8>, start: u64, end: u64, code: u64) {
    put_vi(b, start);
    put_vi(b, end);
    put_vi(b, code);
}

fn get_drop(body: &[u8]) -> Result<SubscribeResponse, DecodeError> {
    within(body, |b| {
        Ok(SubscribeResponse::Drop {
            start: get_vi(b)?,
            end: get_vi(b)?,
            code: get_vi(b)?,
        })
    })
}

impl SubscribeResponse {
    /// Encodes it. A response the version does not have writes nothing
    /// (`Start`/`End` before 05, `Ok` from 05, `Drop` on 01/02).
    pub fn encode(&self, v: Version, out: &mut BytesMut) {
        match (v, self) {
            (Version::Lite01, Self::Ok { priority }) => put_msg(out, |b| b.put_u8(*priority)),
            (Version::Lite02, Self::Ok { .. }) => put_msg(out, |_| {}),
            (Version::Lite03 | Version::Lite04, Self::Ok { priority }) => put_typed(out, 0, |b| {
                // Priority, Ordered 0, Max Latency 0, no start, no end.
                b.put_u8(*priority);
                b.put_u8(0);
                put_vi(b, 0);
                put_opt(b, None);
                put_opt(b, None);
            }),
            (Version::Lite03 | Version::Lite04, Self::Drop { start, end, code }) => {
                put_typed(out, 1, |b| put_drop(b, *start, *end, *code))
            }
            (Version::Lite05 | Version::Lite06, Self::Start { group }) => {
                put_typed(out, 0, |b| put_vi(b, *group))
            }
            (Version::Lite05 | Version::Lite06, Self::End { group }) => {
                put_typed(out, 1, |b| put_vi(b, *group))
            }
            (Version::Lite05 | Version::Lite06, Self::Drop { start, end, code }) => {
                put_typed(out, 2, |b| put_drop(b, *start, *end, *code))
            }
            _ => {}
        }
    }

    /// Decodes the next one (on 03/04 an Ok's fields after the priority
    /// must be there but are ignored; on 02 the priority reads as 0).
    pub fn decode(buf: &mut &[u8], v: Version) -> Result<Self, DecodeError> {
        match v {
            Version::Lite01 => get(buf, |b| {
                Ok(Self::Ok {
                    priority: get_u8(b)?,
                })
            }),
            Version::Lite02 => get(buf, |_| Ok(Self::Ok { priority: 0 })),
            Version::Lite03 | Version::Lite04 => get_typed(buf, |ty, body| match ty {
                0 => within(body, |b| {
                    let priority = get_u8(b)?;
                    let _ordered = get_u8(b)?;
                    let _max_latency = get_vi(b)?;
                    let _start = get_vi(b)?;
                    let _end = get_vi(b)?;
                    Ok(Self::Ok { priority })
                }),
                1 => get_drop(body),
                ty => Err(DecodeError::UnknownMessage(ty)),
            }),
            Version::Lite05 | Version::Lite06 => get_typed(buf, |ty, body| match ty {
                0 => within(body, |b| Ok(Self::Start { group: get_vi(b)? })),
                1 => within(body, |b| Ok(Self::End { group: get_vi(b)? })),
                2 => get_drop(body),
                ty => Err(DecodeError::UnknownMessage(ty)),
            }),
        }
    }
}

/// FETCH (one group of one track).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    /// Broadcast path.
    pub broadcast: String,
    /// Track name.
    pub track: String,
    /// Priority, higher first.
    pub priority: u8,
    /// The group.
    pub group: u64,
    /// lite-06: first frame.
    pub start_frame: u64,
    /// lite-06: last frame, inclusive.
    pub end_frame: Option<u64>,
}

impl Fetch {
    /// Encodes it (frame bounds only on 06; nothing on 01/02, which have no FETCH).
    pub fn encode(&self, v: Version, out: &mut BytesMut) {
        if v < Version::Lite03 {
            return;
        }
        put_msg(out, |b| {
            put_str(b, &self.broadcast);
            put_str(b, &self.track);
            b.put_u8(self.priority);
            put_vi(b, self.group);
            if v.has_announce_ids() {
                put_vi(b, self.start_frame);
                put_opt(b, self.end_frame);
            }
        });
    }

    /// Decodes it (a frame end before the frame start is an error).
    pub fn decode(buf: &mut &[u8], v: Version) -> Result<Self, DecodeError> {
        if v < Version::Lite03 {
            return Err(absent("no FETCH before lite-03"));
        }
        get(buf, |b| {
            let broadcast = get_path(b)?;
            let track = get_str(b, MAX_MESSAGE_SIZE)?;
            let priority = get_u8(b)?;
            let group = get_vi(b)?;
            let (start_frame, end_frame) = if v.has_announce_ids() {
                (get_vi(b)?, get_opt(b)?)
            } else {
                (0, None)
            };
            if end_frame.is_some_and(|e| e < start_frame) {
                return Err(DecodeError::Invalid("fetch frame end before its start"));
            }
            Ok(Self {
                broadcast,
                track,
                priority,
                group,
                start_frame,
                end_frame,
            })
        })
    }
}

/// TRACK (05+): the subscriber asks for a track's properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Track {
    /// Broadcast path.
    pub broadcast: String,
    /// Track name.
    pub track: String,
}

impl Track {
    /// Encodes it (nothing before 05).
    pub fn encode(&self, v: Version, out: &mut BytesMut) {
        if !v.has_track_stream() {
            return;
        }
        put_msg(out, |b| {
            put_str(b, &self.broadcast);
            put_str(b, &self.track);
        });
    }

    /// Decodes it (an error before 05).
    pub fn decode(buf: &mut &[u8], v: Version) -> Result<Self, DecodeError> {
        if !v.has_track_stream() {
            return Err(absent("no TRACK before lite-05"));
        }
        get(buf, |b| {
            Ok(Self {
                broadcast: get_path(b)?,
                track: get_str(b, MAX_MESSAGE_SIZE)?,
            })
        })
    }
}

/// TRACK_INFO (05+), the answer to TRACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackInfo {
    /// Publisher priority, higher first.
    pub priority: u8,
    /// Max age, milliseconds.
    pub max_age_ms: u64,
    /// Timestamp units per second (never 0).
    pub timescale: u64,
}

impl TrackInfo {
    /// Encodes it (05 writes Ordered 0; nothing before 05).
    pub fn encode(&self, v: Version, out: &mut BytesMut) {
        if !v.has_track_stream() {
            return;
        }
        put_msg(out, |b| {
            b.put_u8(self.priority);
            if has_ordered(v) {
                b.put_u8(0);
            }
            put_vi(b, self.max_age_ms);
            put_vi(b, self.timescale);
        });
    }

    /// Decodes it (timescale 0 is an error; any Ordered byte accepted).
    pub fn decode(buf: &mut &[u8], v: Version) -> Result<Self, DecodeError> {
        if !v.has_track_stream() {
            return Err(absent("no TRACK_INFO before lite-05"));
        }
        get(buf, |b| {
            let priority = get_u8(b)?;
            if has_ordered(v) {
                let _ordered = get_u8(b)?;
            }
            let max_age_ms = get_vi(b)?;
            let timescale = get_vi(b)?;
            if timescale == 0 {
                return Err(DecodeError::Invalid("timescale 0"));
            }
            Ok(Self {
                priority,
                max_age_ms,
                timescale,
            })
        })
    }
}

/// PROBE (03+): the publisher's estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// Bits per second, 0 unknown.
    pub bitrate: u64,
    /// 04+: round-trip time in milliseconds, 0 unknown.
    pub rtt_ms: u64,
}

impl Probe {
    /// Encodes it (the RTT from 04; nothing on 01/02).
    pub fn encode(&self, v: Version, out: &mut BytesMut) {
        if v < Version::Lite03 {
            return;
        }
        put_msg(out, |b| {
            put_vi(b, self.bitrate);
            if v >= Version::Lite04 {
                put_vi(b, self.rtt_ms);
            }
        });
    }

    /// Decodes it (an error on 01/02).
    pub fn decode(buf: &mut &[u8], v: Version) -> Result<Self, DecodeError> {
        if v < Version::Lite03 {
            return Err(absent("no PROBE before lite-03"));
        }
        get(buf, |b| {
            let bitrate = get_vi(b)?;
            let rtt_ms = if v >= Version::Lite04 { get_vi(b)? } else { 0 };
            Ok(Self { bitrate, rtt_ms })
        })
    }
}

/// GOAWAY (04+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoAway {
    /// Where to reconnect ("" from a client, or "reuse this URI").
    pub uri: String,
}

impl GoAway {
    /// Encodes it (nothing before 04).
    pub fn encode(&self, v: Version, out: &mut BytesMut) {
        if !v.has_goaway() {
            return;
        }
        put_msg(out, |b| put_str(b, &self.uri));
    }

    /// Decodes it (at most [`MAX_GOAWAY_URI`] bytes; an error before 04).
    pub fn decode(buf: &mut &[u8], v: Version) -> Result<Self, DecodeError> {
        if !v.has_goaway() {
            return Err(absent("no GOAWAY before lite-04"));
        }
        get(buf, |b| {
            Ok(Self {
                uri: get_str(b, MAX_GOAWAY_URI)?,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::test_util::{check, check_asym, hex};
    use super::*;

    const ALL: [Version; 6] = Version::ALL;

    /// The vectors of `docs/lite-wire-notes.md` §6 that include the stream
    /// type start with it; the codecs do not write it.
    fn strip_type(bytes: &str, ty: u8) -> String {
        let b = hex(bytes);
        assert_eq!(b[0], ty, "{bytes} starts with stream type {ty}");
        super::super::wire::test_util::hex_of(&b[1..])
    }

    fn enc_with<T>(v: Version, f: fn(&T, Version, &mut BytesMut)) -> impl Fn(&T, &mut BytesMut) {
        move |m, out| f(m, v, out)
    }

    fn dec_with<T>(
        v: Version,
        f: fn(&mut &[u8], Version) -> Result<T, DecodeError>,
    ) -> impl Fn(&mut &[u8]) -> Result<T, DecodeError> {
        move |b| f(b, v)
    }

    // §6.1: the legacy SETUP exchange.

    #[test]
    fn legacy_client_setup() {
        let versions = vec![0xff0d_ad02, 0xff0d_ad01, 0xff00_000e];
        check(
            "20 00 1a 03 c0 00 00 00 ff 0d ad 02 c0 00 00 00 ff 0d ad 01 c0 00 00 00 ff 00 00 0e 00",
            &LegacyClientSetup {
                versions: versions.clone(),
                parameters: Bytes::from_static(&[0]),
            },
            LegacyClientSetup::encode,
            LegacyClientSetup::decode,
        );
        // As @moq/net 0.1.9 (@moq/publish) sends it: MaxRequestId, Implementation.
        check(
            "20 00 2c 03 c0 00 00 00 ff 0d ad 02 c0 00 00 00 ff 0d ad 01 c0 00 00 00 ff 00 00 0e \
             02 02 80 00 a4 55 07 0b 6d 6f 71 2d 6c 69 74 65 2d 6a 73",
            &LegacyClientSetup {
                versions,
                parameters: Bytes::from(hex(
                    "02 02 80 00 a4 55 07 0b 6d 6f 71 2d 6c 69 74 65 2d 6a 73",
                )),
            },
            LegacyClientSetup::encode,
            LegacyClientSetup::decode,
        );
    }

    #[test]
    fn legacy_client_setup_errors() {
        // Not a CLIENT_SETUP.
        let b = hex("21 00 01 00");
        let mut s = &b[..];
        assert_eq!(
            LegacyClientSetup::decode(&mut s),
            Err(DecodeError::UnknownMessage(0x21))
        );
        assert_eq!(s.len(), 4);
        // A version list running past the body.
        let b = hex("20 00 02 02 01");
        let mut s = &b[..];
        assert_eq!(
            LegacyClientSetup::decode(&mut s),
            Err(DecodeError::LengthMismatch)
        );
        assert_eq!(s.len(), 5);
        // Too many versions.
        let b = hex("20 00 02 40 81");
        assert_eq!(
            LegacyClientSetup::decode(&mut &b[..]),
            Err(DecodeError::TooMany)
        );
    }

    #[test]
    fn legacy_server_setup() {
        for (v, bytes) in [
            (Version::Lite02, "21 00 09 c0 00 00 00 ff 0d ad 02 00"),
            (Version::Lite01, "21 00 09 c0 00 00 00 ff 0d ad 01 00"),
        ] {
            let mut out = BytesMut::new();
            encode_legacy_server_setup(v, &mut out);
            assert_eq!(&out[..], &hex(bytes)[..]);
        }
    }

    #[test]
    fn session_update() {
        check(
            "01 00",
            &SessionUpdate { bitrate: 0 },
            SessionUpdate::encode,
            SessionUpdate::decode,
        );
    }

    // ANNOUNCE_REQUEST, every version.

    #[test]
    fn announce_request() {
        let room = |exclude_hop| AnnounceRequest {
            prefix: "room".into(),
            exclude_hop,
        };
        for v in ALL {
            let (bytes, value) = match v {
                Version::Lite04 | Version::Lite05 => ("01 06 04 72 6f 6f 6d 2a", room(42)),
                _ => ("01 05 04 72 6f 6f 6d", room(0)),
            };
            check(
                &strip_type(bytes, 1),
                &value,
                enc_with(v, AnnounceRequest::encode),
                dec_with(v, AnnounceRequest::decode),
            );
        }
        // The exclude hop is not on the wire before 04 nor on 06.
        for v in [Version::Lite01, Version::Lite03, Version::Lite06] {
            let mut out = BytesMut::new();
            room(42).encode(v, &mut out);
            assert_eq!(&out[..], &hex("05 04 72 6f 6f 6d")[..]);
        }
    }

    #[test]
    fn announce_request_normalises() {
        let b = hex("09 08 2f 61 2f 2f 62 2f 2f 2f");
        let mut s = &b[..];
        let r = AnnounceRequest::decode(&mut s, Version::Lite06).unwrap();
        assert_eq!(r.prefix, "a/b");
        assert!(s.is_empty());
    }

    // Announcements.

    fn announce(v: Version, first: bool) -> impl Fn(&mut &[u8]) -> Result<Announce, DecodeError> {
        move |b| Announce::decode(b, v, first)
    }

    fn active(suffix: &str, hops: &[u64], cost: (u64, u64)) -> Announce {
        Announce::Active {
            suffix: suffix.into(),
            hops: hops.to_vec(),
            cost,
        }
    }

    #[test]
    fn announce_01_02() {
        for v in [Version::Lite01, Version::Lite02] {
            check(
                "05 02 01 61 01 62",
                &Announce::Init {
                    suffixes: vec!["a".into(), "b".into()],
                },
                enc_with(v, Announce::encode),
                announce(v, true),
            );
            // The hops are not on the wire.
            check_asym(
                "05 01 03 63 61 6d",
                &active("cam", &[7, 9], UNKNOWN_COST),
                &active("cam", &[], UNKNOWN_COST),
                enc_with(v, Announce::encode),
                announce(v, false),
            );
            check(
                "05 00 03 63 61 6d",
                &Announce::Ended {
                    suffix: "cam".into(),
                },
                enc_with(v, Announce::encode),
                announce(v, false),
            );
        }
    }

    #[test]
    fn announce_03() {
        let v = Version::Lite03;
        // Only the chain's length: decoded as that many unknown hops.
        check_asym(
            "06 01 03 63 61 6d 02",
            &active("cam", &[7, 9], UNKNOWN_COST),
            &active("cam", &[0, 0], UNKNOWN_COST),
            enc_with(v, Announce::encode),
            announce(v, false),
        );
        // 03 has no first message: `first` changes nothing.
        check_asym(
            "06 01 03 63 61 6d 02",
            &active("cam", &[7, 9], UNKNOWN_COST),
            &active("cam", &[0, 0], UNKNOWN_COST),
            enc_with(v, Announce::encode),
            announce(v, true),
        );
        check(
            "06 00 03 63 61 6d 00",
            &Announce::Ended {
                suffix: "cam".into(),
            },
            enc_with(v, Announce::encode),
            announce(v, false),
        );
        // A count above MAX_HOPS.
        let b = hex("06 01 03 63 61 6d 21");
        assert_eq!(
            Announce::decode(&mut &b[..], v, false),
            Err(DecodeError::TooMany)
        );
    }

    #[test]
    fn announce_04_05() {
        for v in [Version::Lite04, Version::Lite05] {
            check(
                "08 01 03 63 61 6d 02 07 09",
                &active("cam", &[7, 9], UNKNOWN_COST),
                enc_with(v, Announce::encode),
                announce(v, v == Version::Lite04),
            );
            check(
                "06 00 03 63 61 6d 00",
                &Announce::Ended {
                    suffix: "cam".into(),
                },
                enc_with(v, Announce::encode),
                announce(v, false),
            );
        }
        check(
            "02 2a 03",
            &Announce::Ok { hop: 42, active: 3 },
            enc_with(Version::Lite05, Announce::encode),
            announce(Version::Lite05, true),
        );
        // Status 2 (restart) is an active on 05, an error before.
        let b = hex("06 02 03 63 61 6d 00");
        assert_eq!(
            Announce::decode(&mut &b[..], Version::Lite05, false),
            Ok(active("cam", &[], UNKNOWN_COST))
        );
        assert!(matches!(
            Announce::decode(&mut &b[..], Version::Lite04, false),
            Err(DecodeError::Invalid(_))
        ));
        // A repeated hop, and a chain above MAX_HOPS.
        let b = hex("08 01 03 63 61 6d 02 07 07");
        assert!(matches!(
            Announce::decode(&mut &b[..], Version::Lite04, false),
            Err(DecodeError::Invalid(_))
        ));
        let b = hex("06 01 03 63 61 6d 21");
        assert_eq!(
            Announce::decode(&mut &b[..], Version::Lite05, false),
            Err(DecodeError::TooMany)
        );
    }

    #[test]
    fn announce_06() {
        let v = Version::Lite06;
        check(
            "02 2a 03",
            &Announce::Ok { hop: 42, active: 3 },
            enc_with(v, Announce::encode),
            announce(v, true),
        );
        check(
            "00 08 03 63 61 6d 01 07 0c 1e",
            &active("cam", &[7], (12, 30)),
            enc_with(v, Announce::encode),
            announce(v, false),
        );
        check(
            "01 01 03",
            &Announce::End { id: 3 },
            enc_with(v, Announce::encode),
            announce(v, false),
        );
        check(
            "02 05 03 01 07 0c 1e",
            &Announce::Restart {
                id: 3,
                hops: vec![7],
                cost: (12, 30),
            },
            enc_with(v, Announce::encode),
            announce(v, false),
        );
        // An unknown type is skipped by its length.
        let b = hex("07 03 aa bb cc 01 01 03");
        let mut s = &b[..];
        assert_eq!(Announce::decode(&mut s, v, false), Ok(Announce::Unknown));
        assert_eq!(
            Announce::decode(&mut s, v, false),
            Ok(Announce::End { id: 3 })
        );
        assert!(s.is_empty());
        // ... but a known one must fill its body exactly.
        let b = hex("01 02 03 00");
        assert_eq!(
            Announce::decode(&mut &b[..], v, false),
            Err(DecodeError::LengthMismatch)
        );
        // `Ended` has no form on 06; `End` none before it.
        let mut out = BytesMut::new();
        Announce::Ended {
            suffix: "cam".into(),
        }
        .encode(v, &mut out);
        Announce::End { id: 1 }.encode(Version::Lite05, &mut out);
        Announce::Unknown.encode(v, &mut out);
        assert!(out.is_empty());
    }

    // SUBSCRIBE and SUBSCRIBE_UPDATE.

    fn sub(max_age_ms: Option<u64>, start: Option<u64>, end: Option<u64>) -> Subscribe {
        Subscribe {
            id: 1,
            broadcast: "room".into(),
            track: "video".into(),
            priority: 3,
            max_age_ms,
            start_group: start,
            end_group: end,
            start_frame: 0,
            end_frame: None,
        }
    }

    #[test]
    fn subscribe_01_02() {
        for v in [Version::Lite01, Version::Lite02] {
            check(
                &strip_type("02 0d 01 04 72 6f 6f 6d 05 76 69 64 65 6f 03", 2),
                &sub(None, None, None),
                enc_with(v, Subscribe::encode),
                dec_with(v, Subscribe::decode),
            );
        }
    }

    #[test]
    fn subscribe_03_05() {
        for v in [Version::Lite03, Version::Lite04, Version::Lite05] {
            check(
                &strip_type(
                    "02 12 01 04 72 6f 6f 6d 05 76 69 64 65 6f 03 00 40 fa 08 0a",
                    2,
                ),
                &sub(Some(250), Some(7), Some(9)),
                enc_with(v, Subscribe::encode),
                dec_with(v, Subscribe::decode),
            );
            check(
                "12 01 04 72 6f 6f 6d 05 76 69 64 65 6f 03 00 40 fa 00 00",
                &sub(Some(250), None, None),
                enc_with(v, Subscribe::encode),
                dec_with(v, Subscribe::decode),
            );
            // Any Ordered byte is accepted (moq-net 0.1.3 sends 1).
            let b = hex("12 01 04 72 6f 6f 6d 05 76 69 64 65 6f 03 ff 40 fa 00 00");
            assert_eq!(
                Subscribe::decode(&mut &b[..], v),
                Ok(sub(Some(250), None, None))
            );
            check(
                "06 05 00 43 e8 00 00",
                &SubscribeUpdate {
                    priority: 5,
                    max_age_ms: 1000,
                    start_group: None,
                    end_group: None,
                    start_frame: 0,
                    end_frame: None,
                },
                enc_with(v, SubscribeUpdate::encode),
                dec_with(v, SubscribeUpdate::decode),
            );
        }
    }

    #[test]
    fn subscribe_06() {
        let v = Version::Lite06;
        check(
            &strip_type(
                "02 13 01 04 72 6f 6f 6d 05 76 69 64 65 6f 03 40 fa 07 0a 04 03",
                2,
            ),
            &Subscribe {
                start_frame: 4,
                end_frame: Some(2),
                ..sub(Some(250), Some(7), Some(9))
            },
            enc_with(v, Subscribe::encode),
            dec_with(v, Subscribe::decode),
        );
        check(
            "13 01 04 72 6f 6f 6d 05 76 69 64 65 6f 03 40 fa 00 00 00 00",
            &sub(Some(250), None, None),
            enc_with(v, Subscribe::encode),
            dec_with(v, Subscribe::decode),
        );
        // Group 0 is a floor when a frame start goes with it.
        let b = hex("13 01 04 72 6f 6f 6d 05 76 69 64 65 6f 03 40 fa 00 00 05 00");
        assert_eq!(
            Subscribe::decode(&mut &b[..], v),
            Ok(Subscribe {
                start_frame: 5,
                ..sub(Some(250), Some(0), None)
            })
        );
        // A frame end without a group end.
        let b = hex("13 01 04 72 6f 6f 6d 05 76 69 64 65 6f 03 40 fa 00 00 00 03");
        assert!(matches!(
            Subscribe::decode(&mut &b[..], v),
            Err(DecodeError::Invalid(_))
        ));
        check(
            "07 05 43 e8 00 00 00 00",
            &SubscribeUpdate {
                priority: 5,
                max_age_ms: 1000,
                start_group: None,
                end_group: None,
                start_frame: 0,
                end_frame: None,
            },
            enc_with(v, SubscribeUpdate::encode),
            dec_with(v, SubscribeUpdate::decode),
        );
    }

    #[test]
    fn subscribe_update_absent_before_03() {
        for v in [Version::Lite01, Version::Lite02] {
            let b = hex("06 05 00 43 e8 00 00");
            assert!(matches!(
                SubscribeUpdate::decode(&mut &b[..], v),
                Err(DecodeError::Invalid(_))
            ));
        }
    }

    // Subscribe responses.

    #[test]
    fn subscribe_response() {
        use SubscribeResponse as R;
        let resp = |v| dec_with(v, R::decode);
        let drop = R::Drop {
            start: 1,
            end: 3,
            code: 0,
        };
        check(
            "01 03",
            &R::Ok { priority: 3 },
            enc_with(Version::Lite01, R::encode),
            resp(Version::Lite01),
        );
        check_asym(
            "00",
            &R::Ok { priority: 3 },
            &R::Ok { priority: 0 },
            enc_with(Version::Lite02, R::encode),
            resp(Version::Lite02),
        );
        for v in [Version::Lite03, Version::Lite04] {
            check(
                "00 05 03 00 00 00 00",
                &R::Ok { priority: 3 },
                enc_with(v, R::encode),
                resp(v),
            );
            check("01 03 01 03 00", &drop, enc_with(v, R::encode), resp(v));
            // The fields after the priority are ignored, but must be there.
            let b = hex("00 06 03 01 40 fa 08 0a");
            assert_eq!(R::decode(&mut &b[..], v), Ok(R::Ok { priority: 3 }));
            let b = hex("00 01 03");
            assert_eq!(R::decode(&mut &b[..], v), Err(DecodeError::LengthMismatch));
            let b = hex("02 00");
            assert_eq!(
                R::decode(&mut &b[..], v),
                Err(DecodeError::UnknownMessage(2))
            );
        }
        for v in [Version::Lite05, Version::Lite06] {
            check(
                "00 01 2a",
                &R::Start { group: 42 },
                enc_with(v, R::encode),
                resp(v),
            );
            check(
                "01 01 07",
                &R::End { group: 7 },
                enc_with(v, R::encode),
                resp(v),
            );
            check("02 03 01 03 00", &drop, enc_with(v, R::encode), resp(v));
            let b = hex("03 00");
            assert_eq!(
                R::decode(&mut &b[..], v),
                Err(DecodeError::UnknownMessage(3))
            );
        }
        // A 01 SUBSCRIBE_OK must be exactly its priority.
        let b = hex("02 03 00");
        assert_eq!(
            R::decode(&mut &b[..], Version::Lite01),
            Err(DecodeError::LengthMismatch)
        );
        let b = hex("01 00");
        assert_eq!(
            R::decode(&mut &b[..], Version::Lite02),
            Err(DecodeError::LengthMismatch)
        );
    }

    // FETCH, TRACK, TRACK_INFO, PROBE, GOAWAY.

    #[test]
    fn fetch() {
        let f = Fetch {
            broadcast: "room".into(),
            track: "video".into(),
            priority: 3,
            group: 7,
            start_frame: 0,
            end_frame: None,
        };
        for v in [Version::Lite03, Version::Lite04, Version::Lite05] {
            check(
                &strip_type("03 0d 04 72 6f 6f 6d 05 76 69 64 65 6f 03 07", 3),
                &f,
                enc_with(v, Fetch::encode),
                dec_with(v, Fetch::decode),
            );
        }
        let v = Version::Lite06;
        check(
            &strip_type("03 0f 04 72 6f 6f 6d 05 76 69 64 65 6f 03 07 02 07", 3),
            &Fetch {
                start_frame: 2,
                end_frame: Some(6),
                ..f.clone()
            },
            enc_with(v, Fetch::encode),
            dec_with(v, Fetch::decode),
        );
        // End before start.
        let b = hex("0f 04 72 6f 6f 6d 05 76 69 64 65 6f 03 07 05 03");
        assert!(matches!(
            Fetch::decode(&mut &b[..], v),
            Err(DecodeError::Invalid(_))
        ));
    }

    #[test]
    fn track_and_info() {
        let t = Track {
            broadcast: "room".into(),
            track: "video".into(),
        };
        for v in [Version::Lite05, Version::Lite06] {
            check(
                &strip_type("06 0b 04 72 6f 6f 6d 05 76 69 64 65 6f", 6),
                &t,
                enc_with(v, Track::encode),
                dec_with(v, Track::decode),
            );
        }
        let info = |timescale| TrackInfo {
            priority: 127,
            max_age_ms: 5000,
            timescale,
        };
        for (v, bytes, ts) in [
            (Version::Lite05, "06 7f 00 53 88 43 e8", 1000),
            (Version::Lite05, "08 7f 00 53 88 80 0f 42 40", 1_000_000),
            (Version::Lite06, "05 7f 53 88 43 e8", 1000),
            (Version::Lite06, "07 7f 53 88 80 0f 42 40", 1_000_000),
        ] {
            check(
                bytes,
                &info(ts),
                enc_with(v, TrackInfo::encode),
                dec_with(v, TrackInfo::decode),
            );
        }
        // Timescale 0; a TRACK before 05.
        let b = hex("05 7f 53 88 00 00");
        assert!(TrackInfo::decode(&mut &b[..], Version::Lite06).is_err());
        let b = hex("04 7f 53 88 00");
        assert!(matches!(
            TrackInfo::decode(&mut &b[..], Version::Lite06),
            Err(DecodeError::Invalid(_))
        ));
        let b = hex("0b 04 72 6f 6f 6d 05 76 69 64 65 6f");
        assert!(matches!(
            Track::decode(&mut &b[..], Version::Lite04),
            Err(DecodeError::Invalid(_))
        ));
    }

    #[test]
    fn probe() {
        check(
            "04 80 0f 42 40",
            &Probe {
                bitrate: 1_000_000,
                rtt_ms: 0,
            },
            enc_with(Version::Lite03, Probe::encode),
            dec_with(Version::Lite03, Probe::decode),
        );
        for v in [Version::Lite04, Version::Lite05, Version::Lite06] {
            check(
                "05 80 0f 42 40 28",
                &Probe {
                    bitrate: 1_000_000,
                    rtt_ms: 40,
                },
                enc_with(v, Probe::encode),
                dec_with(v, Probe::decode),
            );
        }
        // The PROBE stream's opening is its type alone.
        assert_eq!(super::super::stream::PROBE, 0x04);
    }

    #[test]
    fn goaway() {
        for v in [Version::Lite04, Version::Lite05, Version::Lite06] {
            check(
                &strip_type(
                    "05 14 13 68 74 74 70 73 3a 2f 2f 72 2e 65 78 61 6d 70 6c 65 2f 78",
                    5,
                ),
                &GoAway {
                    uri: "https://r.example/x".into(),
                },
                enc_with(v, GoAway::encode),
                dec_with(v, GoAway::decode),
            );
            check(
                &strip_type("05 01 00", 5),
                &GoAway { uri: String::new() },
                enc_with(v, GoAway::encode),
                dec_with(v, GoAway::decode),
            );
        }
        // A URI above MAX_GOAWAY_URI.
        let mut out = BytesMut::new();
        GoAway {
            uri: "x".repeat(MAX_GOAWAY_URI + 1),
        }
        .encode(Version::Lite06, &mut out);
        assert_eq!(
            GoAway::decode(&mut &out[..], Version::Lite06),
            Err(DecodeError::TooLong)
        );
        assert!(GoAway::decode(&mut &hex("01 00")[..], Version::Lite03).is_err());
    }

    // SETUP.

    #[test]
    fn setup() {
        check(
            &strip_type("01 01 00", 1),
            &Setup::default(),
            Setup::encode,
            Setup::decode,
        );
        check(
            &strip_type("01 04 01 01 01 01", 1),
            &Setup::default().with_int(param::PROBE, 1),
            Setup::encode,
            Setup::decode,
        );
        let path = Setup::default().with_bytes(param::PATH, Bytes::from_static(b"/anon"));
        check(
            &strip_type("01 08 01 02 05 2f 61 6e 6f 6e", 1),
            &path,
            Setup::encode,
            Setup::decode,
        );
        assert_eq!(path.path(), Some("/anon"));
        assert_eq!(path.int(param::PATH), None);
        check(
            "05 01 04 02 40 64",
            &Setup::default().with_int(param::COST, 100),
            Setup::encode,
            Setup::decode,
        );
        let hop = Setup::default().with_int(param::HOP, 42);
        check(
            &strip_type("01 04 01 05 01 2a", 1),
            &hop,
            Setup::encode,
            Setup::decode,
        );
        assert_eq!(hop.int(param::HOP), Some(42));
        assert_eq!(hop.int(param::ROLE), None);
        assert_eq!(hop.path(), None);
        assert_eq!(hop.with_int(param::HOP, 7).int(param::HOP), Some(7));
    }

    #[test]
    fn setup_errors() {
        // Any order, unknown ids kept; a repeated id is an error.
        let b = hex("07 02 05 01 2a 3f 01 09");
        let s = Setup::decode(&mut &b[..]).unwrap();
        assert_eq!(s.int(param::HOP), Some(42));
        assert_eq!(s.int(0x3f), Some(9));
        let b = hex("07 02 05 01 2a 05 01 2b");
        assert!(matches!(
            Setup::decode(&mut &b[..]),
            Err(DecodeError::Invalid(_))
        ));
        // More than MAX_PARAMETERS.
        let b = hex("02 40 41");
        assert_eq!(Setup::decode(&mut &b[..]), Err(DecodeError::TooMany));
        // A varint parameter with bytes after the varint is not well formed.
        let s = Setup::default().with_bytes(param::ROLE, Bytes::from_static(&[1, 0]));
        assert_eq!(s.int(param::ROLE), None);
        // An empty PATH is absent.
        let s = Setup::default().with_bytes(param::PATH, Bytes::new());
        assert_eq!(s.path(), None);
    }

    // Limits and truncation, for every decoder and version.

    type Dec = fn(&mut &[u8], Version) -> Result<(), DecodeError>;

    fn decoders() -> Vec<(&'static str, Dec)> {
        vec![
            ("announce_request", |b, v| {
                AnnounceRequest::decode(b, v).map(drop)
            }),
            ("announce first", |b, v| {
                Announce::decode(b, v, true).map(drop)
            }),
            ("announce", |b, v| Announce::decode(b, v, false).map(drop)),
            ("subscribe", |b, v| Subscribe::decode(b, v).map(drop)),
            ("subscribe_update", |b, v| {
                SubscribeUpdate::decode(b, v).map(drop)
            }),
            ("subscribe_response", |b, v| {
                SubscribeResponse::decode(b, v).map(drop)
            }),
            ("fetch", |b, v| Fetch::decode(b, v).map(drop)),
            ("track", |b, v| Track::decode(b, v).map(drop)),
            ("track_info", |b, v| TrackInfo::decode(b, v).map(drop)),
            ("probe", |b, v| Probe::decode(b, v).map(drop)),
            ("goaway", |b, v| GoAway::decode(b, v).map(drop)),
            ("setup", |b, _| Setup::decode(b).map(drop)),
            ("session_update", |b, _| SessionUpdate::decode(b).map(drop)),
        ]
    }

    /// Whether `name` exists in `v` (else its decoder refuses before reading).
    fn exists(name: &str, v: Version) -> bool {
        match name {
            "subscribe_update" | "fetch" | "probe" => v >= Version::Lite03,
            "track" | "track_info" => v >= Version::Lite05,
            "goaway" => v >= Version::Lite04,
            _ => true,
        }
    }

    #[test]
    fn oversize_length_is_too_long_at_once() {
        // A body length of MAX_MESSAGE_SIZE + 1 with no body yet: the decoder
        // refuses on the length alone.
        let mut len = Vec::new();
        put_vi(&mut len, MAX_MESSAGE_SIZE as u64 + 1);
        for v in ALL {
            for (name, dec) in decoders() {
                if !exists(name, v) {
                    continue;
                }
                // Typed messages: a type first.
                let typed = match name {
                    "subscribe_response" => v >= Version::Lite03,
                    "announce" => v == Version::Lite06,
                    _ => false,
                };
                let mut b = if typed { vec![0] } else { vec![] };
                b.extend_from_slice(&len);
                let mut s = &b[..];
                assert_eq!(dec(&mut s, v), Err(DecodeError::TooLong), "{name} {v:?}");
                assert_eq!(s.len(), b.len());
            }
        }
        // Exactly the limit is only waiting for its body.
        let mut b = Vec::new();
        put_vi(&mut b, MAX_MESSAGE_SIZE as u64);
        assert_eq!(
            Subscribe::decode(&mut &b[..], Version::Lite06),
            Err(DecodeError::Short)
        );
    }

    #[test]
    fn failures_leave_the_input_alone() {
        // Every decoder over some malformed bodies and all their prefixes.
        let inputs = [
            "05 ff ff ff ff ff",
            "03 02 ff fe",
            "01 80",
            "02 01 02 03",
            "0a 01 04 72 6f 6f 6d 05 76 69",
        ];
        for v in ALL {
            for (name, dec) in decoders() {
                for input in inputs {
                    let b = hex(input);
                    for n in 0..=b.len() {
                        let mut s = &b[..n];
                        if dec(&mut s, v).is_err() {
                            assert_eq!(s.len(), n, "{name} {v:?} {input} at {n}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn paths_over_32_segments() {
        let deep = ["a"; 33].join("/");
        let mut out = BytesMut::new();
        AnnounceRequest {
            prefix: deep,
            exclude_hop: 0,
        }
        .encode(Version::Lite06, &mut out);
        assert_eq!(
            AnnounceRequest::decode(&mut &out[..], Version::Lite06),
            Err(DecodeError::TooMany)
        );
        let ok = ["a"; 32].join("/");
        let mut out = BytesMut::new();
        AnnounceRequest {
            prefix: ok.clone(),
            exclude_hop: 0,
        }
        .encode(Version::Lite06, &mut out);
        assert_eq!(
            AnnounceRequest::decode(&mut &out[..], Version::Lite06).map(|r| r.prefix),
            Ok(ok)
        );
    }

    #[test]
    fn strings_must_be_utf8() {
        let b = hex("0d 01 04 72 6f 6f 6d 05 76 69 64 ff 6f 03");
        assert!(matches!(
            Subscribe::decode(&mut &b[..], Version::Lite01),
            Err(DecodeError::Invalid(_))
        ));
    }
}
