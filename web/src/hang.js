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
 * A rendition: {kind, track, codec, container, description?, codedWidth?,
 * codedHeight?, framerate?, sampleRate?, numberOfChannels?, bitrate?}.
 */
export function parseCatalog(bytes) {
  const raw = JSON.parse(td.decode(bytes));
  if (!raw || typeof raw !== 'object') throw new Error('catalog is not an object');
  return { video: renditions(raw.video, 'video'), audio: renditions(raw.audio, 'audio'), raw };
}
