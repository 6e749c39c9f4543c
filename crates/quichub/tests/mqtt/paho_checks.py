#!/usr/bin/env python3
"""End-to-end checks of the quichub MQTT broker with the Eclipse Paho client
(paho-mqtt 2.x), driven by crates/quichub/tests/e2e_mqtt_paho.rs.

Usage: paho_checks.py HOST PORT CHECK

Every check waits on events with timeouts (no sleeps as assertions, except
short "nothing more arrives" windows and the waits that let a delay or an
expiry run out) and exits non-zero with a message on the first failed
expectation.
"""

import collections
import os
import queue
import socket
import sys
import threading
import time
import traceback

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

HOST = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
PORT = int(sys.argv[2]) if len(sys.argv) > 2 else 1883
# Longest wait for something that must happen.
WAIT = 5.0
# How long to watch for something that must not happen.
QUIET = 0.6
V5 = mqtt.MQTTv5
V311 = mqtt.MQTTv311


class CheckFailed(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise CheckFailed(what)


def log(*args):
    print(*args, flush=True)


def props(ptype, **kw):
    p = Properties(ptype)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def vname(version):
    return "5" if version == V5 else "3.1.1"


class Client:
    """A paho client whose callbacks feed queues the checks wait on."""

    def __init__(self, cid, version=V5, clean=True, expiry=None, will=None,
                 receive_maximum=None, manual_ack=False):
        self.cid = cid
        self.version = version
        self.clean = clean
        self.expiry = expiry
        self.receive_maximum = receive_maximum
        kw = {}
        if version != V5:
            kw["clean_session"] = clean
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid,
                             protocol=version, reconnect_on_failure=False, **kw)
        self.messages = queue.Queue()
        self.connacks = queue.Queue()
        self.subacks = queue.Queue()
        self.disconnects = queue.Queue()
        self.lock = threading.Lock()
        self.published = set()
        if manual_ack:
            self.c.manual_ack_set(True)
        if will is not None:
            topic, payload, qos, retain, delay = will
            wp = None
            if version == V5 and delay is not None:
                wp = props(PacketTypes.WILLMESSAGE, WillDelayInterval=delay)
            self.c.will_set(topic, payload, qos, retain, wp)
        self.c.on_connect = self._on_connect
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe
        self.c.on_publish = self._on_publish
        self.c.on_disconnect = self._on_disconnect
        self.log = collections.deque(maxlen=20)
        self.c.on_log = lambda _c, _u, _level, line: self.log.append(f"{time.monotonic():.3f} {line}")

    def _on_connect(self, _c, _u, flags, rc, properties):
        self.connacks.put((flags, rc, properties))

    def _on_message(self, _c, _u, msg):
        self.messages.put(msg)

    def _on_subscribe(self, _c, _u, mid, rcs, properties):
        self.subacks.put((mid, rcs))

    def _on_publish(self, _c, _u, mid, rc, properties):
        with self.lock:
            self.published.add(mid)

    def _on_disconnect(self, _c, _u, flags, rc, properties):
        self.disconnects.put(rc)

    def connect(self):
        """Connects and waits for a successful CONNACK; returns session_present."""
        if self.version == V5:
            cp = Properties(PacketTypes.CONNECT)
            if self.expiry is not None:
                cp.SessionExpiryInterval = self.expiry
            if self.receive_maximum is not None:
                cp.ReceiveMaximum = self.receive_maximum
            self.c.connect(HOST, PORT, keepalive=30, clean_start=self.clean,
                           properties=cp)
        else:
            self.c.connect(HOST, PORT, keepalive=30)
        self.c.loop_start()
        try:
            flags, rc, _p = self.connacks.get(timeout=WAIT)
        except queue.Empty:
            raise CheckFailed(f"{self.cid}: no CONNACK")
        expect(not rc.is_failure, f"{self.cid}: CONNACK refused: {rc}")
        return flags.session_present

    def subscribe(self, topic, qos=1, no_local=False, rap=False, rh=0, sub_id=None):
        p = None
        if self.version == V5:
            opts = SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=rap,
                                    retainHandling=rh)
            if sub_id is not None:
                p = props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=sub_id)
            rc, mid = self.c.subscribe(topic, options=opts, properties=p)
        else:
            rc, mid = self.c.subscribe(topic, qos)
        expect(rc == mqtt.MQTT_ERR_SUCCESS, f"{self.cid}: subscribe {topic}: {rc}")
        try:
            got, rcs = self.subacks.get(timeout=WAIT)
        except queue.Empty:
            raise CheckFailed(f"{self.cid}: no SUBACK for {topic}")
        expect(got == mid, f"{self.cid}: SUBACK for {got}, expected {mid}")
        expect(len(rcs) == 1 and not rcs[0].is_failure and rcs[0].value == qos,
               f"{self.cid}: SUBACK for {topic} qos {qos}: {rcs}")

    def publish(self, topic, payload, qos=0, retain=False, properties=None):
        info = self.c.publish(topic, payload, qos, retain, properties)
        expect(info.rc == mqtt.MQTT_ERR_SUCCESS, f"{self.cid}: publish {topic}: {info.rc}; paho log:\n"
               + "\n".join(self.log))
        self.wait_published(info, topic)
        return info

    def wait_published(self, info, what=""):
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            with self.lock:
                if info.mid in self.published:
                    return
            time.sleep(0.005)
        raise CheckFailed(f"{self.cid}: publish {what} (mid {info.mid}) not completed "
                          f"(on_publish not called)")

    def recv(self, what="a message", timeout=WAIT):
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise CheckFailed(f"{self.cid}: timed out waiting for {what}")

    def recv_n(self, n, what="messages"):
        return [self.recv(f"{what} ({i + 1}/{n})") for i in range(n)]

    def expect_nothing(self, why, window=QUIET):
        try:
            m = self.messages.get(timeout=window)
        except queue.Empty:
            return
        raise CheckFailed(f"{self.cid}: unexpected message on {m.topic} "
                          f"payload {m.payload[:40]!r} ({why})")

    def disconnect(self, reasoncode=None):
        if reasoncode is None:
            self.c.disconnect()
        else:
            self.c.disconnect(reasoncode=reasoncode)
        try:
            self.disconnects.get(timeout=WAIT)
        except queue.Empty:
            raise CheckFailed(f"{self.cid}: disconnect not completed")
        self.c.loop_stop()

    def kill(self):
        """Drops the TCP connection without a DISCONNECT packet; returns when
        (time.monotonic()) the connection was shut down."""
        s = self.c.socket()
        expect(s is not None, f"{self.cid}: no socket to close")
        s.shutdown(socket.SHUT_RDWR)
        t = time.monotonic()
        # The network thread sees the connection lost and, with
        # reconnect_on_failure off, ends.
        self.c.loop_stop()
        return t


