#!/usr/bin/env python3
"""A flood of idle (or, with --slow, slow-header) TCP connections on a relay's
HTTP port, as in issue 11: opens N connections from source addresses
127.0.0.1 .. 127.0.0.S, then reports at the --checks times (seconds after the
last one opened) the relay's descriptors (/proc/PID/fd), how many connections
the relay still holds open, and whether a fresh MQTT client (CONNECT ->
CONNACK) and a fresh HTTP client (GET /v1/time -> 200) are served.

    quichub relay --mqtt 127.0.0.1:18830 --http 127.0.0.1:18080 --data-dir off &
    python3 scripts/tcp-flood.py --pid $! --http 127.0.0.1:18080 \
        --mqtt 127.0.0.1:18830 -n 10000 --sources 40 --checks 1,12,40

One process holds at most its RLIMIT_NOFILE of connections: run two at once
(with --hold to keep them open until both are done) to go past it."""
import socket, sys, time, os, select, resource, argparse, struct

ap = argparse.ArgumentParser()
ap.add_argument("--pid", type=int, required=True)
ap.add_argument("--http", required=True)
ap.add_argument("--mqtt", required=True)
ap.add_argument("-n", type=int, default=20000)
ap.add_argument("--sources", type=int, default=1)
ap.add_argument("--checks", default="1,12")
ap.add_argument("--tag", default="A")
ap.add_argument("--hold", type=float, default=0)
ap.add_argument("--slow", action="store_true", help="send a request line, then one header line every 2 s")
a = ap.parse_args()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
host, port = a.http.rsplit(":", 1); port = int(port)
mh, mp = a.mqtt.rsplit(":", 1); mp = int(mp)

def fds():
    return len(os.listdir(f"/proc/{a.pid}/fd"))

def mqtt_ok():
    try:
        s = socket.create_connection((mh, mp), timeout=3)
        s.sendall(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x")
        r = s.recv(4); s.close()
        return r == b"\x20\x02\x00\x00"
    except Exception as e:
        return f"no ({e.__class__.__name__})"

def http_ok():
    try:
        s = socket.create_connection((host, port), timeout=3)
        s.sendall(b"GET /v1/time HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        r = s.recv(64); s.close()
        return r.startswith(b"HTTP/1.1 200")
    except Exception as e:
        return f"no ({e.__class__.__name__})"

print(f"server fds before: {fds()}", flush=True)
socks = []
t0 = time.time()
fail = 0
for i in range(a.n):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.setblocking(False)
    if a.sources > 1:
        s.setsockopt(socket.IPPROTO_IP, 24, 1)  # IP_BIND_ADDRESS_NO_PORT
        s.bind((f"127.0.0.{1 + i % a.sources}", 0))
    try:
        s.connect((host, port))
    except BlockingIOError:
        pass
    except OSError:
        fail += 1; s.close(); continue
    socks.append(s)
    if i % 100 == 99:
        time.sleep(0.05)
# wait for connects to finish
p = select.poll()
for s in socks:
    p.register(s, select.POLLOUT)
done = 0
deadline = time.time() + 30
while done < len(socks) and time.time() < deadline:
    done += len(p.poll(1000))
print(f"[{a.tag}] opened {len(socks)} connections in {time.time()-t0:.1f}s ({fail} failed to start)", flush=True)

def still_open():
    n = 0
    for s in socks:
        try:
            d = s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            if d == b"":
                continue  # EOF: server closed
            n += 1
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n

def dribble(first):
    for s in socks:
        try:
            s.send(b"GET /v1/time HTTP/1.1\r\n" if first else b"X-Slow: 1\r\n")
        except OSError:
            pass

t0 = time.time()
next_drip = t0
first = True
for t in [float(x) for x in a.checks.split(",")]:
    while time.time() - t0 < t:
        if a.slow and time.time() >= next_drip:
            dribble(first); first = False; next_drip += 2
        time.sleep(0.1)
    print(f"[{a.tag}] t=open+{t:.0f}s server fds={fds()} client-side still open={still_open()} "
          f"new mqtt client ok={mqtt_ok()} new http client ok={http_ok()}", flush=True)
time.sleep(a.hold)
