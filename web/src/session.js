// A MoQT draft-18 subscriber session over WebTransport (browser only): the
// SETUP exchange on unidirectional control streams, one bidirectional
// request stream per SUBSCRIBE or FETCH, objects from SUBGROUP_HEADER
// streams, FETCH streams and OBJECT_DATAGRAMs. The wire format is in moqt.js.

import * as moqt from './moqt.js';

const IMPLEMENTATION = 'quichub-web';

/** Buffers a ReadableStream of bytes so decoders can retry on Short. */
class StreamBuf {
  constructor(readable) {
    this.reader = readable.getReader();
    this.buf = new Uint8Array(0);
    this.pos = 0;
    this.done = false;
  }

  async fill() {
    if (this.done) return false;
    const { value, done } = await this.reader.read();
    if (done) {
      this.done = true;
      return false;
    }
    const rest = this.buf.subarray(this.pos);
    const b = new Uint8Array(rest.length + value.length);
    b.set(rest);
    b.set(value, rest.length);
    this.buf = b;
    this.pos = 0;
    return true;
  }

  /** Runs `decode(reader)` until it does not throw Short; null at a clean end of stream. */
  async read(decode) {
    for (;;) {
      if (this.pos < this.buf.length) {
        const r = new moqt.Reader(this.buf, this.pos);
        try {
          const v = decode(r);
          this.pos = r.pos;
          return v;
        } catch (e) {
          if (!(e instanceof moqt.Short)) throw e;
        }
      }
      if (!(await this.fill())) {
        if (this.pos < this.buf.length) throw new moqt.ProtocolError('stream ended inside a frame');
        return null;
      }
    }
  }

  cancel() {
    this.reader.cancel().catch(() => {});
  }
}

/** One SUBSCRIBE: objects go to `onObject({group, objectId, payload, status, datagram})`. */
class Subscription {
  constructor(session, requestId, namespace, name, onObject) {
    this.session = session;
    this.requestId = requestId;
    this.namespace = namespace;
    this.name = name;
    this.onObject = onObject;
    this.alias = null;
    this.largest = null;
    this.done = null;
    this.writer = null;
    this.objects = 0;
    this.bytes = 0;
  }

  deliver(o) {
    this.objects++;
    this.bytes += o.payload.length;
    try {
      this.onObject(o);
    } catch (e) {
      console.error('object handler', e);
    }
  }

  /** Ends the subscription (closes the request stream). */
  close() {
    if (this.alias !== null) this.session.tracks.delete(this.alias);
    if (this.writer) this.writer.close().catch(() => {});
    this.writer = null;
  }
}

function connectWebTransport(url, fingerprint) {
  const opts = { protocols: [moqt.ALPN] };
  if (fingerprint) {
    opts.serverCertificateHashes = [{ algorithm: 'sha-256', value: moqt.fromHex(fingerprint.trim()) }];
  }
  return new WebTransport(url, opts);
}

export class Session {
  /**
   * Connects to `url` (https://host:port/path), pinning the certificate by
   * its SHA-256 (hex) when given, and completes the SETUP exchange. With
   * `transport` (a WebTransport-like session already dialed, such as
   * websocket.js's), the SETUP exchange runs on it instead.
   */
  static async connect(url, { fingerprint, timeoutMs = 10000, transport } = {}) {
    const how = transport ? 'WebSocket' : 'WebTransport';
    const failed = (e) => {
      // The transport itself did not come up (UDP blocked, an option this
      // browser refuses): another one may; a refusal after that point would
      // be the same on any.
      const err = e instanceof Error ? e : new Error(String(e));
      err.transportFailed = true;
      return err;
    };
    let wt;
    try {
      wt = transport || connectWebTransport(url, fingerprint);
    } catch (e) {
      throw failed(e);
    }
    const close = () => {
      try { wt.close(); } catch (_) { /* already closed */ }
    };
    try {
      await withTimeout(wt.ready, timeoutMs, `no ${how} session with ${url}`);
    } catch (e) {
      close();
      throw failed(e);
    }
    const s = new Session(wt);
    s.transport = how;
    try {
      await s.start(timeoutMs);
    } catch (e) {
      close();
      throw e;
    }
    return s;
  }

  constructor(wt) {
    this.wt = wt;
    this.nextRequestId = 0; // the client's Request IDs are even
    this.tracks = new Map(); // alias -> Subscription
    this.aliasWaiters = new Map(); // alias -> [resolve]
    this.fetches = new Map(); // request id -> handler(StreamBuf)
    this.peerSetup = null;
    this.closed = wt.closed.then(
      (i) => i,
      (e) => ({ reason: String(e) }),
    );
  }

  async start(timeoutMs) {
    let setupSeen;
    this.setupReceived = new Promise((r) => (setupSeen = r));
    this.onSetup = setupSeen;
    this.acceptUni();
    this.readDatagrams();
    const control = await this.wt.createUnidirectionalStream();
    this.control = control.getWriter();
    await this.control.write(moqt.encodeMessage(moqt.clientSetup(IMPLEMENTATION)));
    await withTimeout(this.setupReceived, timeoutMs, 'no SETUP from the relay');
  }

