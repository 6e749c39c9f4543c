#!/usr/bin/env bash
# How the relay scales with cores: the same fan-out load per relay core on 1,
# 2, 4, 8 ... cores, the relay pinned to CPUs 0..N-1 and the load generator
# (`quichub-bench run`, draft-evens-moq-bench) to the CPUs left. Two ways to
# use N cores are compared:
#   runtime    one QUIC endpoint, a Tokio runtime of N worker threads (--threads N --endpoints 1)
#   endpoints  N QUIC endpoints on one port, a thread each (relay --endpoints N)
# Prints, per mode and N: subscribers, lost objects, relay CPU (% of one
# core), CPU µs per delivered object, latency, and the scaling efficiency
# (µs per object on 1 core ÷ µs per object on N cores; 100 % = linear).
# With CAPACITY=1 it runs `quichub-bench capacity --relay-cpus N` instead,
# from PER_CORE×N subscribers up in steps of STEP×N, and prints the largest
# clean step (no loss, no failure, relay CPU ≤ 95 % of N cores).
#
#   scripts/bench-cores.sh                  # CORES up to half this machine's CPUs
#   CORES="1 2 4 8" PER_CORE=1500 scripts/bench-cores.sh   # on a 16-core machine
#
# The load generator needs about as much CPU per object as the relay: a
# result is only the relay's when its CPU stayed below 95 % of N cores and
# the load generator had at least as many cores (the table says how many it
# had). Slow; not part of the tests.
#
# Environment (all optional):
#   QUICHUB_BIN=PATH   prebuilt quichub binary; skips `cargo build`
#   QUICHUB_BENCH_BIN=PATH  prebuilt quichub-bench (default: beside QUICHUB_BIN)
#   CORES="1 2"        relay core counts (default: 1, 2, 4 ... up to nproc/2)
#   MODES="runtime endpoints"
#   PROFILE=scenario1-audio   a profile in profiles/
#   PER_CORE=1000      subscribers per relay core
#   DURATION=20        seconds per run (start delay included)
#   START_DELAY=5      seconds before the first DATA (the profile's start_delay):
#                      subscribers connect one after another, so thousands
#                      need more than 5 s or they miss the start
#   RELAY_ARGS="..."   more `quichub relay` flags
#   SHARE=1            let the load generator run on every CPU, the relay's
#                      too (for N up to all CPUs on a small machine; the
#                      relay's figures then include contention with it)
#   CAPACITY=1 STEP=250  capacity search instead of one load per N
#   BENCH_KEEP=DIR     keep relay logs and JSON reports
set -euo pipefail
cd "$(dirname "$0")/.."
NPROC=$(nproc)
if [ -z "${CORES:-}" ]; then
	CORES=""
	n=1
	while [ $((2 * n)) -le "$NPROC" ]; do CORES="$CORES $n"; n=$((2 * n)); done
fi
MODES="${MODES:-runtime endpoints}"
PROFILE="${PROFILE:-scenario1-audio}"
PER_CORE="${PER_CORE:-1000}"
DURATION="${DURATION:-20}"
STEP="${STEP:-250}"
START_DELAY="${START_DELAY:-5}"
read -r -a EXTRA <<<"${RELAY_ARGS:-}"
if [ -n "${QUICHUB_BIN:-}" ]; then
	Q="$(realpath "$QUICHUB_BIN")"
	QB="$(realpath "${QUICHUB_BENCH_BIN:-$(dirname "$Q")/quichub-bench}")"
else
	cargo build --release --quiet -p quichub -p quichub-bench
	Q="$PWD/target/release/quichub"
	QB="$PWD/target/release/quichub-bench"
fi
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${BENCH_KEEP:-}" ] && mkdir -p "$BENCH_KEEP" && cp -r "$WORK"/. "$BENCH_KEEP"/; rm -rf "$WORK"' EXIT
ulimit -n 1048576 2>/dev/null || ulimit -n 65536 2>/dev/null || true
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$WORK/key.pem" \
	-out "$WORK/cert.pem" -days 10 -subj /CN=localhost \
	-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -addext basicConstraints=critical,CA:FALSE 2>/dev/null
echo "machine: $NPROC CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')); profile $PROFILE, $PER_CORE subscribers per relay core, ${DURATION} s runs (${START_DELAY} s start delay)"

