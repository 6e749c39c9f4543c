#!/usr/bin/env bash
# What a relay-to-relay hop costs: a publisher on relay A (the origin), the
# same subscribers once on A and once on relay B, which follows A
# ([cluster] origins). Prints latency (publisher → subscriber) and each
# relay's CPU per delivered object. Slow; not part of the tests.
#
#   scripts/bench-hop.sh [SUBSCRIBERS] [PROFILE]     (defaults 200, scenario1-audio)
#
# Environment: QUICHUB_BIN (prebuilt binary; quichub-bench beside it, or
# QUICHUB_BENCH_BIN), DURATION (default 20 s),
# RELAY_A_CPUS / RELAY_B_CPUS / LOAD_CPUS (taskset lists; default: none).
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-200}"
PROFILE="${2:-scenario1-audio}"
DURATION="${DURATION:-20}"
if [ -n "${QUICHUB_BIN:-}" ]; then
	Q="$(realpath "$QUICHUB_BIN")"
	QB="$(realpath "${QUICHUB_BENCH_BIN:-$(dirname "$Q")/quichub-bench}")"
else
	cargo build --release --quiet -p quichub -p quichub-bench
	Q="$PWD/target/release/quichub"
	QB="$PWD/target/release/quichub-bench"
fi
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
ulimit -n 65536 2>/dev/null || true
pin() { local cpus="$1"; shift; if [ -n "$cpus" ]; then taskset -c "$cpus" "$@"; else "$@"; fi; }
cpu_s() { awk '{ print ($14 + $15) / 100 }' "/proc/$1/stat"; }
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$WORK/key.pem" \
	-out "$WORK/cert.pem" -days 10 -subj /CN=localhost \
	-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -addext basicConstraints=critical,CA:FALSE 2>/dev/null
FP=$(openssl x509 -in "$WORK/cert.pem" -outform der | sha256sum | cut -d' ' -f1)
cat >"$WORK/b.toml" <<TOML
[[cluster.origins]]
url = "moqt://127.0.0.1:17443/"
fingerprint = "$FP"
TOML
common=(--metrics off --mqtt off --http off --data-dir off --cert "$WORK/cert.pem" --key "$WORK/key.pem")
# `exec` so that $! is the relay's PID (its CPU is read from /proc).
(exec taskset -c "${RELAY_A_CPUS:-0-$(($(nproc) - 1))}" "$Q" relay --bind 127.0.0.1:17443 "${common[@]}" >"$WORK/a.log" 2>&1) &
A=$!
(exec taskset -c "${RELAY_B_CPUS:-0-$(($(nproc) - 1))}" "$Q" relay --bind 127.0.0.1:17444 --config "$WORK/b.toml" "${common[@]}" >"$WORK/b.log" 2>&1) &
B=$!
sleep 2
run() { # name subscriber-relay-port
	local a0 b0
	a0=$(cpu_s $A)
	b0=$(cpu_s $B)
	pin "${LOAD_CPUS:-}" "$QB" pub "profiles/$PROFILE.ini" --duration "$DURATION" --relay moqt://127.0.0.1:17443/anon --quiet >"$WORK/pub-$1.txt" 2>&1 &
	local p=$!
	pin "${LOAD_CPUS:-}" "$QB" sub "profiles/$PROFILE.ini" --duration "$DURATION" --relay "moqt://127.0.0.1:$2/anon" -n "$N" \
		--quiet --json "$WORK/sub-$1.json" >"$WORK/sub-$1.txt" 2>&1 || true
	wait $p || true
	awk -v n="$1" -v a1="$(cpu_s $A)" -v a0="$a0" -v b1="$(cpu_s $B)" -v b0="$b0" \
		'BEGIN { print n, a1 - a0, b1 - b0 }' >>"$WORK/cpu.txt"
	sleep 1
}
run direct 17443
run via-b 17444
python3 - "$WORK" "$N" <<'PY'
import json, sys, os
w, n = sys.argv[1], int(sys.argv[2])
cpu = {l.split()[0]: (float(l.split()[1]), float(l.split()[2])) for l in open(os.path.join(w, "cpu.txt"))}
print(f"{'path':<22} {'subs':>5} {'received':>9} {'lost':>6} {'p50 ms':>7} {'p99 ms':>7} {'A us/obj':>9} {'B us/obj':>9}")
for name, label in [("direct", "publisher→A→subs"), ("via-b", "publisher→A→B→subs")]:
    p = os.path.join(w, f"sub-{name}.json")
    if not os.path.exists(p):
        print(f"{label:<22} (no result)"); continue
    d = json.load(open(p))
    a = d.get("report", d)["aggregates"][-1]
    recv = a["received_objects"]
    ca, cb = cpu[name]
    f = lambda c: f"{1e6 * c / recv:.2f}" if recv else "-"
    print(f"{label:<22} {n:>5} {recv:>9} {a['lost_objects']:>6} {a['latency']['p50_ms']:>7.2f} {a['latency']['p99_ms']:>7.2f} {f(ca):>9} {f(cb) if name == 'via-b' else '-':>9}")
print("us/obj: the relay's CPU time over the run ÷ objects delivered to the subscribers")
PY
