// MoQT draft-18 wire format, the subscriber's part: a port of crates/moqt
// (coding.rs, message.rs, params.rs, names.rs, data.rs), sans-IO.
//
// Integers: vi64 (draft-18 §1.4.1: the count of leading one bits of the first
// byte is the count of bytes that follow), NOT QUIC varints. Values are
// decoded as JS numbers; a value above Number.MAX_SAFE_INTEGER throws
// (getVi64Big reads the full 64 bits as a BigInt).
//
// Decoders throw `Short` when the buffer ends early, so a stream reader can
// wait for more bytes and retry from the same position.

/** Thrown when more bytes are needed. */
export class Short extends Error {
  constructor() {
    super('short buffer');
    this.name = 'Short';
  }
}

/** Thrown on bytes that break the draft's rules. */
export class ProtocolError extends Error {
  constructor(msg) {
    super(msg);
    this.name = 'ProtocolError';
  }
}

export const ALPN = 'moqt-18';

export const MSG = Object.freeze({
  SETUP: 0x2f00,
  GOAWAY: 0x10,
  SUBSCRIBE: 0x3,
  SUBSCRIBE_OK: 0x4,
  PUBLISH: 0x1d,
  PUBLISH_OK: 0x1e,
  PUBLISH_DONE: 0xb,
  FETCH: 0x16,
  FETCH_OK: 0x18,
  TRACK_STATUS: 0xd,
  PUBLISH_NAMESPACE: 0x6,
  SUBSCRIBE_NAMESPACE: 0x50,
  SUBSCRIBE_TRACKS: 0x51,
  NAMESPACE: 0x8,
  NAMESPACE_DONE: 0xe,
  PUBLISH_BLOCKED: 0xf,
  REQUEST_UPDATE: 0x2,
  REQUEST_OK: 0x7,
  REQUEST_ERROR: 0x5,
});

export const SETUP_OPTION = Object.freeze({
  PATH: 0x01,
  AUTHORIZATION_TOKEN: 0x03,
  MAX_AUTH_TOKEN_CACHE_SIZE: 0x04,
  AUTHORITY: 0x05,
  MOQT_IMPLEMENTATION: 0x07,
});

export const PARAM = Object.freeze({
  OBJECT_DELIVERY_TIMEOUT: 0x02,
  AUTHORIZATION_TOKEN: 0x03,
  RENDEZVOUS_TIMEOUT: 0x04,
  SUBGROUP_DELIVERY_TIMEOUT: 0x06,
  EXPIRES: 0x08,
  LARGEST_OBJECT: 0x09,
  FILL_TIMEOUT: 0x0a,
  FORWARD: 0x10,
  SUBSCRIBER_PRIORITY: 0x20,
  SUBSCRIPTION_FILTER: 0x21,
  GROUP_ORDER: 0x22,
  NEW_GROUP_REQUEST: 0x32,
  TRACK_NAMESPACE_PREFIX: 0x34,
});

export const FILTER = Object.freeze({
  NEXT_GROUP_START: 1,
  LARGEST_OBJECT: 2,
  ABSOLUTE_START: 3,
  ABSOLUTE_RANGE: 4,
});

export const FETCH_HEADER = 0x05;
export const PADDING_STREAM = 0x132b3e28;
export const PADDING_DATAGRAM = 0x132b3e29;
export const END_OF_NONEXISTENT_RANGE = 0x8c;
export const END_OF_UNKNOWN_RANGE = 0x10c;
export const MAX_MESSAGE = 0xffff;
export const MAX_OBJECT_PAYLOAD = 16 * 1024 * 1024;

const te = new TextEncoder();
const td = new TextDecoder();

