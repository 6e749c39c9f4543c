//! Harness bodies shared by the cargo-fuzz targets in `fuzz/` and by this
//! crate's proptests: whatever the bytes, the demuxers and the catalog parser
//! return values or errors and never panic, buffer more than their limits, or
//! produce frames that point outside their input.

use crate::fmp4::Fmp4Demuxer;
use crate::hang::{self, Catalog};
use crate::ts::TsDemuxer;
use crate::{Demuxer, Event, Limits};

/// Small limits, so the fuzzer reaches the "too large" paths.
const LIMITS: Limits = Limits {
    max_box: 1 << 20,
    max_tracks: 4,
};

/// Feeds `data` to `d` in pieces whose sizes come from the data itself, then
/// ends it, draining every event. Returns the number of events.
fn drive(d: &mut dyn Demuxer, data: &[u8]) -> usize {
    let mut events = 0;
    let step = usize::from(data.first().copied().unwrap_or(1)).max(1) * 7;
    for chunk in data.chunks(step) {
        d.push(chunk);
        loop {
            match d.next() {
                Ok(Some(e)) => {
                    check(&e);
                    events += 1;
                }
                Ok(None) => break,
                // A refused input stays refused or goes on; either is fine,
                // but it must not loop forever: stop feeding.
                Err(_) => return events,
            }
        }
    }
    d.end();
    // Bounded: at most one event per input byte plus the held-back ones.
    for _ in 0..data.len() + 64 {
        match d.next() {
            Ok(Some(e)) => {
                check(&e);
                events += 1;
            }
            Ok(None) | Err(_) => break,
        }
    }
    events
}

fn check(e: &Event) {
    match e {
        Event::Tracks(t) => assert!(t.len() <= LIMITS.max_tracks.max(16)),
        Event::Frame(f) => assert!(f.data.len() as u64 <= LIMITS.max_box),
    }
}

/// fMP4 demuxing of arbitrary bytes.
pub fn fuzz_fmp4(data: &[u8]) {
    drive(&mut Fmp4Demuxer::new(LIMITS), data);
}

/// MPEG-TS demuxing of arbitrary bytes.
pub fn fuzz_ts(data: &[u8]) {
    drive(&mut TsDemuxer::new(LIMITS), data);
}

/// hang catalogs and legacy frames: parsing never panics, and what parses
/// re-serialises to a catalog that parses to the same value.
pub fn fuzz_catalog(data: &[u8]) {
    if let Ok(c) = Catalog::parse(data) {
        let again = Catalog::parse(&c.to_bytes()).expect("a written catalog parses");
        // The same renditions come back (numbers in unknown fields may move
        // by an ulp: serde_json's fast float parsing is not exact).
        let names = |c: &Catalog| {
            c.renditions()
                .map(|(k, n, r)| {
                    (
                        k,
                        n.clone(),
                        r.codec.clone(),
                        r.description.clone(),
                        r.container.kind(),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&again), names(&c));
        for (kind, _, r) in c.renditions() {
            let _ = r.to_track(1, kind).map(|t| crate::codec::sample_entry(&t));
        }
        let _ = c.clock_unix_micros();
    }
    let b = bytes::Bytes::copy_from_slice(data);
    if let Ok((ts, payload)) = hang::decode_legacy(&b) {
        assert!(hang::encode_legacy(ts, &payload).len() <= data.len());
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::mux::{init_segment, Fragmenter};
    use crate::{Frame, TrackInfo};

    /// A small valid fMP4 stream from this crate's muxer.
    fn sample() -> Vec<u8> {
        let mut a = TrackInfo::audio(1, "opus", 48_000, 2);
        a.description = None;
        let mut out = init_segment(&[a.clone()]).unwrap().to_vec();
        let mut f = Fragmenter::new();
        for i in 0..5 {
            let fr = Frame {
                track: 1,
                pts: i * 20_000,
                dts: i * 20_000,
                duration: 20_000,
                keyframe: true,
                disposable: false,
                data: bytes::Bytes::from(vec![i as u8; 30]),
            };
            out.extend_from_slice(&f.fragment(&a, &fr).unwrap());
        }
        out
    }

    #[test]
    fn the_sample_demuxes() {
        let mut d = Fmp4Demuxer::new(LIMITS);
        assert_eq!(drive(&mut d, &sample()), 6);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
            fuzz_fmp4(&data);
            fuzz_ts(&data);
            fuzz_catalog(&data);
        }

        #[test]
        fn mutated_fmp4_never_panics(
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut data = sample();
            for (at, v) in flips {
                let i = at.index(data.len());
                data[i] = v;
            }
            let n = cut.index(data.len() + 1);
            fuzz_fmp4(&data[..n]);
        }

        #[test]
        fn json_like_catalogs_never_panic(s in r#"\{("(video|audio|clock)":\{("renditions":\{"[a-z]":\{"codec":"(avc1\.64001f|mp4a\.40\.2|opus|x)"(,"description":"[0-9a-g]{0,9}")?(,"container":\{"kind":"(legacy|cmaf|loc)"(,"init":"[A-Za-z0-9+/=]{0,12}")?\})?\}\}|"wall":[0-9]{1,20},"timescale":[0-9]{1,3})\})?\}"#) {
            fuzz_catalog(s.as_bytes());
        }
    }
}
