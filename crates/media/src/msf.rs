//! The MSF catalog: MOQT Streaming Format, draft-ietf-moq-msf-01 (2 June
//! 2026), with CMSF's `cmaf` packaging (draft-ietf-moq-cmsf-01, 3 June 2026).
//!
//! - The catalog is a track named `catalog` (§Catalog). Object 0 of each of
//!   its groups is an independent catalog ([`Catalog`]); later objects of the
//!   group are delta updates ([`Delta`]: `add`, `remove`, `clone`) applied in
//!   order with [`Catalog::apply`]. [`CatalogObject::parse`] tells them apart
//!   by the `deltaUpdate` field, as the draft does.
//! - Each media track is described by a [`Track`] whose field names are the
//!   draft's Table 2 (and CMSF's SAP fields). Fields this module does not
//!   know are kept in `other`, so a catalog passes through unchanged, and
//!   ignored otherwise, as §Catalog requires of parsers.
//! - `loc` packaging ([`crate::loc`]): one frame per object. The catalog
//!   holds no decoder configuration for it; LOC's Video/Audio Config
//!   properties carry that on the objects.
//! - `cmaf` packaging (CMSF §3): objects are `moof`+`mdat` CMAF chunks and
//!   the track's CMAF header (init segment) is in the catalog: an
//!   `initDataList` entry of type `inline` (base64) named by the track's
//!   `initRef` (msf-01 §Initialization Data List). CMSF-00's per-track
//!   `initData` is read too.
//!
//! `version` is a string from msf-01 on ("draft-01"; the draft's own
//! examples still say "1"); draft-00's number 1 is read as "1". A catalog
//! with any other version is refused, as §MSF version requires.

use std::collections::HashSet;

use base64::Engine;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Error, TrackInfo, TrackKind};

/// The catalog's track name (§Catalog: case-sensitive "catalog").
pub const CATALOG_TRACK: &str = "catalog";

/// The `version` this module writes (msf-01 §MSF version: "draft-XX").
pub const VERSION: &str = "draft-01";

/// Versions whose fields this module understands: msf-01's, the "1" of
/// msf-01's examples, and draft-00's number 1.
pub const KNOWN_VERSIONS: &[&str] = &["draft-01", "1"];

/// Largest catalog object accepted, in bytes: inline init segments make
/// catalogs bigger than hang's, but a few MB is already absurd.
pub const MAX_CATALOG: usize = 4 << 20;

/// Most tracks one catalog may declare (after deltas), against a peer
/// that adds tracks forever.
pub const MAX_TRACKS: usize = 4096;

/// How a track's objects are packaged (msf-01 Table 3, CMSF Table 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packaging {
    /// `loc`: one LOC frame per object.
    Loc,
    /// `cmaf`: CMAF chunks (CMSF).
    Cmaf,
    /// `mediatimeline`.
    MediaTimeline,
    /// `eventtimeline`.
    EventTimeline,
    /// `moqlog`.
    MoqLog,
    /// `moqmetrics`.
    MoqMetrics,
    /// Anything else, verbatim.
    Other(String),
}

impl Packaging {
    /// The value as written in the catalog.
    pub fn as_str(&self) -> &str {
        match self {
            Packaging::Loc => "loc",
            Packaging::Cmaf => "cmaf",
            Packaging::MediaTimeline => "mediatimeline",
            Packaging::EventTimeline => "eventtimeline",
            Packaging::MoqLog => "moqlog",
            Packaging::MoqMetrics => "moqmetrics",
            Packaging::Other(s) => s,
        }
    }

    fn from_str(s: &str) -> Self {
        match s {
            "loc" => Packaging::Loc,
            "cmaf" => Packaging::Cmaf,
            "mediatimeline" => Packaging::MediaTimeline,
            "eventtimeline" => Packaging::EventTimeline,
            "moqlog" => Packaging::MoqLog,
            "moqmetrics" => Packaging::MoqMetrics,
            other => Packaging::Other(other.to_string()),
        }
    }
}

impl Serialize for Packaging {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Packaging {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Packaging::from_str(&String::deserialize(d)?))
    }
}

