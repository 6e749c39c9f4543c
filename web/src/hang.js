// moq-dev's "hang" media format (draft-lcurley-moq-hang) as carried over
// MoQT: a `catalog.json` track whose objects are whole JSON catalogs, and
// media tracks whose objects, in the "legacy" container, are a QUIC varint
// (RFC 9000 §16, NOT MoQT's vi64) presentation timestamp in microseconds
// followed by one raw codec frame.

const td = new TextDecoder();

/** The catalog's track name. */
export const CATALOG_TRACK = 'catalog.json';

/** Reads an RFC 9000 variable-length integer at `pos`: {value, length}. */
export function readQuicVarint(buf, pos) {
  if (pos >= buf.length) throw new Error('short varint');
  const first = buf[pos];
  const length = 1 << (first >> 6);
  if (pos + length > buf.length) throw new Error('short varint');
  let v = BigInt(first & 0x3f);
  for (let i = 1; i < length; i++) v = (v << 8n) | BigInt(buf[pos + i]);
  return { value: Number(v), length };
}

/**
 * One object of a rendition's track: {timestamp (µs), data (the codec
 * frame)}, for the "legacy" and "cmaf" containers.
 */
export function decodeFrame(rendition, payload) {
  if (rendition.container === 'cmaf') return decodeFragment(payload, rendition.init.timescale);
  return decodeLegacy(payload);
}

/** Whether this page can unpack the rendition's container. */
export function containerSupported(r) {
  return r.container === 'legacy' || (r.container === 'cmaf' && !!r.init);
}

/** A legacy-container object: {timestamp (µs), data (the codec frame)}. */
export function decodeLegacy(payload) {
  const { value, length } = readQuicVarint(payload, 0);
  return { timestamp: value, data: payload.subarray(length) };
}

