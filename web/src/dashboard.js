// The live dashboard (/): broadcasts (published namespaces) and tracks at
// the relay with subscribers and rates from /v1/relay, and a live plot of
// any track's objects over WebTransport (uPlot).
//
// Plotted values: quichub's IMU payload (16-byte stamp, then 6 big-endian
// f32: accelerometer x, y, z and gyroscope x, y, z); otherwise a payload that
// is a number in text, or a JSON object of numbers (MQTT sensors); otherwise
// the payload's size.

import uPlot from 'uplot';
import { Session, relayInfo, relayUrl, pageToken } from './session.js';
import { FILTER } from './moqt.js';

const $ = (id) => document.getElementById(id);
const td = new TextDecoder();
const WINDOW_S = 10;

const state = { points: 0, plotted: null, series: [], polls: 0, error: null, tracks: [], namespaces: [] };
// For tests: `window.quichubDashboard`.
window.quichubDashboard = state;

let info = null;
let session = null;
let plot = null;
let plotSub = null;

function el(tag, text, attrs = {}) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text; // text, never HTML
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

function watchHref(fields) {
  // The player needs the dashboard's token too.
  const t = pageToken();
  const path = '/watch/' + fields.map(encodeURIComponent).join('/');
  return t ? `${path}?jwt=${encodeURIComponent(t)}` : path;
}

function kbit(bytesPerSec) {
  return (bytesPerSec * 8 / 1000).toFixed(1);
}

/**
 * Broadcasts: the namespaces published with PUBLISH_NAMESPACE and those of
 * the tracks at the relay, each with whether it has a hang catalog.
 */
function broadcasts(j) {
  const m = new Map();
  const add = (fields, how) => {
    const key = fields.join('/');
    const b = m.get(key) || { fields, published: false, tracks: 0, catalog: false };
    if (how === 'namespace') b.published = true;
    m.set(key, b);
    return b;
  };
  for (const n of j.namespaces) add(n.namespace, 'namespace');
  for (const t of j.tracks) {
    const b = add(t.namespace, 'track');
    b.tracks++;
    if (t.name === 'catalog.json') b.catalog = true;
  }
  return [...m.values()].sort((a, b) => a.fields.join('/').localeCompare(b.fields.join('/')));
}

function renderTables(j) {
  const ns = $('namespaces');
  ns.replaceChildren();
  const list = broadcasts(j);
  for (const b of list) {
    const tr = el('tr');
    const name = b.fields.join('/');
    tr.dataset.broadcast = name;
    tr.append(el('td', name));
    tr.append(el('td', b.published ? 'PUBLISH_NAMESPACE' : 'PUBLISH'));
    tr.append(el('td', String(b.tracks)));
    const td2 = el('td');
    if (b.catalog || b.published) td2.append(el('a', b.catalog ? 'watch' : 'watch?', { href: watchHref(b.fields) }));
    tr.append(td2);
    ns.append(tr);
  }
  $('no-namespaces').hidden = list.length > 0;
  const tb = $('tracks');
  tb.replaceChildren();
  for (const t of j.tracks) {
    const tr = el('tr');
    const full = [...t.namespace, t.name].join('/');
    tr.dataset.track = full;
    tr.append(el('td', t.namespace.join('/')));
    tr.append(el('td', t.name));
    tr.append(el('td', t.origin));
    tr.append(el('td', String(t.subscribers)));
    tr.append(el('td', String(t.objects_per_sec)));
    tr.append(el('td', kbit(t.bytes_per_sec)));
    tr.append(el('td', t.largest ? `${t.largest.group}/${t.largest.object}` : '-'));
    const act = el('td');
    const b = el('button', 'plot', { type: 'button' });
    b.onclick = () => startPlot(t.namespace, t.name);
    act.append(b);
    tr.append(act);
    tb.append(tr);
  }
  $('no-tracks').hidden = j.tracks.length > 0;
  $('sessions').textContent = String(j.sessions);
}

