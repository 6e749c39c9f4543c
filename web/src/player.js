// The player of /watch/{broadcast}: MoQT over WebTransport, the hang
// catalog, WebCodecs decoding, video on a canvas and audio through Web
// Audio on one playout clock, with live latency and a stats overlay.
//
// Containers: "legacy" (a QUIC varint timestamp and the frame) and "cmaf"
// (one moof+mdat fragment per frame, the init segment in the catalog).
//
// Playout: a frame with timestamp `pts` (µs) is due at performance time
// `pts / 1000 + offset` (ms). `offset` is set by the first frame so that it
// plays `BUFFER_MS` after it arrived, grows when a frame arrives too late
// to be on time and slowly shrinks back when frames come early; audio is scheduled on the AudioContext at the same due
// times, which keeps the two in sync.
//
// Latency: the wall-clock time of the frame on screen is the catalog's
// `clock` (hang: `wall`, the time of PTS zero since the MoQ epoch
// 2020-01-01, in `timescale` units; quichub's publisher writes it) plus its
// PTS, or the PTS itself when it is already wall-clock microseconds since
// the Unix epoch. The latency shown is the relay's clock (estimated from
// /v1/time) minus that. Without either only the playout buffer is known,
// and is shown as such.

import { Session, relayInfo, relayUrl, relayWebSocketUrl, clockOffset } from './session.js';
import { openWebSocket } from './websocket.js';
import { CATALOG_TRACK, parseCatalog, decodeFrame, containerSupported } from './hang.js';
import { FILTER } from './moqt.js';
import { Reorder } from './reorder.js';

const BUFFER_MS = 50;
/** Timestamps above this (µs) are taken as Unix-epoch wall clock (after 2001-09-09). */
const WALLCLOCK_US = 1e15;
/** The MoQ epoch (2020-01-01T00:00:00Z) in µs since the Unix epoch. */
const MOQ_EPOCH_US = 1_577_836_800_000_000;

/** Unix µs of PTS zero from a hang catalog's `clock`, or null. */
export function clockZeroUs(raw) {
  const c = raw && raw.clock;
  if (!c || typeof c.wall !== 'number' || !Number.isSafeInteger(c.wall) || c.wall < 0) return null;
  const scale = c.timescale === undefined ? 1_000_000 : c.timescale;
  if (typeof scale !== 'number' || !(scale > 0)) return null;
  return MOQ_EPOCH_US + (c.wall * 1_000_000) / scale;
}

const $ = (id) => document.getElementById(id);

const stats = {
  state: 'starting',
  decodeErrors: 0,
  lastDecodeError: null,
  broadcast: '',
  videoCodec: null,
  audioCodec: null,
  videoObjects: 0,
  audioObjects: 0,
  videoBytes: 0,
  audioBytes: 0,
  decodedFrames: 0,
  renderedFrames: 0,
  droppedFrames: 0,
  decodedAudio: 0,
  playedAudio: 0,
  droppedAudio: 0,
  latencyMs: null,
  avSyncMs: null,
  firstFrameMs: null,
  catchUpObjects: 0,
  bufferMs: 0,
  bitrateKbps: 0,
  width: 0,
  height: 0,
  wallclock: false,
  transport: null,
  error: null,
};
// For tests and curious users: `window.quichubPlayer.stats`.
window.quichubPlayer = { stats };

function setState(s, err) {
  stats.state = s;
  $('state').textContent = s;
  if (err) {
    stats.error = String(err && err.message ? err.message : err);
    $('error').textContent = stats.error;
    console.error(err);
  }
}

function broadcastFromPath() {
  const raw = location.pathname.slice('/watch/'.length);
  let name;
  try {
    name = decodeURIComponent(raw);
  } catch {
    name = raw;
  }
  return name.replace(/^\/+|\/+$/g, '');
}