def connected(cid, **kw):
    c = Client(cid, **kw)
    c.connect()
    return c


# ---------------------------------------------------------------- checks


def check_qos_matrix():
    big = bytes(range(256)) * 256  # 64 KiB, every byte value
    for version in (V311, V5):
        v = vname(version)
        sub = connected(f"qm-sub-{v}", version=version)
        pub = connected(f"qm-pub-{v}", version=version)
        for sq in range(3):
            sub.subscribe(f"qm/{v}/s{sq}", qos=sq)
        expected = {}
        for pq in range(3):
            for sq in range(3):
                topic = f"qm/{v}/s{sq}"
                small = b"\x00" + bytes([pq, sq]) + b"\x00\xff\x00bin\x00"
                large = bytes([pq, sq]) + big
                for payload in (small, large):
                    expected[(topic, payload)] = (pq, sq)
                    pub.publish(topic, payload, qos=pq)
        got = {}
        for i in range(len(expected)):
            m = sub.recv(f"v{v} message {i + 1}/{len(expected)}")
            key = (m.topic, bytes(m.payload))
            expect(key in expected, f"v{v}: unexpected message {m.topic} "
                   f"len {len(m.payload)} head {bytes(m.payload[:12])!r}")
            expect(key not in got, f"v{v}: duplicate message {m.topic} "
                   f"head {bytes(m.payload[:12])!r}")
            got[key] = m.qos
        for (topic, payload), (pq, sq) in expected.items():
            q = got[(topic, payload)]
            expect(q == min(pq, sq), f"v{v}: pub qos {pq} sub qos {sq} ({len(payload)} bytes): "
                   f"received qos {q}, expected {min(pq, sq)}")
        sub.expect_nothing(f"v{v}: all {len(expected)} received")
        log(f"qos_matrix v{v}: {len(expected)} deliveries with qos = min(pub, sub), payloads exact")
        sub.disconnect()
        pub.disconnect()


