#!/usr/bin/env python3
"""A small HTTP/3 client on aioquic's H3Connection (PyPI aioquic), for
quichub's end-to-end tests: a third-party HTTP/3 stack talking to our server.

    h3_client.py --port PORT [--host 127.0.0.1] [--ca cert.pem]
                 [--ticket FILE] [--zero-rtt] < spec.json

spec.json: {"requests": [REQUEST, ...], "parallel": false}
REQUEST:   {"method": "POST", "path": "/v1/t/a", "headers": {"k": "v"},
            "authority": "host:port",   # default localhost:PORT
            "body": "text" | "body_b64": "...",
            "stream": {"until_bytes": N, "timeout": SECONDS}}   # streaming GET

Requests run one after another on one connection (all at once with
"parallel": true). A request with "stream" reads its response until the
stream ends, N body bytes have arrived, or the timeout passes, then cancels
it (STOP_SENDING + RESET_STREAM, as a client that goes away does).

Output, one JSON object per line on stdout:
  {"ready": i}                                when response i's headers arrive
  {"early_data_accepted": bool, "responses": [{"status", "headers",
   "body_b64", "reset", "ended"}]}            at the end

--ticket FILE stores the session ticket the server sends and, if FILE
exists, resumes with it; with --zero-rtt the requests are sent before the
handshake completes (0-RTT).
"""
import argparse
import asyncio
import base64
import json
import os
import pickle
import ssl
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import HandshakeCompleted, StreamReset


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.http = H3Connection(self._quic)
        self.streams = {}
        # aioquic's wait_connected() only notices a handshake that completes
        # while it waits, so track completion here.
        self.handshake_done = asyncio.Event()
        self.early_data_accepted = False

    def quic_event_received(self, event):
        if isinstance(event, HandshakeCompleted):
            self.early_data_accepted = event.early_data_accepted
            self.handshake_done.set()
        if isinstance(event, StreamReset) and event.stream_id in self.streams:
            st = self.streams[event.stream_id]
            st["reset"] = event.error_code
            st["done"].set()
        for ev in self.http.handle_event(event):
            st = self.streams.get(ev.stream_id)
            if st is None:
                continue
            if isinstance(ev, HeadersReceived) and st["headers"] is None:
                st["headers"] = ev.headers
                emit({"ready": st["index"]})
            elif isinstance(ev, DataReceived):
                st["body"] += ev.data
                if st["until"] is not None and len(st["body"]) >= st["until"]:
                    st["done"].set()
            if getattr(ev, "stream_ended", False):
                st["ended"] = True
                st["done"].set()

    async def request(self, index, req, authority):
        sid = self._quic.get_next_available_stream_id()
        body = b""
        if "body" in req:
            body = req["body"].encode()
        elif "body_b64" in req:
            body = base64.b64decode(req["body_b64"])
        stream = req.get("stream")
        st = {
            "index": index,
            "headers": None,
            "body": b"",
            "reset": None,
            "ended": False,
            "until": stream.get("until_bytes") if stream else None,
            "done": asyncio.Event(),
        }
        self.streams[sid] = st
        headers = [
            (b":method", req["method"].encode()),
            (b":scheme", b"https"),
            (b":authority", req.get("authority", authority).encode()),
            (b":path", req["path"].encode()),
        ] + [(k.lower().encode(), str(v).encode()) for k, v in req.get("headers", {}).items()]
        has_body = bool(body) or req.get("send_empty_body", False)
        self.http.send_headers(sid, headers, end_stream=not has_body)
        if has_body:
            self.http.send_data(sid, body, end_stream=True)
        self.transmit()
        timeout = (stream or {}).get("timeout", req.get("timeout", 10))
        try:
            await asyncio.wait_for(st["done"].wait(), timeout)
        except asyncio.TimeoutError:
            pass
        if not st["ended"] and st["reset"] is None:
            # Walk away from the response, as a closing browser tab does.
            self._quic.stop_stream(sid, 0x10C)
            self._quic.reset_stream(sid, 0x10C)
            self.transmit()
        h = {k.decode(): v.decode() for k, v in (st["headers"] or [])}
        return {
            "status": int(h.pop(":status")) if ":status" in h else None,
            "headers": h,
            "body_b64": base64.b64encode(st["body"]).decode(),
            "reset": st["reset"],
            "ended": st["ended"],
        }


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ca")
    ap.add_argument("--ticket")
    ap.add_argument("--zero-rtt", action="store_true")
    a = ap.parse_args()
    spec = json.load(sys.stdin)

    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    if a.ca:
        cfg.load_verify_locations(a.ca)
    else:
        cfg.verify_mode = ssl.CERT_NONE
    if a.ticket and os.path.exists(a.ticket):
        with open(a.ticket, "rb") as f:
            cfg.session_ticket = pickle.load(f)

    def save_ticket(ticket):
        if a.ticket:
            with open(a.ticket, "wb") as f:
                pickle.dump(ticket, f)

    authority = f"localhost:{a.port}"
    async with connect(
        a.host,
        a.port,
        configuration=cfg,
        create_protocol=Client,
        session_ticket_handler=save_ticket,
        wait_connected=not a.zero_rtt,
    ) as client:
        reqs = spec["requests"]
        if spec.get("parallel"):
            responses = await asyncio.gather(
                *(client.request(i, r, authority) for i, r in enumerate(reqs))
            )
        else:
            responses = [await client.request(i, r, authority) for i, r in enumerate(reqs)]
        await asyncio.wait_for(client.handshake_done.wait(), 10)
        early = client.early_data_accepted
        # Let a ticket arrive (it follows the handshake) before closing.
        if a.ticket:
            for _ in range(50):
                if os.path.exists(a.ticket):
                    break
                await asyncio.sleep(0.02)
        client.close()
    emit({"early_data_accepted": early, "responses": responses})


if __name__ == "__main__":
    asyncio.run(main())
