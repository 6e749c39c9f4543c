// The JS MoQT codec against the byte vectors of crates/moqt's unit tests
// (coding.rs, message/tests.rs, data/tests.rs). Run: `node --test test/unit/`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as m from '../../src/moqt.js';
import * as hang from '../../src/hang.js';

const hex = (s) => m.fromHex(s.replace(/\s+/g, ''));
const enc = (s) => new TextEncoder().encode(s);

test('vi64: the draft examples (§1.4.1)', () => {
  const dec = (h) => {
    const r = new m.Reader(hex(h));
    const v = r.vi64Big();
    assert.equal(r.remaining, 0, h);
    return v;
  };
  assert.equal(dec('25'), 37n);
  assert.equal(dec('8025'), 37n);
  assert.equal(dec('bbbd'), 15293n);
  assert.equal(dec('ed7f3e7d'), 226442877n);
  assert.equal(dec('faa1a0e403d8'), 2893212287960n);
  assert.equal(dec('fc8998abc66bc0'), 151288809941952n);
  assert.equal(dec('fefa318fa8e3ca11'), 70423237261249041n);
  assert.equal(dec('ffffffffffffffffff'), 18446744073709551615n);
});

test('vi64: minimal encodings and round trips', () => {
  assert.deepEqual(m.encodeVi64(15293), hex('bbbd'));
  assert.deepEqual(m.encodeVi64(226442877), hex('ed7f3e7d'));
  assert.deepEqual(m.encodeVi64(18446744073709551615n), hex('ffffffffffffffffff'));
  for (const v of [0, 1, 0x7f, 0x80, 0x3fff, 0x4000, 0x1fffff, 0x200000, 2 ** 32, 2 ** 53 - 1]) {
    const b = m.encodeVi64(v);
    assert.equal(b.length, m.vi64Len(v));
    const r = new m.Reader(b);
    assert.equal(r.vi64(), v);
    assert.equal(r.remaining, 0);
  }
  assert.throws(() => new m.Reader(hex('bb')).vi64(), m.Short);
  assert.throws(() => new m.Reader(new Uint8Array(0)).vi64(), m.Short);
  // Above 2^53 a plain number would lose bits: refused rather than rounded.
  assert.throws(() => new m.Reader(hex('ffffffffffffffffff')).vi64(), m.ProtocolError);
});

test('SETUP vector', () => {
  const bytes = hex('af00 0008 01 02 2f78 06 02 7168');
  const msg = {
    type: m.MSG.SETUP,
    options: [
      { kind: 1, value: enc('/x') },
      { kind: 7, value: enc('qh') },
    ],
  };
  assert.deepEqual(m.encodeMessage(msg), bytes);
  const d = m.decodeMessage(new m.Reader(bytes));
  assert.equal(d.type, m.MSG.SETUP);
  assert.deepEqual(d.options, msg.options);
  assert.deepEqual(m.streamKind(0x2f00), { kind: 'control' });
  // Non-minimal encodings and an unknown even option.
  const d2 = m.decodeMessage(new m.Reader(hex('c02f00 0007 8007 01 71 39 8001')));
  assert.deepEqual(d2.options, [
    { kind: 7, value: enc('q') },
    { kind: 0x40, value: 1 },
  ]);
});

test('SUBSCRIBE vectors', () => {
  const bytes = hex('03 000d 04 01 02 6e73 01 74 02 20 01 01 01 02');
  const msg = {
    type: m.MSG.SUBSCRIBE,
    requestId: 4,
    namespace: ['ns'],
    name: 't',
    params: { subscriberPriority: 1, filter: { type: m.FILTER.LARGEST_OBJECT } },
  };
  assert.deepEqual(m.encodeMessage(msg), bytes);
  assert.deepEqual(m.decodeMessage(new m.Reader(bytes)), msg);
  const range = m.decodeMessage(new m.Reader(hex('03 000b 00 00 00 01 21 05 04 812c 00 02')));
  assert.deepEqual(range.params.filter, {
    type: m.FILTER.ABSOLUTE_RANGE,
    start: { group: 300, object: 0 },
    endGroupDelta: 2,
  });
  assert.throws(() => m.decodeMessage(new m.Reader(hex('03 000a 00 00 00 01 21 04 04 812c 00 02'))));
  assert.throws(() => m.decodeMessage(new m.Reader(hex('03 000c 00 00 00 01 21 06 04 812c 00 02 00'))));
});