/** Appends bytes; grows as needed. */
export class Writer {
  constructor() {
    this.buf = new Uint8Array(64);
    this.len = 0;
  }
  reserve(n) {
    if (this.len + n <= this.buf.length) return;
    let cap = this.buf.length * 2;
    while (cap < this.len + n) cap *= 2;
    const b = new Uint8Array(cap);
    b.set(this.buf.subarray(0, this.len));
    this.buf = b;
  }
  u8(v) {
    this.reserve(1);
    this.buf[this.len++] = v & 0xff;
  }
  u16(v) {
    this.u8(v >> 8);
    this.u8(v);
  }
  bytes(b) {
    this.reserve(b.length);
    this.buf.set(b, this.len);
    this.len += b.length;
  }
  vi64(v) {
    putVi64(this, v);
  }
  /** A vi64 length, then the bytes (a string is UTF-8 encoded). */
  lpBytes(b) {
    if (typeof b === 'string') b = te.encode(b);
    this.vi64(b.length);
    this.bytes(b);
  }
  finish() {
    return this.buf.slice(0, this.len);
  }
}

/** Number of bytes of the minimal vi64 for `v` (a number or BigInt). */
export function vi64Len(v) {
  v = BigInt(v);
  if (v < 0n) throw new RangeError('vi64 is unsigned');
  if (v <= 0x7fn) return 1;
  if (v <= 0x3fffn) return 2;
  if (v <= 0x1fffffn) return 3;
  if (v <= 0x0fffffffn) return 4;
  if (v <= 0x07ffffffffn) return 5;
  if (v <= 0x03ffffffffffn) return 6;
  if (v <= 0x01ffffffffffffn) return 7;
  if (v <= 0x00ffffffffffffffn) return 8;
  if (v <= 0xffffffffffffffffn) return 9;
  throw new RangeError('vi64 over 64 bits');
}

/** Appends the minimal vi64 encoding of `v` to a Writer. */
export function putVi64(w, v) {
  const big = BigInt(v);
  const n = vi64Len(big);
  if (n === 9) {
    w.u8(0xff);
    for (let i = 7; i >= 0; i--) w.u8(Number((big >> BigInt(i * 8)) & 0xffn));
    return;
  }
  const prefix = ~(0xff >> (n - 1)) & 0xff;
  const out = new Uint8Array(n);
  let x = big;
  for (let i = n - 1; i >= 0; i--) {
    out[i] = Number(x & 0xffn);
    x >>= 8n;
  }
  out[0] |= prefix;
  w.bytes(out);
}

/** Encodes one vi64 into a fresh array. */
export function encodeVi64(v) {
  const w = new Writer();
  putVi64(w, v);
  return w.finish();
}

function leadingOnes(b) {
  let n = 0;
  while (n < 8 && b & (0x80 >> n)) n++;
  return n;
}

/** A cursor over a Uint8Array. Reads throw Short past the end. */
export class Reader {
  constructor(buf, pos = 0, end = buf.length) {
    this.buf = buf;
    this.pos = pos;
    this.end = end;
  }
  get remaining() {
    return this.end - this.pos;
  }
  need(n) {
    if (this.end - this.pos < n) throw new Short();
  }
  u8() {
    this.need(1);
    return this.buf[this.pos++];
  }
  u16() {
    this.need(2);
    const v = (this.buf[this.pos] << 8) | this.buf[this.pos + 1];
    this.pos += 2;
    return v;
  }
  bytes(n) {
    this.need(n);
    const b = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return b;
  }
  vi64Big() {
    this.need(1);
    const first = this.buf[this.pos];
    const n = leadingOnes(first) + 1;
    this.need(n);
    let v;
    if (n === 9) {
      v = 0n;
      for (let i = 1; i < 9; i++) v = (v << 8n) | BigInt(this.buf[this.pos + i]);
    } else {
      v = BigInt(first & (0xff >> n));
      for (let i = 1; i < n; i++) v = (v << 8n) | BigInt(this.buf[this.pos + i]);
    }
    this.pos += n;
    return v;
  }
  vi64() {
    const v = this.vi64Big();
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new ProtocolError('integer too large for this client');
    return Number(v);
  }
  /** A vi64 used as a length or count, at most `max`. */
  len(max) {
    const v = this.vi64Big();
    if (v > BigInt(max)) throw new ProtocolError('length too long');
    return Number(v);
  }
  lpBytes(max) {
    return this.bytes(this.len(max));
  }
  lpString(max) {
    return td.decode(this.lpBytes(max));
  }
}