def check_retained():
    pub = connected("ret-pub")
    pub.publish("r/a", b"one", qos=1, retain=True)
    s1 = connected("ret-s1")
    s1.subscribe("r/#", qos=1)
    m = s1.recv("retained 'one'")
    expect((m.topic, m.payload, m.retain) == ("r/a", b"one", True),
           f"retained on subscribe: {m.topic} {m.payload!r} retain={m.retain}")
    # Replaced by a newer one; live delivery has RETAIN 0 (Retain As Published 0).
    pub.publish("r/a", b"two", qos=1, retain=True)
    m = s1.recv("live 'two'")
    expect((m.payload, m.retain) == (b"two", False),
           f"live retained publish: {m.payload!r} retain={m.retain} (expected retain 0)")
    s2 = connected("ret-s2")
    s2.subscribe("r/a", qos=1)
    m = s2.recv("retained 'two'")
    expect((m.payload, m.retain) == (b"two", True),
           f"replaced retained: {m.payload!r} retain={m.retain}")
    s2.expect_nothing("only the newest retained message")
    # Cleared by an empty retained payload (still forwarded to subscribers).
    pub.publish("r/a", b"", qos=1, retain=True)
    m = s1.recv("live empty retained publish")
    expect(m.payload == b"", f"empty retained publish forwarded as {m.payload!r}")
    s3 = connected("ret-s3")
    s3.subscribe("r/#", qos=1)
    s3.expect_nothing("retained message was cleared")
    log("retained: delivered on subscribe, replaced, cleared")

    # Retain Handling.
    pub.publish("rh/x", b"keep", qos=1, retain=True)
    s4 = connected("ret-s4")
    s4.subscribe("rh/x", qos=1, rh=2)
    s4.expect_nothing("retain handling 2")
    s5 = connected("ret-s5")
    s5.subscribe("rh/x", qos=1, rh=1)
    m = s5.recv("retained with retain handling 1 (new subscription)")
    expect((m.payload, m.retain) == (b"keep", True), f"rh1: {m.payload!r} retain={m.retain}")
    s5.subscribe("rh/x", qos=1, rh=1)
    s5.expect_nothing("retain handling 1 on an existing subscription")
    s5.subscribe("rh/x", qos=1, rh=0)
    m = s5.recv("retained with retain handling 0 on resubscribe")
    expect((m.payload, m.retain) == (b"keep", True), f"rh0: {m.payload!r} retain={m.retain}")
    log("retained: retain handling 0/1/2")

    # Retain As Published on live messages.
    s6 = connected("ret-s6")
    s6.subscribe("rap/t", qos=1, rap=True)
    s7 = connected("ret-s7")
    s7.subscribe("rap/t", qos=1, rap=False)
    pub.publish("rap/t", b"r", qos=1, retain=True)
    pub.publish("rap/t", b"n", qos=1, retain=False)
    for c, want in ((s6, [(b"r", True), (b"n", False)]), (s7, [(b"r", False), (b"n", False)])):
        got = [(bytes(m.payload), m.retain) for m in c.recv_n(2, "live messages")]
        expect(got == want, f"{c.cid}: retain as published: got {got}, expected {want}")
    log("retained: retain as published 1/0 on live messages")


