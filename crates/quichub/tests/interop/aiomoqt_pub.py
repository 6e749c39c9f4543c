"""Runs aiomoqt's own example publisher (examples/pub_example.py) against a
relay with a self-signed certificate: the example has no flag to skip the
certificate check, so MOQTClient is built with verify_tls=False. Arguments
are pub_example's."""
import os
import runpy
import sys

import aiomoqt
import aiomoqt.client

_init = aiomoqt.client.MOQTClient.__init__


def _insecure(self, *args, **kwargs):
    kwargs["verify_tls"] = False
    _init(self, *args, **kwargs)


aiomoqt.client.MOQTClient.__init__ = _insecure
example = os.path.join(os.path.dirname(aiomoqt.__file__), "examples", "pub_example.py")
sys.argv = [example] + sys.argv[1:]
runpy.run_path(example, run_name="__main__")
