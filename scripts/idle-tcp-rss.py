#!/usr/bin/env python3
"""Resident memory a running relay spends per idle TCP connection.

Usage: scripts/idle-tcp-rss.py PORT COUNT RELAY_PID
Opens COUNT connections to 127.0.0.1:PORT that send nothing, waits 2 s and
prints the relay's VmRSS growth per connection. Aim it only at a relay you run;
COUNT must stay below the relay's per-address cap ([tcp] max_connections_per_ip).
"""
import socket
import sys
import time


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise SystemExit(f"no VmRSS for pid {pid}")


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    port, n, pid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    before = rss_kb(pid)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    time.sleep(2)
    grown = rss_kb(pid) - before
    print(f"port {port}: {n} idle TCP connections, relay RSS +{grown} kB, "
          f"{grown / n:.1f} kB per connection")
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
