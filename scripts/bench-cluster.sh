#!/usr/bin/env bash
# Fan-out through a cluster on etcd: a publisher on relay A, the same
# subscribers once all on A ("direct") and once split over relays B and C,
# which follow A through the registry ("via edges"). Prints latency
# (publisher → subscriber) and each relay's CPU per delivered object.
# Needs etcd (scripts/install-cluster-tools.sh). Slow; not part of the tests.
#
#   scripts/bench-cluster.sh [SUBSCRIBERS] [PROFILE]     (defaults 200, scenario1-audio)
#
# Environment: QUICHUB_BIN (prebuilt binary; quichub-bench beside it, or
# QUICHUB_BENCH_BIN), DURATION (default 20 s),
# RELAY_A_CPUS / RELAY_B_CPUS / RELAY_C_CPUS / LOAD_CPUS (taskset lists;
# default: none).
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-200}"
PROFILE="${2:-scenario1-audio}"
DURATION="${DURATION:-20}"
command -v etcd >/dev/null || { echo "bench-cluster: no etcd (scripts/install-cluster-tools.sh)" >&2; exit 1; }
if [ -n "${QUICHUB_BIN:-}" ]; then
	Q="$(realpath "$QUICHUB_BIN")"
	QB="$(realpath "${QUICHUB_BENCH_BIN:-$(dirname "$Q")/quichub-bench}")"
else
	cargo build --release --quiet -p quichub -p quichub-bench
	Q="$PWD/target/release/quichub"
	QB="$PWD/target/release/quichub-bench"
fi
WORK="$(mktemp -d)"
[ -n "${KEEP:-}" ] && echo "bench-cluster: work directory $WORK" >&2
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
ulimit -n 65536 2>/dev/null || true
pin() { local cpus="$1"; shift; if [ -n "$cpus" ]; then taskset -c "$cpus" "$@"; else "$@"; fi; }
cpu_s() { awk '{ print ($14 + $15) / 100 }' "/proc/$1/stat"; }
etcd --name bench --data-dir "$WORK/etcd" --listen-client-urls http://127.0.0.1:17379 \
	--advertise-client-urls http://127.0.0.1:17379 --listen-peer-urls http://127.0.0.1:17380 \
	--initial-advertise-peer-urls http://127.0.0.1:17380 --initial-cluster bench=http://127.0.0.1:17380 \
	--log-level error >"$WORK/etcd.log" 2>&1 &
sleep 2
common=(--config contrib/bench-relay.toml --metrics off --mqtt off --http off --data-dir off --cluster etcd://127.0.0.1:17379/bench)
all="0-$(($(nproc) - 1))"
# `exec` so that $! is the relay's PID (its CPU is read from /proc).
(exec taskset -c "${RELAY_A_CPUS:-$all}" "$Q" relay --bind 127.0.0.1:17443 "${common[@]}" >"$WORK/a.log" 2>&1) &
A=$!
(exec taskset -c "${RELAY_B_CPUS:-$all}" "$Q" relay --bind 127.0.0.1:17444 "${common[@]}" >"$WORK/b.log" 2>&1) &
B=$!
(exec taskset -c "${RELAY_C_CPUS:-$all}" "$Q" relay --bind 127.0.0.1:17445 "${common[@]}" >"$WORK/c.log" 2>&1) &
C=$!
sleep 3
run() { # name port...
	local name="$1" a0 b0 c0 i=0
	shift
	a0=$(cpu_s $A) b0=$(cpu_s $B) c0=$(cpu_s $C)
	pin "${LOAD_CPUS:-}" "$QB" pub "profiles/$PROFILE.ini" --duration "$DURATION" --relay moqt://127.0.0.1:17443/anon --quiet >"$WORK/pub-$name.txt" 2>&1 &
	local p=$! subs=()
	for port in "$@"; do
		pin "${LOAD_CPUS:-}" "$QB" sub "profiles/$PROFILE.ini" --duration "$DURATION" --relay "moqt://127.0.0.1:$port/anon" \
			-n "$((N / $#))" --quiet --json "$WORK/sub-$name-$i.json" >"$WORK/sub-$name-$i.txt" 2>&1 &
		subs+=($!)
		i=$((i + 1))
	done
	wait "${subs[@]}" || true
	wait $p || true
	echo "$name $(awk -v x="$(cpu_s $A)" -v y="$a0" 'BEGIN{print x-y}') $(awk -v x="$(cpu_s $B)" -v y="$b0" 'BEGIN{print x-y}') $(awk -v x="$(cpu_s $C)" -v y="$c0" 'BEGIN{print x-y}')" >>"$WORK/cpu.txt"
	# Until the relays have dropped the last run's sessions (the load
	# generator exits without closing them: QUIC's idle timeout, 30 s).
	sleep "${PAUSE:-35}"
}
run via-edges 17444 17445
run direct 17443
python3 - "$WORK" "$N" <<'PY'
import glob, json, os, sys
w, n = sys.argv[1], int(sys.argv[2])
cpu = {l.split()[0]: [float(x) for x in l.split()[1:]] for l in open(os.path.join(w, "cpu.txt"))}
print(f"{'path':<24} {'subs':>5} {'received':>9} {'lost':>6} {'p50 ms':>7} {'p99 ms':>7} {'A us/obj':>9} {'B us/obj':>9} {'C us/obj':>9}")
for name, label in [("direct", "publisher→A→subs"), ("via-edges", "publisher→A→B|C→subs")]:
    files = sorted(glob.glob(os.path.join(w, f"sub-{name}-*.json")))
    if not files:
        print(f"{label:<24} (no result)"); continue
    aggs = [json.load(open(f)).get("report", {}) for f in files]
    aggs = [(d if "aggregates" in d else json.load(open(f)))["aggregates"][-1] for d, f in zip(aggs, files)]
    recv = sum(a["received_objects"] for a in aggs)
    lost = sum(a["lost_objects"] for a in aggs)
    p50 = max(a["latency"]["p50_ms"] for a in aggs)
    p99 = max(a["latency"]["p99_ms"] for a in aggs)
    ca, cb, cc = cpu[name]
    f = lambda c: f"{1e6 * c / recv:.2f}" if recv else "-"
    edge = name == "via-edges"
    print(f"{label:<24} {n:>5} {recv:>9} {lost:>6} {p50:>7.2f} {p99:>7.2f} {f(ca):>9} {f(cb) if edge else '-':>9} {f(cc) if edge else '-':>9}")
print("us/obj: the relay's CPU time over the run ÷ objects delivered to all subscribers; p50/p99: the worse of the edges")
PY