def check_will():
    sub = connected("will-sub")
    sub.subscribe("will/#", qos=1)

    # Abrupt close: the will is published.
    a = connected("will-a", will=("will/a", b"a-gone", 1, False, 0))
    a.kill()
    m = sub.recv("will of a connection closed without DISCONNECT")
    expect((m.topic, m.payload) == ("will/a", b"a-gone"), f"will: {m.topic} {m.payload!r}")
    log("will: published when the socket closes abruptly")

    # Clean DISCONNECT: no will.
    b = connected("will-b", will=("will/b", b"b-gone", 1, False, 0))
    b.disconnect()
    sub.expect_nothing("clean DISCONNECT discards the will")
    log("will: discarded on a normal DISCONNECT")

    # DISCONNECT with reason 0x04: the will is published.
    c = connected("will-c", will=("will/c", b"c-gone", 1, False, 0))
    c.disconnect(ReasonCode(PacketTypes.DISCONNECT, identifier=0x04))
    m = sub.recv("will after DISCONNECT 0x04")
    expect((m.topic, m.payload) == ("will/c", b"c-gone"), f"will 0x04: {m.topic} {m.payload!r}")
    log("will: published on DISCONNECT with reason 0x04")

    # In parallel, to save time, all with session expiry 10 s:
    # - d: will delay 2 s, connection dropped, reconnected within 1 s: no will;
    # - e: will delay 1 s, connection dropped, no reconnect: will after 1 s;
    # - t: will delay 2 s, session taken over by a new connection (Clean
    #   Start 0) while still connected: no will (§3.1.2.5: a new connection to
    #   the session came before the delay ran out);
    # - k: will delay 5 s, taken over by a new connection with Clean Start 1:
    #   the session ended, so the will is published at once.
    def delayed(name, delay):
        return connected(f"will-{name}", will=(f"will/{name}", f"{name}-gone".encode(), 1, False, delay),
                         clean=False, expiry=10)

    d, e, t, k = delayed("d", 2), delayed("e", 1), delayed("t", 2), delayed("k", 5)
    t_e = e.kill()
    t_d = d.kill()
    d2 = Client("will-d", clean=False, expiry=10)
    present = d2.connect()
    took = time.monotonic() - t_d
    expect(took < 1.0, f"reconnect took {took:.2f} s, more than 1 s")
    expect(present, "will-d: session not present on reconnect")
    takers = []
    for old, clean in ((t, False), (k, True)):
        new = Client(old.cid, clean=clean, expiry=10)
        expect(new.connect() != clean, f"{old.cid}: session present {not clean} expected "
               f"on takeover with clean start {clean}")
        try:
            old.disconnects.get(timeout=WAIT)
        except queue.Empty:
            raise CheckFailed(f"{old.cid}: not disconnected when its session was taken over")
        old.c.loop_stop()
        takers.append(new)
    wills = []
    while True:
        left = t_d + 2.6 - time.monotonic()
        if left <= 0:
            break
        try:
            m = sub.messages.get(timeout=left)
        except queue.Empty:
            break
        wills.append((m.topic, time.monotonic() - t_e))
    log("will: delayed and takeover wills seen: "
        + ", ".join(f"{topic} after {at:.2f} s" for topic, at in wills))
    topics = sorted(topic for topic, _ in wills)
    expect(topics == ["will/e", "will/k"], f"wills published: {topics}, expected will/e and will/k "
           f"(will/d: reconnected within its delay; will/t: taken over within its delay)")
    expect(dict(wills)["will/k"] < 0.9, "will/k: not published when its session ended")
    elapsed = dict(wills)["will/e"]
    expect(elapsed >= 0.9, f"will with delay 1 s arrived after {elapsed:.2f} s")
    expect(elapsed <= 2.5, f"will with delay 1 s arrived only after {elapsed:.2f} s")
    log(f"will: delay 1 s honoured (arrived after {elapsed:.2f} s); delayed will cancelled by "
        f"a reconnect after {took:.2f} s and by a takeover; published when a takeover ends the session")
    for c in takers:
        c.disconnect()
    d2.disconnect()