async function poll() {
  try {
    const j = await relayInfo();
    info = j;
    state.tracks = j.tracks;
    state.namespaces = j.namespaces;
    state.polls++;
    renderTables(j);
    $('status').textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    $('status').textContent = `relay unreachable: ${e.message}`;
  }
}

/** Values of one object, and their series names. */
export function decodeValues(payload) {
  if (payload.length === 40) {
    const v = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
    const vals = [];
    for (let i = 0; i < 6; i++) vals.push(v.getFloat32(16 + i * 4, false));
    if (vals.every(Number.isFinite)) return { names: ['ax', 'ay', 'az', 'gx', 'gy', 'gz'], vals };
  }
  if (payload.length <= 4096) {
    const s = td.decode(payload).trim();
    const n = Number(s);
    if (s.length && Number.isFinite(n)) return { names: ['value'], vals: [n] };
    try {
      const o = JSON.parse(s);
      if (o && typeof o === 'object' && !Array.isArray(o)) {
        const names = Object.keys(o).filter((k) => typeof o[k] === 'number').slice(0, 8);
        if (names.length) return { names, vals: names.map((k) => o[k]) };
      }
    } catch {
      /* not JSON */
    }
  }
  return { names: ['bytes'], vals: [payload.length] };
}

const COLORS = ['#e6194b', '#3cb44b', '#4363d8', '#f58231', '#911eb4', '#42d4f4', '#f032e6', '#9a6324'];

async function startPlot(namespace, name) {
  const label = [...namespace, name].join('/');
  $('plot-title').textContent = label;
  $('plot-status').textContent = 'subscribing';
  if (plotSub) plotSub.close();
  plotSub = null;
  if (plot) plot.destroy();
  plot = null;
  state.points = 0;
  state.series = [];
  state.plotted = label;
  try {
    if (!session) {
      const i = info || (await relayInfo());
      session = await Session.connect(relayUrl(i), { fingerprint: i.certificate_sha256 });
      session.closed.then(() => {
        session = null;
      });
    }
    let names = null;
    let data = null;
    const t0 = performance.now();
    let dirty = false;
    const onObject = (o) => {
      if (o.status !== 0 || !o.payload.length) return;
      const { names: n, vals } = decodeValues(o.payload);
      if (!names || n.join() !== names.join()) {
        names = n;
        state.series = n;
        data = [[], ...n.map(() => [])];
        if (plot) plot.destroy();
        plot = new uPlot(
          {
            width: Math.min(900, $('plot').clientWidth || 900),
            height: 300,
            scales: { x: { time: false } },
            axes: [{ label: 's' }, {}],
            series: [{ label: 't (s)' }, ...n.map((s, i) => ({ label: s, stroke: COLORS[i % COLORS.length] }))],
          },
          data,
          $('plot'),
        );
      }
      const t = (performance.now() - t0) / 1000;
      data[0].push(t);
      vals.forEach((v, i) => data[i + 1].push(v));
      while (data[0].length && data[0][0] < t - WINDOW_S) data.forEach((s) => s.shift());
      state.points++;
      dirty = true;
    };
    plotSub = await session.subscribe(namespace, name, onObject, { filter: { type: FILTER.LARGEST_OBJECT } });
    $('plot-status').textContent = 'live';
    const draw = () => {
      if (!plotSub) return;
      if (dirty && plot) {
        plot.setData(data);
        dirty = false;
      }
      $('plot-points').textContent = String(state.points);
      requestAnimationFrame(draw);
    };
    requestAnimationFrame(draw);
  } catch (e) {
    state.error = e.message;
    $('plot-status').textContent = `error: ${e.message}`;
  }
}

function main() {
  poll();
  setInterval(poll, 1000);
  // `/?plot=ns/track` plots that track at once (the last field is the track name).
  const p = new URLSearchParams(location.search).get('plot');
  if (p) {
    const fields = p.split('/').filter((s) => s.length);
    if (fields.length >= 2) startPlot(fields.slice(0, -1), fields[fields.length - 1]);
  }
}

main();