class Player {
  constructor(session, namespace, clockOffsetMs) {
    this.session = session;
    this.namespace = namespace;
    this.clockOffsetMs = clockOffsetMs;
    this.offset = null; // ms: due(perf) = pts/1000 + offset
    this.frames = []; // decoded VideoFrames waiting for their due time
    this.canvas = $('video');
    this.ctx2d = this.canvas.getContext('2d');
    this.video = null;
    this.audio = null;
    this.catalogGroup = -1;
    this.subs = [];
    this.lastShownPts = null;
    this.zeroUs = null;
    this.waitKey = true;
    this.lastVideo = -1;
    this.catchUpPts = null;
    this.catchUpFrame = null;
    this.audioCtx = null;
    this.bytesWindow = [];
    requestAnimationFrame(() => this.render());
    setInterval(() => this.tick(), 250);
  }

  async start() {
    setState('catalog');
    const onCatalog = (o) => {
      if (o.status !== 0 || o.objectId !== 0 || o.group <= this.catalogGroup) return;
      this.catalogGroup = o.group;
      this.onCatalog(o.payload).catch((e) => setState('error', e));
    };
    const sub = await this.session.subscribe(this.namespace, CATALOG_TRACK, onCatalog);
    this.subs.push(sub);
    // The current catalog was published before we came: fetch its group.
    if (sub.largest) {
      const objs = await this.session.fetchJoining(sub, 0);
      for (const o of objs) onCatalog({ ...o, status: 0 });
    }
    sub.done.then((d) => {
      if (d) setState(`ended: ${d.reason || 'publisher done'}`);
    });
  }

  async onCatalog(bytes) {
    const cat = parseCatalog(bytes);
    $('catalog').textContent = JSON.stringify(cat.raw, null, 1);
    this.zeroUs = clockZeroUs(cat.raw);
    const video = await pick(cat.video, async (r) => {
      if (!containerSupported(r)) return false;
      const s = await VideoDecoder.isConfigSupported(videoConfig(r));
      return s.supported;
    });
    const audio = await pick(cat.audio, async (r) => {
      if (!containerSupported(r)) return false;
      const s = await AudioDecoder.isConfigSupported(audioConfig(r));
      return s.supported;
    });
    if (!video && !audio) {
      setState('error', new Error('no rendition in the catalog that this browser decodes (legacy or cmaf container)'));
      return;
    }
    if (video && (!this.video || this.video.track !== video.track)) await this.startVideo(video);
    if (audio && (!this.audio || this.audio.track !== audio.track)) await this.startAudio(audio);
    setState('playing');
  }

  async startVideo(r) {
    stats.videoCodec = r.codec;
    this.video = r;
    this.waitKey = true;
    this.videoDecoder = this.newVideoDecoder(r);
    // A group may come on several subgroup streams: decode in Object ID order.
    this.videoOrder = new Reorder((o) => this.onVideoObject(o));
    const sub = await this.session.subscribe(
      this.namespace,
      r.track,
      (o) => this.videoOrder.push(o),
      { subscriberPriority: 2, filter: { type: FILTER.LARGEST_OBJECT } },
    );
    this.subs.push(sub);
    // Start at once: the current group up to the subscription's start, by a
    // joining FETCH, is decoded to catch up (only its last frame is shown);
    // the reorder buffer puts it before the live objects of the same group.
    if (sub.largest) {
      this.session
        .fetchJoining(sub, 0)
        .then((objs) => {
          stats.catchUpObjects = objs.length;
          for (const o of objs) this.videoOrder.push({ ...o, status: 0, fetched: true });
        })
        .catch((e) => console.warn('joining fetch:', e));
    }
  }