def persistent_round(version, tag):
    v = vname(version)
    cid = f"ps-{tag}"
    topic = f"ps/{tag}"
    s = Client(cid, version=version, clean=False, expiry=60)
    expect(not s.connect(), f"{cid}: session present on the first connect")
    s.subscribe(topic, qos=1)
    s.disconnect()
    pub = connected(f"ps-pub-{tag}", version=version)
    sent = []
    for i, q in enumerate([1, 0, 1, 1, 0, 1, 1]):
        payload = f"{tag}-{i}-q{q}".encode()
        pub.publish(topic, payload, qos=q)
        if q == 1:
            sent.append(payload)
    s = Client(cid, version=version, clean=False, expiry=60)
    expect(s.connect(), f"{cid} (v{v}): session_present false on resume")
    got = [bytes(m.payload) for m in s.recv_n(len(sent), "queued messages")]
    expect(got == sent, f"{cid} (v{v}): queued {got}, expected {sent}")
    s.expect_nothing("only the QoS 1 messages were queued")
    s.disconnect()
    log(f"persistent_session v{v}: session present, {len(sent)} QoS 1 messages in order, QoS 0 dropped")
    return pub


def check_persistent_session():
    pub = persistent_round(V5, "v5")
    persistent_round(V311, "v311")

    # Clean Start discards the session and its queue.
    pub.publish("ps/v5", b"lost", qos=1)
    s = Client("ps-v5", clean=True, expiry=60)
    expect(not s.connect(), "ps-v5: session present with clean_start=True")
    s.expect_nothing("clean start discards the queue")
    s.disconnect()
    log("persistent_session: clean start -> no session, nothing queued")

    # Session expiry 1 s: gone after 2.5 s offline.
    s = Client("ps-exp", clean=False, expiry=1)
    s.connect()
    s.subscribe("ps/exp", qos=1)
    s.disconnect()
    time.sleep(2.5)
    s = Client("ps-exp", clean=False, expiry=1)
    expect(not s.connect(), "ps-exp: session still present 2.5 s after a 1 s expiry")
    s.disconnect()
    log("persistent_session: session expired after its expiry interval")


def check_shared():
    a = connected("sh-a")
    b = connected("sh-b")
    n = connected("sh-n")
    a.subscribe("$share/g/jobs", qos=1)
    b.subscribe("$share/g/jobs", qos=1)
    n.subscribe("jobs", qos=1)
    pub = connected("sh-pub")
    jobs = [f"job-{i}".encode() for i in range(20)]
    for j in jobs:
        pub.publish("jobs", j, qos=1)
    got_n = [bytes(m.payload) for m in n.recv_n(20, "messages of the normal subscriber")]
    expect(sorted(got_n) == sorted(jobs), f"normal subscriber got {got_n}")
    got_a, got_b = [], []
    deadline = time.monotonic() + WAIT
    while len(got_a) + len(got_b) < 20 and time.monotonic() < deadline:
        for c, got in ((a, got_a), (b, got_b)):
            try:
                while True:
                    got.append(bytes(c.messages.get_nowait().payload))
            except queue.Empty:
                pass
        time.sleep(0.01)
    a.expect_nothing("20 messages shared", window=0.3)
    b.expect_nothing("20 messages shared", window=0.3)
    sa, sb = set(got_a), set(got_b)
    expect(len(got_a) == len(sa) and len(got_b) == len(sb), "duplicates within a member")
    expect(not (sa & sb), f"shared members overlap: {sorted(sa & sb)}")
    expect(sa | sb == set(jobs), f"shared members missed {sorted(set(jobs) - (sa | sb))}")
    expect(sa and sb, f"one member got nothing: a={len(sa)} b={len(sb)}")
    log(f"shared: members got {len(sa)} + {len(sb)} disjoint, normal subscriber all 20")

    pub.publish("sjobs/r", b"retained", qos=1, retain=True)
    c = connected("sh-c")
    c.subscribe("$share/g2/sjobs/#", qos=1)
    c.expect_nothing("retained messages are not sent to shared subscriptions")
    d = connected("sh-d")
    d.subscribe("sjobs/#", qos=1)
    m = d.recv("retained on a normal subscription")
    expect(m.payload == b"retained" and m.retain, f"control: {m.payload!r} retain={m.retain}")
    log("shared: no retained messages for a shared subscription")