test('SUBSCRIBE_OK vectors', () => {
  const frame = (type, body) => {
    const w = new m.Writer();
    w.vi64(type);
    w.u16(body.length);
    w.bytes(body);
    return w.finish();
  };
  const ok = m.decodeMessage(new m.Reader(frame(m.MSG.SUBSCRIBE_OK, hex('2a 01 09 09 03'))));
  assert.equal(ok.trackAlias, 42);
  assert.deepEqual(ok.params.largestObject, { group: 9, object: 3 });
  assert.deepEqual(ok.properties, []);
  const ok2 = m.decodeMessage(new m.Reader(frame(m.MSG.SUBSCRIBE_OK, hex('04 01 09 81ab 00'))));
  assert.deepEqual(ok2.params.largestObject, { group: 0x1ab, object: 0 });
});

test('FETCH, FETCH_OK, GOAWAY, REQUEST_ERROR vectors', () => {
  const fetch = {
    type: m.MSG.FETCH,
    requestId: 1,
    fetchType: 2,
    joiningRequestId: 3,
    joiningStart: 0,
    params: { fillTimeout: 32 },
  };
  assert.deepEqual(m.encodeMessage(fetch), hex('16 0007 01 02 03 00 01 0a 20'));
  const fok = m.decodeMessage(new m.Reader(hex('18 0004 00 05 03 00')));
  assert.equal(fok.endOfTrack, false);
  assert.deepEqual(fok.endLocation, { group: 5, object: 3 });
  assert.throws(() => m.decodeMessage(new m.Reader(hex('18 0004 02 05 03 00'))), m.ProtocolError);
  assert.deepEqual(m.decodeMessage(new m.Reader(hex('10 0004 01 2f 8bb8'))), {
    type: m.MSG.GOAWAY,
    newSessionUri: '/',
    timeout: 3000,
  });
  assert.throws(() => m.decodeMessage(new m.Reader(hex('10 0004 00 00 00 00'))), m.ProtocolError);
  assert.deepEqual(m.decodeMessage(new m.Reader(hex('05 0005 10 00 02 6e6f'))), {
    type: m.MSG.REQUEST_ERROR,
    code: 0x10,
    retryInterval: 0,
    reason: 'no',
  });
  const redirect = m.decodeMessage(new m.Reader(hex('05 0009 34 00 00 00 01 01 61 01 62')));
  assert.deepEqual(redirect.redirect, { connectUri: '', namespace: ['a'], name: 'b' });
  // Unknown parameters cannot be skipped: range filters (0x25) are draft-19.
  assert.throws(() => m.decodeMessage(new m.Reader(hex('16 0007 01 02 03 00 01 25 00'))));
});

test('a message split across reads: Short until whole, then decoded', () => {
  const bytes = hex('03 000d 04 01 02 6e73 01 74 02 20 01 01 01 02');
  for (let cut = 0; cut < bytes.length; cut++) {
    const r = new m.Reader(bytes.subarray(0, cut));
    assert.throws(() => m.decodeMessage(r), m.Short);
    assert.equal(r.pos, 0);
  }
});

test('subgroup stream: the spec example (§11.6)', () => {
  const bytes = hex('14 02 00 00 00   00 04 61626364   00 04 65666768');
  const r = new m.Reader(bytes);
  const t = r.vi64();
  assert.deepEqual(m.streamKind(t), { kind: 'subgroup', type: 0x14 });
  const h = m.decodeSubgroupHeader(t, r);
  assert.deepEqual(h, {
    trackAlias: 2,
    group: 0,
    subgroup: 0,
    priority: 0,
    hasProperties: false,
    endOfGroup: false,
    firstObject: false,
  });
  const o0 = m.decodeSubgroupObject(r, null, false);
  const o1 = m.decodeSubgroupObject(r, o0.objectId, false);
  assert.equal(o0.objectId, 0);
  assert.equal(o1.objectId, 1);
  assert.equal(new TextDecoder().decode(o0.payload), 'abcd');
  assert.equal(new TextDecoder().decode(o1.payload), 'efgh');
  assert.equal(r.remaining, 0);
  assert.deepEqual(
    m.encodeSubgroupHeader({ trackAlias: 2, group: 0, subgroup: 0, subgroupMode: 'explicit', priority: 0 }),
    hex('14 02 00 00 00'),
  );
});