/// msf-01 §Buffers: target, minimum and maximum buffer in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Buffers {
    /// Target buffer (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<u64>,
    /// Minimum buffer (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u64>,
    /// Maximum buffer (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    /// Unknown keys (to be ignored, kept for pass-through).
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// One track object (msf-01 Table 2, plus CMSF's fields). Every field is
/// optional here because delta operations carry partial track objects;
/// [`Catalog::validate`] checks what an independent catalog requires.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Track {
    /// Track name (required).
    pub name: String,
    /// Track namespace; absent means the catalog track's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Packaging (required for a declared track).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packaging: Option<Packaging>,
    /// Event timeline type (for `eventtimeline` packaging).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// Whether objects will still be added (required for a declared track).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_live: Option<bool>,
    /// Target latency in ms (exclusive with `buffers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_latency: Option<u64>,
    /// Target buffers (exclusive with `targetLatency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffers: Option<Buffers>,
    /// Content role: `video`, `audio`, `caption`, … (Table 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Human-readable label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Tracks with the same number are rendered together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub render_group: Option<u64>,
    /// Tracks with the same number are alternatives of one another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alt_group: Option<u64>,
    /// The `id` of this track's entry in the catalog's `initDataList`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_ref: Option<String>,
    /// CMSF-00's inline init data (base64), superseded by `initRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_data: Option<String>,
    /// Names of the tracks this one depends on for decoding.
    #[serde(default, rename = "depends", skip_serializing_if = "Option::is_none")]
    pub depends: Option<Vec<String>>,
    /// Media timeline template (kept as JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Value>,
    /// Temporal layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temporal_id: Option<u64>,
    /// Spatial layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spatial_id: Option<u64>,
    /// WebCodecs codec string (required for audio and video).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codec: Option<String>,
    /// MIME type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Frames per second.
    #[serde(
        default,
        serialize_with = "ser_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub framerate: Option<f64>,
    /// Time units per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timescale: Option<u64>,
    /// Maximum bitrate, bits per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bitrate: Option<u64>,
    /// Average bitrate, bits per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avg_bitrate: Option<u64>,
    /// Longest time between random access points, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gop_duration: Option<u64>,
    /// Longest MoQT group, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_group_duration: Option<u64>,
    /// Maximum encoded width, pixels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    /// Maximum encoded height, pixels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
    /// Audio samples per second.
    #[serde(
        default,
        rename = "samplerate",
        skip_serializing_if = "Option::is_none"
    )]
    pub samplerate: Option<u32>,
    /// Audio channel configuration, e.g. "2".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_config: Option<String>,
    /// Intended display width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_width: Option<u32>,
    /// Intended display height.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_height: Option<u32>,
    /// Dominant language (BCP 47).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lang: Option<String>,
    /// Parent to clone (only in a `clone` operation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_name: Option<String>,
    /// Parent's namespace (only in a `clone` operation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_namespace: Option<String>,
    /// Duration of a finished track, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub track_duration: Option<u64>,
    /// Authorization info (kept as JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_info: Option<Value>,
    /// Accessibility descriptors (kept as JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accessibility: Option<Value>,
    /// CMSF: highest SAP type a group starts with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_grp_sap_starting_type: Option<u8>,
    /// CMSF: highest SAP type an object starts with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_obj_sap_starting_type: Option<u8>,
    /// Every other field (encryption, custom fields), verbatim.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// One `initDataList` entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InitData {
    /// Unique within the catalog; tracks name it in `initRef`.
    pub id: String,
    /// `inline` (the only type msf-01 defines): `data` is base64.
    #[serde(rename = "type")]
    pub kind: String,
    /// The payload, as `kind` says.
    pub data: String,
    /// Unknown keys, kept.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// An independent catalog.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Catalog {
    /// MSF version ([`VERSION`] when written here).
    #[serde(deserialize_with = "de_version")]
    pub version: String,
    /// Wallclock ms since the Unix epoch when this catalog was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_at: Option<u64>,
    /// The broadcast is over: no track will be added or extended. Never
    /// written as false (§Is Complete).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_complete: bool,
    /// The tracks.
    pub tracks: Vec<Track>,
    /// Tracks subscribers may publish to (logs, metrics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_tracks: Option<Vec<Track>>,
    /// Init data that tracks reference by `initRef` (after `tracks`, as
    /// the draft asks, for readability).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_data_list: Vec<InitData>,
    /// Every other root field, verbatim.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// Writes a whole number without a fraction (`30`, not `30.0`), as the
