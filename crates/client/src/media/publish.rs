//! [`publish`]: demux, pace, package and publish.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use moqt::{FullTrackName, KeyValue, TrackNamespace};
use quichub_media::broadcast::{self, Pacer, Packager, PRIO_CATALOG};
use quichub_media::fmp4::Fmp4Demuxer;
use quichub_media::ts::TsDemuxer;
use quichub_media::{Demuxer, Event, Limits, TrackInfo};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use super::{
    unix_ms, unix_us, InputFormat, MediaPublishOptions, Note, PublishSummary, PublishedTrack, Stop,
};
use crate::{ClientSession, LocalTrack, Shaper, SubgroupWriter, TrackMode};

/// One published rendition's track and open streams; the packager has the
/// rest.
struct Rendition {
    track: Arc<LocalTrack>,
    writers: BTreeMap<u64, SubgroupWriter<'static>>,
    streams: u64,
}

/// Publishes a media broadcast read from `input` (fMP4/CMAF or MPEG-TS) on
/// `session`, until the input ends or `stop` completes; then ends the
/// tracks (and, for MSF, sends the catalog that ends the broadcast).
/// `notes` hears of each track as it is created.
pub async fn publish<R: AsyncRead + Unpin + Send>(
    session: &ClientSession,
    opts: &MediaPublishOptions,
    mut input: R,
    stop: impl Future<Output = ()> + Send,
    mut notes: impl FnMut(Note) + Send,
) -> anyhow::Result<PublishSummary> {
    let mut stop = Stop::new(stop);
    let ns = TrackNamespace::from_path(&opts.broadcast);
    let name = |t: &str| FullTrackName {
        namespace: ns.clone(),
        name: Bytes::from(t.to_string()),
    };
    let mode = opts.mode;
    let catalog_track = session
        .create_track(name(opts.format.catalog_track()), PRIO_CATALOG, mode)
        .await?;
    let shaper = opts
        .shape
        .active()
        .then(|| Shaper::start(session, opts.shape));
    if let Some(s) = &shaper {
        catalog_track.set_shaper(s.clone());
    }
    // The broadcast's namespace is published in both modes: players that
    // find broadcasts with SUBSCRIBE_NAMESPACE (moq-dev's, which then
    // subscribe to `catalog.json`) learn of a pushed one only this way.
    let _announced = session.publish_namespace(ns.clone()).await?;
    let mut demux: Option<Box<dyn Demuxer + Send>> = None;
    let mut packager: Option<Packager> = None;
    let mut renditions: Vec<Rendition> = Vec::new();
    let mut catalog = CatalogWriter {
        track: catalog_track.clone(),
        group: 0,
        current: None,
        served: 0,
    };
    let mut pacer = Pacer::default();
    // The wall clock of PTS zero in the catalog's `clock`, and whether the
    // catalog must go out (again) before the next frame.
    let mut published_wall: Option<u64> = None;
    let mut catalog_dirty = false;
    let mut eof = false;
    let limits = Limits::default();
    let mut buf = vec![0u8; 64 * 1024];
    'input: loop {
        catalog.serve_new_subscriber().await?;
        // Drain every event the demuxer has before reading more.
        while let Some(d) = demux.as_mut() {
            let ev = match d.next() {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => bail!("input: {e}"),
            };
            match ev {
                Event::Tracks(tracks) => {
                    // An input that described no track yet has no renditions.
                    match packager.as_mut().filter(|p| !p.renditions().is_empty()) {
                        None => {
                            let p = Packager::new(
                                opts.format,
                                opts.delivery,
                                opts.target_latency_ms,
                                &tracks,
                            );
                            renditions =
                                create_renditions(session, &name, &p, mode, opts, &mut notes)
                                    .await?;
                            if let Some(s) = &shaper {
                                for r in &renditions {
                                    r.track.set_shaper(s.clone());
                                }
                            }
                            packager = Some(p);
                        }
                        Some(p) => {
                            p.retrack(tracks);
                            pacer.reset();
                        }
                    }
                    // The catalog goes out before the next frame, when its
                    // clock is known.
                    catalog_dirty = true;
                }
                Event::Frame(f) => {
                    catalog.serve_new_subscriber().await?;
                    let (c, wait) =
                        pacer.pace(f.dts, opts.pace, Instant::now().into_std(), unix_us());
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                    if stop.fired() {
                        break 'input;
                    }
                    let Some(p) = packager.as_mut() else {
                        continue;
                    };
                    // Players turn PTS into wall-clock time (for the latency
                    // they show) with the catalog's clock; a re-anchored
                    // clock (paused encoder) goes out as a new catalog.
                    let wall = c.wall_of_zero();
                    if catalog_dirty || published_wall.is_none_or(|p| p.abs_diff(wall) > 50_000) {
                        // Every catalog is a complete one in a group of its
                        // own (MSF requires an independent catalog to start
                        // a new group; hang subscribers take the latest).
                        catalog.write(p.catalog(wall, unix_ms())?).await?;
                        published_wall = Some(wall);
                        catalog_dirty = false;
                    }
                    if let Some(placed) = p.frame(f)? {
                        send(&mut renditions[placed.rendition], placed, opts).await?;
                    }
                }
            }
        }
        if eof {
            break;
        }
        let read = tokio::select! {
            r = input.read(&mut buf) => r,
            _ = stop.wait() => break,
            // A stalled input must not keep a new subscriber from the catalog.
            _ = catalog.subscribed() => continue,
        };
        match read {
            Ok(0) => {
                if let Some(d) = demux.as_mut() {
                    d.end();
                }
                eof = true;
            }
            Ok(n) => {
                let data = &buf[..n];
                let d = demux.get_or_insert_with(|| match opts.input_format.resolve(data) {
                    InputFormat::Ts => Box::new(TsDemuxer::new(limits)),
                    _ => Box::new(Fmp4Demuxer::new(limits)),
                });
                d.push(data);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("read input"),
        }
    }
    let Some(packager) = packager.filter(|p| !p.renditions().is_empty()) else {
        bail!("the input ended before describing any track");
    };
    for r in &mut renditions {
        for (_, w) in std::mem::take(&mut r.writers) {
            w.finish();
        }
    }
    // PUBLISH_DONE may overtake the last streams: it carries their count,
    // and the relay waits for them before it ends the track.
    let mut tracks = Vec::new();
    for (r, p) in renditions.iter_mut().zip(packager.renditions()) {
        r.track.finish(r.streams).await?;
        tracks.push(PublishedTrack {
            name: p.name.clone(),
            codec: p.info.codec.clone(),
            frames: p.frames(),
        });
    }
    if let Some(done) = packager.final_catalog(unix_ms()) {
        catalog.write(done).await?;
    }
    catalog_track.finish(catalog.group).await?;
    let shaping = match &shaper {
        Some(s) => {
            s.drain().await;
            let st = s.stats();
            s.stop();
            Some(st)
        }
        None => None,
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(PublishSummary {
        broadcast: opts.broadcast.clone(),
        tracks,
        dropped_before_keyframe: packager.dropped_before_keyframe(),
        shaping,
    })
}

/// The catalog track and its latest version.
struct CatalogWriter {
    track: Arc<LocalTrack>,
    /// The next group to write.
    group: u64,
    /// The latest catalog object written.
    current: Option<Bytes>,
    /// SUBSCRIBEs answered when the catalog was last written.
    served: u64,
}

impl CatalogWriter {
    /// Writes `catalog` as the next group (dropped when nobody subscribes):
    /// every catalog is a complete one in a group of its own.
    async fn write(&mut self, catalog: Bytes) -> anyhow::Result<()> {
        self.served = self.track.subscriptions_served();
        if let Some(mut w) = self.track.open_subgroup(self.group, 0).await? {
            w.write(0, catalog.clone()).await?;
            w.finish();
        }
        self.group += 1;
        self.current = Some(catalog);
        Ok(())
    }

    /// Whether a SUBSCRIBE has come in since the current version was
    /// written, and objects flow to it.
    fn unserved(&self) -> bool {
        self.current.is_some()
            && self.track.subscriptions_served() > self.served
            && self.track.is_forwarding()
    }

    /// Returns once [`Self::unserved`] holds (polled: the client library
    /// counts SUBSCRIBEs but does not signal them).
    async fn subscribed(&self) {
        while !self.unserved() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// With `TrackMode::Announce` a track is sent only while the relay
    /// subscribes, so a catalog written before then never reached it and a
    /// player waits for one forever: when a SUBSCRIBE has come in since
    /// the last version was written, write it again as a new group.
    async fn serve_new_subscriber(&mut self) -> anyhow::Result<()> {
        if self.unserved() {
            if let Some(c) = self.current.take() {
                self.write(c).await?;
            }
        }
        Ok(())
    }
}

/// Creates the packager's renditions' tracks.
async fn create_renditions(
    session: &ClientSession,
    name: &impl Fn(&str) -> FullTrackName,
    packager: &Packager,
    mode: TrackMode,
    opts: &MediaPublishOptions,
    notes: &mut impl FnMut(Note),
) -> anyhow::Result<Vec<Rendition>> {
    let mut out = Vec::new();
    for r in packager.renditions() {
        let mut props = Vec::new();
        if opts.target_latency_ms > 0 {
            props.push(KeyValue::int(
                moqt::params::kind::OBJECT_DELIVERY_TIMEOUT,
                opts.target_latency_ms,
            ));
        }
        let track = session
            .create_track_with(name(&r.name), broadcast::priority(r.info.kind), mode, props)
            .await?;
        out.push(Rendition {
            track,
            writers: BTreeMap::new(),
            streams: 0,
        });
        notes(Note::Track {
            name: r.name.clone(),
            info: TrackInfo::clone(&r.info),
        });
    }
    Ok(out)
}

/// Writes a placed object: a new group ends the previous group's streams,
/// and a subgroup's stream opens with its first object (nothing is written
/// when nobody subscribes).
async fn send(
    r: &mut Rendition,
    placed: broadcast::Placed,
    opts: &MediaPublishOptions,
) -> anyhow::Result<()> {
    if placed.new_group {
        for (_, w) in std::mem::take(&mut r.writers) {
            w.finish();
        }
    }
    let (group, subgroup, prio) = (placed.group, placed.subgroup, placed.priority);
    if !r.writers.contains_key(&subgroup) {
        let opened = if opts.format == super::Format::Msf {
            r.track
                .open_subgroup_owned_with_properties(group, subgroup, prio)
                .await?
        } else {
            r.track.open_subgroup_owned(group, subgroup, prio).await?
        };
        match opened {
            Some(w) => {
                r.writers.insert(subgroup, w);
                r.streams += 1;
            }
            None => return Ok(()),
        }
    }
    if let Some(w) = r.writers.get_mut(&subgroup) {
        w.write_with_properties(placed.object, placed.properties, placed.payload)
            .await?;
    }
    Ok(())
}
