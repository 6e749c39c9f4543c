"""Runs an aiomoqt script (the first argument; the rest are its own) with its
WebTransport CONNECT stripped of `wt-available-protocols`: a draft-14 client
that offers no subprotocol, as draft 14 allowed (the version was negotiated
in CLIENT_SETUP alone). Everything else is aiomoqt's: only the header goes."""
import runpy
import sys

from qh3.h3.connection import H3Connection

_send_headers = H3Connection.send_headers


def _without_subprotocols(self, stream_id, headers, end_stream=False):
    headers = [(k, v) for (k, v) in headers if k != b"wt-available-protocols"]
    return _send_headers(self, stream_id, headers, end_stream)


H3Connection.send_headers = _without_subprotocols
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