def check_wildcards():
    filters = {"+/b/#": {"a/b", "a/b/c/d", "x/b"},
               "a/+": {"a/b"},
               "#": {"a/b", "a/b/c/d", "x/b"}}
    subs = {}
    for i, f in enumerate(filters):
        c = connected(f"wc-{i}")
        c.subscribe(f, qos=1)
        subs[f] = c
    sys_sub = connected("wc-sys")
    sys_sub.subscribe("$SYS/#", qos=1)
    pub = connected("wc-pub")
    # Clients never publish to $SYS (refused, as mosquitto does).
    for t in ("a/b", "a/b/c/d", "x/b", "$SYS/x"):
        pub.publish(t, t.encode(), qos=1)
    for f, want in filters.items():
        c = subs[f]
        got = [m.topic for m in c.recv_n(len(want), f"matches of {f}")]
        expect(sorted(got) == sorted(want), f"filter {f}: got {sorted(got)}, expected {sorted(want)}")
        c.expect_nothing(f"filter {f} matches only {sorted(want)}", window=0.3)
        log(f"wildcards: {f} -> {sorted(got)}")
    # `$SYS/#` sees only the broker's own topics (`#` saw none of them).
    seen = []
    while True:
        try:
            seen.append(sys_sub.messages.get(timeout=0.3).topic)
        except queue.Empty:
            break
    expect(all(t.startswith("$SYS/broker/") for t in seen),
           f"filter $SYS/#: only $SYS/broker/... topics, got {sorted(seen)}")
    log(f"wildcards: $SYS/# -> {len(seen)} broker topics")


def check_properties():
    pub = connected("pr-pub")
    sub = connected("pr-sub")
    sub.subscribe("p/x", qos=1)
    up = [("k1", "v1"), ("k1", "v2"), ("a", "b")]
    pp = props(PacketTypes.PUBLISH, UserProperty=up, ContentType="application/json",
               ResponseTopic="p/reply", CorrelationData=b"\x00corr\xff",
               PayloadFormatIndicator=1)
    pub.publish("p/x", '{"ok":true}', qos=1, properties=pp)
    m = sub.recv("message with properties")
    p = m.properties
    got = {
        "UserProperty": getattr(p, "UserProperty", None),
        "ContentType": getattr(p, "ContentType", None),
        "ResponseTopic": getattr(p, "ResponseTopic", None),
        "CorrelationData": getattr(p, "CorrelationData", None),
        "PayloadFormatIndicator": getattr(p, "PayloadFormatIndicator", None),
    }
    want = {"UserProperty": up, "ContentType": "application/json", "ResponseTopic": "p/reply",
            "CorrelationData": b"\x00corr\xff", "PayloadFormatIndicator": 1}
    expect(got == want, f"properties: got {got}, expected {want}")
    expect(m.payload == b'{"ok":true}', f"payload {m.payload!r}")
    log("properties: user properties, content type, response topic, correlation data, "
        "payload format forwarded")

    # Message expiry while queued for an offline session.
    s = Client("pr-exp", clean=False, expiry=60)
    s.connect()
    s.subscribe("pe/t", qos=1)
    s.disconnect()
    pub.publish("pe/t", b"short", qos=1, properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
    pub.publish("pe/t", b"long", qos=1, properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=60))
    time.sleep(2.0)
    s = Client("pr-exp", clean=False, expiry=60)
    expect(s.connect(), "pr-exp: session not present")
    m = s.recv("the message with expiry 60")
    expect(m.payload == b"long", f"expired message delivered: {m.payload!r}")
    mei = getattr(m.properties, "MessageExpiryInterval", None)
    expect(mei is not None and 50 <= mei <= 60, f"remaining expiry {mei}, expected <= 60")
    s.expect_nothing("the message with expiry 1 s expired offline")
    s.disconnect()
    log(f"properties: expired message dropped, other delivered with remaining expiry {mei}")

    # Subscription identifiers of overlapping subscriptions: one delivery with both.
    sid = connected("pr-sid")
    sid.subscribe("sid/#", qos=1, sub_id=7)
    sid.subscribe("sid/+", qos=1, sub_id=9)
    pub.publish("sid/a", b"x", qos=1)
    m = sid.recv("message with subscription identifiers")
    ids = getattr(m.properties, "SubscriptionIdentifier", None)
    expect(ids is not None and sorted(ids) == [7, 9], f"subscription identifiers {ids}, expected [7, 9]")
    sid.expect_nothing("one delivery for overlapping subscriptions")
    log(f"properties: subscription identifiers {sorted(ids)} in one delivery")


