// The page of test/moq-publish.mjs: moq-dev's <moq-publish> element (npm
// @moq/publish, pinned in package.json), publishing the browser's camera
// and microphone (Chromium's fake devices) to a quichub relay.
// Query: url (https://HOST:QUIC_PORT/), name (the broadcast), hash (the
// relay certificate's SHA-256 in hex, for serverCertificateHashes), ws
// (MoQT over WebSocket to this URL, for a page without WebTransport).
import '@moq/publish/element';

const q = new URLSearchParams(location.search);
const el = document.createElement('moq-publish');
el.connection.webtransport = { serverCertificateHashes: [{ algorithm: 'sha-256', value: q.get('hash') }] };
el.connection.websocket = q.get('ws') ? { enabled: true, url: new URL(q.get('ws')), delay: 0 } : { enabled: false };
// H.264, which quichub's fMP4 output carries (Chromium picks it anyway
// without a hardware VP9 encoder; this keeps a GPU build from picking VP9),
// at 640x360 at most: a software encoder on a loaded test machine.
el.broadcast.video.hd.config.set({ codec: 'avc1', maxPixels: 640 * 360 });
el.setAttribute('name', q.get('name'));
el.setAttribute('source', 'camera');
const video = document.createElement('video');
video.muted = true;
video.autoplay = true;
el.appendChild(video);
document.body.appendChild(el);
el.setAttribute('url', q.get('url'));

window.moqPublishState = () => {
  const est = el.connection.established.peek();
  return {
    connection: el.connection.status.peek(),
    version: est ? String(est.version) : null,
    videoSource: !!el.broadcast.video.source.peek(),
    audioSource: !!el.broadcast.audio.source.peek(),
    videoCatalog: el.broadcast.video.hd.catalog.peek() ?? null,
    audioCatalog: el.broadcast.audio.catalog.peek() ?? null,
  };
};
