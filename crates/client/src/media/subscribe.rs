//! [`subscribe`]: read the catalog, subscribe the renditions, write fMP4.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use moqt::message::FetchKind;
use moqt::{FullTrackName, Parameters, SubscriptionFilter};
use quichub_media::hang;
use quichub_media::msf;
use quichub_media::playback::{catalog_update, AnyCatalog, CatalogChange, Decoder, Muxer};
use quichub_media::reorder::{Held, Reorder, REORDER_WAIT};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{MediaSubscribeOptions, Note, PlayedRendition, Stop, SubscribeError, SubscribeSummary};
use crate::{ClientSession, SubscribeOptions, Subscription, SubscriptionEvent};

/// One object as the subscription tasks pass it on.
#[derive(Clone, Debug, Default)]
struct Obj {
    payload: Bytes,
    /// The object's property block (LOC's metadata).
    properties: Bytes,
}

impl Held for Obj {
    fn size(&self) -> usize {
        self.payload.len() + self.properties.len()
    }
}

/// What the subscription tasks pass to the writer.
enum Arrival {
    /// (group, subgroup (`None` if fetched), object, the object).
    Object(u64, Option<u64>, u64, Obj),
    /// A subgroup stream ended: (group, subgroup).
    SubgroupEnd(u64, u64),
    /// The subscription ended.
    Done,
    /// Time to give up on old gaps.
    Tick,
}

/// One subscribed rendition on the subscriber side.
struct Output {
    decoder: Decoder,
    reorder: Reorder<Obj>,
    frames: u64,
}

/// The next event of either of (at most) two subscriptions, with its index.
async fn next_of(subs: &mut [(bool, Subscription)]) -> (usize, Option<SubscriptionEvent>) {
    match subs {
        [] => std::future::pending().await,
        [(_, a)] => (0, a.next().await),
        [(_, a), (_, b), ..] => tokio::select! {
            ev = a.next() => (0, ev),
            ev = b.next() => (1, ev),
        },
    }
}

/// The current catalog of a subscription just accepted, if it started after
/// the catalog was written: a Joining FETCH of the latest group (MSF: object
/// 0 and the delta updates after it, as §Catalog asks; hang: its last
/// object). `None` when it has none, or none that lists a track.
async fn joined_catalog(
    session: &ClientSession,
    is_msf: bool,
    sub: &Subscription,
) -> anyhow::Result<Option<AnyCatalog>> {
    if sub.largest.is_none() {
        return Ok(None);
    }
    let r = session
        .fetch(
            FetchKind::RelativeJoining {
                joining_request_id: sub.request_id,
                joining_start: 0,
            },
            Parameters::default(),
        )
        .await?;
    let objects: Vec<_> = if is_msf {
        r.objects
    } else {
        r.objects.into_iter().last().into_iter().collect()
    };
    let mut catalog = None;
    for o in objects.iter().filter(|o| !o.payload.is_empty()) {
        AnyCatalog::read(&mut catalog, is_msf, &o.payload)?;
    }
    Ok(catalog.filter(|c| !c.track_names().is_empty()))
}

/// What [`first_catalog`] waits on next.
enum CatalogStep {
    /// The answer to the SUBSCRIBE for MSF's (`true`) or hang's catalog.
    Answer(bool, anyhow::Result<Subscription>),
    /// An event of the accepted subscription at this index.
    Event(usize, Option<SubscriptionEvent>),
    /// `stop` fired.
    Stop,
}

