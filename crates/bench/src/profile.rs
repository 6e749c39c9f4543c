//! Config profiles (draft-evens-moq-bench-00 §5.1 and Appendix A).
//!
//! A profile is an INI file with one section per track:
//!
//! ```ini
//! [360p Video]
//! namespace           = perf/video/{}  ; fields delimited by `/`, `{}` is the client id
//! name                = 1
//! track_mode          = stream         ; datagram | stream
//! priority            = 3              ; 0-255
//! ttl                 = 5000           ; ms
//! time_interval       = 33.33          ; ms, floating point
//! objects_per_group   = 150            ; >= 1
//! first_object_size   = 21333          ; bytes
//! object_size         = 2666           ; bytes
//! start_delay         = 5000           ; ms
//! total_transmit_time = 35000          ; ms, including start_delay
//! ```
//!
//! # Syntax
//!
//! - `[section]` starts a track; its name is free text (spaces allowed) and
//!   must be unique in the file.
//! - `key = value`, with any whitespace around `=`. Keys are case-sensitive.
//! - `;` and `#` start a comment anywhere on a line, as in the `inicpp`
//!   parser qperf uses, so values cannot contain them. Blank lines are
//!   ignored.
//! - Every key is required. A key given twice in a section, a key outside a
//!   section, an unknown key and a line that is neither a section header nor
//!   `key = value` are errors, as is a file without a section.
//!
//! # Keys accepted for qperf compatibility
//!
//! The draft's keys are the ones of qperf's current `examples/*.ini`
//! (github.com/quicr/qperf). qperf's older `templates/*.ini` use four other
//! names, accepted here as aliases (giving both spellings in one section is a
//! duplicate-key error):
//!
//! | qperf legacy key        | draft key             |
//! |-------------------------|-----------------------|
//! | `objs_per_group`        | `objects_per_group`   |
//! | `bytes_per_group_start` | `first_object_size`   |
//! | `bytes_per_group`       | `object_size`         |
//! | `total_test_time`       | `total_transmit_time` |
//!
//! `total_test_time` was documented by qperf as "including start delay",
//! which is what `total_transmit_time` means here (Appendix A.4.1's comment).
//!
//! # Interpolation
//!
//! [`TrackProfile::namespace`] and [`TrackProfile::name`] replace every `{}`
//! with a client id. The namespace template is split on `/` *before*
//! substitution, so an id is always inserted inside one field and never adds
//! fields; fields that end up empty are dropped (MoQT forbids empty fields).
//! Other braces are literal.
//!
//! # Schedule
//!
//! DATA object `k` (0-based, over the whole track) belongs to group
//! `k / objects_per_group` and has object number `k % objects_per_group`; it
//! is due `k * interval` after the first one, with the interval taken in whole
//! microseconds ([`TrackProfile::interval_us`], the value START carries).
//! Objects are sent while that offset is below the transmit time
//! `total_transmit_time - start_delay`.

// `ProfileError` is 128 bytes (file, section, key, value as owned strings);
// it is only built on the cold path of reading a config file, so it is not
// boxed.
#![allow(clippy::result_large_err)]

use std::fmt;
use std::path::Path;

use bytes::Bytes;
use moqt::names::MAX_NAMESPACE_FIELDS;
use moqt::TrackNamespace;
use serde::Serialize;

use crate::message::{effective_object_size, BenchMessage, Completion, Start};

/// How a track's objects travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    /// One QUIC datagram per object (`track_mode = datagram`).
    Datagram,
    /// QUIC streams, one subgroup per group (`track_mode = stream`).
    Stream,
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Delivery::Datagram => "datagram",
            Delivery::Stream => "stream",
        })
    }
}

/// One track of a profile: one INI section.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrackProfile {
    /// The section name, e.g. `360p Video`.
    pub section: String,
    /// `namespace`: fields delimited by `/`, `{}` replaced by the client id.
    pub namespace_template: String,
    /// `name`: the track name, `{}` replaced by the client id.
    pub name_template: String,
    /// `track_mode`.
    pub mode: Delivery,
    /// `priority` (0-255), the publisher priority.
    pub priority: u8,
    /// `ttl` in milliseconds: how long an object may wait to be sent.
    pub ttl_ms: u64,
    /// `time_interval` in milliseconds between objects (> 0).
    pub interval_ms: f64,
    /// `objects_per_group` (1 to 2^32-1, the range START can carry).
    pub objects_per_group: u64,
    /// `first_object_size`: bytes of the first object of each group.
    pub first_object_size: u32,
    /// `object_size`: bytes of every other object of a group.
    pub object_size: u32,
    /// `start_delay` in milliseconds: START is repeated this long before
    /// the first DATA.
    pub start_delay_ms: u64,
    /// `total_transmit_time` in milliseconds, including `start_delay`.
    pub total_transmit_time_ms: u64,
}

/// Where a DATA object sits in the schedule of [`TrackProfile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectSlot {
    /// 0-based index over the whole track.
    pub index: u64,
    /// DATA `group_number`: `index / objects_per_group`.
    pub group: u64,
    /// DATA `object_number`: `index % objects_per_group`.
    pub object: u64,
    /// Total object payload size in bytes (the DATA message, header
    /// included; see [`effective_object_size`]).
    pub size: u32,
    /// Microseconds after the first DATA at which this one is due.
    pub due_us: u64,
}