  async acceptUni() {
    const reader = this.wt.incomingUnidirectionalStreams.getReader();
    for (;;) {
      let r;
      try {
        r = await reader.read();
      } catch {
        return;
      }
      if (r.done) return;
      this.onUni(r.value).catch((e) => {
        if (!(e instanceof moqt.ProtocolError)) return; // a reset stream: the relay dropped it
        console.error('closing session:', e);
        this.wt.close({ closeCode: 0x3, reason: String(e.message).slice(0, 100) });
      });
    }
  }

  async onUni(readable) {
    const sb = new StreamBuf(readable);
    const t = await sb.read((r) => r.vi64());
    if (t === null) return;
    const k = moqt.streamKind(t);
    if (k.kind === 'control') {
      // The type was SETUP's message type: put it back and read messages.
      sb.pos = 0;
      for (;;) {
        const m = await sb.read(moqt.decodeMessage);
        if (m === null) return;
        if (m.type === moqt.MSG.SETUP) {
          this.peerSetup = m;
          this.onSetup();
        } else if (m.type === moqt.MSG.GOAWAY) {
          this.goaway = m;
        }
      }
    } else if (k.kind === 'subgroup') {
      const h = await sb.read((r) => moqt.decodeSubgroupHeader(k.type, r));
      if (h === null) return;
      const sub = await this.waitAlias(h.trackAlias);
      if (!sub) {
        sb.cancel();
        return;
      }
      let prev = null;
      for (;;) {
        const o = await sb.read((r) => moqt.decodeSubgroupObject(r, prev, h.hasProperties));
        if (o === null) return;
        prev = o.objectId;
        if (!this.tracks.has(h.trackAlias)) {
          sb.cancel();
          return;
        }
        sub.deliver({ group: h.group, objectId: o.objectId, status: o.status, payload: o.payload.slice() });
      }
    } else if (k.kind === 'fetch') {
      const id = await sb.read((r) => r.vi64());
      const handler = this.fetches.get(id);
      if (!handler) {
        sb.cancel();
        return;
      }
      this.fetches.delete(id);
      await handler(sb);
    }
  }

  async readDatagrams() {
    const reader = this.wt.datagrams.readable.getReader();
    for (;;) {
      let r;
      try {
        r = await reader.read();
      } catch {
        return;
      }
      if (r.done) return;
      let d;
      try {
        d = moqt.decodeDatagram(r.value);
      } catch (e) {
        console.warn('bad datagram', e);
        continue;
      }
      const sub = this.tracks.get(d.trackAlias);
      if (sub) {
        sub.deliver({
          group: d.group,
          objectId: d.objectId,
          status: d.status ?? 0,
          payload: d.payload.slice(),
          datagram: true,
        });
      }
    }
  }

  /** The subscription of `alias`, waiting a little for its SUBSCRIBE_OK (data may overtake it). */
  waitAlias(alias) {
    const s = this.tracks.get(alias);
    if (s) return Promise.resolve(s);
    return new Promise((resolve) => {
      const list = this.aliasWaiters.get(alias) || [];
      list.push(resolve);
      this.aliasWaiters.set(alias, list);
      setTimeout(() => resolve(this.tracks.get(alias) || null), 2000);
    });
  }

  takeRequestId() {
    const id = this.nextRequestId;
    this.nextRequestId += 2;
    return id;
  }

  /**
   * SUBSCRIBE to `namespace` (array of fields) / `name`. Resolves once
   * SUBSCRIBE_OK arrives (rejects on REQUEST_ERROR) with a subscription
   * whose `largest` is the relay's Largest Location, and whose `done`
   * promise resolves with the PUBLISH_DONE (or null when the stream ends).
   */
  async subscribe(namespace, name, onObject, params = {}) {
    const requestId = this.takeRequestId();
    const sub = new Subscription(this, requestId, namespace, name, onObject);
    const bidi = await this.wt.createBidirectionalStream();
    sub.writer = bidi.writable.getWriter();
    const p = { subscriberPriority: 128, filter: { type: moqt.FILTER.LARGEST_OBJECT }, forward: true, ...params };
    await sub.writer.write(
      moqt.encodeMessage({ type: moqt.MSG.SUBSCRIBE, requestId, namespace, name, params: p }),
    );
    const sb = new StreamBuf(bidi.readable);
    const reply = await sb.read(moqt.decodeMessage);
    if (!reply) throw new Error(`SUBSCRIBE ${name}: the request stream ended`);
    if (reply.type === moqt.MSG.REQUEST_ERROR) {
      const e = new Error(`SUBSCRIBE ${name} refused: ${reply.reason} (code 0x${reply.code.toString(16)})`);
      e.code = reply.code;
      throw e;
    }
    if (reply.type !== moqt.MSG.SUBSCRIBE_OK) throw new moqt.ProtocolError(`unexpected reply ${reply.type}`);
    sub.alias = reply.trackAlias;
    sub.largest = reply.params.largestObject || null;
    this.tracks.set(sub.alias, sub);
    for (const w of this.aliasWaiters.get(sub.alias) || []) w(sub);
    this.aliasWaiters.delete(sub.alias);
    sub.done = (async () => {
      for (;;) {
        let m;
        try {
          m = await sb.read(moqt.decodeMessage);
        } catch {
          return null;
        }
        if (m === null) return null;
        if (m.type === moqt.MSG.PUBLISH_DONE) return m;
      }
    })();
    return sub;
  }