/// draft's examples do, so a catalog read and written back is unchanged.
fn ser_number<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(f) if f.fract() == 0.0 && *f >= 0.0 && *f < 9.0e15 => s.serialize_u64(*f as u64),
        Some(f) => s.serialize_f64(*f),
        None => s.serialize_none(),
    }
}

/// Reads `version` as a string, or draft-00's number as its decimal text.
fn de_version<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(serde::de::Error::custom(format!(
            "version must be a string, not {other}"
        ))),
    }
}

/// A delta update: operations on the previous catalog.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Delta {
    /// Wallclock ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_at: Option<u64>,
    /// The operations, applied in order.
    pub delta_update: Vec<DeltaOp>,
    /// Every other root field, verbatim.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// One delta operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeltaOp {
    /// `add`, `remove` or `clone`.
    pub op: String,
    /// The track objects the operation applies to.
    pub tracks: Vec<Track>,
}

/// One object of the catalog track.
#[derive(Clone, Debug, PartialEq)]
pub enum CatalogObject {
    /// A complete catalog (object 0 of a group).
    Independent(Catalog),
    /// A delta update (later objects of the group).
    Delta(Delta),
}

impl CatalogObject {
    /// Parses and checks one catalog object.
    pub fn parse(data: &[u8]) -> Result<Self, Error> {
        if data.len() > MAX_CATALOG {
            return Err(Error::TooLarge {
                what: "MSF catalog".into(),
                size: data.len() as u64,
                limit: MAX_CATALOG as u64,
            });
        }
        let v: Value =
            serde_json::from_slice(data).map_err(|e| Error::malformed("MSF catalog", e))?;
        let Some(root) = v.as_object() else {
            return Err(Error::malformed("MSF catalog", "not a JSON object"));
        };
        if root.contains_key("deltaUpdate") {
            // §Delta updates: no tracks, no version, at least one operation.
            if root.contains_key("tracks") || root.contains_key("version") {
                return Err(Error::malformed(
                    "MSF catalog",
                    "a delta update with tracks or version",
                ));
            }
            let d: Delta =
                serde_json::from_value(v).map_err(|e| Error::malformed("MSF delta update", e))?;
            if d.delta_update.is_empty() {
                return Err(Error::malformed("MSF delta update", "no operation"));
            }
            for op in &d.delta_update {
                match op.op.as_str() {
                    "add" | "remove" | "clone" => {}
                    other => {
                        return Err(Error::malformed(
                            "MSF delta update",
                            format!("unknown operation {other:?}"),
                        ))
                    }
                }
            }
            Ok(CatalogObject::Delta(d))
        } else {
            let c: Catalog =
                serde_json::from_value(v).map_err(|e| Error::malformed("MSF catalog", e))?;
            c.validate()?;
            Ok(CatalogObject::Independent(c))
        }
    }

    /// The object's payload.
    pub fn to_bytes(&self) -> Bytes {
        // Serialising strings, numbers and maps cannot fail.
        match self {
            CatalogObject::Independent(c) => serde_json::to_vec(c),
            CatalogObject::Delta(d) => serde_json::to_vec(d),
        }
        .unwrap_or_default()
        .into()
    }
}

impl Catalog {
    /// An empty catalog of this module's version.
    pub fn new() -> Self {
        Self {
            version: VERSION.into(),
            ..Self::default()
        }
    }

    /// Parses an object that must be an independent catalog.
    pub fn parse(data: &[u8]) -> Result<Self, Error> {
        match CatalogObject::parse(data)? {
            CatalogObject::Independent(c) => Ok(c),
            CatalogObject::Delta(_) => Err(Error::malformed(
                "MSF catalog",
                "a delta update where an independent catalog was expected",
            )),
        }
    }

    /// The catalog as an object payload.
    pub fn to_bytes(&self) -> Bytes {
        serde_json::to_vec(self).unwrap_or_default().into()
    }

