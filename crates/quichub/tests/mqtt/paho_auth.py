#!/usr/bin/env python3
"""MQTT 5 reason codes of quichub's authentication and authorisation, seen by
Eclipse Paho (paho-mqtt 2.x), with JWTs made by PyJWT (an implementation
independent of quichub's). Driven by crates/quichub/tests/e2e_mqtt_auth.rs,
whose password file (alice/apw, bob/bpw) and ACL file it expects.

Usage: paho_auth.py HOST PORT SECRET_FILE

Every wait is bounded; the first failed expectation exits non-zero.
"""

import queue
import socket
import struct
import sys
import time
import traceback

import jwt
import paho.mqtt.client as mqtt

HOST, PORT, SECRET_FILE = sys.argv[1], int(sys.argv[2]), sys.argv[3]
WAIT = 5.0
NOT_AUTHORIZED = 0x87
BAD_USER_OR_PASSWORD = 0x86
MAXIMUM_CONNECT_TIME = 0xA0


class CheckFailed(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise CheckFailed(what)
    print("ok:", what, flush=True)


def token(**claims):
    with open(SECRET_FILE, "rb") as f:
        secret = f.read()
    return jwt.encode(claims, secret, algorithm="HS256")


class Client:
    """A paho MQTT 5 client whose callbacks feed queues."""

    def __init__(self, cid, user=None, password=None):
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid,
                             protocol=mqtt.MQTTv5, reconnect_on_failure=False)
        if user is not None or password is not None:
            self.c.username_pw_set(user, password)
        self.connacks, self.subacks, self.acks = queue.Queue(), queue.Queue(), queue.Queue()
        self.disconnects = queue.Queue()
        self.c.on_connect = lambda c, u, f, rc, p: self.connacks.put(rc.value)
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.subacks.put([r.value for r in rcs])
        self.c.on_publish = lambda c, u, mid, rc, p: self.acks.put((mid, rc.value))
        self.c.on_disconnect = lambda c, u, f, rc, p: self.disconnects.put(rc.value)

    def connect(self):
        self.c.connect(HOST, PORT, keepalive=30)
        self.c.loop_start()
        return self.connacks.get(timeout=WAIT)

    def subscribe(self, *filters):
        self.c.subscribe([(f, 1) for f in filters])
        return self.subacks.get(timeout=WAIT)

    def publish(self, topic, qos):
        info = self.c.publish(topic, b"x", qos)
        mid, code = self.acks.get(timeout=WAIT)
        expect(mid == info.mid, f"ack for message {info.mid}")
        return code

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


def refused_at_connect(cid, user, password, want, what):
    c = Client(cid, user, password)
    code = c.connect()
    c.c.loop_stop()
    expect(code == want, f"{what}: CONNACK {code:#x} == {want:#x}")


def main():
    refused_at_connect("p1", "alice", "wrong", BAD_USER_OR_PASSWORD, "wrong password")
    refused_at_connect("p2", "mallory", "apw", BAD_USER_OR_PASSWORD, "unknown user")
    refused_at_connect("p3", None, None, NOT_AUTHORIZED, "anonymous")

    # alice: readwrite sensors/#, deny sensors/secret, write commands/#.
    a = Client("alice-1", "alice", "apw")
    expect(a.connect() == 0, "alice connects")
    codes = a.subscribe("sensors/#", "commands/#", "clients/alice-1/#", "clients/other/#")
    expect(codes == [1, NOT_AUTHORIZED, 1, NOT_AUTHORIZED], f"SUBACK {codes}")
    expect(a.publish("sensors/secret", 1) == NOT_AUTHORIZED, "PUBACK 0x87 on a denied topic")
    # (QoS 2's PUBREC 0x87 is checked on the wire by the gateway's tests:
    # paho ignores PUBREC reason codes.)
    expect(a.publish("other/x", 1) == NOT_AUTHORIZED, "PUBACK 0x87 on a topic without a rule")
    expect(a.publish("$SYS/broker/uptime", 1) == NOT_AUTHORIZED, "PUBACK 0x87 on $SYS")
    expect(a.publish("sensors/a", 1) == 0, "PUBACK 0 on sensors/a")
    expect(a.publish("commands/x", 1) in (0, 0x10), "PUBACK success on a write-only topic")
    a.close()

    now = int(time.time())
    # A JWT as the password: `put` mqtt/sensors publishes sensors/#.
    t = token(put=["mqtt/sensors"], get=["mqtt/sensors"], exp=now + 600)
    # (paho sends a password only with a user name: the empty one here.)
    for user in ("jwt", ""):
        j = Client(f"jwt-{user}", user, t)
        expect(j.connect() == 0, f"JWT with user name {user!r} connects")
        expect(j.publish("sensors/x", 1) in (0, 0x10), "JWT publishes sensors/x")
        expect(j.publish("other/x", 1) == NOT_AUTHORIZED, "JWT may not publish other/x")
        expect(j.subscribe("sensors/+", "#") == [1, NOT_AUTHORIZED], "JWT get prefix")
        j.close()
    # A JWT whose `sub` is an ACL user gets that user's rules (bob reads
    # sensors/# only).
    b = Client("jwt-bob", "jwt", token(sub="bob", exp=now + 600))
    expect(b.connect() == 0, "JWT sub=bob connects")
    expect(b.subscribe("sensors/#") == [1], "bob's ACL: read sensors/#")
    expect(b.publish("sensors/x", 1) == NOT_AUTHORIZED, "bob's ACL: no write")
    b.close()
    # Expired, forged: bad user name or password.
    refused_at_connect("p4", "jwt", token(put=["mqtt"], exp=now - 10),
                       BAD_USER_OR_PASSWORD, "expired JWT")
    forged = jwt.encode({"put": ["mqtt"]}, b"another secret, 32 bytes or more!", algorithm="HS256")
    refused_at_connect("p5", "jwt", forged, BAD_USER_OR_PASSWORD, "JWT signed by another key")
    # A JWT's exp ends the connection: DISCONNECT Maximum connect time.
    # (On a raw socket: paho 2.1 drops the reason code of a DISCONNECT
    # without properties.)
    sock = socket.create_connection((HOST, PORT), timeout=WAIT + 3)
    sock.sendall(connect_v5("jwt-short", "jwt", token(put=["mqtt/sensors"], exp=now + 2)))
    first, body = read_packet(sock)
    expect(first == 0x20 and body[1] == 0, "short-lived JWT connects")
    first, body = read_packet(sock)
    expect(first == 0xE0 and body[:1] == bytes([MAXIMUM_CONNECT_TIME]),
           f"DISCONNECT {body[:1].hex()} at exp")
    sock.close()


def varint(n):
    out = bytearray()
    while True:
        b, n = n % 128, n // 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def utf8(s):
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def connect_v5(cid, user, password):
    """An MQTT 5 CONNECT with Clean Start, a user name and a password."""
    body = utf8("MQTT") + bytes([5, 0xC2]) + struct.pack("!H", 30) + b"\x00"
    body += utf8(cid) + utf8(user) + utf8(password)
    return b"\x10" + varint(len(body)) + body


def read_packet(sock):
    """(first byte, body) of the next packet."""
    def exactly(n):
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise CheckFailed("connection closed")
            data += chunk
        return data
    first = exactly(1)[0]
    length, shift = 0, 0
    while True:
        b = exactly(1)[0]
        length |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return first, exactly(length)

if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