function hexBytes(s) {
  if (typeof s !== 'string' || s.length % 2 || !/^[0-9a-fA-F]*$/.test(s)) throw new Error('description is not hex');
  const out = new Uint8Array(s.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(s.substr(i * 2, 2), 16);
  return out;
}

function renditions(section, kind) {
  const out = [];
  const r = section && section.renditions;
  if (!r || typeof r !== 'object') return out;
  for (const [track, c] of Object.entries(r)) {
    if (!c || typeof c !== 'object' || typeof c.codec !== 'string') continue;
    const container = (c.container && c.container.kind) || 'legacy';
    const e = { kind, track, codec: c.codec, container, bitrate: c.bitrate };
    if (c.description) e.description = hexBytes(c.description);
    if (container === 'cmaf') {
      try {
        e.init = parseInit(fromBase64(c.container.init));
        if (!e.description && e.init.description) e.description = e.init.description;
      } catch (err) {
        e.error = `bad init segment: ${err.message}`;
      }
    }
    if (kind === 'video') {
      e.codedWidth = c.codedWidth;
      e.codedHeight = c.codedHeight;
      e.framerate = c.framerate;
    } else {
      e.sampleRate = c.sampleRate;
      e.numberOfChannels = c.numberOfChannels;
    }
    out.push(e);
  }
  return out;
}

/**
 * Parses a catalog object: {video: [rendition], audio: [rendition], raw}.
 * A rendition: {kind, track, codec, container ('legacy' or 'cmaf', with
 * `init` {timescale, description} parsed from its init segment), description?, codedWidth?,
 * codedHeight?, framerate?, sampleRate?, numberOfChannels?, bitrate?}.
 */
export function parseCatalog(bytes) {
  const raw = JSON.parse(td.decode(bytes));
  if (!raw || typeof raw !== 'object') throw new Error('catalog is not an object');
  return { video: renditions(raw.video, 'video'), audio: renditions(raw.audio, 'audio'), raw };
}

// ---- The "cmaf" container: the catalog carries the init segment (base64),
// each object is one moof+mdat fragment of one frame. ----

function boxes(buf, start = 0, end = buf.length) {
  const out = [];
  const v = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  let p = start;
  while (p + 8 <= end) {
    let size = v.getUint32(p);
    const type = String.fromCharCode(buf[p + 4], buf[p + 5], buf[p + 6], buf[p + 7]);
    let header = 8;
    if (size === 1) {
      if (p + 16 > end) break;
      size = Number(v.getBigUint64(p + 8));
      header = 16;
    } else if (size === 0) {
      size = end - p;
    }
    if (size < header || p + size > end) throw new Error(`bad MP4 box ${type}`);
    out.push({ type, start: p + header, end: p + size });
    p += size;
  }
  return out;
}

function child(buf, box, type) {
  return boxes(buf, box.start, box.end).find((b) => b.type === type) || null;
}

function path(buf, box, types) {
  let b = box;
  for (const t of types) {
    b = child(buf, b, t);
    if (!b) return null;
  }
  return b;
}

// Sample entries: fields before their child boxes (ISO 14496-12 §12.1.3, §12.2.3).
const VISUAL_ENTRY = 78;
const AUDIO_ENTRY = 28;

/** The AudioSpecificConfig inside an esds box (ES_Descriptor → DecoderConfig → DecoderSpecificInfo). */
function esdsConfig(buf, box) {
  let p = box.start + 4; // version and flags
  const desc = () => {
    const tag = buf[p++];
    let len = 0;
    for (let i = 0; i < 4; i++) {
      const b = buf[p++];
      len = (len << 7) | (b & 0x7f);
      if (!(b & 0x80)) break;
    }
    return { tag, len, at: p };
  };
  const es = desc();
  if (es.tag !== 3) return undefined;
  p += 2;
  const flags = buf[p++];
  if (flags & 0x80) p += 2;
  if (flags & 0x40) p += 1 + buf[p];
  if (flags & 0x20) p += 2;
  const dc = desc();
  if (dc.tag !== 4) return undefined;
  p += 13;
  const ds = desc();
  if (ds.tag !== 5) return undefined;
  return buf.slice(ds.at, ds.at + ds.len);
}

/**
 * Parses a CMAF init segment: {timescale, description?} of its first track
 * (the avcC/hvcC/vpcC/av1C body for video, the AudioSpecificConfig for AAC).
 */
export function parseInit(init) {
  const moov = boxes(init).find((b) => b.type === 'moov');
  if (!moov) throw new Error('init segment without moov');
  const trak = child(init, moov, 'trak');
  const mdhd = trak && path(init, trak, ['mdia', 'mdhd']);
  const stsd = trak && path(init, trak, ['mdia', 'minf', 'stbl', 'stsd']);
  if (!mdhd || !stsd) throw new Error('init segment without mdhd or stsd');
  const v = new DataView(init.buffer, init.byteOffset, init.byteLength);
  const timescale = init[mdhd.start] === 1 ? v.getUint32(mdhd.start + 20) : v.getUint32(mdhd.start + 12);
  const entries = boxes(init, stsd.start + 8, stsd.end);
  const entry = entries[0];
  if (!entry) throw new Error('empty stsd');
  let description;
  const visual = ['avc1', 'avc3', 'hvc1', 'hev1', 'vp08', 'vp09', 'av01'].includes(entry.type);
  const inner = boxes(init, entry.start + (visual ? VISUAL_ENTRY : AUDIO_ENTRY), entry.end);
  for (const b of inner) {
    if (['avcC', 'hvcC', 'av1C'].includes(b.type)) description = init.slice(b.start, b.end);
    else if (b.type === 'esds') description = esdsConfig(init, b);
  }
  return { timescale, sampleEntry: entry.type, description };
}

/** One frame of a moof+mdat fragment: {timestamp (µs), data}. */
export function decodeFragment(frag, timescale) {
  const top = boxes(frag);
  const moof = top.find((b) => b.type === 'moof');
  const mdat = top.find((b) => b.type === 'mdat');
  if (!moof || !mdat) throw new Error('fragment without moof or mdat');
  const traf = child(frag, moof, 'traf');
  const tfdt = traf && child(frag, traf, 'tfdt');
  const v = new DataView(frag.buffer, frag.byteOffset, frag.byteLength);
  let decode = 0;
  if (tfdt) decode = frag[tfdt.start] === 1 ? Number(v.getBigUint64(tfdt.start + 4)) : v.getUint32(tfdt.start + 4);
  // trun: the first sample's composition offset and size, when present.
  let cto = 0;
  let size = mdat.end - mdat.start;
  const trun = traf && child(frag, traf, 'trun');
  if (trun) {
    const flags = v.getUint32(trun.start) & 0xffffff;
    const version = frag[trun.start];
    let p = trun.start + 8;
    if (flags & 0x1) p += 4; // data offset
    if (flags & 0x4) p += 4; // first sample flags
    if (flags & 0x100) p += 4; // duration
    if (flags & 0x200) {
      size = Math.min(size, v.getUint32(p));
      p += 4;
    }
    if (flags & 0x400) p += 4; // sample flags
    if (flags & 0x800) cto = version === 1 ? v.getInt32(p) : v.getUint32(p);
  }
  const timestamp = Math.round(((decode + cto) * 1e6) / timescale);
  return { timestamp, data: frag.subarray(mdat.start, mdat.start + size) };
}

/** Bytes of a base64 string. */
export function fromBase64(s) {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