  /** A decoder for `r`; after an error (it is then closed) the next keyframe makes a new one. */
  newVideoDecoder(r) {
    const dec = new VideoDecoder({
      output: (f) => {
        stats.decodedFrames++;
        if (this.catchUpPts !== null && f.timestamp <= this.catchUpPts) {
          // Decoded only to reach the live frames: keep the latest to show now.
          if (this.catchUpFrame) this.catchUpFrame.close();
          this.catchUpFrame = f;
          return;
        }
        this.catchUpPts = null; // frames come out in order: catching up is over
        this.frames.push(f);
        if (this.frames.length > 60) {
          this.frames.shift().close();
          stats.droppedFrames++;
        }
      },
      error: (e) => {
        stats.decodeErrors++;
        stats.lastDecodeError = String(e && e.message);
        console.warn('video decoder:', e);
        this.waitKey = true;
      },
    });
    dec.configure(videoConfig(r));
    return dec;
  }

  onVideoObject(o) {
    if (o.status !== 0 || o.payload.length === 0) return;
    stats.videoObjects++;
    stats.videoBytes += o.payload.length;
    this.bytesWindow.push([performance.now(), o.payload.length]);
    const key = o.objectId === 0;
    if (this.waitKey && !key) return; // a group joined midway: wait for the next keyframe
    if (!key && o.objectId !== this.lastVideo + 1) {
      // A frame the reorder buffer gave up on: what follows may not decode.
      stats.droppedFrames++;
    }
    this.lastVideo = o.objectId;
    this.waitKey = false;
    const { timestamp, data } = decodeFrame(this.video, o.payload);
    if (o.fetched) this.catchUpPts = Math.max(this.catchUpPts ?? -Infinity, timestamp);
    else this.noteArrival(timestamp);
    if (this.videoDecoder.state === 'closed') {
      if (!key) return;
      this.videoDecoder = this.newVideoDecoder(this.video);
    }
    if (this.videoDecoder.decodeQueueSize > 30) {
      // Far behind: drop until the next keyframe.
      stats.droppedFrames++;
      this.waitKey = true;
      return;
    }
    this.videoDecoder.decode(new EncodedVideoChunk({ type: key ? 'key' : 'delta', timestamp, data }));
  }

  async startAudio(r) {
    stats.audioCodec = r.codec;
    this.audio = r;
    this.audioCtx = new AudioContext({ sampleRate: r.sampleRate || 48000, latencyHint: 'interactive' });
    const unmute = $('unmute');
    if (this.audioCtx.state !== 'running') {
      unmute.hidden = false;
      unmute.onclick = () => {
        this.audioCtx.resume();
        unmute.hidden = true;
      };
    }
    this.audioDecoder = this.newAudioDecoder(r);
    const sub = await this.session.subscribe(this.namespace, r.track, (o) => this.onAudioObject(o), {
      subscriberPriority: 1,
      filter: { type: FILTER.LARGEST_OBJECT },
    });
    this.subs.push(sub);
  }

  newAudioDecoder(r) {
    const dec = new AudioDecoder({
      output: (d) => this.playAudio(d),
      error: (e) => {
        stats.decodeErrors++;
        stats.lastDecodeError = String(e && e.message);
        console.warn('audio decoder:', e);
      },
    });
    dec.configure(audioConfig(r));
    return dec;
  }

  onAudioObject(o) {
    if (o.status !== 0 || o.payload.length === 0) return;
    stats.audioObjects++;
    stats.audioBytes += o.payload.length;
    this.bytesWindow.push([performance.now(), o.payload.length]);
    const { timestamp, data } = decodeFrame(this.audio, o.payload);
    // Fetched objects (the current group, from the relay's cache) are old
    // by design: they must not set how far behind live playout runs.
    if (!o.fetched) this.noteArrival(timestamp);
    if (this.audioDecoder.state === 'closed') this.audioDecoder = this.newAudioDecoder(this.audio);
    this.audioDecoder.decode(new EncodedAudioChunk({ type: 'key', timestamp, data }));
  }