/** Reads one vi64 from the front of `buf` (BigInt, all 64 bits). */
export function getVi64Big(buf) {
  return new Reader(buf).vi64Big();
}

// ---- Key-Value-Pairs (§1.4.3) ----

/** Encodes pairs [{kind, value}] (sorted by kind): even kinds hold a number, odd kinds bytes. */
export function putKvps(w, kvs) {
  let prev = 0;
  for (const kv of kvs) {
    w.vi64(kv.kind - prev);
    prev = kv.kind;
    if (kv.kind % 2 === 0) w.vi64(kv.value);
    else w.lpBytes(kv.value);
  }
}

/** Decodes pairs until the reader's end. */
export function getKvps(r) {
  const out = [];
  let prev = 0;
  while (r.remaining > 0) {
    if (out.length >= 256) throw new ProtocolError('too many key-value pairs');
    const kind = prev + r.vi64();
    prev = kind;
    const value = kind % 2 === 0 ? r.vi64() : r.lpBytes(0xffff).slice();
    out.push({ kind, value });
  }
  return out;
}

// ---- Names (§2.4.1) ----

/** A namespace from `a/b/c` (empty segments skipped), as an array of strings. */
export function namespaceFromPath(path) {
  return path.split('/').filter((s) => s.length > 0);
}

export function putNamespace(w, fields) {
  w.vi64(fields.length);
  for (const f of fields) w.lpBytes(f);
}

export function getNamespace(r) {
  const n = r.len(32);
  const fields = [];
  let total = 0;
  for (let i = 0; i < n; i++) {
    const f = r.lpBytes(4096);
    if (f.length === 0) throw new ProtocolError('empty namespace field');
    total += f.length;
    if (total > 4096) throw new ProtocolError('namespace too long');
    fields.push(td.decode(f));
  }
  return fields;
}

// ---- Parameters (§10.2) ----

/** Encodes the filter body. */
export function putFilter(w, f) {
  w.vi64(f.type);
  if (f.type === FILTER.ABSOLUTE_START || f.type === FILTER.ABSOLUTE_RANGE) {
    w.vi64(f.start.group);
    w.vi64(f.start.object);
  }
  if (f.type === FILTER.ABSOLUTE_RANGE) w.vi64(f.endGroupDelta);
}

export function getFilter(r) {
  const type = r.vi64();
  switch (type) {
    case FILTER.NEXT_GROUP_START:
    case FILTER.LARGEST_OBJECT:
      return { type };
    case FILTER.ABSOLUTE_START:
      return { type, start: { group: r.vi64(), object: r.vi64() } };
    case FILTER.ABSOLUTE_RANGE:
      return { type, start: { group: r.vi64(), object: r.vi64() }, endGroupDelta: r.vi64() };
    default:
      throw new ProtocolError('filter type');
  }
}

/**
 * Encodes a parameter block from an object with any of:
 * deliveryTimeout, authorizationTokens (array of bytes), rendezvousTimeout,
 * subgroupDeliveryTimeout, expires, largestObject {group, object},
 * fillTimeout, forward (bool), subscriberPriority, filter, groupOrder,
 * newGroupRequest, namespacePrefix (array).
 */