/// The current catalog of `broadcast`, with its subscription and whether it
/// is MSF's. Both catalog tracks a broadcast may have, MSF's `catalog` and
/// hang's `catalog.json`, are asked for at once (a subscriber started
/// before the publisher waits for it with RENDEZVOUS_TIMEOUT), and the
/// first catalog that arrives on either decides: an acceptance proves
/// little, as a moq-lite publisher (`@moq/publish`, through the relay's
/// bridge) accepts any track name and only then resets the one it lacks. A
/// catalog that lists no track yet (`@moq/publish`'s first, `{}`, before
/// its encoders are configured) is waited past; a subscription that ends
/// without a catalog is dropped, the other cancelled once one wins.
/// `Ok(None)` when `stop` came first.
async fn first_catalog<F: Future<Output = ()>>(
    session: &ClientSession,
    broadcast: &str,
    opts: SubscribeOptions,
    stop: &mut Stop<F>,
) -> Result<Option<(bool, Subscription, AnyCatalog)>, SubscribeError> {
    let m = session.subscribe(
        FullTrackName::new(broadcast, msf::CATALOG_TRACK),
        opts.clone(),
    );
    let h = session.subscribe(FullTrackName::new(broadcast, hang::CATALOG_TRACK), opts);
    tokio::pin!(m, h);
    let (mut m_open, mut h_open) = (true, true);
    // The accepted subscriptions and what each has read of its catalog.
    let mut subs: Vec<(bool, Subscription)> = Vec::new();
    let mut catalogs: Vec<Option<AnyCatalog>> = Vec::new();
    let mut refused = None;
    let mut accepted = false;
    let (i, catalog) = loop {
        if subs.is_empty() && !m_open && !h_open {
            if accepted {
                return Err(anyhow::anyhow!("the broadcast ended before its catalog").into());
            }
            let e: anyhow::Error = refused.unwrap_or_else(|| anyhow::anyhow!("refused"));
            return Err(e
                .context(format!(
                    "subscribe to {broadcast}/{} or {broadcast}/{}",
                    msf::CATALOG_TRACK,
                    hang::CATALOG_TRACK
                ))
                .into());
        }
        let step = tokio::select! {
            r = &mut m, if m_open => CatalogStep::Answer(true, r),
            r = &mut h, if h_open => CatalogStep::Answer(false, r),
            (i, ev) = next_of(&mut subs), if !subs.is_empty() => CatalogStep::Event(i, ev),
            _ = stop.wait() => CatalogStep::Stop,
        };
        match step {
            CatalogStep::Stop => return Ok(None),
            CatalogStep::Answer(is_msf, r) => {
                if is_msf {
                    m_open = false;
                } else {
                    h_open = false;
                }
                match r {
                    Ok(sub) => {
                        accepted = true;
                        let joined = tokio::select! {
                            r = joined_catalog(session, is_msf, &sub) => r,
                            _ = stop.wait() => return Ok(None),
                        };
                        match joined {
                            Ok(Some(c)) => {
                                subs.push((is_msf, sub));
                                break (subs.len() - 1, c);
                            }
                            Ok(None) => {
                                subs.push((is_msf, sub));
                                catalogs.push(None);
                            }
                            // The other catalog track may still have one.
                            Err(e) => {
                                sub.cancel();
                                refused = Some(e);
                            }
                        }
                    }
                    Err(e) => refused = Some(e),
                }
            }
            CatalogStep::Event(i, Some(SubscriptionEvent::Object(o))) if !o.payload.is_empty() => {
                let is_msf = subs[i].0;
                AnyCatalog::read(&mut catalogs[i], is_msf, &o.payload)
                    .map_err(anyhow::Error::from)?;
                if let Some(c) = catalogs[i].take_if(|c| !c.track_names().is_empty()) {
                    break (i, c);
                }
            }
            CatalogStep::Event(i, Some(SubscriptionEvent::Done { .. }) | None) => {
                subs.remove(i).1.cancel();
                catalogs.remove(i);
            }
            CatalogStep::Event(..) => {}
        }
    };
    let (is_msf, sub) = subs.remove(i);
    for (_, other) in subs {
        other.cancel();
    }
    Ok(Some((is_msf, sub, catalog)))
}