  /**
   * Keeps every frame on time: the offset grows at once when one arrives
   * late, and shrinks by at most 20 ms every 2 s towards what the latest
   * frame of that window needed (each frame still `BUFFER_MS` early), so a
   * burst of jitter does not add latency for good.
   */
  noteArrival(pts) {
    const now = performance.now();
    const needed = now - pts / 1000 + BUFFER_MS;
    if (this.offset === null || needed > this.offset + BUFFER_MS) {
      this.offset = needed;
      stats.wallclock = pts > WALLCLOCK_US;
      this.windowMax = needed;
      this.windowStart = now;
      return;
    }
    this.windowMax = Math.max(this.windowMax, needed);
    if (now - this.windowStart >= 2000) {
      if (this.windowMax < this.offset - 5) this.offset = Math.max(this.windowMax, this.offset - 20);
      this.windowMax = -Infinity;
      this.windowStart = now;
    }
  }

  playAudio(d) {
    stats.decodedAudio++;
    const ctx = this.audioCtx;
    if (!ctx || ctx.state !== 'running' || this.offset === null) {
      stats.droppedAudio++;
      d.close();
      return;
    }
    const ts = ctx.getOutputTimestamp();
    const duePerf = d.timestamp / 1000 + this.offset;
    const when = ts.contextTime + (duePerf - ts.performanceTime) / 1000;
    if (when < ctx.currentTime) {
      stats.droppedAudio++;
      d.close();
      return;
    }
    const buf = ctx.createBuffer(d.numberOfChannels, d.numberOfFrames, d.sampleRate);
    for (let c = 0; c < d.numberOfChannels; c++) {
      const plane = new Float32Array(d.numberOfFrames);
      d.copyTo(plane, { planeIndex: c, format: 'f32-planar' });
      buf.copyToChannel(plane, c);
    }
    d.close();
    const src = ctx.createBufferSource();
    src.buffer = buf;
    src.connect(ctx.destination);
    src.start(when);
    stats.playedAudio++;
  }

  draw(frame) {
    if (this.canvas.width !== frame.displayWidth || this.canvas.height !== frame.displayHeight) {
      this.canvas.width = frame.displayWidth;
      this.canvas.height = frame.displayHeight;
    }
    stats.width = frame.displayWidth;
    stats.height = frame.displayHeight;
    this.ctx2d.drawImage(frame, 0, 0);
    if (stats.firstFrameMs === null) stats.firstFrameMs = Math.round(performance.now());
  }

  render() {
    requestAnimationFrame(() => this.render());
    if (this.catchUpFrame) {
      if (this.lastShownPts === null) this.draw(this.catchUpFrame);
      this.catchUpFrame.close();
      this.catchUpFrame = null;
    }
    if (this.offset === null || this.frames.length === 0) return;
    const now = performance.now();
    // The latest frame that is due; the ones before it were never shown.
    let show = null;
    while (this.frames.length && this.frames[0].timestamp / 1000 + this.offset <= now) {
      if (show) {
        show.close();
        stats.droppedFrames++;
      }
      show = this.frames.shift();
    }
    if (!show) return;
    this.draw(show);
    // How late the frame is on its due time: audio plays at its due time on
    // the output device, so this is the audio/video offset.
    const late = now - (show.timestamp / 1000 + this.offset);
    this.lateSum = (this.lateSum || 0) + late;
    this.lateN = (this.lateN || 0) + 1;
    this.lastShownPts = show.timestamp;
    stats.renderedFrames++;
    show.close();
  }