def check_topic_alias():
    sub = connected("ta-sub")
    sub.subscribe("ta/#", qos=1)
    pub = connected("ta-pub")
    steps = [("ta/x", "ta/x"), ("", "ta/x"), ("ta/y", "ta/y"), ("", "ta/y")]
    for i, (sent, want) in enumerate(steps):
        pub.publish(sent, f"m{i}".encode(), qos=1, properties=props(PacketTypes.PUBLISH, TopicAlias=1))
        m = sub.recv(f"aliased message {i}")
        expect((m.topic, m.payload) == (want, f"m{i}".encode()),
               f"alias step {i}: got {m.topic} {m.payload!r}, expected {want}")
    log("topic_alias: alias set, used, remapped")
    # paho-mqtt 2.1 drops the reason code of a DISCONNECT without properties
    # (eclipse-paho/paho.mqtt.python#860), so paho only sees that it was
    # disconnected; a raw MQTT 5 connection checks the reason code itself.
    # (The DISCONNECT can beat publish() returning, which then reports
    # MQTT_ERR_NO_CONN: its return code is not checked.)
    pub.c.publish("ta/z", b"bad", 1, False, props(PacketTypes.PUBLISH, TopicAlias=65))
    try:
        pub.disconnects.get(timeout=WAIT)
    except queue.Empty:
        raise CheckFailed("paho not disconnected after topic alias 65 > Topic Alias Maximum 64")
    pub.c.loop_stop()
    with raw_connect_v5("ta-raw") as s:
        topic = b"ta/z"
        body = (len(topic).to_bytes(2, "big") + topic
                + b"\x03\x23" + (65).to_bytes(2, "big") + b"bad")
        s.sendall(bytes([0x30, len(body)]) + body)
        ptype, pbody = read_packet(s)
        expect(ptype == 0xE0, f"after alias 65: packet {ptype:#x}, expected DISCONNECT")
        expect(pbody[:1] == b"\x94", f"DISCONNECT {pbody.hex()}, expected reason 0x94")
    sub.expect_nothing("message with an invalid alias is not routed", window=0.3)
    log("topic_alias: alias 65 -> DISCONNECT 0x94")


def check_no_local():
    a = connected("nl-a")
    b = connected("nl-b")
    c = connected("nl-c")
    a.subscribe("nl/t", qos=1, no_local=True)
    b.subscribe("nl/t", qos=1)
    a.publish("nl/t", b"from-a", qos=1)
    c.publish("nl/t", b"from-c", qos=1)
    m = a.recv("another client's message")
    expect(m.payload == b"from-c", f"no local: subscriber got {m.payload!r}")
    a.expect_nothing("no local")
    got = [bytes(m.payload) for m in b.recv_n(2, "both messages")]
    expect(got == [b"from-a", b"from-c"], f"other subscriber got {got}")
    log("no_local: own publishes suppressed, others delivered")