export function putParams(w, p = {}) {
  const items = [];
  const add = (k, fn) => items.push([k, fn]);
  if (p.deliveryTimeout !== undefined) add(PARAM.OBJECT_DELIVERY_TIMEOUT, () => w.vi64(p.deliveryTimeout));
  for (const t of p.authorizationTokens || []) add(PARAM.AUTHORIZATION_TOKEN, () => w.lpBytes(t));
  if (p.rendezvousTimeout !== undefined) add(PARAM.RENDEZVOUS_TIMEOUT, () => w.vi64(p.rendezvousTimeout));
  if (p.subgroupDeliveryTimeout !== undefined)
    add(PARAM.SUBGROUP_DELIVERY_TIMEOUT, () => w.vi64(p.subgroupDeliveryTimeout));
  if (p.expires !== undefined) add(PARAM.EXPIRES, () => w.vi64(p.expires));
  if (p.largestObject !== undefined)
    add(PARAM.LARGEST_OBJECT, () => {
      w.vi64(p.largestObject.group);
      w.vi64(p.largestObject.object);
    });
  if (p.fillTimeout !== undefined) add(PARAM.FILL_TIMEOUT, () => w.vi64(p.fillTimeout));
  if (p.forward !== undefined) add(PARAM.FORWARD, () => w.u8(p.forward ? 1 : 0));
  if (p.subscriberPriority !== undefined) add(PARAM.SUBSCRIBER_PRIORITY, () => w.u8(p.subscriberPriority));
  if (p.filter !== undefined)
    add(PARAM.SUBSCRIPTION_FILTER, () => {
      const body = new Writer();
      putFilter(body, p.filter);
      w.lpBytes(body.finish());
    });
  if (p.groupOrder !== undefined) add(PARAM.GROUP_ORDER, () => w.u8(p.groupOrder));
  if (p.newGroupRequest !== undefined) add(PARAM.NEW_GROUP_REQUEST, () => w.vi64(p.newGroupRequest));
  if (p.namespacePrefix !== undefined) add(PARAM.TRACK_NAMESPACE_PREFIX, () => putNamespace(w, p.namespacePrefix));
  w.vi64(items.length);
  let prev = 0;
  for (const [k, fn] of items) {
    w.vi64(k - prev);
    prev = k;
    fn();
  }
}

/** Decodes a parameter block (every type this client knows; others are errors, as the draft says). */
export function getParams(r) {
  const n = r.len(64);
  const p = {};
  let prev = 0;
  const seen = new Set();
  for (let i = 0; i < n; i++) {
    const delta = r.vi64();
    const k = prev + delta;
    if (i > 0 && delta === 0 && k !== PARAM.AUTHORIZATION_TOKEN) throw new ProtocolError('duplicate parameter');
    prev = k;
    if (k !== PARAM.AUTHORIZATION_TOKEN && seen.has(k)) throw new ProtocolError('duplicate parameter');
    seen.add(k);
    switch (k) {
      case PARAM.OBJECT_DELIVERY_TIMEOUT:
        p.deliveryTimeout = r.vi64();
        break;
      case PARAM.AUTHORIZATION_TOKEN:
        (p.authorizationTokens ||= []).push(r.lpBytes(4096).slice());
        break;
      case PARAM.RENDEZVOUS_TIMEOUT:
        p.rendezvousTimeout = r.vi64();
        break;
      case PARAM.SUBGROUP_DELIVERY_TIMEOUT:
        p.subgroupDeliveryTimeout = r.vi64();
        break;
      case PARAM.EXPIRES:
        p.expires = r.vi64();
        break;
      case PARAM.LARGEST_OBJECT:
        p.largestObject = { group: r.vi64(), object: r.vi64() };
        break;
      case PARAM.FILL_TIMEOUT:
        p.fillTimeout = r.vi64();
        break;
      case PARAM.FORWARD: {
        const v = r.u8();
        if (v > 1) throw new ProtocolError('forward');
        p.forward = v === 1;
        break;
      }
      case PARAM.SUBSCRIBER_PRIORITY:
        p.subscriberPriority = r.u8();
        break;
      case PARAM.SUBSCRIPTION_FILTER: {
        const body = r.lpBytes(64);
        const br = new Reader(body);
        p.filter = getFilter(br);
        if (br.remaining) throw new ProtocolError('trailing bytes in filter');
        break;
      }
      case PARAM.GROUP_ORDER: {
        const v = r.u8();
        if (v !== 1 && v !== 2) throw new ProtocolError('group order');
        p.groupOrder = v;
        break;
      }
      case PARAM.NEW_GROUP_REQUEST:
        p.newGroupRequest = r.vi64();
        break;
      case PARAM.TRACK_NAMESPACE_PREFIX:
        p.namespacePrefix = getNamespace(r);
        break;
      default:
        throw new ProtocolError(`unknown parameter 0x${k.toString(16)}`);
    }
  }
  return p;
}