impl TrackProfile {
    /// The track namespace for client `id`: `{}` replaced by `id` in each
    /// `/`-delimited field, empty fields dropped.
    pub fn namespace(&self, id: &str) -> TrackNamespace {
        let fields: Vec<String> = self
            .namespace_template
            .split('/')
            .map(|f| f.replace("{}", id))
            .filter(|f| !f.is_empty())
            .collect();
        TrackNamespace::from_strs(&fields)
    }

    /// The track name for client `id`: `{}` replaced by `id`.
    pub fn name(&self, id: &str) -> Bytes {
        Bytes::from(self.name_template.replace("{}", id))
    }

    /// The interval in whole microseconds (rounded to nearest), as carried
    /// by START. Always at least 1.
    pub fn interval_us(&self) -> u32 {
        interval_ms_to_us(self.interval_ms).unwrap_or(1)
    }

    /// Milliseconds during which DATA is sent:
    /// `total_transmit_time - start_delay`.
    pub fn transmit_time_ms(&self) -> u64 {
        self.total_transmit_time_ms
            .saturating_sub(self.start_delay_ms)
    }

    /// Number of DATA objects the publisher sends: those due strictly
    /// before the transmit time ends, i.e. `ceil(transmit_time / interval)`
    /// with both in microseconds.
    pub fn data_objects(&self) -> u64 {
        let transmit_us = self.transmit_time_ms().saturating_mul(1000);
        transmit_us.div_ceil(u64::from(self.interval_us()))
    }

    /// Number of groups those objects fill: `ceil(data_objects / objects_per_group)`.
    pub fn groups(&self) -> u64 {
        self.data_objects().div_ceil(self.objects_per_group.max(1))
    }

    /// Table 3's Expected Bits Per Second: the mean object size of a group
    /// times 8 over the interval. Sizes below the DATA minimum count as the
    /// minimum (see [`effective_object_size`]).
    pub fn expected_bits_per_second(&self) -> f64 {
        expected_bits_per_second(
            self.first_object_size,
            self.object_size,
            self.objects_per_group,
            self.interval_us(),
        )
    }

    /// The slot of DATA object `index` (0-based over the track).
    pub fn object_at(&self, index: u64) -> ObjectSlot {
        let opg = self.objects_per_group.max(1);
        let object = index % opg;
        ObjectSlot {
            index,
            group: index / opg,
            object,
            size: effective_object_size(if object == 0 {
                self.first_object_size
            } else {
                self.object_size
            }),
            due_us: index.saturating_mul(u64::from(self.interval_us())),
        }
    }

    /// How often START is repeated during the start delay (§5.2): a tenth
    /// of the start delay, but at least 100 ms.
    pub fn start_repeat_interval_ms(&self) -> u64 {
        (self.start_delay_ms / 10).max(100)
    }

    /// The START message of this track.
    pub fn start_message(&self) -> BenchMessage {
        BenchMessage::Start(Start {
            objects_per_group: u32::try_from(self.objects_per_group).unwrap_or(u32::MAX),
            first_object_size: self.first_object_size,
            remaining_object_size: self.object_size,
            interval_us: self.interval_us(),
        })
    }

    /// A COMPLETION message for this track after `objects_sent` DATA
    /// objects, the last sent `total_duration_ms` after the first.
    pub fn completion_message(&self, objects_sent: u64, total_duration_ms: u32) -> BenchMessage {
        BenchMessage::Completion(Completion {
            objects_sent,
            groups_sent: objects_sent.div_ceil(self.objects_per_group.max(1)),
            total_duration_ms,
        })
    }
}

/// `interval_ms` in whole microseconds, rounded to nearest, if it is in
/// `1..=u32::MAX`.
pub(crate) fn interval_ms_to_us(interval_ms: f64) -> Option<u32> {
    let us = (interval_ms * 1000.0).round();
    if us.is_finite() && us >= 1.0 && us <= f64::from(u32::MAX) {
        Some(us as u32)
    } else {
        None
    }
}

/// Expected bits per second of a track (Table 3) from START's fields:
/// `(first + (objects_per_group - 1) * remaining) / objects_per_group` bytes
/// every `interval_us`. Sizes are taken through [`effective_object_size`];
/// 0 when `interval_us` is 0.
pub fn expected_bits_per_second(
    first_object_size: u32,
    object_size: u32,
    objects_per_group: u64,
    interval_us: u32,
) -> f64 {
    if interval_us == 0 {
        return 0.0;
    }
    let opg = objects_per_group.max(1) as f64;
    let first = f64::from(effective_object_size(first_object_size));
    let rest = f64::from(effective_object_size(object_size));
    let mean = (first + (opg - 1.0) * rest) / opg;
    mean * 8.0 * 1_000_000.0 / f64::from(interval_us)
}

/// A parsed config profile: its tracks, in file order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    /// One entry per section.
    pub tracks: Vec<TrackProfile>,
}

