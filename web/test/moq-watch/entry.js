// The page of test/moq-watch.mjs: moq-dev's <moq-watch> element (npm
// @moq/watch, pinned in package.json), pointed at a quichub relay.
// Query: url (https://HOST:QUIC_PORT/), name (the broadcast), hash (the
// relay certificate's SHA-256 in hex, for serverCertificateHashes), ws
// (MoQT over WebSocket to this URL).
import '@moq/watch/element';

const q = new URLSearchParams(location.search);
const el = document.createElement('moq-watch');
// Read at each connection attempt: pin the self-signed certificate; with
// `ws` (a ws:// URL of the relay's HTTP port) WebSocket only, with no head
// start for WebTransport (the page removes WebTransport, as Safari has
// none), else no WebSocket fallback (a WebTransport failure must not pass
// for a success over WebSocket).
el.connection.webtransport = { serverCertificateHashes: [{ algorithm: 'sha-256', value: q.get('hash') }] };
el.connection.websocket = q.get('ws') ? { enabled: true, url: new URL(q.get('ws')), delay: 0 } : { enabled: false };
el.setAttribute('name', q.get('name'));
el.setAttribute('visible', 'always');
// Not muted: a muted element does not even download its audio (the
// browser is started with autoplay allowed).
const canvas = document.createElement('canvas');
canvas.width = 640;
canvas.height = 360;
el.appendChild(canvas);
document.body.appendChild(el);
el.setAttribute('url', q.get('url'));

// What the test reads, from the element's signals.
window.moqWatchState = () => {
  const est = el.connection.established.peek();
  return {
    connection: el.connection.status.peek(),
    version: est ? String(est.version) : null,
    broadcast: el.broadcast.out.status.peek(),
    catalog: !!el.broadcast.out.catalog.peek(),
    videoFrames: el.video.out.stats.peek()?.frameCount ?? 0,
  };
};