/// Subscribes to a media broadcast on `session` and writes it to `output`
/// as fragmented MP4 (an init segment, one fragment per frame), until the
/// broadcast ends, `opts.count` frames are written, the reader of `output`
/// leaves (a broken pipe), or `stop` completes. `notes` hears of the
/// catalog, the renditions chosen and catalog updates.
///
/// `Ok(None)`: `stop` completed before the catalog arrived, so nothing was
/// played.
pub async fn subscribe<W: AsyncWrite + Unpin + Send>(
    session: &ClientSession,
    opts: &MediaSubscribeOptions,
    mut output: W,
    stop: impl Future<Output = ()> + Send,
    mut notes: impl FnMut(Note) + Send,
) -> Result<Option<SubscribeSummary>, SubscribeError> {
    let mut stop = Stop::new(stop);
    let broadcast = opts.broadcast.as_str();
    let rendezvous_ms = (opts.rendezvous_ms > 0).then_some(opts.rendezvous_ms);
    let sub_opts = SubscribeOptions {
        rendezvous_ms,
        ..Default::default()
    };
    let Some((is_msf, mut cat_sub, catalog)) =
        first_catalog(session, broadcast, sub_opts, &mut stop).await?
    else {
        return Ok(None);
    };
    let chosen = catalog
        .choose(opts.video.as_deref(), opts.audio.as_deref())
        .with_context(|| format!("broadcast {broadcast}"))?;
    notes(Note::Catalog { msf: is_msf });
    let mut outputs = Vec::new();
    for (i, c) in chosen.into_iter().enumerate() {
        let decoder = Decoder::new(&c, i as u32 + 1).map_err(anyhow::Error::from)?;
        notes(Note::Rendition {
            name: c.name.clone(),
            info: decoder.info().clone(),
        });
        outputs.push((
            c.name,
            Output {
                decoder,
                reorder: Reorder::default(),
                frames: 0,
            },
        ));
    }

    // Subscribe each rendition from the latest object, and fetch the
    // current group up to it, so output starts at the GOP's keyframe at once.
    // The tasks end with the subscriptions, or when this future is done or
    // dropped (the JoinSets abort them).
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Arrival)>();
    let mut subs = JoinSet::new();
    for (i, (track_name, _)) in outputs.iter().enumerate() {
        let name = FullTrackName::new(broadcast, track_name);
        let mut sub = session
            .subscribe(
                name,
                SubscribeOptions {
                    filter: Some(SubscriptionFilter::LargestObject),
                    rendezvous_ms,
                    ..Default::default()
                },
            )
            .await
            .with_context(|| format!("subscribe to {track_name}"))?;
        if sub.largest.is_some() {
            // Objects go to the muxer as they arrive: the group's keyframe
            // plays before the rest of the group is in.
            let mut r = session
                .fetch_stream(
                    FetchKind::RelativeJoining {
                        joining_request_id: sub.request_id,
                        joining_start: 0,
                    },
                    Parameters::default(),
                )
                .await?;
            while let Some(o) = r.next().await? {
                let obj = Obj {
                    payload: o.payload,
                    properties: o.properties,
                };
                let _ = tx.send((i, Arrival::Object(o.group, None, o.object_id, obj)));
            }
        }
        let tx = tx.clone();
        subs.spawn(async move {
            while let Some(ev) = sub.next().await {
                match ev {
                    SubscriptionEvent::Object(o) => {
                        let obj = Obj {
                            payload: o.payload,
                            properties: o.properties,
                        };
                        let a = Arrival::Object(o.group, o.subgroup, o.object_id, obj);
                        if tx.send((i, a)).is_err() {
                            break;
                        }
                    }
                    SubscriptionEvent::SubgroupEnd {
                        group, subgroup, ..
                    } => {
                        let _ = tx.send((i, Arrival::SubgroupEnd(group, subgroup)));
                    }
                    SubscriptionEvent::Done { .. } => break,
                }
            }
            let _ = tx.send((i, Arrival::Done));
            sub.cancel();
        });
    }
    drop(tx);
    // Catalog updates keep coming on the catalog subscription: read them
    // (and say what changed) while the media plays.
    let (cat_tx, mut cat_rx) = tokio::sync::mpsc::unbounded_channel::<Option<Bytes>>();
    subs.spawn(async move {
        while let Some(ev) = cat_sub.next().await {
            let payload = match ev {
                SubscriptionEvent::Object(o) => o.payload,
                SubscriptionEvent::Done { .. } => break,
                _ => continue,
            };
            if !payload.is_empty() && cat_tx.send(Some(payload)).is_err() {
                break;
            }
        }
        let _ = cat_tx.send(None);
        cat_sub.cancel();
    });
    let mut catalog = Some(catalog);
    let mut catalog_open = true;
    let mut open = outputs.len();
    let mut written = 0u64;
    // Frames wait in the muxer until every output knows its decoder
    // configuration (LOC), so the init segment is written first.
    let mut muxer = Muxer::new();
    let result: anyhow::Result<()> = async {
        let mut tick = tokio::time::interval(REORDER_WAIT / 4);
        // Once the media has ended, a moment more for the catalog's last
        // word (MSF's isComplete), which comes after the tracks end.
        let mut linger: Option<Instant> = None;
        while open > 0 || (catalog_open && linger.is_none_or(|l| Instant::now() < l)) {
            if open == 0 && linger.is_none() {
                linger = Some(Instant::now() + Duration::from_secs(1));
            }
            let msg = tokio::select! {
                m = rx.recv(), if open > 0 => m,
                c = cat_rx.recv(), if catalog_open => {
                    match c.flatten() {
                        Some(p) => match catalog_update(&mut catalog, is_msf, &p) {
                            CatalogChange::None => {}
                            change => notes(Note::CatalogUpdate(change)),
                        },
                        None => catalog_open = false,
                    }
                    continue;
                }
                _ = tick.tick() => Some((usize::MAX, Arrival::Tick)),
                _ = stop.wait() => break,
            };
            let Some((i, arrival)) = msg else { break };
            let now = Instant::now().into_std();
            let ready: Vec<(usize, bool, Obj)> = match arrival {
                Arrival::Object(group, subgroup, object, obj) => outputs[i]
                    .1
                    .reorder
                    .object(group, subgroup, object, obj, now)
                    .into_iter()
                    .map(|(s, p)| (i, s, p))
                    .collect(),
                Arrival::SubgroupEnd(group, subgroup) => outputs[i]
                    .1
                    .reorder
                    .subgroup_end(group, subgroup, now)
                    .into_iter()
                    .map(|(s, p)| (i, s, p))
                    .collect(),
                Arrival::Done => {
                    open -= 1;
                    outputs[i]
                        .1
                        .reorder
                        .release(true, now)
                        .into_iter()
                        .map(|(s, p)| (i, s, p))
                        .collect()
                }
                Arrival::Tick => {
                    let mut v = Vec::new();
                    for (j, (_, o)) in outputs.iter_mut().enumerate() {
                        v.extend(
                            o.reorder
                                .release(false, now)
                                .into_iter()
                                .map(|(s, p)| (j, s, p)),
                        );
                    }
                    v
                }
            };
            for (i, starts_group, obj) in ready {
                let o = &mut outputs[i].1;
                for f in o
                    .decoder
                    .decode(starts_group, obj.payload, &obj.properties)?
                {
                    muxer.push(i, f);
                }
            }
            if !muxer.is_started() {
                let decoders: Vec<(&str, &Decoder)> = outputs
                    .iter()
                    .map(|(n, o)| (n.as_str(), &o.decoder))
                    .collect();
                if let Some(init) = muxer.init(&decoders)? {
                    output.write_all(&init).await?;
                }
            }
            while let Some((i, frag)) = muxer.next_fragment(|i| outputs[i].1.decoder.info())? {
                let w = match output.write_all(&frag).await {
                    Ok(()) => output.flush().await,
                    e => e,
                };
                match w {
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                    r => r.context("write output")?,
                }
                outputs[i].1.frames += 1;
                written += 1;
                if opts.count.is_some_and(|c| written >= c) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
    .await;
    subs.abort_all();
    // What a buffered writer still holds (the init segment alone, say).
    let _ = output.flush().await;
    let summary = SubscribeSummary {
        renditions: outputs
            .iter()
            .map(|(n, o)| PlayedRendition {
                name: n.clone(),
                frames: o.frames,
                late: o.reorder.late(),
            })
            .collect(),
    };
    match result {
        Ok(()) => Ok(Some(summary)),
        Err(error) => Err(SubscribeError {
            written: Some(summary),
            error,
        }),
    }
}