/// What went wrong in a profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileErrorKind {
    /// The file could not be read.
    Io(String),
    /// A section lacks a required key.
    MissingKey,
    /// A value is not a number of the expected kind.
    BadNumber {
        /// What was expected, e.g. `a number`, `an integer`.
        expected: &'static str,
        /// The value as written.
        value: String,
    },
    /// A number outside the allowed range.
    OutOfRange {
        /// The value as written.
        value: String,
        /// The allowed range, e.g. `0-255`.
        range: &'static str,
    },
    /// `total_transmit_time` not above `start_delay` (it includes it).
    NotAfterStartDelay {
        /// The value as written.
        value: String,
        /// `start_delay` of the section.
        start_delay_ms: u64,
    },
    /// A value that is not one of the allowed words, or is empty.
    InvalidValue {
        /// What was expected.
        expected: &'static str,
        /// The value as written.
        value: String,
    },
    /// A key this parser does not know.
    UnknownKey,
    /// A key given twice in one section (possibly under its qperf alias).
    DuplicateKey {
        /// Line of the first occurrence.
        first_line: usize,
    },
    /// A section name used twice.
    DuplicateSection {
        /// Line of the first occurrence.
        first_line: usize,
    },
    /// `key = value` before any `[section]`.
    KeyOutsideSection,
    /// A line that is neither `[section]`, `key = value`, a comment nor blank.
    MalformedLine(String),
    /// No section at all.
    EmptyProfile,
}

/// A profile error, naming the file, 1-based line, section and key where
/// they apply: `profiles/x.ini:12: [360p Video] time_interval: expected a
/// number, got "abc"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ProfileError {
    /// The file, when loaded with [`Profile::load`].
    pub path: Option<String>,
    /// 1-based line; 0 when the error concerns the whole file.
    pub line: usize,
    /// The section, when inside one.
    pub section: Option<String>,
    /// The key, when about one.
    pub key: Option<String>,
    /// What went wrong.
    pub kind: ProfileErrorKind,
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.path.as_deref().unwrap_or("<profile>"))?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        f.write_str(": ")?;
        if let Some(s) = &self.section {
            write!(f, "[{s}] ")?;
        }
        if let Some(k) = &self.key {
            write!(f, "{k}: ")?;
        }
        match &self.kind {
            ProfileErrorKind::Io(e) => write!(f, "cannot read: {e}"),
            ProfileErrorKind::MissingKey => f.write_str("missing required key"),
            ProfileErrorKind::BadNumber { expected, value } => {
                write!(f, "expected {expected}, got {value:?}")
            }
            ProfileErrorKind::OutOfRange { value, range } => {
                write!(f, "{value} is out of range ({range})")
            }
            ProfileErrorKind::NotAfterStartDelay {
                value,
                start_delay_ms,
            } => write!(
                f,
                "{value} must exceed start_delay ({start_delay_ms}): it includes the start delay"
            ),
            ProfileErrorKind::InvalidValue { expected, value } => {
                write!(f, "expected {expected}, got {value:?}")
            }
            ProfileErrorKind::UnknownKey => f.write_str("unknown key"),
            ProfileErrorKind::DuplicateKey { first_line } => {
                write!(f, "duplicate key (first given on line {first_line})")
            }
            ProfileErrorKind::DuplicateSection { first_line } => {
                write!(f, "duplicate section (first on line {first_line})")
            }
            ProfileErrorKind::KeyOutsideSection => {
                f.write_str("key outside a section (add a [section] line above it)")
            }
            ProfileErrorKind::MalformedLine(text) => {
                write!(f, "expected [section] or key = value, got {text:?}")
            }
            ProfileErrorKind::EmptyProfile => f.write_str("no track section in profile"),
        }
    }
}

/// The keys of a section, in the order of [`TrackProfile`]'s fields.
const KEYS: [&str; 11] = [
    "namespace",
    "name",
    "track_mode",
    "priority",
    "ttl",
    "time_interval",
    "objects_per_group",
    "first_object_size",
    "object_size",
    "start_delay",
    "total_transmit_time",
];

/// Maps a key (or its qperf legacy alias) to its slot in [`KEYS`].
fn key_slot(key: &str) -> Option<usize> {
    let canonical = match key {
        "objs_per_group" => "objects_per_group",
        "bytes_per_group_start" => "first_object_size",
        "bytes_per_group" => "object_size",
        "total_test_time" => "total_transmit_time",
        k => k,
    };
    KEYS.iter().position(|k| *k == canonical)
}

/// One `key = value` as written.
#[derive(Clone)]
struct Entry {
    key: String,
    value: String,
    line: usize,
}

/// A section being collected.
struct RawSection {
    name: String,
    line: usize,
    entries: [Option<Entry>; 11],
}