    /// Checks what an independent catalog must hold: a known version,
    /// named tracks, unique per namespace, and initRefs that resolve.
    pub fn validate(&self) -> Result<(), Error> {
        if !KNOWN_VERSIONS.contains(&self.version.as_str()) {
            return Err(Error::WrongFormat {
                expected: "MSF catalog version draft-01",
                detail: format!("version {:?}", self.version),
            });
        }
        if self.tracks.len() > MAX_TRACKS {
            return Err(Error::malformed("MSF catalog", "too many tracks"));
        }
        let mut seen = HashSet::new();
        for t in &self.tracks {
            if t.name.is_empty() {
                return Err(Error::malformed("MSF catalog", "a track without a name"));
            }
            if !seen.insert((t.namespace.as_deref(), t.name.as_str())) {
                return Err(Error::malformed(
                    "MSF catalog",
                    format!("track {:?} declared twice", t.name),
                ));
            }
            if let Some(r) = &t.init_ref {
                if !self.init_data_list.iter().any(|i| &i.id == r) {
                    return Err(Error::malformed(
                        "MSF catalog",
                        format!("track {:?}: initRef {r:?} is not in initDataList", t.name),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The track named `name` in the catalog's own namespace.
    pub fn track(&self, name: &str) -> Option<&Track> {
        self.tracks
            .iter()
            .find(|t| t.namespace.is_none() && t.name == name)
    }

    /// The init segment of `track` (CMAF packaging): its `initRef` entry,
    /// or CMSF-00's inline `initData`. `Ok(None)` if it has neither.
    pub fn init_data(&self, track: &Track) -> Result<Option<Bytes>, Error> {
        let b64 = match (&track.init_ref, &track.init_data) {
            (Some(r), _) => {
                let Some(e) = self.init_data_list.iter().find(|i| &i.id == r) else {
                    return Err(Error::malformed(
                        "MSF catalog",
                        format!("initRef {r:?} is not in initDataList"),
                    ));
                };
                if e.kind != "inline" {
                    return Err(Error::malformed(
                        "MSF catalog",
                        format!("init data {r:?} has type {:?}, not inline", e.kind),
                    ));
                }
                &e.data
            }
            (None, Some(d)) => d,
            (None, None) => return Ok(None),
        };
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map(|v| Some(Bytes::from(v)))
            .map_err(|e| Error::malformed("MSF init data", e))
    }

    /// Declares `track` with its init data (CMAF), added to
    /// `initDataList` as `init-NAME`.
    pub fn push(&mut self, mut track: Track, init: Option<&[u8]>) {
        if let Some(init) = init {
            let id = format!("init-{}", track.name);
            self.init_data_list.retain(|i| i.id != id);
            self.init_data_list.push(InitData {
                id: id.clone(),
                kind: "inline".into(),
                data: base64::engine::general_purpose::STANDARD.encode(init),
                other: Map::new(),
            });
            track.init_ref = Some(id);
        }
        self.tracks.push(track);
    }

    /// Applies a delta update in place (§Delta updates). On error the
    /// catalog is unchanged: an update that names a track that is not
    /// there, adds one that is, or clones into an existing name is refused
    /// whole rather than half applied.
    pub fn apply(&mut self, delta: &Delta) -> Result<(), Error> {
        let mut next = self.clone();
        let key = |ns: &Option<String>, name: &str| (ns.clone(), name.to_string());
        let find = |c: &Catalog, ns: &Option<String>, name: &str| {
            c.tracks
                .iter()
                .position(|t| key(&t.namespace, &t.name) == key(ns, name))
        };
        let bad = |detail: String| Error::malformed("MSF delta update", detail);
        for op in &delta.delta_update {
            for t in &op.tracks {
                match op.op.as_str() {
                    "add" => {
                        if find(&next, &t.namespace, &t.name).is_some() {
                            return Err(bad(format!("add: {:?} already declared", t.name)));
                        }
                        next.tracks.push(t.clone());
                    }
                    "remove" => match find(&next, &t.namespace, &t.name) {
                        Some(i) => {
                            next.tracks.remove(i);
                        }
                        None => return Err(bad(format!("remove: no track {:?}", t.name))),
                    },
                    "clone" => {
                        let Some(parent) = &t.parent_name else {
                            return Err(bad(format!("clone {:?} without parentName", t.name)));
                        };
                        let Some(p) = find(&next, &t.parent_namespace, parent) else {
                            return Err(bad(format!("clone: no parent {parent:?}")));
                        };
                        if find(&next, &t.namespace, &t.name).is_some() {
                            return Err(bad(format!("clone: {:?} already declared", t.name)));
                        }
                        // Inherit every attribute, then let the clone's own
                        // fields override (the name among them).
                        let mut merged = serde_json::to_value(&next.tracks[p])
                            .map_err(|e| bad(e.to_string()))?;
                        let overlay = serde_json::to_value(t).map_err(|e| bad(e.to_string()))?;
                        if let (Some(m), Some(o)) = (merged.as_object_mut(), overlay.as_object()) {
                            for (k, v) in o {
                                m.insert(k.clone(), v.clone());
                            }
                            m.remove("parentName");
                            m.remove("parentNamespace");
                            // A parent in another namespace: the clone is in
                            // the namespace it names (or the catalog's).
                            if t.namespace.is_none() {
                                m.remove("namespace");
                            }
                        }
                        let c: Track =
                            serde_json::from_value(merged).map_err(|e| bad(e.to_string()))?;
                        next.tracks.push(c);
                    }
                    other => return Err(bad(format!("unknown operation {other:?}"))),
                }
            }
        }
        if next.tracks.len() > MAX_TRACKS {
            return Err(bad("too many tracks".into()));
        }
        if let Some(g) = delta.generated_at {
            next.generated_at = Some(g);
        }
        *self = next;
        Ok(())
    }
}

impl Track {
    /// The track object a subscriber needs to pick and decode `t`, with
    /// the given packaging.
    pub fn from_info(name: &str, t: &TrackInfo, packaging: Packaging) -> Self {
        let video = t.kind == TrackKind::Video;
        Track {
            name: name.to_string(),
            packaging: Some(packaging),
            is_live: Some(true),
            role: Some(if video { "video" } else { "audio" }.into()),
            render_group: Some(1),
            codec: Some(t.codec.clone()),
            width: video.then_some(t.width),
            height: video.then_some(t.height),
            samplerate: (!video).then_some(t.sample_rate),
            channel_config: (!video).then(|| t.channels.to_string()),
            ..Track::default()
        }
    }

    /// Video or audio, by `role`, else by the codec.
    pub fn kind(&self) -> Option<TrackKind> {
        match self.role.as_deref() {
            Some("video") => Some(TrackKind::Video),
            Some("audio") | Some("audiodescription") => Some(TrackKind::Audio),
            Some(_) => None,
            None => self.codec.as_deref().and_then(crate::codec::kind_of),
        }
    }

    /// The track as a muxer needs it, from the catalog alone: codec, sizes
    /// and rates. The decoder configuration is not in an MSF catalog for
    /// LOC (it comes with the objects); for CMAF use the init segment.
    pub fn to_info(&self, id: u32) -> Result<TrackInfo, Error> {
        let codec = self.codec.as_deref().ok_or_else(|| {
            Error::malformed("MSF catalog", format!("track {:?} has no codec", self.name))
        })?;
        Ok(match self.kind() {
            Some(TrackKind::Video) => {
                TrackInfo::video(id, codec, self.width.unwrap_or(0), self.height.unwrap_or(0))
            }
            Some(TrackKind::Audio) => {
                // channelConfig is a string for layouts beyond a count;
                // a count is what a sample entry needs, 2 if it is not one.
                let channels = self
                    .channel_config
                    .as_deref()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(2);
                TrackInfo::audio(id, codec, self.samplerate.unwrap_or(48_000), channels)
            }
            None => {
                return Err(Error::UnsupportedCodec(format!(
                    "{codec} (track {:?} is neither video nor audio)",
                    self.name
                )))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// msf-01 §Catalog Examples, "Time-aligned Audio/Video Tracks with
    /// single quality", verbatim.
    const SINGLE_QUALITY: &str = r#"{
  "version": "1",
  "generatedAt": 1746104606044,
  "tracks": [
    {
      "name": "1080p-video",
      "namespace": "conference.example.com/conference123/alice",
      "packaging": "loc",
      "isLive": true,
      "targetLatency": 2000,
      "role": "video",
      "renderGroup": 1,
      "codec":"av01.0.08M.10.0.110.09",
      "width":1920,
      "height":1080,
      "framerate":30,
      "bitrate":1500000
    },
    {
      "name": "audio",
      "namespace": "conference.example.com/conference123/alice",
      "packaging": "loc",
      "isLive": true,
      "targetLatency": 2000,
      "role": "audio",
      "renderGroup": 1,
      "codec":"opus",
      "samplerate":48000,
      "channelConfig":"2",
      "bitrate":32000
    }
   ]
}
"#;

    /// msf-01 "SVC video tracks with 2 spatial and 2 temporal qualities"
    /// (the first and last tracks of it, verbatim).
    const SVC: &str = r#"{
  "version": "1",
  "generatedAt": 1746104606044,
  "tracks":[
    {
      "name": "480p15",
      "namespace": "conference.example.com/conference123/alice",
      "renderGroup": 1,
      "packaging": "loc",
      "isLive": true,
      "buffers": {"target":2000},
      "role": "video",
      "codec":"av01.0.01M.10.0.110.09",
      "width":640,
      "height":480,
      "bitrate":3000000,
      "framerate":15
    },
    {
      "name": "1080p30",
      "namespace": "conference.example.com/conference123/alice",
      "renderGroup": 1,
      "packaging": "loc",
      "isLive": true,
      "buffers": {"target":2000},
      "role": "video",
      "codec":"av01.0.08M.10.0.110.09",
      "width":1920,
      "height":1080,
      "bitrate":5000000,
      "framerate":30,
      "depends": ["480p30", "1080p15"]
    }
   ]
}"#;

    /// msf-01 "Delta update - adding two tracks", verbatim.
    const DELTA_ADD: &str = r#"{
  "generatedAt": 1746104606044,
  "deltaUpdate": [
    {
      "op": "add",
      "tracks": [
        {
          "name": "slides",
          "isLive": true,
          "role": "video",
          "codec": "av01.0.08M.10.0.110.09",
          "width": 1920,
          "height": 1080,
          "framerate": 15,
          "bitrate": 750000,
          "renderGroup": 1
        }
      ]
    },
    {
      "op": "clone",
      "tracks": [
        {
          "parentName": "video-1080",
          "parentNamespace": "example.com/custom",
          "name": "video-720",
          "width": 1280,
          "height": 720,
          "bitrate": 600000
        }
      ]
    }
  ]
}"#;

    /// msf-01 "Delta update removing tracks", verbatim.
    const DELTA_REMOVE: &str = r#"{
  "generatedAt": 1746104606044,
  "deltaUpdate": [
    {
      "op": "remove",
      "tracks": [{"name": "video"}, {"name": "slides"}]
    }
  ]
}"#;

    /// msf-01 "Terminating a live broadcast", verbatim.
    const TERMINATE: &str = r#"{
  "version": "1",
  "generatedAt": 1746104606044,
  "isComplete": true,
  "tracks": []
}"#;

    /// CMSF-00 §Catalog Examples, the audio track of "Simulcast video
    /// tracks", verbatim (draft-00's numeric version and inline initData;
    /// the draft elides the base64 with "...").
    const CMSF_00: &str = r#"{
  "version": 1,
  "generatedAt": 1746104606044,
  "tracks":[
    {
      "name": "audio",
      "renderGroup": 1,
      "packaging": "cmaf",
      "isLive": true,
      "initData": "AAAAHGZ0eXBpc281AAA...AAAAAAAAAAAAAA",
      "role": "audio",
      "codec":"mp4a.40.5",
      "samplerate":48000,
      "channelConfig":"2",
      "bitrate":67071
    }
   ]
}"#;

    fn independent(s: &str) -> Catalog {
        match CatalogObject::parse(s.as_bytes()).unwrap() {
            CatalogObject::Independent(c) => c,
            other => panic!("{other:?}"),
        }
    }

    fn delta(s: &str) -> Delta {
        match CatalogObject::parse(s.as_bytes()).unwrap() {
            CatalogObject::Delta(d) => d,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reads_the_drafts_single_quality_example() {
        let c = independent(SINGLE_QUALITY);
        assert_eq!(c.version, "1");
        assert_eq!(c.generated_at, Some(1_746_104_606_044));
        let v = &c.tracks[0];
        assert_eq!(v.name, "1080p-video");
        assert_eq!(v.packaging, Some(Packaging::Loc));
        assert_eq!(
            (v.width, v.height, v.framerate),
            (Some(1920), Some(1080), Some(30.0))
        );
        assert_eq!((v.is_live, v.target_latency), (Some(true), Some(2000)));
        assert_eq!(v.kind(), Some(TrackKind::Video));
        let a = &c.tracks[1];
        assert_eq!(
            (a.samplerate, a.channel_config.as_deref()),
            (Some(48_000), Some("2"))
        );
        let info = a.to_info(2).unwrap();
        assert_eq!(
            (info.codec.as_str(), info.sample_rate, info.channels),
            ("opus", 48_000, 2)
        );
        // Written back, it is the same JSON.
        let back: Value = serde_json::from_slice(&c.to_bytes()).unwrap();
        let orig: Value = serde_json::from_str(SINGLE_QUALITY).unwrap();
        assert_eq!(back, orig);
    }

    #[test]
    fn reads_buffers_and_depends() {
        let c = independent(SVC);
        let t = &c.tracks[1];
        assert_eq!(t.buffers.as_ref().and_then(|b| b.target), Some(2000));
        assert_eq!(
            t.depends.as_deref(),
            Some(&["480p30".to_string(), "1080p15".to_string()][..])
        );
        let back: Value = serde_json::from_slice(&c.to_bytes()).unwrap();
        assert_eq!(back, serde_json::from_str::<Value>(SVC).unwrap());
    }

    #[test]
    fn applies_the_drafts_delta_examples() {
        let mut c = Catalog::new();
        c.push(
            Track {
                name: "video-1080".into(),
                namespace: Some("example.com/custom".into()),
                packaging: Some(Packaging::Loc),
                is_live: Some(true),
                role: Some("video".into()),
                codec: Some("av01.0.08M.10.0.110.09".into()),
                width: Some(1920),
                height: Some(1080),
                bitrate: Some(1_500_000),
                ..Track::default()
            },
            None,
        );
        c.push(
            Track {
                name: "video".into(),
                ..Track::default()
            },
            None,
        );
        c.apply(&delta(DELTA_ADD)).unwrap();
        let names: Vec<_> = c.tracks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["video-1080", "video", "slides", "video-720"]);
        let clone = &c.tracks[3];
        // Inherited from the parent, overridden by the clone, no parent fields.
        assert_eq!(clone.codec.as_deref(), Some("av01.0.08M.10.0.110.09"));
        assert_eq!((clone.width, clone.height), (Some(1280), Some(720)));
        assert_eq!(clone.bitrate, Some(600_000));
        assert_eq!(clone.packaging, Some(Packaging::Loc));
        assert_eq!(clone.parent_name, None);
        assert_eq!(clone.namespace, None);
        // Adding again is refused, and leaves the catalog as it was.
        let before = c.clone();
        assert!(c.apply(&delta(DELTA_ADD)).is_err());
        assert_eq!(c, before);
        c.apply(&delta(DELTA_REMOVE)).unwrap();
        let names: Vec<_> = c.tracks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["video-1080", "video-720"]);
        // Removing what is gone is refused.
        assert!(c.apply(&delta(DELTA_REMOVE)).is_err());
        // A delta round-trips.
        let d = delta(DELTA_ADD);
        let again = CatalogObject::parse(&CatalogObject::Delta(d.clone()).to_bytes()).unwrap();
        assert_eq!(again, CatalogObject::Delta(d));
    }

    #[test]
    fn reads_the_terminating_catalog() {
        let c = independent(TERMINATE);
        assert!(c.is_complete && c.tracks.is_empty());
        // isComplete false is never written.
        assert!(!String::from_utf8(Catalog::new().to_bytes().to_vec())
            .unwrap()
            .contains("isComplete"));
    }

    #[test]
    fn cmsf_init_data_inline_and_by_reference() {
        let c = independent(CMSF_00);
        assert_eq!(c.version, "1");
        assert_eq!(c.tracks[0].packaging, Some(Packaging::Cmaf));
        // The draft's elided base64 is not base64: an error, not a panic.
        assert!(c.init_data(&c.tracks[0]).is_err());

        let mut c = Catalog::new();
        let info = TrackInfo::audio(1, "opus", 48_000, 2);
        c.push(
            Track::from_info("audio", &info, Packaging::Cmaf),
            Some(b"\0\0\0\x08ftyp"),
        );
        let s = String::from_utf8(c.to_bytes().to_vec()).unwrap();
        assert!(s.contains(r#""initRef":"init-audio""#), "{s}");
        assert!(
            s.contains(
                r#""initDataList":[{"id":"init-audio","type":"inline","data":"AAAACGZ0eXA="}]"#
            ),
            "{s}"
        );
        // initDataList comes after tracks.
        assert!(s.find("initDataList") > s.find("tracks"));
        let back = Catalog::parse(s.as_bytes()).unwrap();
        assert_eq!(back, c);
        assert_eq!(
            back.init_data(&back.tracks[0]).unwrap().as_deref(),
            Some(&b"\0\0\0\x08ftyp"[..])
        );
        assert_eq!(back.track("audio").map(|t| t.name.as_str()), Some("audio"));
    }

    #[test]
    fn tracks_from_and_to_track_info() {
        let mut v = TrackInfo::video(1, "avc1.64001f", 1280, 720);
        v.description = None;
        let t = Track::from_info("video", &v, Packaging::Loc);
        let j = serde_json::to_value(&t).unwrap();
        assert_eq!(
            j,
            serde_json::json!({"name":"video","packaging":"loc","isLive":true,"role":"video",
                "renderGroup":1,"codec":"avc1.64001f","width":1280,"height":720})
        );
        assert_eq!(t.to_info(1).unwrap(), v);
        let a = TrackInfo::audio(2, "mp4a.40.2", 44_100, 1);
        assert_eq!(
            Track::from_info("audio", &a, Packaging::Loc)
                .to_info(2)
                .unwrap(),
            a
        );
    }

    #[test]
    fn unknown_fields_pass_through() {
        let j = r#"{"version":"draft-01","tracks":[{"name":"v","packaging":"webvtt","isLive":false,"codec":"x","encryptionScheme":"moq-secure-objects","custom":{"a":1}}],"contentProtections":[]}"#;
        let c = Catalog::parse(j.as_bytes()).unwrap();
        assert_eq!(
            c.tracks[0].packaging,
            Some(Packaging::Other("webvtt".into()))
        );
        assert!(c.tracks[0].other.contains_key("encryptionScheme"));
        let back: Value = serde_json::from_slice(&c.to_bytes()).unwrap();
        assert_eq!(back, serde_json::from_str::<Value>(j).unwrap());
    }

    #[test]
    fn malformed_catalogs_are_errors() {
        for bad in [
            "",
            "{",
            "[]",
            r#"{"tracks":[]}"#,
            r#"{"version":"draft-99","tracks":[]}"#,
            r#"{"version":true,"tracks":[]}"#,
            r#"{"version":"draft-01"}"#,
            r#"{"version":"draft-01","tracks":[{"packaging":"loc"}]}"#,
            r#"{"version":"draft-01","tracks":[{"name":""}]}"#,
            r#"{"version":"draft-01","tracks":[{"name":"a"},{"name":"a"}]}"#,
            r#"{"version":"draft-01","tracks":[{"name":"a","initRef":"x"}]}"#,
            r#"{"version":"draft-01","tracks":[{"name":"a","width":-1}]}"#,
            r#"{"deltaUpdate":[]}"#,
            r#"{"deltaUpdate":[{"op":"patch","tracks":[]}]}"#,
            r#"{"deltaUpdate":[{"op":"add"}]}"#,
            r#"{"version":"draft-01","deltaUpdate":[{"op":"add","tracks":[]}]}"#,
            r#"{"tracks":[],"deltaUpdate":[{"op":"add","tracks":[]}]}"#,
        ] {
            assert!(CatalogObject::parse(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(CatalogObject::parse(&vec![b' '; MAX_CATALOG + 1]).is_err());
        // A delta where a full catalog must be.
        assert!(Catalog::parse(DELTA_REMOVE.as_bytes()).is_err());
        // A clone without its parent.
        let d =
            delta(r#"{"deltaUpdate":[{"op":"clone","tracks":[{"name":"b","parentName":"a"}]}]}"#);
        assert!(Catalog::new().apply(&d).is_err());
        let d = delta(r#"{"deltaUpdate":[{"op":"clone","tracks":[{"name":"b"}]}]}"#);
        assert!(Catalog::new().apply(&d).is_err());
        // An initRef to a non-inline entry.
        let c = Catalog::parse(
            br#"{"version":"draft-01","tracks":[{"name":"a","initRef":"i"}],"initDataList":[{"id":"i","type":"url","data":"x"}]}"#,
        )
        .unwrap();
        assert!(c.init_data(&c.tracks[0]).is_err());
    }
}