  tick() {
    const now = performance.now();
    this.bytesWindow = this.bytesWindow.filter(([t]) => now - t < 1000);
    stats.bitrateKbps = Math.round(this.bytesWindow.reduce((a, [, n]) => a + n, 0) * 8 / 1000);
    const last = this.frames[this.frames.length - 1];
    stats.bufferMs = last && this.offset !== null ? Math.max(0, Math.round(last.timestamp / 1000 + this.offset - now)) : 0;
    const zero = stats.wallclock ? 0 : this.zeroUs;
    if (this.lastShownPts !== null && zero !== null && zero !== undefined) {
      const relayNowUs = (Date.now() + this.clockOffsetMs) * 1000;
      stats.latencyMs = Math.round((relayNowUs - zero - this.lastShownPts) / 1000);
      $('latency').textContent = `${stats.latencyMs} ms`;
    } else if (this.lastShownPts !== null) {
      stats.latencyMs = null;
      $('latency').textContent = `n/a (timestamps are not wall clock; buffer ${stats.bufferMs} ms)`;
    }
    if (this.lateN) {
      stats.avSyncMs = Math.round(this.lateSum / this.lateN);
      this.lateSum = 0;
      this.lateN = 0;
    }
    if (this.videoOrder) {
      stats.reorderLate = this.videoOrder.late;
      stats.reorderSkipped = this.videoOrder.skipped;
    }
    $('bitrate').textContent = `${stats.bitrateKbps} kbit/s`;
    $('dropped').textContent = `${stats.droppedFrames} video, ${stats.droppedAudio} audio`;
    $('buffer').textContent = `${stats.bufferMs} ms`;
    $('frames').textContent = `${stats.decodedFrames} decoded, ${stats.renderedFrames} shown`;
    $('codecs').textContent = `${stats.videoCodec || '-'} ${stats.width}x${stats.height}, ${stats.audioCodec || '-'}`;
    $('sync').textContent = stats.audioCodec && stats.avSyncMs !== null ? `video ${stats.avSyncMs} ms behind audio` : '-';
  }
}

async function pick(renditions, ok) {
  for (const r of renditions) {
    try {
      if (await ok(r)) return r;
    } catch {
      /* not this one */
    }
  }
  return null;
}

function videoConfig(r) {
  const c = { codec: r.codec, optimizeForLatency: true };
  if (r.codedWidth) c.codedWidth = r.codedWidth;
  if (r.codedHeight) c.codedHeight = r.codedHeight;
  if (r.description) c.description = r.description;
  return c;
}

function audioConfig(r) {
  const c = { codec: r.codec, sampleRate: r.sampleRate || 48000, numberOfChannels: r.numberOfChannels || 2 };
  if (r.description) c.description = r.description;
  return c;
}

/**
 * WebTransport when the browser has it, else (Safari) or when it fails (UDP
 * blocked) MoQT over a WebSocket to the page's own origin. `?transport=
 * websocket` or `webtransport` forces one.
 */
async function connect(info) {
  const forced = new URLSearchParams(location.search).get('transport');
  const webtransport = 'WebTransport' in window && forced !== 'websocket';
  if (webtransport) {
    try {
      return await Session.connect(relayUrl(info), {
        fingerprint: info.certificate_sha256,
        timeoutMs: forced === 'webtransport' ? 10000 : 4000,
      });
    } catch (e) {
      // Only a transport that did not come up is worth another: the relay's
      // refusal (a token, a full relay) would be the same over WebSocket.
      if (forced === 'webtransport' || info.websocket === false || !e.transportFailed) throw e;
      console.warn(`WebTransport failed (${e && e.message}); trying WebSocket`);
    }
  }
  const url = relayWebSocketUrl();
  return Session.connect(url, { transport: openWebSocket(url) });
}

async function main() {
  const broadcast = broadcastFromPath();
  stats.broadcast = broadcast;
  $('broadcast').textContent = broadcast; // text, never HTML
  document.title = `${broadcast} - quichub`;
  if (!('VideoDecoder' in window)) {
    setState('error', new Error('this browser lacks WebCodecs'));
    return;
  }
  try {
    setState('connecting');
    const info = await relayInfo();
    const offset = await clockOffset();
    const session = await connect(info);
    stats.transport = session.transport;
    const namespace = broadcast.split('/').filter((s) => s.length);
    const p = new Player(session, namespace, offset);
    window.quichubPlayer.player = p;
    await p.start();
    session.closed.then((i) => setState(`closed: ${(i && i.reason) || ''}`));
  } catch (e) {
    setState('error', e);
  }
}

main();