// ---- Control messages (§10): Type (vi64) | Length (u16) | Payload ----

function payload(m, w) {
  switch (m.type) {
    case MSG.SETUP:
      putKvps(w, m.options || []);
      break;
    case MSG.SUBSCRIBE:
    case MSG.TRACK_STATUS:
      w.vi64(m.requestId);
      putNamespace(w, m.namespace);
      w.lpBytes(m.name);
      putParams(w, m.params);
      break;
    case MSG.REQUEST_UPDATE:
      w.vi64(m.requestId);
      putParams(w, m.params);
      break;
    case MSG.FETCH:
      w.vi64(m.requestId);
      w.vi64(m.fetchType);
      if (m.fetchType === 1) {
        putNamespace(w, m.namespace);
        w.lpBytes(m.name);
        w.vi64(m.start.group);
        w.vi64(m.start.object);
        w.vi64(m.end.group);
        w.vi64(m.end.object);
      } else {
        w.vi64(m.joiningRequestId);
        w.vi64(m.joiningStart);
      }
      putParams(w, m.params);
      break;
    case MSG.SUBSCRIBE_NAMESPACE:
    case MSG.PUBLISH_NAMESPACE:
    case MSG.SUBSCRIBE_TRACKS:
      w.vi64(m.requestId);
      putNamespace(w, m.namespace);
      putParams(w, m.params);
      break;
    case MSG.SUBSCRIBE_OK:
      w.vi64(m.trackAlias);
      putParams(w, m.params);
      putKvps(w, m.properties || []);
      break;
    case MSG.REQUEST_OK:
      putParams(w, m.params);
      putKvps(w, m.properties || []);
      break;
    case MSG.PUBLISH_DONE:
      w.vi64(m.status);
      w.vi64(m.streamCount);
      w.lpBytes(m.reason || '');
      break;
    case MSG.REQUEST_ERROR:
      w.vi64(m.code);
      w.vi64(m.retryInterval || 0);
      w.lpBytes(m.reason || '');
      break;
    case MSG.GOAWAY:
      w.lpBytes(m.newSessionUri || '');
      w.vi64(m.timeout || 0);
      if (m.requestId !== undefined) w.vi64(m.requestId);
      break;
    default:
      throw new Error(`encoding ${m.type} is not supported by this client`);
  }
}

/** Encodes a framed control message `{type, ...fields}`. */
export function encodeMessage(m) {
  const body = new Writer();
  payload(m, body);
  const bytes = body.finish();
  if (bytes.length > MAX_MESSAGE) throw new Error('control message too large');
  const w = new Writer();
  w.vi64(m.type);
  w.u16(bytes.length);
  w.bytes(bytes);
  return w.finish();
}

const REQUEST_ERROR_REDIRECT = 0x34; // crates/moqt error::request_error::REDIRECT

/**
 * Decodes one framed message from `r`, or throws Short (leaving `r` where
 * it was) until the whole frame is there.
 */
export function decodeMessage(r) {
  const start = r.pos;
  let type, len;
  try {
    type = r.vi64();
    len = r.u16();
    r.need(len);
  } catch (e) {
    r.pos = start;
    throw e;
  }
  const p = new Reader(r.buf, r.pos, r.pos + len);
  r.pos += len;
  let m;
  try {
    m = decodePayload(type, p);
  } catch (e) {
    if (e instanceof Short) throw new ProtocolError('message shorter than its length');
    throw e;
  }
  if (p.remaining !== 0) throw new ProtocolError('message longer than its fields');
  return m;
}