port=16443
for n in $CORES; do
	relay_cpus="0-$((n - 1))"
	if [ "${SHARE:-0}" = 1 ]; then
		[ "$n" -le "$NPROC" ] || { echo "skip $n cores: $NPROC here"; continue; }
		load_cpus="0-$((NPROC - 1))"
	else
		[ "$n" -lt "$NPROC" ] || { echo "skip $n cores: the load generator needs CPUs too ($NPROC here; SHARE=1 lets it share)"; continue; }
		load_cpus="$n-$((NPROC - 1))"
	fi
	for mode in $MODES; do
		case "$mode" in
		runtime) args=(--threads "$n" relay --endpoints 1) ;;
		endpoints) args=(--threads 1 relay --endpoints "$n") ;;
		*) echo "unknown mode $mode" >&2; exit 2 ;;
		esac
		port=$((port + 1))
		taskset -c "$relay_cpus" "$Q" "${args[@]}" --bind "127.0.0.1:$port" --metrics off --mqtt off --http off \
			--data-dir off --cert "$WORK/cert.pem" --key "$WORK/key.pem" "${EXTRA[@]}" >"$WORK/relay-$mode-$n.log" 2>&1 &
		pid=$!
		sleep 2
		out="$WORK/$mode-$n"
		if [ "${CAPACITY:-0}" = 1 ]; then
			taskset -c "$load_cpus" "$QB" capacity "profiles/$PROFILE.ini" --duration "$DURATION" --start-delay "$START_DELAY" \
				--relay "moqt://127.0.0.1:$port/anon" --relay-pid "$pid" --relay-cpus "$n" \
				--start $((PER_CORE * n)) --step $((STEP * n)) --max $((PER_CORE * n * 4)) \
				--quiet --json "$out.json" 2>&1 | tee "$out.txt" | sed "s/^/$mode $n: /" || true
		else
			taskset -c "$load_cpus" "$QB" run "profiles/$PROFILE.ini" --duration "$DURATION" --start-delay "$START_DELAY" \
				--relay "moqt://127.0.0.1:$port/anon" -n $((PER_CORE * n)) --relay-pid "$pid" \
				--quiet --json "$out.json" >"$out.txt" 2>&1 || true
		fi
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		echo "$mode $n cores: relay CPUs $relay_cpus, load generator CPUs $load_cpus" >>"$WORK/placement.txt"
		sleep 1
	done
done

python3 - "$WORK" "$NPROC" "${CAPACITY:-0}" "$CORES" "$MODES" "${SHARE:-0}" <<'PY'
import json, os, sys
w, nproc, capacity, cores, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4].split(), sys.argv[5].split()
if sys.argv[6] == "1":
    print(f"SHARE=1: the load generator ran on all {nproc} CPUs, the relay's included ('load cpus' below)")
    nproc_load = lambda n: nproc
else:
    nproc_load = lambda n: nproc - int(n)
def load(mode, n):
    p = os.path.join(w, f"{mode}-{n}.json")
    if not os.path.exists(p) or os.path.getsize(p) == 0:
        return None
    return json.load(open(p))
f = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"
if capacity:
    print(f"{'mode':<10} {'cores':>5} {'load cpus':>9} {'capacity':>9} {'cpu %':>7} {'us/obj':>7} {'p99 ms':>7} {'efficiency':>10}")
    for mode in modes:
        base = None
        for n in cores:
            steps = load(mode, n)
            if not steps:
                print(f"{mode:<10} {n:>5} (no result)"); continue
            clean = [s for s in steps if s["clean"]]
            best = clean[-1] if clean else None
            cap = best["subscribers"] if best else 0
            bound = "≥" if clean and clean[-1] is steps[-1] else ""
            if n == cores[0] and cap:
                base = cap / int(n)
            eff = f"{100 * cap / (base * int(n)):.0f} %" if base and cap else "-"
            print(f"{mode:<10} {n:>5} {nproc_load(n):>9} {bound + str(cap):>9} {f(best and best['relay_cpu_pct'], 1):>7} "
                  f"{f(best and best['relay_us_per_object']):>7} {f(best and best['latency_p99_ms']):>7} {eff:>10}")
else:
    print(f"{'mode':<10} {'cores':>5} {'load cpus':>9} {'subs':>6} {'failed':>6} {'lost':>8} {'cpu %':>7} {'us/obj':>7} {'p50 ms':>7} {'p99 ms':>7} {'efficiency':>10}")
    for mode in modes:
        base = None
        for n in cores:
            d = load(mode, n)
            if d is None:
                print(f"{mode:<10} {n:>5} (no result)"); continue
            a = d["report"]["aggregates"][-1]
            us = d.get("relay_us_per_object")
            if n == cores[0]:
                base = us
            eff = f"{100 * base / us:.0f} %" if base and us else "-"
            print(f"{mode:<10} {n:>5} {nproc_load(n):>9} {d['subscribers']:>6} {d['failed_subscriptions']:>6} {a['lost_objects']:>8} "
                  f"{f(d.get('relay_cpu_pct'), 1):>7} {f(us):>7} {f(a['latency']['p50_ms']):>7} {f(a['latency']['p99_ms']):>7} {eff:>10}")
    print("efficiency: µs per delivered object on the first core count ÷ on N (CPU cost per object; capacity also needs the load to spread over the N cores: CAPACITY=1)")
PY