  /**
   * A relative joining FETCH of `sub`'s track: the objects from `groupsBack`
   * groups before its Joining Location up to it. Resolves with the objects
   * (possibly none) in order.
   */
  async fetchJoining(sub, groupsBack = 0) {
    const requestId = this.takeRequestId();
    const objects = [];
    const done = new Promise((resolve, reject) => {
      this.fetches.set(requestId, async (sb) => {
        const dec = new moqt.FetchDecoder(false);
        try {
          for (;;) {
            const e = await sb.read((r) => dec.decode(r));
            if (e === null) break;
            if (e.kind === 'object') objects.push({ group: e.group, objectId: e.objectId, payload: e.payload.slice() });
          }
          resolve(objects);
        } catch (err) {
          reject(err);
        }
      });
    });
    const bidi = await this.wt.createBidirectionalStream();
    const w = bidi.writable.getWriter();
    await w.write(
      moqt.encodeMessage({
        type: moqt.MSG.FETCH,
        requestId,
        fetchType: 2,
        joiningRequestId: sub.requestId,
        joiningStart: groupsBack,
        params: {},
      }),
    );
    const sb = new StreamBuf(bidi.readable);
    const reply = await sb.read(moqt.decodeMessage);
    if (!reply || reply.type !== moqt.MSG.FETCH_OK) {
      this.fetches.delete(requestId);
      w.close().catch(() => {});
      return [];
    }
    const got = await withTimeout(done, 5000, 'FETCH stream').catch(() => objects);
    w.close().catch(() => {});
    return got;
  }

  close() {
    try {
      this.wt.close({ closeCode: 0, reason: 'bye' });
    } catch {
      /* already closed */
    }
  }
}

function withTimeout(p, ms, what) {
  let t;
  return Promise.race([
    p,
    new Promise((_, reject) => {
      t = setTimeout(() => reject(new Error(`${what} within ${ms / 1000} s`)), ms);
    }),
  ]).finally(() => clearTimeout(t));
}

/**
 * The token of the page's own URL (`?jwt=`), or null: with auth on, the
 * pages pass it on to the relay (MoQT session, `/v1/relay`, event streams).
 * The pages send `Referrer-Policy: no-referrer`, so it does not leak from
 * them to other sites.
 */
export function pageToken() {
  return new URLSearchParams(location.search).get('jwt') || null;
}

/** `url` (absolute, or relative to the page) with the page's token as `?jwt=`. */
export function withToken(url) {
  const t = pageToken();
  const u = new URL(url, location.href);
  if (t) u.searchParams.set('jwt', t);
  return u.href;
}

/**
 * Reads the relay's facts the pages need (`/v1/relay` on the page's own
 * origin; with a token, only what it may read).
 */
export async function relayInfo() {
  const t = pageToken();
  const headers = t ? { Authorization: `Bearer ${t}` } : {};
  const r = await fetch('/v1/relay', { cache: 'no-store', headers });
  if (r.status === 401 || r.status === 403) {
    const why = t ? 'the token in ?jwt= was refused' : 'the relay needs a token: add ?jwt=TOKEN to this page\'s URL';
    throw new Error(`/v1/relay: HTTP ${r.status}: ${why}`);
  }
  if (!r.ok) throw new Error(`/v1/relay: HTTP ${r.status}`);
  return r.json();
}

/** The WebTransport URL of the relay that served the page (with the page's token). */
export function relayUrl(info) {
  return withToken(`https://${location.hostname}:${info.quic_port}/`);
}

/**
 * The WebSocket URL of the relay that served the page: the page's own
 * origin (the HTTP port serves MoQT over WebSocket upgrades), ws: or wss:
 * as the page is http: or https:, with the page's token.
 */
export function relayWebSocketUrl() {
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  return withToken(`${scheme}://${location.host}/`);
}

/**
 * The offset (ms) to add to Date.now() to get the relay's clock, from a few
 * `/v1/time` round trips (the sample with the smallest round trip wins).
 */
export async function clockOffset() {
  let best = null;
  for (let i = 0; i < 3; i++) {
    const t0 = Date.now();
    let j;
    try {
      const r = await fetch('/v1/time', { cache: 'no-store' });
      j = await r.json();
    } catch {
      return 0;
    }
    const t1 = Date.now();
    const rtt = t1 - t0;
    const off = j.unix_ms - (t0 + rtt / 2);
    if (!best || rtt < best.rtt) best = { rtt, off };
  }
  return best ? best.off : 0;
}