function decodePayload(type, p) {
  switch (type) {
    case MSG.SETUP:
      return { type, options: getKvps(p) };
    case MSG.GOAWAY: {
      const newSessionUri = p.lpString(8192);
      const timeout = p.vi64();
      const m = { type, newSessionUri, timeout };
      if (p.remaining) m.requestId = p.vi64();
      return m;
    }
    case MSG.SUBSCRIBE_OK:
      return { type, trackAlias: p.vi64(), params: getParams(p), properties: getKvps(p) };
    case MSG.REQUEST_OK:
      return { type, params: getParams(p), properties: getKvps(p) };
    case MSG.PUBLISH_OK:
      return { type, params: getParams(p) };
    case MSG.PUBLISH_DONE:
      return { type, status: p.vi64(), streamCount: p.vi64(), reason: p.lpString(1024) };
    case MSG.REQUEST_ERROR: {
      const m = { type, code: p.vi64(), retryInterval: p.vi64(), reason: p.lpString(1024) };
      if (m.code === REQUEST_ERROR_REDIRECT) {
        m.redirect = { connectUri: p.lpString(8192), namespace: getNamespace(p), name: p.lpString(4096) };
      }
      return m;
    }
    case MSG.FETCH_OK: {
      const eot = p.u8();
      if (eot > 1) throw new ProtocolError('end of track');
      return {
        type,
        endOfTrack: eot === 1,
        endLocation: { group: p.vi64(), object: p.vi64() },
        params: getParams(p),
        properties: getKvps(p),
      };
    }
    case MSG.SUBSCRIBE:
    case MSG.TRACK_STATUS:
      return { type, requestId: p.vi64(), namespace: getNamespace(p), name: p.lpString(4096), params: getParams(p) };
    case MSG.PUBLISH:
      return {
        type,
        requestId: p.vi64(),
        namespace: getNamespace(p),
        name: p.lpString(4096),
        trackAlias: p.vi64(),
        params: getParams(p),
        properties: getKvps(p),
      };
    case MSG.NAMESPACE:
    case MSG.NAMESPACE_DONE:
      return { type, namespace: getNamespace(p) };
    case MSG.SUBSCRIBE_NAMESPACE:
    case MSG.PUBLISH_NAMESPACE:
    case MSG.SUBSCRIBE_TRACKS:
      return { type, requestId: p.vi64(), namespace: getNamespace(p), params: getParams(p) };
    case MSG.REQUEST_UPDATE:
      return { type, requestId: p.vi64(), params: getParams(p) };
    default:
      throw new ProtocolError(`unknown message type 0x${type.toString(16)}`);
  }
}

/** The SETUP a WebTransport client sends: only the implementation name (PATH and AUTHORITY come from the URL). */
export function clientSetup(implementation) {
  return { type: MSG.SETUP, options: [{ kind: SETUP_OPTION.MOQT_IMPLEMENTATION, value: te.encode(implementation) }] };
}

// ---- Data streams and datagrams (§11) ----

export function validSubgroupType(t) {
  return (t & 0x90) === 0x10 && (t & 0x06) !== 0x06;
}

/**
 * Classifies a unidirectional stream by its first vi64:
 * {kind: 'subgroup', type} | {kind: 'fetch'} | {kind: 'control'} | {kind: 'padding'}.
 */
export function streamKind(t) {
  if (t === FETCH_HEADER) return { kind: 'fetch' };
  if (t === MSG.SETUP) return { kind: 'control' };
  if (t === PADDING_STREAM) return { kind: 'padding' };
  if (t < 0x80 && validSubgroupType(t)) return { kind: 'subgroup', type: t };
  throw new ProtocolError(`unknown stream type 0x${t.toString(16)}`);
}

/** The rest of a SUBGROUP_HEADER whose type `t` was read. */
export function decodeSubgroupHeader(t, r) {
  if (!validSubgroupType(t)) throw new ProtocolError('subgroup header type');
  const trackAlias = r.vi64();
  const group = r.vi64();
  const mode = (t & 0x06) >> 1;
  let subgroup;
  if (mode === 0) subgroup = 0;
  else if (mode === 1) subgroup = null; // the first object's ID
  else subgroup = r.vi64();
  const priority = t & 0x20 ? null : r.u8();
  return {
    trackAlias,
    group,
    subgroup,
    priority,
    hasProperties: (t & 0x01) !== 0,
    endOfGroup: (t & 0x08) !== 0,
    firstObject: (t & 0x40) !== 0,
  };
}