test('subgroup stream with properties (§11.6, draft-18 lengths)', () => {
  const bytes = hex(`35 02 00 00
         00 16 04f08257dcd3 490e747261636549443a313233343536 04 61626364
         00 00 04 65666768`);
  const r = new m.Reader(bytes);
  const h = m.decodeSubgroupHeader(r.vi64(), r);
  assert.equal(h.hasProperties, true);
  assert.equal(h.priority, null);
  const o0 = m.decodeSubgroupObject(r, null, true);
  assert.deepEqual(m.getKvps(new m.Reader(o0.properties)), [
    { kind: 4, value: 2186796243 },
    { kind: 77, value: enc('traceID:123456') },
  ]);
  const o1 = m.decodeSubgroupObject(r, 0, true);
  assert.equal(o1.objectId, 1);
  // A partial object leaves the reader where it was.
  const part = new m.Reader(hex('00 04 6162'));
  assert.throws(() => m.decodeSubgroupObject(part, null, false), m.Short);
  assert.equal(part.pos, 0);
});

test('fetch stream: flags byte by byte (ascending)', () => {
  const b = hex(`1c 04 00 07 01 70
         00 01 70
         02 01 70
         15 03 09 01 70
         0f 01 09 00 01 70
         40 01 70
         808c 01 04
         00 01 70
         810c 00 00`);
  const d = new m.FetchDecoder(false);
  const r = new m.Reader(b);
  const got = [];
  while (r.remaining) got.push(d.decode(r));
  const objs = got.map((e) =>
    e.kind === 'object' ? [e.group, e.subgroup, e.objectId, e.priority] : [e.kind, e.group, e.object],
  );
  assert.deepEqual(objs, [
    [4, 0, 0, 7],
    [4, 0, 1, 7],
    [4, 1, 2, 7],
    [4, 1, 5, 9],
    [6, 9, 0, 9],
    [6, null, 1, 9],
    ['endOfNonExistentRange', 8, 4],
    [8, 0, 5, 9],
    ['endOfUnknownRange', 9, 0],
  ]);
  // Descending below group 0 is an error.
  const src = hex('1c 00 00 01 00   0c 00 00 00');
  const dd = new m.FetchDecoder(true);
  const rr = new m.Reader(src);
  dd.decode(rr);
  assert.throws(() => {
    const e = dd.decode(rr);
    if (e.group < 0) throw new m.ProtocolError('group underflow');
  });
});

test('datagram', () => {
  // Type 0x04 (object 0) | 0x08 (default priority): alias 2, group 5, payload "hi".
  const d = m.decodeDatagram(hex('0c 02 05 6869'));
  assert.equal(d.trackAlias, 2);
  assert.equal(d.group, 5);
  assert.equal(d.objectId, 0);
  assert.equal(d.priority, null);
  assert.deepEqual(d.payload, enc('hi'));
  // Status datagram (0x20): no payload after the status.
  assert.equal(m.decodeDatagram(hex('2c 02 05 03')).status, 3);
  assert.throws(() => m.decodeDatagram(hex('2c 02 05 03 00')), m.ProtocolError);
  assert.throws(() => m.decodeDatagram(hex('22 02 05 00')), m.ProtocolError);
});