impl Profile {
    /// Reads and parses a profile file; errors name `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Profile, ProfileError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ProfileError {
            path: Some(shown.clone()),
            line: 0,
            section: None,
            key: None,
            kind: ProfileErrorKind::Io(e.to_string()),
        })?;
        Profile::parse(&text).map_err(|mut e| {
            e.path = Some(shown);
            e
        })
    }

    /// Parses a profile from text.
    pub fn parse(text: &str) -> Result<Profile, ProfileError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut sections: Vec<RawSection> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let content = strip_comment(raw).trim();
            if content.is_empty() {
                continue;
            }
            let section_name = sections.last().map(|s| s.name.clone());
            let err = |key: Option<&str>, kind| ProfileError {
                path: None,
                line,
                section: section_name.clone(),
                key: key.map(str::to_string),
                kind,
            };
            if let Some(rest) = content.strip_prefix('[') {
                let Some(name) = rest.strip_suffix(']') else {
                    return Err(err(
                        None,
                        ProfileErrorKind::MalformedLine(content.to_string()),
                    ));
                };
                let name = name.trim();
                if name.is_empty() {
                    return Err(err(
                        None,
                        ProfileErrorKind::MalformedLine(content.to_string()),
                    ));
                }
                if let Some(first) = sections.iter().find(|s| s.name == name) {
                    return Err(ProfileError {
                        path: None,
                        line,
                        section: Some(name.to_string()),
                        key: None,
                        kind: ProfileErrorKind::DuplicateSection {
                            first_line: first.line,
                        },
                    });
                }
                sections.push(RawSection {
                    name: name.to_string(),
                    line,
                    entries: Default::default(),
                });
                continue;
            }
            let Some((key, value)) = content.split_once('=') else {
                return Err(err(
                    None,
                    ProfileErrorKind::MalformedLine(content.to_string()),
                ));
            };
            let key = key.trim();
            let value = value.trim();
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(err(
                    None,
                    ProfileErrorKind::MalformedLine(content.to_string()),
                ));
            }
            let Some(section) = sections.last_mut() else {
                return Err(err(Some(key), ProfileErrorKind::KeyOutsideSection));
            };
            let Some(slot) = key_slot(key) else {
                return Err(err(Some(key), ProfileErrorKind::UnknownKey));
            };
            if let Some(first) = &section.entries[slot] {
                return Err(err(
                    Some(key),
                    ProfileErrorKind::DuplicateKey {
                        first_line: first.line,
                    },
                ));
            }
            section.entries[slot] = Some(Entry {
                key: key.to_string(),
                value: value.to_string(),
                line,
            });
        }
        if sections.is_empty() {
            return Err(ProfileError {
                path: None,
                line: 0,
                section: None,
                key: None,
                kind: ProfileErrorKind::EmptyProfile,
            });
        }
        let tracks = sections
            .iter()
            .map(build_track)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Profile { tracks })
    }

    /// The track whose section is `section`.
    pub fn track(&self, section: &str) -> Option<&TrackProfile> {
        self.tracks.iter().find(|t| t.section == section)
    }

    /// Overrides `start_delay` and `total_transmit_time` (which includes the
    /// start delay) of every track, for runs shorter or longer than the
    /// profile's without editing it. The total must stay above the start delay.
    pub fn set_times(
        &mut self,
        start_delay_ms: Option<u64>,
        total_transmit_time_ms: Option<u64>,
    ) -> Result<(), String> {
        let times = |t: &TrackProfile| {
            (
                start_delay_ms.unwrap_or(t.start_delay_ms),
                total_transmit_time_ms.unwrap_or(t.total_transmit_time_ms),
            )
        };
        if let Some(t) = self.tracks.iter().find(|t| times(t).1 <= times(t).0) {
            let (start, total) = times(t);
            return Err(format!(
                "[{}]: the total transmit time ({total} ms) includes the start delay \
                 ({start} ms) and must be longer",
                t.section
            ));
        }
        for t in &mut self.tracks {
            (t.start_delay_ms, t.total_transmit_time_ms) = times(t);
        }
        Ok(())
    }
}

/// The line up to its first `;` or `#`.
fn strip_comment(line: &str) -> &str {
    match line.find([';', '#']) {
        Some(i) => &line[..i],
        None => line,
    }
}

/// Typed access to one section's entries, making errors that name it.
struct Fields<'a> {
    section: &'a RawSection,
}

impl Fields<'_> {
    fn entry(&self, slot: usize) -> Result<&Entry, ProfileError> {
        self.section.entries[slot]
            .as_ref()
            .ok_or_else(|| ProfileError {
                path: None,
                line: self.section.line,
                section: Some(self.section.name.clone()),
                key: Some(KEYS[slot].to_string()),
                kind: ProfileErrorKind::MissingKey,
            })
    }

    fn error(&self, entry: &Entry, kind: ProfileErrorKind) -> ProfileError {
        ProfileError {
            path: None,
            line: entry.line,
            section: Some(self.section.name.clone()),
            key: Some(entry.key.clone()),
            kind,
        }
    }

    fn text(&self, slot: usize, expected: &'static str) -> Result<String, ProfileError> {
        let e = self.entry(slot)?;
        if e.value.is_empty() {
            return Err(self.error(
                e,
                ProfileErrorKind::InvalidValue {
                    expected,
                    value: String::new(),
                },
            ));
        }
        Ok(e.value.clone())
    }

    /// An unsigned integer in `min..=max`.
    fn uint(
        &self,
        slot: usize,
        min: u64,
        max: u64,
        range: &'static str,
    ) -> Result<u64, ProfileError> {
        let e = self.entry(slot)?;
        let v = &e.value;
        let parsed = if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
            v.parse::<u64>().ok()
        } else {
            None
        };
        let out_of_range = || {
            self.error(
                e,
                ProfileErrorKind::OutOfRange {
                    value: v.clone(),
                    range,
                },
            )
        };
        match parsed {
            Some(n) if (min..=max).contains(&n) => Ok(n),
            Some(_) => Err(out_of_range()),
            // All digits but too large for u64.
            None if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => Err(out_of_range()),
            None if v.starts_with('-') && v[1..].parse::<f64>().is_ok() => Err(out_of_range()),
            None => Err(self.error(
                e,
                ProfileErrorKind::BadNumber {
                    expected: "a non-negative integer",
                    value: v.clone(),
                },
            )),
        }
    }

    /// The interval in ms: a finite float whose microsecond value fits u32.
    fn interval(&self, slot: usize) -> Result<f64, ProfileError> {
        let e = self.entry(slot)?;
        let parsed = e.value.parse::<f64>().ok().filter(|f| f.is_finite());
        let Some(ms) = parsed else {
            return Err(self.error(
                e,
                ProfileErrorKind::BadNumber {
                    expected: "a number",
                    value: e.value.clone(),
                },
            ));
        };
        if interval_ms_to_us(ms).is_none() {
            return Err(self.error(
                e,
                ProfileErrorKind::OutOfRange {
                    value: e.value.clone(),
                    range: "0.0005-4294967.295 ms, at least 1 us once rounded",
                },
            ));
        }
        Ok(ms)
    }
}