/** Encodes a SUBGROUP_HEADER (for tests and publishers). */
export function encodeSubgroupHeader(h) {
  let t = 0x10;
  if (h.hasProperties) t |= 0x01;
  if (h.subgroupMode === 'first') t |= 0x02;
  else if (h.subgroupMode === 'explicit' || h.subgroup) t |= 0x04;
  if (h.endOfGroup) t |= 0x08;
  if (h.priority === null || h.priority === undefined) t |= 0x20;
  if (h.firstObject) t |= 0x40;
  const w = new Writer();
  w.vi64(t);
  w.vi64(h.trackAlias);
  w.vi64(h.group);
  if (t & 0x04) w.vi64(h.subgroup);
  if (!(t & 0x20)) w.u8(h.priority);
  return w.finish();
}

export const STATUS = Object.freeze({ NORMAL: 0, END_OF_GROUP: 3, END_OF_TRACK: 4 });

function checkStatus(s) {
  if (s !== 0 && s !== 3 && s !== 4) throw new ProtocolError('object status');
  return s;
}

/**
 * One object of a subgroup stream, given the previous Object ID (null for
 * the first). Throws Short (leaving `r` untouched) until it is whole.
 * Returns {objectId, properties, status, payload}; `payload` is a view into the reader's buffer.
 */
export function decodeSubgroupObject(r, prev, withProperties, maxPayload = MAX_OBJECT_PAYLOAD) {
  const start = r.pos;
  try {
    const delta = r.vi64();
    const objectId = prev === null ? delta : prev + delta + 1;
    const properties = withProperties ? r.lpBytes(0xffff) : new Uint8Array(0);
    const len = r.len(maxPayload);
    if (len === 0) {
      const status = checkStatus(r.vi64());
      if (status !== 0 && properties.length) throw new ProtocolError('properties on a status object');
      return { objectId, properties, status, payload: new Uint8Array(0) };
    }
    return { objectId, properties, status: 0, payload: r.bytes(len) };
  } catch (e) {
    r.pos = start;
    throw e;
  }
}

/** Encodes one subgroup object (for tests and publishers). */
export function encodeSubgroupObject(o, prev, withProperties) {
  const w = new Writer();
  w.vi64(prev === null ? o.objectId : o.objectId - prev - 1);
  if (withProperties) w.lpBytes(o.properties || new Uint8Array(0));
  const payload = o.payload || new Uint8Array(0);
  w.vi64(payload.length);
  if (payload.length === 0) w.vi64(o.status || 0);
  else w.bytes(payload);
  return w.finish();
}

export function validDatagramType(t) {
  return t < 0x30 && (t & 0x10) === 0 && !((t & 0x20) !== 0 && (t & 0x02) !== 0);
}

/** OBJECT_DATAGRAM (§11.3.1) from a whole datagram. */
export function decodeDatagram(buf) {
  const r = new Reader(buf);
  const t = r.vi64();
  if (!validDatagramType(t)) throw new ProtocolError(`datagram type 0x${t.toString(16)}`);
  const trackAlias = r.vi64();
  const group = r.vi64();
  const objectId = t & 0x04 ? 0 : r.vi64();
  const priority = t & 0x08 ? null : r.u8();
  let properties = new Uint8Array(0);
  if (t & 0x01) {
    properties = r.lpBytes(0xffff);
    if (properties.length === 0) throw new ProtocolError('empty datagram properties');
  }
  let status = null;
  let payload;
  if (t & 0x20) {
    status = checkStatus(r.vi64());
    if (r.remaining) throw new ProtocolError('payload after datagram status');
    payload = new Uint8Array(0);
  } else {
    payload = r.bytes(r.remaining);
  }
  return { trackAlias, group, objectId, priority, properties, endOfGroup: (t & 0x02) !== 0, status, payload };
}

