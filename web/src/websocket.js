// MoQT over a WebSocket (ws://, wss://) for browsers without WebTransport
// (Safari) and networks that block UDP: moq-dev's QMux polyfill (@moq/qmux)
// gives the socket WebTransport's API, and the relay's HTTP port speaks it
// (subprotocol qmux-01.moqt-18, as moq-dev pins draft-18). A module of its
// own so that only the player, not the dashboard, bundles the polyfill.

import QmuxSession from '@moq/qmux';
import * as moqt from './moqt.js';

/** A WebTransport-like session over a WebSocket to `url`, for `Session.connect`. */
export function openWebSocket(url) {
  return new QmuxSession(url, {
    protocols: [moqt.ALPN],
    versions: { [moqt.ALPN]: 'qmux-01' },
    requireProtocol: true,
  });
}
