//! Data streams across the bridge: re-encoded, with resets, STOP_SENDING
//! and priorities carried over.

use super::*;

/// FETCH_HEADER's stream type (all drafts).
const FETCH_HEADER: u64 = 0x05;

/// What a data stream's copy needs besides its two ends.
pub(super) struct Pipe {
    pub(super) draft: Draft,
    pub(super) dir: Direction,
    /// FETCHes in flight: the group order of each, and the relay's Request
    /// ID where the bridge renumbered it (draft 18's fetch streams encode
    /// Group IDs relative to the order).
    pub(super) fetches: Arc<Mutex<HashMap<u64, FetchInfo>>>,
    pub(super) fail: mpsc::Sender<Fail>,
}

impl Pipe {
    /// A stream that does not translate. The peer's garbage is a protocol
    /// violation (the draft closes the session on a malformed data stream);
    /// what only has no form in the other draft (draft 14's "does not
    /// exist" status as a subgroup's first object, a value of 2^62 or more)
    /// loses that stream.
    async fn failed(&self, e: TranscodeError, from: &mut RecvStream, to: &mut SendStream) {
        let code = match (&e, self.dir) {
            (TranscodeError::Unsupported(_), _) | (_, Direction::ToLegacy) => reset::INTERNAL_ERROR,
            (_, Direction::ToModern) => {
                let _ = self
                    .fail
                    .send(Fail::protocol(format!("data stream: {e}")))
                    .await;
                reset::MALFORMED_TRACK
            }
        };
        let _ = from.stop(code);
        let _ = to.reset(map_reset(self.draft, self.dir, code));
    }
}

/// Copies one data stream across, re-encoding it; resets and STOP_SENDING
/// travel with it.
pub(super) async fn pipe(
    mut from: RecvStream,
    mut to: SendStream,
    mut t: StreamTranscoder,
    p: Pipe,
) {
    let mut out = Vec::new();
    // The draft-18 stream header, kept to give the stream towards a legacy
    // peer the publisher's priority (the relay's own scheduling of it stays
    // on the in-memory session).
    let mut header = Vec::new();
    loop {
        let chunk = tokio::select! {
            r = from.read_chunk(64 * 1024) => r,
            s = to.stopped() => {
                let code = s.ok().flatten().unwrap_or(reset::CANCELLED);
                // STOP_SENDING goes the other way: back to the source's draft.
                let back = match p.dir {
                    Direction::ToModern => Direction::ToLegacy,
                    Direction::ToLegacy => Direction::ToModern,
                };
                let _ = from.stop(map_reset(p.draft, back, code));
                return;
            }
        };
        match chunk {
            Ok(Some(mut c)) => {
                // The header a byte at a time (a few bytes), so a fetch
                // stream's group order is set before its first object.
                while !t.header_done() && !c.is_empty() {
                    let b = c.split_to(1);
                    if p.dir == Direction::ToLegacy {
                        header.push(b[0]);
                    }
                    if let Err(e) = t.push(b, &mut out) {
                        return p.failed(e, &mut from, &mut to).await;
                    }
                    if t.header_done() && t.fetch_request_id().is_none() && !header.is_empty() {
                        if let Ok(h) = moqt::data::SubgroupHeader::decode(&mut &header[..]) {
                            // Subscriber priority and group order are the
                            // subscription's, which the bridge does not
                            // track by alias: the defaults.
                            let _ = to.set_priority(moqt::priority::stream_priority(
                                DEFAULT_PRIORITY,
                                h.priority.unwrap_or(DEFAULT_PRIORITY),
                                h.group,
                                moqt::GroupOrder::Ascending,
                            ));
                        }
                    }
                    if let (true, Some(id)) = (t.header_done(), t.fetch_request_id()) {
                        let info = p.fetches.lock().expect("fetches").remove(&id);
                        if let Some(info) = info {
                            t.set_descending(info.descending);
                            // The peer answers the bridge's Request ID; the
                            // relay waits for its own.
                            if let Some(relay_id) = info.relay_id {
                                out.clear();
                                let mut h = BytesMut::with_capacity(10);
                                moqt::coding::put_vi64(&mut h, FETCH_HEADER);
                                moqt::coding::put_vi64(&mut h, relay_id);
                                out.push(h.freeze());
                            }
                        }
                    }
                }
                if let Err(e) = t.push(c, &mut out) {
                    return p.failed(e, &mut from, &mut to).await;
                }
                for piece in out.drain(..) {
                    if to.write_chunk(piece).await.is_err() {
                        let _ = from.stop(reset::CANCELLED);
                        return;
                    }
                }
            }
            Ok(None) => {
                match t.finish() {
                    Ok(()) => {
                        let _ = to.finish();
                    }
                    Err(e) => p.failed(e, &mut from, &mut to).await,
                }
                return;
            }
            Err(e) => {
                let code = reset_code(&e).unwrap_or(reset::INTERNAL_ERROR);
                let _ = to.reset(map_reset(p.draft, p.dir, code));
                return;
            }
        }
    }
}

/// A RESET_STREAM or STOP_SENDING code, from the draft of one side to the
/// other's: draft 16 has UNKNOWN_OBJECT_STATUS at 0x4, where draft 18 put
/// GOING_AWAY (and moved UNKNOWN_OBJECT_STATUS to 0x6); draft 14 stops at
/// 0x3. Codes a side does not define become INTERNAL_ERROR.
pub(super) fn map_reset(draft: Draft, dir: Direction, code: u32) -> u32 {
    const D16_UNKNOWN_OBJECT_STATUS: u32 = 0x4;
    match (dir, draft, code) {
        (_, _, c @ 0x0..=0x3) => c,
        (Direction::ToModern, Draft::D16, D16_UNKNOWN_OBJECT_STATUS) => {
            reset::UNKNOWN_OBJECT_STATUS
        }
        (Direction::ToModern, Draft::D16, reset::MALFORMED_TRACK) => reset::MALFORMED_TRACK,
        (Direction::ToLegacy, _, reset::GOING_AWAY) => reset::SESSION_CLOSED,
        (Direction::ToLegacy, Draft::D16, reset::UNKNOWN_OBJECT_STATUS) => {
            D16_UNKNOWN_OBJECT_STATUS
        }
        (Direction::ToLegacy, Draft::D16, reset::MALFORMED_TRACK) => reset::MALFORMED_TRACK,
        _ => reset::INTERNAL_ERROR,
    }
}

/// The RESET_STREAM code behind a read error, if the peer reset the stream.
fn reset_code(e: &crate::mux::Error) -> Option<u32> {
    match e {
        crate::mux::Error::Read(web_transport_quinn::ReadError::Reset(c)) => Some(*c),
        crate::mux::Error::Qmux(qmux::Error::StreamReset(c)) => u32::try_from(c.into_inner()).ok(),
        _ => None,
    }
}