/**
 * Decoder of the entries of a FETCH stream (after its FETCH_HEADER): keeps the
 * prior object's fields that Serialization Flags refer to (§11.4.4).
 */
export class FetchDecoder {
  constructor(descending = false) {
    this.descending = descending;
    this.prevGroup = null;
    this.prevObject = null;
    this.prevSubgroup = null;
    this.prevPriority = null;
  }

  readGroup(r) {
    const d = r.vi64();
    if (this.prevGroup === null) return d;
    return this.descending ? this.prevGroup - d - 1 : this.prevGroup + d + 1;
  }

  /**
   * One entry: {kind: 'object', group, subgroup, objectId, priority, properties, payload}
   * or {kind: 'endOfNonExistentRange'|'endOfUnknownRange', group, object}.
   * Throws Short, changing nothing, until the entry is whole.
   */
  decode(r, maxPayload = MAX_OBJECT_PAYLOAD) {
    const start = r.pos;
    const saved = [this.prevGroup, this.prevObject, this.prevSubgroup, this.prevPriority];
    try {
      return this.decodeInner(r, maxPayload);
    } catch (e) {
      r.pos = start;
      [this.prevGroup, this.prevObject, this.prevSubgroup, this.prevPriority] = saved;
      throw e;
    }
  }

  decodeInner(r, maxPayload) {
    const flags = r.vi64();
    if (flags === END_OF_NONEXISTENT_RANGE || flags === END_OF_UNKNOWN_RANGE) {
      const group = this.readGroup(r);
      const object = r.vi64();
      this.prevGroup = group;
      this.prevObject = object;
      return {
        kind: flags === END_OF_NONEXISTENT_RANGE ? 'endOfNonExistentRange' : 'endOfUnknownRange',
        group,
        object,
      };
    }
    if (flags >= 0x80) throw new ProtocolError('serialization flags');
    if (this.prevGroup === null && (!(flags & 0x08) || !(flags & 0x04)))
      throw new ProtocolError('first fetch object must carry group and object');
    const group = flags & 0x08 ? this.readGroup(r) : this.prevGroup;
    let subgroup = null;
    if (!(flags & 0x40)) {
      switch (flags & 0x03) {
        case 0:
          subgroup = 0;
          break;
        case 1:
          if (this.prevSubgroup === null) throw new ProtocolError('no prior subgroup');
          subgroup = this.prevSubgroup;
          break;
        case 2:
          if (this.prevSubgroup === null) throw new ProtocolError('no prior subgroup');
          subgroup = this.prevSubgroup + 1;
          break;
        default:
          subgroup = r.vi64();
      }
    }
    let objectId;
    if (flags & 0x04) {
      const d = r.vi64();
      if (flags & 0x08) objectId = d;
      else objectId = this.prevGroup === group && this.prevObject !== null ? this.prevObject + d : d;
    } else {
      if (this.prevObject === null) throw new ProtocolError('no prior object');
      objectId = this.prevObject + 1;
    }
    let priority;
    if (flags & 0x10) priority = r.u8();
    else {
      if (this.prevPriority === null) throw new ProtocolError('no prior priority');
      priority = this.prevPriority;
    }
    const properties = flags & 0x20 ? r.lpBytes(0xffff) : new Uint8Array(0);
    const len = r.len(maxPayload);
    const payload = r.bytes(len);
    this.prevGroup = group;
    this.prevObject = objectId;
    if (subgroup !== null) this.prevSubgroup = subgroup;
    this.prevPriority = priority;
    return { kind: 'object', group, subgroup, objectId, priority, properties, payload };
  }
}

/** Hex of bytes (for logs and tests). */
export function toHex(b) {
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

/** Bytes of a hex string. */
export function fromHex(s) {
  if (s.length % 2) throw new Error('odd hex');
  const out = new Uint8Array(s.length / 2);
  for (let i = 0; i < out.length; i++) {
    const v = parseInt(s.substr(i * 2, 2), 16);
    if (Number.isNaN(v)) throw new Error('bad hex');
    out[i] = v;
  }
  return out;
}
