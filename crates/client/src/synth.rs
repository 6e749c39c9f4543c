//! Synthetic media and sensor sources, and the payload header that lets a
//! subscriber measure one-way latency and loss.
//!
//! Every synthetic payload starts with 16 bytes: the send time in microseconds
//! since the Unix epoch and a per-track sequence number, both big-endian u64.
//! Publisher and subscriber must share a clock (same machine, or NTP/PTP).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};

/// Bytes of the timing header at the front of every synthetic payload.
pub const HEADER: usize = 16;

/// Microseconds since the Unix epoch.
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Builds a payload of `size` bytes (at least [`HEADER`]) stamped with now and `seq`.
pub fn payload(seq: u64, size: usize) -> Bytes {
    let size = size.max(HEADER);
    let mut b = BytesMut::with_capacity(size);
    b.put_u64(now_micros());
    b.put_u64(seq);
    b.resize(size, 0xa5);
    b.freeze()
}

/// An IMU sample (the `imu` profile's payload): the stamp, then six
/// big-endian `f32`: accelerometer x, y, z (m/s², gravity on z) and gyroscope
/// x, y, z (rad/s), smooth waves of the sample's time (`seq` × 10 ms), so a
/// plot of the track shows motion.
pub fn imu_payload(seq: u64) -> Bytes {
    let t = seq as f32 * 0.01;
    let values = [
        (t * 4.0).sin(),
        (t * 2.5).cos() * 0.5,
        9.81 + (t * 7.0).sin() * 0.3,
        (t * 1.5).sin() * 0.8,
        (t * 3.0).cos() * 0.3,
        (t * 6.0).sin() * 0.1,
    ];
    let mut b = BytesMut::with_capacity(HEADER + 24);
    b.put_u64(now_micros());
    b.put_u64(seq);
    for v in values {
        b.put_f32(v);
    }
    b.freeze()
}

/// Reads the stamp of a synthetic payload: (send time µs, sequence).
pub fn stamp(p: &[u8]) -> Option<(u64, u64)> {
    if p.len() < HEADER {
        return None;
    }
    Some((
        u64::from_be_bytes(p[0..8].try_into().ok()?),
        u64::from_be_bytes(p[8..16].try_into().ok()?),
    ))
}

/// How a synthetic track is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// One object per QUIC datagram.
    Datagram,
    /// One subgroup stream per group.
    Stream,
}

/// A synthetic source.
#[derive(Debug, Clone)]
pub struct Profile {
    /// Track name.
    pub name: &'static str,
    /// Datagrams or streams.
    pub delivery: Delivery,
    /// Time between objects.
    pub interval: Duration,
    /// Objects per group.
    pub objects_per_group: u64,
    /// Size of the first object of a group (a keyframe for video).
    pub first_size: usize,
    /// Size of the other objects.
    pub size: usize,
    /// Publisher priority.
    pub priority: u8,
}

impl Profile {
    /// The relay benchmark methodology's (draft-evens-moq-bench) scenario 1 audio: a 120-byte datagram every 20 ms.
    pub fn audio() -> Self {
        Self {
            name: "audio",
            delivery: Delivery::Datagram,
            interval: Duration::from_millis(20),
            objects_per_group: 1,
            first_size: 120,
            size: 120,
            priority: 1,
        }
    }

    /// 360p video at 30 fps, a keyframe group every second (draft-evens-moq-bench scenario 2
    /// profile: ~20 kB keyframe, ~2.5 kB delta frames, about 0.7 Mbit/s).
    pub fn video() -> Self {
        Self {
            name: "video",
            delivery: Delivery::Stream,
            interval: Duration::from_micros(33_333),
            objects_per_group: 30,
            first_size: 20_000,
            size: 2_500,
            priority: 2,
        }
    }

    /// An IMU at 100 Hz: accelerometer and gyroscope (6 × f32) plus the stamp,
    /// one group per second on a stream (as in Sengupta, "Streaming over QUIC").
    pub fn imu() -> Self {
        Self {
            name: "imu",
            delivery: Delivery::Stream,
            interval: Duration::from_millis(10),
            objects_per_group: 100,
            first_size: HEADER + 24,
            size: HEADER + 24,
            priority: 0,
        }
    }

    /// Looks a profile up by name.
    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "audio" => Some(Self::audio()),
            "video" => Some(Self::video()),
            "imu" => Some(Self::imu()),
            _ => None,
        }
    }

    /// Size of object `object_id` within its group.
    pub fn size_of(&self, object_id: u64) -> usize {
        if object_id == 0 {
            self.first_size
        } else {
            self.size
        }
    }
}

/// Publishes `profile` on `track` until `count` objects or `until`, pacing by
/// the profile's interval. Returns the number of objects handed to the
/// transport (objects generated while nobody subscribes are not counted).
pub async fn run(
    track: &crate::LocalTrack,
    profile: &Profile,
    count: Option<u64>,
    until: tokio::time::Instant,
) -> anyhow::Result<u64> {
    let mut tick = tokio::time::interval(profile.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut seq = 0u64;
    let mut sent = 0u64;
    let mut group = 0u64;
    let mut writer: Option<crate::SubgroupWriter<'_>> = None;
    loop {
        tick.tick().await;
        if tokio::time::Instant::now() >= until || count.is_some_and(|c| seq >= c) {
            break;
        }
        let object_id = seq % profile.objects_per_group;
        if object_id == 0 && seq > 0 {
            group += 1;
        }
        let p = if profile.name == "imu" {
            imu_payload(seq)
        } else {
            payload(seq, profile.size_of(object_id))
        };
        match profile.delivery {
            Delivery::Datagram => {
                if track.send_datagram(group, object_id, p) {
                    sent += 1;
                }
            }
            Delivery::Stream => {
                if object_id == 0 {
                    if let Some(w) = writer.take() {
                        w.finish();
                    }
                    writer = track.open_subgroup(group, 0).await?;
                }
                if let Some(w) = writer.as_mut() {
                    if w.write(object_id, p).await.is_ok() {
                        sent += 1;
                    }
                }
                if object_id + 1 == profile.objects_per_group {
                    if let Some(w) = writer.take() {
                        w.finish();
                    }
                }
            }
        }
        seq += 1;
    }
    if let Some(w) = writer.take() {
        w.finish();
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_roundtrip() {
        let p = payload(42, 120);
        assert_eq!(p.len(), 120);
        let (t, s) = stamp(&p).unwrap();
        assert_eq!(s, 42);
        assert!(t > 0);
        assert!(stamp(&p[..10]).is_none());
    }

    #[test]
    fn imu_payload_is_the_profile_size_with_values() {
        let p = imu_payload(100);
        assert_eq!(p.len(), Profile::imu().size_of(0));
        assert_eq!(stamp(&p).unwrap().1, 100);
        let az = f32::from_be_bytes(p[24..28].try_into().unwrap());
        assert!((9.0..10.5).contains(&az), "{az}");
    }
}