fn build_track(section: &RawSection) -> Result<TrackProfile, ProfileError> {
    let f = Fields { section };
    let namespace_template = f.text(0, "a namespace such as perf/audio/{}")?;
    let field_count = namespace_template
        .split('/')
        .filter(|s| !s.is_empty())
        .count();
    if field_count == 0 || field_count > MAX_NAMESPACE_FIELDS {
        let e = f.entry(0)?;
        return Err(f.error(
            e,
            ProfileErrorKind::InvalidValue {
                expected: "1 to 32 non-empty fields delimited by /",
                value: namespace_template,
            },
        ));
    }
    let name_template = f.text(1, "a track name")?;
    let mode_text = f.text(2, "datagram or stream")?;
    let mode = if mode_text.eq_ignore_ascii_case("datagram") {
        Delivery::Datagram
    } else if mode_text.eq_ignore_ascii_case("stream") {
        Delivery::Stream
    } else {
        let e = f.entry(2)?;
        return Err(f.error(
            e,
            ProfileErrorKind::InvalidValue {
                expected: "datagram or stream",
                value: mode_text,
            },
        ));
    };
    const U32: &str = "0-4294967295";
    let priority = f.uint(3, 0, 255, "0-255")? as u8;
    let ttl_ms = f.uint(4, 0, u64::from(u32::MAX), U32)?;
    let interval_ms = f.interval(5)?;
    let objects_per_group = f.uint(6, 1, u64::from(u32::MAX), "1-4294967295")?;
    let first_object_size = f.uint(7, 0, u64::from(u32::MAX), U32)? as u32;
    let object_size = f.uint(8, 0, u64::from(u32::MAX), U32)? as u32;
    // Both bounded so that `* 1000` (microseconds) cannot overflow.
    let max_ms = u64::from(u32::MAX);
    let start_delay_ms = f.uint(9, 0, max_ms, U32)?;
    let total_transmit_time_ms = f.uint(10, 0, max_ms, U32)?;
    if total_transmit_time_ms <= start_delay_ms {
        let e = f.entry(10)?;
        return Err(f.error(
            e,
            ProfileErrorKind::NotAfterStartDelay {
                value: e.value.clone(),
                start_delay_ms,
            },
        ));
    }
    Ok(TrackProfile {
        section: section.name.clone(),
        namespace_template,
        name_template,
        mode,
        priority,
        ttl_ms,
        interval_ms,
        objects_per_group,
        first_object_size,
        object_size,
        start_delay_ms,
        total_transmit_time_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCENARIO1: &str = include_str!("../../../profiles/scenario1-audio.ini");
    const SCENARIO2: &str = include_str!("../../../profiles/scenario2-audio-video.ini");
    const SCENARIO3: &str = include_str!("../../../profiles/scenario3-meeting.ini");

    /// qperf's examples/config-av.ini (draft key names).
    const QPERF_EXAMPLE_AV: &str = "\
[Audio]
namespace          = perf/audio/{}  ; MAY be the same across tracks, entries delimited by /
name               = 1              ; SHOULD be unique to other tracks
track_mode         = datagram       ; (datagram|stream)
priority           = 2              ; (0-255)
ttl                = 5000           ; TTL in ms
time_interval      = 20             ; transmit interval in floating point ms
objects_per_group  = 1              ; number of objects per group >=1
first_object_size  = 120            ; size in bytes of the first object in a group
object_size        = 120            ; size in bytes of remaining objects in a group
start_delay        = 5000           ; start delay in ms - after control messages are sent and acknowledged
total_transmit_time = 35000          ; total transmit time in ms

[360p Video]
namespace          = perf/video/{}  ; MAY be the same across tracks, entries delimited by /
name               = 1              ; SHOULD be unique to other tracks
track_mode         = stream         ; (datagram|stream)
priority           = 3              ; (0-255)
ttl                = 5000           ; TTL in ms
time_interval      = 33.33          ; transmit interval in floating point ms
objects_per_group  = 150            ; number of objects per group >=1
first_object_size  = 21333          ; size in bytes of the first object in a group
object_size        = 2666           ; size in bytes of remaining objects in a group
start_delay        = 5000           ; start delay in ms - after control messages are sent and acknowledged
total_transmit_time = 35000          ; total transmit time in ms
";

    /// qperf's templates/config.template.ini (legacy key names).
    const QPERF_TEMPLATE: &str = "\
[TRACK 1]
namespace             = perf/1         ; track namespace - can be the same or different than other section tracks
name                  = 1              ; track name - Should be different than other section tracks
track_mode            = datagram       ; track mode {datagram,stream}
priority              = 1              ; priority (0-255)
ttl                   = 5000           ; ttl in ms
time_interval         = 20.00          ; transmit interval in floating point ms
objs_per_group        = 1              ; objects per group count >=1
bytes_per_group_start = 60             ; size of a group 0 object
bytes_per_group       = 60             ; size of a group <> 0 object
start_delay           = 10000          ; start delay in ms - after subscribes
total_test_time       = 35000          ; total transmit time in ms - including start delay

[TRACK 2]
namespace             = perf/1         ; track namespace - can be the same or different than other section tracks
name                  = 2              ; track name - Should be different than other section tracks
track_mode            = stream         ; track mode {datagram,stream}
priority              = 2              ; priority (0-255)
ttl                   = 5000           ; ttl in ms
time_interval         = 33.33          ; transmit interval in floating point ms
objs_per_group        = 150            ; objects per group count >=1
bytes_per_group_start = 22000          ; size of a group 0 object
bytes_per_group       = 2500           ; size of a group <> 0 object
start_delay           = 10000          ; start delay in ms - after subscribes
total_test_time       = 35000          ; total transmit time in ms - including start delay
";

    /// qperf's templates/config-audio.ini (legacy names, trailing comment line).
    const QPERF_TEMPLATE_AUDIO: &str = "\
[Audio]
namespace             = perf/{}        ; track namespace
name                  = audio          ; track name
track_mode            = datagram       ; track mode {datagram,stream}
priority              = 2              ; priority (0-255)
ttl                   = 5000           ; ttl in ms
time_interval         = 20             ; transmit interval in floating point ms
objs_per_group        = 1              ; objects per group count >=1
bytes_per_group_start = 120            ; size of a group 0 object
bytes_per_group       = 120            ; size of a group <> 0 object
start_delay           = 5000           ; start delay in ms - after subscribes
total_test_time       = 40000          ; total transmit time in ms - including startdelay
; (not configured): total_transmit_time - is calculated total_transmit_time = total_test_time - start_delay
";

    fn audio() -> TrackProfile {
        Profile::parse(SCENARIO1).unwrap().tracks.remove(0)
    }

    fn err(text: &str) -> ProfileError {
        Profile::parse(text).unwrap_err()
    }

    const VALID: &str = "[T]\nnamespace = a/{}\nname = n\ntrack_mode = stream\npriority = 1\n\
        ttl = 10\ntime_interval = 10\nobjects_per_group = 2\nfirst_object_size = 100\n\
        object_size = 50\nstart_delay = 1000\ntotal_transmit_time = 2000\n";

    #[test]
    fn scenario1_parses_as_appendix_a() {
        let p = Profile::parse(SCENARIO1).unwrap();
        assert_eq!(p.tracks.len(), 1);
        assert_eq!(
            p.tracks[0],
            TrackProfile {
                section: "Audio Datagram".into(),
                namespace_template: "perf/audio/{}".into(),
                name_template: "1".into(),
                mode: Delivery::Datagram,
                priority: 2,
                ttl_ms: 5000,
                interval_ms: 20.0,
                objects_per_group: 1,
                first_object_size: 120,
                object_size: 120,
                start_delay_ms: 5000,
                total_transmit_time_ms: 35000,
            }
        );
    }

    #[test]
    fn scenario2_parses_video() {
        let p = Profile::parse(SCENARIO2).unwrap();
        assert_eq!(p.tracks.len(), 2);
        let v = p.track("360p Video").unwrap();
        assert_eq!(v.mode, Delivery::Stream);
        assert_eq!(v.priority, 3);
        assert_eq!(v.interval_ms, 33.33);
        assert_eq!(v.interval_us(), 33_330);
        assert_eq!(v.objects_per_group, 150);
        assert_eq!(v.first_object_size, 21333);
        assert_eq!(v.object_size, 2666);
        // 30 s / 33.33 ms: objects due at 0 .. 900 * 33.33 = 29997 ms.
        assert_eq!(v.data_objects(), 901);
        assert_eq!(v.groups(), 7);
        // (21333 + 149 * 2666) / 150 bytes every 33.33 ms.
        let expected = (21333.0 + 149.0 * 2666.0) / 150.0 * 8.0 / 0.03333;
        assert!((v.expected_bits_per_second() - expected).abs() < 1e-6);
    }

    #[test]
    fn scenario3_meeting_interpolates_per_client() {
        let p = Profile::parse(SCENARIO3).unwrap();
        assert_eq!(p.tracks.len(), 2);
        let a = &p.tracks[0];
        assert_eq!(
            a.namespace("2"),
            TrackNamespace::from_strs(&["perf", "meeting", "2", "audio"])
        );
        assert_eq!(p.tracks[1].mode, Delivery::Stream);
    }

    #[test]
    fn qperf_files_parse() {
        let p = Profile::parse(QPERF_EXAMPLE_AV).unwrap();
        assert_eq!(p.tracks[0].section, "Audio");
        assert_eq!(p.tracks[1].section, "360p Video");
        let t = Profile::parse(QPERF_TEMPLATE).unwrap();
        assert_eq!(t.tracks[1].objects_per_group, 150);
        assert_eq!(t.tracks[1].first_object_size, 22000);
        assert_eq!(t.tracks[1].object_size, 2500);
        assert_eq!(t.tracks[1].total_transmit_time_ms, 35000);
        assert_eq!(t.tracks[1].start_delay_ms, 10000);
        let a = Profile::parse(QPERF_TEMPLATE_AUDIO).unwrap();
        assert_eq!(a.tracks[0].name(""), Bytes::from_static(b"audio"));
        assert_eq!(a.tracks[0].transmit_time_ms(), 35000);
    }

    #[test]
    fn audio_helpers() {
        let a = audio();
        assert_eq!(a.transmit_time_ms(), 30000);
        assert_eq!(a.data_objects(), 1500);
        assert_eq!(a.groups(), 1500);
        assert_eq!(a.expected_bits_per_second(), 48000.0);
        assert_eq!(a.start_repeat_interval_ms(), 500);
        assert_eq!(
            a.object_at(7),
            ObjectSlot {
                index: 7,
                group: 7,
                object: 0,
                size: 120,
                due_us: 140_000
            }
        );
        assert_eq!(
            a.start_message(),
            BenchMessage::Start(Start {
                objects_per_group: 1,
                first_object_size: 120,
                remaining_object_size: 120,
                interval_us: 20_000
            })
        );
    }

    #[test]
    fn schedule_and_sizes() {
        let t = Profile::parse(VALID).unwrap().tracks.remove(0);
        assert_eq!(t.object_at(0).size, 100);
        assert_eq!(t.object_at(1).size, 50);
        assert_eq!((t.object_at(5).group, t.object_at(5).object), (2, 1));
        assert_eq!(t.data_objects(), 100);
        assert_eq!(t.groups(), 50);
        assert_eq!(t.expected_bits_per_second(), 75.0 * 8.0 * 100.0);
        assert_eq!(t.start_repeat_interval_ms(), 100);
        assert_eq!(
            t.completion_message(5, 40),
            BenchMessage::Completion(Completion {
                objects_sent: 5,
                groups_sent: 3,
                total_duration_ms: 40
            })
        );
    }

    #[test]
    fn interpolation() {
        let t = audio();
        assert_eq!(
            t.namespace("17"),
            TrackNamespace::from_strs(&["perf", "audio", "17"])
        );
        // An id with a slash stays in one field; an empty id drops the field.
        assert_eq!(
            t.namespace("a/b"),
            TrackNamespace::from_strs(&["perf", "audio", "a/b"])
        );
        assert_eq!(
            t.namespace(""),
            TrackNamespace::from_strs(&["perf", "audio"])
        );
        let mut u = t.clone();
        u.name_template = "v{}-{}".into();
        assert_eq!(u.name("3"), Bytes::from_static(b"v3-3"));
        assert_eq!(t.name("3"), Bytes::from_static(b"1"));
    }

    #[test]
    fn comments_and_whitespace() {
        let text = "# leading comment\n  ; another\n\n  [ T ]  # trailing\nnamespace=a\nname =n\n\
            track_mode= DATAGRAM\n\tpriority\t=\t0 ;x\nttl = 0#y\ntime_interval = 0.5\n\
            objects_per_group = 1\nfirst_object_size = 0\nobject_size = 0\nstart_delay = 0\n\
            total_transmit_time = 1\n";
        let t = Profile::parse(text).unwrap().tracks.remove(0);
        assert_eq!(t.section, "T");
        assert_eq!(t.mode, Delivery::Datagram);
        assert_eq!(t.priority, 0);
        assert_eq!(t.interval_us(), 500);
        assert_eq!(t.data_objects(), 2);
    }

    #[test]
    fn display_names_path_line_section_key() {
        let text = VALID.replace("time_interval = 10", "time_interval = abc");
        let e = err(&text);
        assert_eq!(e.line, 7);
        assert_eq!(
            e.to_string(),
            "<profile>:7: [T] time_interval: expected a number, got \"abc\""
        );
        let dir = std::env::temp_dir().join(format!("quichub-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.ini");
        std::fs::write(&path, &text).unwrap();
        let e = Profile::load(&path).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}:7: [T] time_interval: expected a number, got \"abc\"",
                path.display()
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let e = Profile::load(dir.join("missing.ini")).unwrap_err();
        assert!(matches!(e.kind, ProfileErrorKind::Io(_)));
    }

    #[test]
    fn missing_key() {
        let e = err(&VALID.replace("ttl = 10\n", ""));
        assert_eq!(e.kind, ProfileErrorKind::MissingKey);
        assert_eq!((e.line, e.key.as_deref()), (1, Some("ttl")));
        assert_eq!(e.to_string(), "<profile>:1: [T] ttl: missing required key");
    }

    #[test]
    fn bad_numbers() {
        for (from, to, key) in [
            ("priority = 1", "priority = x", "priority"),
            ("ttl = 10", "ttl = 1.5", "ttl"),
            ("object_size = 50", "object_size =", "object_size"),
            ("start_delay = 1000", "start_delay = 1e3", "start_delay"),
            ("time_interval = 10", "time_interval = inf", "time_interval"),
            ("time_interval = 10", "time_interval = NaN", "time_interval"),
        ] {
            let e = err(&VALID.replace(from, to));
            assert!(
                matches!(e.kind, ProfileErrorKind::BadNumber { .. }),
                "{to}: {e}"
            );
            assert_eq!(e.key.as_deref(), Some(key));
        }
    }

    #[test]
    fn out_of_range() {
        for (from, to, key) in [
            ("priority = 1", "priority = 256", "priority"),
            ("priority = 1", "priority = -1", "priority"),
            (
                "objects_per_group = 2",
                "objects_per_group = 0",
                "objects_per_group",
            ),
            (
                "objects_per_group = 2",
                "objects_per_group = 4294967296",
                "objects_per_group",
            ),
            (
                "object_size = 50",
                "object_size = 99999999999999999999999",
                "object_size",
            ),
            ("time_interval = 10", "time_interval = 0", "time_interval"),
            ("time_interval = 10", "time_interval = -20", "time_interval"),
            (
                "time_interval = 10",
                "time_interval = 0.0004",
                "time_interval",
            ),
        ] {
            let e = err(&VALID.replace(from, to));
            assert!(
                matches!(e.kind, ProfileErrorKind::OutOfRange { .. }),
                "{to}: {e}"
            );
            assert_eq!(e.key.as_deref(), Some(key));
        }
        let e = err(&VALID.replace("total_transmit_time = 2000", "total_transmit_time = 1000"));
        assert_eq!(
            e.kind,
            ProfileErrorKind::NotAfterStartDelay {
                value: "1000".into(),
                start_delay_ms: 1000
            }
        );
        assert_eq!(
            e.to_string(),
            "<profile>:12: [T] total_transmit_time: 1000 must exceed start_delay (1000): \
             it includes the start delay"
        );
        let e = err(&VALID.replace("priority = 1", "priority = 300"));
        assert_eq!(
            e.to_string(),
            "<profile>:5: [T] priority: 300 is out of range (0-255)"
        );
    }

    #[test]
    fn invalid_values() {
        for (from, to) in [
            ("track_mode = stream", "track_mode = reliable"),
            ("namespace = a/{}", "namespace = //"),
            ("name = n", "name ="),
        ] {
            let e = err(&VALID.replace(from, to));
            assert!(
                matches!(e.kind, ProfileErrorKind::InvalidValue { .. }),
                "{to}: {e}"
            );
        }
        let many = vec!["x"; 33].join("/");
        let e = err(&VALID.replace("namespace = a/{}", &format!("namespace = {many}")));
        assert!(matches!(e.kind, ProfileErrorKind::InvalidValue { .. }));
    }

    #[test]
    fn unknown_and_duplicate_keys() {
        let e = err(&VALID.replace("ttl = 10", "ttl = 10\nreliable = true"));
        assert_eq!(e.kind, ProfileErrorKind::UnknownKey);
        assert_eq!((e.line, e.key.as_deref()), (7, Some("reliable")));
        let e = err(&VALID.replace("ttl = 10", "ttl = 10\nttl = 20"));
        assert_eq!(e.kind, ProfileErrorKind::DuplicateKey { first_line: 6 });
        assert_eq!(e.line, 7);
        assert_eq!(
            e.to_string(),
            "<profile>:7: [T] ttl: duplicate key (first given on line 6)"
        );
        // A draft key and its qperf alias are the same key.
        let e = err(&VALID.replace("object_size = 50", "object_size = 50\nbytes_per_group = 50"));
        assert_eq!(e.kind, ProfileErrorKind::DuplicateKey { first_line: 10 });
        assert_eq!(e.key.as_deref(), Some("bytes_per_group"));
    }

    #[test]
    fn structure_errors() {
        let e = err("namespace = a\n[T]\n");
        assert_eq!(e.kind, ProfileErrorKind::KeyOutsideSection);
        assert_eq!((e.line, e.section.as_deref()), (1, None));
        for bad in ["[T\n", "[]\n", "just words\n", "= 5\n", "two words = 5\n"] {
            let e = err(&format!("{VALID}{bad}"));
            assert!(
                matches!(e.kind, ProfileErrorKind::MalformedLine(_)),
                "{bad}"
            );
            assert_eq!(e.line, 13);
        }
        let e = err("; only comments\n\n# here\n");
        assert_eq!(e.kind, ProfileErrorKind::EmptyProfile);
        assert_eq!(e.to_string(), "<profile>: no track section in profile");
        assert_eq!(err("").kind, ProfileErrorKind::EmptyProfile);
        let e = err(&format!("{VALID}{VALID}"));
        assert_eq!(e.kind, ProfileErrorKind::DuplicateSection { first_line: 1 });
        assert_eq!(e.line, 13);
    }

    #[test]
    fn arbitrary_input_never_panics() {
        let samples = [
            "[",
            "]",
            "=",
            "[a]\n=",
            "[a]\nname=\u{00e9}",
            "[a]\n\u{feff}x=1",
            "\r\n\r\n",
            "[a]\r\nnamespace = x\r\n",
            "[a]\ntime_interval = 1e400",
        ];
        for s in samples {
            let _ = Profile::parse(s);
        }
        // CRLF files parse like LF ones.
        let crlf = VALID.replace('\n', "\r\n");
        assert_eq!(
            Profile::parse(&crlf).unwrap(),
            Profile::parse(VALID).unwrap()
        );
    }

    #[test]
    fn set_times_overrides_every_track() {
        let mut p = Profile::parse(QPERF_EXAMPLE_AV).unwrap();
        let objects = p.tracks[0].data_objects();
        p.set_times(None, Some(p.tracks[0].start_delay_ms + 2000))
            .unwrap();
        for t in &p.tracks {
            assert_eq!(t.transmit_time_ms(), 2000);
        }
        assert!(p.tracks[0].data_objects() < objects);
        p.set_times(Some(500), Some(1500)).unwrap();
        assert_eq!(p.tracks[1].start_delay_ms, 500);
        assert_eq!(p.tracks[1].total_transmit_time_ms, 1500);
        let e = p.set_times(Some(2000), None).unwrap_err();
        assert!(e.contains("start delay"), "{e}");
        assert_eq!(p.tracks[0].start_delay_ms, 500, "unchanged on error");
    }
}