def check_receive_maximum():
    s = Client("rm-sub", receive_maximum=2, manual_ack=True)
    s.connect()
    s.subscribe("rm/t", qos=1)
    pub = connected("rm-pub")
    for i in range(5):
        pub.publish("rm/t", f"m{i}".encode(), qos=1)
    first = s.recv_n(2, "messages within receive maximum 2")
    s.expect_nothing("receive maximum 2 reached, none acknowledged")
    got = list(first)
    s.c.ack(first[0].mid, 1)
    third = s.recv("a message after one PUBACK")
    got.append(third)
    s.expect_nothing("one PUBACK frees one slot")
    s.c.ack(first[1].mid, 1)
    s.c.ack(third.mid, 1)
    rest = s.recv_n(2, "the remaining messages")
    got.extend(rest)
    for m in rest:
        s.c.ack(m.mid, 1)
    payloads = [bytes(m.payload) for m in got]
    expect(payloads == [f"m{i}".encode() for i in range(5)], f"received {payloads}")
    log("receive_maximum: at most 2 unacknowledged QoS 1 messages in flight")


def read_packet(s):
    """One MQTT packet from a raw socket: (first byte, body)."""

    def read_exact(n):
        data = b""
        while len(data) < n:
            chunk = s.recv(n - len(data))
            if not chunk:
                raise CheckFailed(f"connection closed after {data.hex()!r}")
            data += chunk
        return data

    first = read_exact(1)[0]
    length, shift = 0, 0
    while True:
        b = read_exact(1)[0]
        length |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return first, read_exact(length)


def raw_connect_v5(client_id):
    """A raw MQTT 5 connection after a successful CONNACK."""
    cid = client_id.encode()
    body = b"\x00\x04MQTT\x05\x02\x00\x3c\x00" + len(cid).to_bytes(2, "big") + cid
    s = socket.create_connection((HOST, PORT), timeout=WAIT)
    s.sendall(bytes([0x10, len(body)]) + body)
    ptype, pbody = read_packet(s)
    expect(ptype == 0x20 and pbody[1:2] == b"\x00", f"raw CONNACK {ptype:#x} {pbody.hex()}")
    return s


def raw_connect_v311(client_id, clean):
    cid = client_id.encode()
    var = b"\x00\x04MQTT\x04" + bytes([0x02 if clean else 0x00]) + b"\x00\x3c"
    body = var + len(cid).to_bytes(2, "big") + cid
    pkt = bytes([0x10, len(body)]) + body
    with socket.create_connection((HOST, PORT), timeout=WAIT) as s:
        s.sendall(pkt)
        data = b""
        while len(data) < 4:
            chunk = s.recv(4 - len(data))
            if not chunk:
                break
            data += chunk
        return data


def check_v311_basics():
    c = Client("", version=V311, clean=True)
    c.connect()
    c.subscribe("v311/t", qos=1)
    c.publish("v311/t", b"hi", qos=1)
    m = c.recv("own message")
    expect(m.payload == b"hi", f"payload {m.payload!r}")
    c.disconnect()
    log("v311_basics: empty client id with clean session accepted")
    ack = raw_connect_v311("", clean=False)
    expect(ack == b"\x20\x02\x00\x02",
           f"empty client id with clean session 0: CONNACK {ack.hex()}, expected 20020002")
    ack = raw_connect_v311("v311-raw", clean=True)
    expect(ack == b"\x20\x02\x00\x00", f"raw CONNACK {ack.hex()}, expected 20020000")
    log("v311_basics: empty client id without clean session -> return code 2")


CHECKS = {name[len("check_"):]: f for name, f in globals().items() if name.startswith("check_")}


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in CHECKS:
        print(f"usage: {sys.argv[0]} HOST PORT {{{','.join(CHECKS)}}}", file=sys.stderr)
        return 2
    name = sys.argv[3]
    t0 = time.monotonic()
    try:
        CHECKS[name]()
    except CheckFailed as e:
        print(f"FAILED {name}: {e}", flush=True)
        return 1
    except Exception:
        traceback.print_exc()
        print(f"FAILED {name}: exception", flush=True)
        return 1
    print(f"OK {name} ({time.monotonic() - t0:.2f} s)", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Skip interpreter teardown of paho network threads.
    os._exit(code)