test('hang: QUIC varint timestamps and legacy frames', () => {
  // RFC 9000 §A.1 examples.
  assert.deepEqual(hang.readQuicVarint(hex('25'), 0), { value: 37, length: 1 });
  assert.deepEqual(hang.readQuicVarint(hex('7bbd'), 0), { value: 15293, length: 2 });
  assert.deepEqual(hang.readQuicVarint(hex('9d7f3e7d'), 0), { value: 494878333, length: 4 });
  assert.deepEqual(hang.readQuicVarint(hex('c2197c5eff14e88c'), 0), {
    value: 151288809941952652,
    length: 8,
  });
  const f = hang.decodeLegacy(hex('7bbd aabbcc'));
  assert.equal(f.timestamp, 15293);
  assert.deepEqual(f.data, hex('aabbcc'));
  assert.throws(() => hang.decodeLegacy(hex('7b')));
});

test('hang: catalog', () => {
  const c = hang.parseCatalog(
    enc(
      JSON.stringify({
        video: {
          renditions: {
            video: {
              codec: 'avc1.64001f',
              description: '0164001fffe1',
              codedWidth: 1280,
              codedHeight: 720,
              container: { kind: 'legacy' },
            },
          },
        },
        audio: {
          renditions: {
            audio: { codec: 'opus', sampleRate: 48000, numberOfChannels: 2, container: { kind: 'legacy' } },
          },
        },
      }),
    ),
  );
  assert.equal(c.video.length, 1);
  assert.equal(c.video[0].track, 'video');
  assert.deepEqual(c.video[0].description, hex('0164001fffe1'));
  assert.equal(c.audio[0].track, 'audio');
  assert.equal(c.audio[0].description, undefined);
  assert.throws(() => hang.parseCatalog(enc('not json')));
});

// A tiny MP4 box writer for the CMAF tests.
function box(type, ...parts) {
  const body = parts.flatMap((p) => Array.from(p));
  const n = body.length + 8;
  return new Uint8Array([(n >>> 24) & 255, (n >>> 16) & 255, (n >>> 8) & 255, n & 255, ...enc(type), ...body]);
}
const u32 = (v) => new Uint8Array([(v >>> 24) & 255, (v >>> 16) & 255, (v >>> 8) & 255, v & 255]);
const zeros = (n) => new Uint8Array(n);

test('hang: cmaf init segment and fragments', () => {
  const avcC = hex('0142c01effe1');
  const mdhd = box('mdhd', zeros(4), zeros(8), u32(90000), zeros(8));
  const avc1 = box('avc1', zeros(78), box('avcC', avcC));
  const stsd = box('stsd', zeros(4), u32(1), avc1);
  const init = new Uint8Array([
    ...box('ftyp', enc('isom'), zeros(4)),
    ...box('moov', box('trak', box('mdia', mdhd, box('minf', box('stbl', stsd))))),
  ]);
  const i = hang.parseInit(init);
  assert.equal(i.timescale, 90000);
  assert.equal(i.sampleEntry, 'avc1');
  assert.deepEqual(i.description, avcC);
  // tfdt v1 = 180000 (2 s), trun with a size (0x200) and a composition offset (0x800) of 9000.
  const tfdt = box('tfdt', new Uint8Array([1, 0, 0, 0]), zeros(4), u32(180000));
  const trun = box('trun', u32(0x000a00), u32(1), u32(3), u32(9000));
  const frag = new Uint8Array([...box('moof', box('traf', box('tfhd', zeros(8)), tfdt, trun)), ...box('mdat', hex('aabbcc'))]);
  const f = hang.decodeFragment(frag, i.timescale);
  assert.equal(f.timestamp, 2_100_000);
  assert.deepEqual(f.data, hex('aabbcc'));
  // Through the catalog.
  const b64 = Buffer.from(init).toString('base64');
  const c = hang.parseCatalog(
    enc(JSON.stringify({ video: { renditions: { v: { codec: 'avc1.42c01e', container: { kind: 'cmaf', init: b64 } } } } })),
  );
  assert.equal(c.video[0].init.timescale, 90000);
  assert.deepEqual(c.video[0].description, avcC);
  assert.equal(hang.containerSupported(c.video[0]), true);
  assert.equal(hang.decodeFrame(c.video[0], frag).timestamp, 2_100_000);
});
