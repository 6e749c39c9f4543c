#!/usr/bin/env bash
# Install moq-dev's independent MoQT implementation (crates.io) into ./.tools/bin
# for interop tests against quichub. See docs/interop-moq-dev.md.
#
#   scripts/install-moq-dev.sh                # moq-clock only (publisher + subscriber), ~5.5 min on 2 cores
#   scripts/install-moq-dev.sh --with-relay   # also moq-relay (a second, independent relay)
#   scripts/install-moq-dev.sh --with-cli     # also moq-cli's `moq` (fMP4 <-> hang media)
# All three build in one target directory (below): 685 crate builds, 41 min
# measured on a 2-core machine busy with other builds (separately they took
# 5.5, 15 and 36 min on a quiet one).
#   MOQ_DEV_WITH_RELAY=1 MOQ_DEV_WITH_CLI=1 scripts/install-moq-dev.sh
#
# Idempotent: a binary already in .tools/bin that reports the pinned version is kept.
# Versions are pinned, and every build uses the crate's own Cargo.lock (--locked).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# QUICHUB_TOOLS lets several checkouts share one build of the tools.
TOOLS="${QUICHUB_TOOLS:-$ROOT/.tools}"
BIN="$TOOLS/bin"

MOQ_CLOCK_VERSION="0.10.21"   # built on moq-net 0.1.3 (speaks moqt-18)
MOQ_RELAY_VERSION="0.17.10"   # built on moq-net 0.3.18 (speaks moqt-14..22)
# moq-relay 0.17.10's Cargo.lock pins webpki-roots 1.0.11, which the crates.io index
# reachable here does not have; fall back to the lock with just that crate at 1.0.10.
MOQ_RELAY_WEBPKI_ROOTS_FALLBACK="1.0.10"
# iroh, mDNS clustering, WebSocket and unix sockets are not needed for interop and
# roughly double the build; noq is the QUIC/WebTransport backend.
MOQ_RELAY_FEATURES="noq"
# moq-cli's `moq` binary: imports fMP4 (CMAF passthrough) into a hang broadcast and
# exports one to fMP4 (hang 0.21.19, moq-mux 0.10.19, moq-relay 0.17.10). Its
# Cargo.lock pins webpki-roots 1.0.11 too (same fallback). Default features add
# iroh, LAN clustering, WebSocket and NVIDIA codecs: none is needed to import or
# export fMP4 over QUIC/WebTransport.
MOQ_CLI_VERSION="0.14.10"
MOQ_CLI_FEATURES="noq"

with_relay="${MOQ_DEV_WITH_RELAY:-0}"
with_cli="${MOQ_DEV_WITH_CLI:-0}"
for arg in "$@"; do
	case "$arg" in
	--with-relay) with_relay=1 ;;
	--with-cli) with_cli=1 ;;
	-h | --help)
		sed -n '2,14p' "$0"
		exit 0
		;;
	*)
		echo "unknown argument: $arg" >&2
		exit 2
		;;
	esac
done

command -v cargo >/dev/null || {
	echo "cargo not found: install a Rust toolchain (1.95 or newer for moq-relay)" >&2
	exit 1
}

mkdir -p "$BIN"

# One target directory for every tool built from crates.io (moq-dev's tools
# here, the MQTT-over-QUIC clients in install-mqtt-tools.sh): moq-cli's 837
# locked crates include 557 of moq-relay's 560, and the builds share tokio,
# quinn, rustls and ring with the others, so each crate version is compiled
# once instead of once per `cargo install` (cargo install otherwise builds in a
# fresh temporary directory every time). scripts/test.sh removes it afterwards.
export CARGO_TARGET_DIR="${QUICHUB_TOOLS_TARGET:-$TOOLS/target/shared}"

# has_version BINARY VERSION: true when .tools/bin/BINARY --version prints exactly VERSION.
has_version() {
	local bin="$BIN/$1" want="$2" got
	[ -x "$bin" ] || return 1
	got="$("$bin" --version 2>/dev/null | awk '{print $2}' | head -n1)" || return 1
	[ "$got" = "$want" ]
}

install_clock() {
	if has_version moq-clock "$MOQ_CLOCK_VERSION"; then
		echo "moq-clock $MOQ_CLOCK_VERSION already installed"
		return
	fi
	echo "installing moq-clock $MOQ_CLOCK_VERSION (about 5-6 min on 2 cores)"
	if ! cargo install --locked --force --root "$TOOLS" "moq-clock@$MOQ_CLOCK_VERSION"; then
		echo "--locked install failed; retrying with fresh dependency resolution" >&2
		cargo install --force --root "$TOOLS" "moq-clock@$MOQ_CLOCK_VERSION"
	fi
}

# fetch_crate_source CRATE VERSION DEST: download the crate's source (not its
# dependencies' build) and copy it to DEST.
fetch_crate_source() {
	local crate="$1" version="$2" dest="$3" tmp src
	tmp="$(mktemp -d)"
	# A throwaway manifest makes cargo download and unpack the exact crate version.
	mkdir -p "$tmp/src"
	cat >"$tmp/Cargo.toml" <<EOF
[package]
name = "fetch-$crate"
version = "0.0.0"
edition = "2021"

[dependencies]
$crate = { version = "=$version", default-features = false }
EOF
	: >"$tmp/src/lib.rs"
	(cd "$tmp" && cargo fetch --quiet)
	src="$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d -name "$crate-$version" | head -n1)"
	rm -rf "$tmp"
	[ -n "$src" ] || {
		echo "could not find $crate-$version source after cargo fetch" >&2
		return 1
	}
	rm -rf "$dest"
	cp -r "$src" "$dest"
}

# install_pinned CRATE VERSION FEATURES: cargo install --locked with the crate's own
# Cargo.lock; when that lock names a crate version the index lacks, build from the
# same lock with just webpki-roots moved to $MOQ_RELAY_WEBPKI_ROOTS_FALLBACK.
install_pinned() {
	local crate="$1" version="$2" features="$3"
	if cargo install --locked --force --root "$TOOLS" --no-default-features \
		--features "$features" "$crate@$version"; then
		return
	fi
	echo "--locked install failed; building from the crate's lockfile with webpki-roots $MOQ_RELAY_WEBPKI_ROOTS_FALLBACK" >&2
	local src="$TOOLS/src/$crate-$version"
	mkdir -p "$TOOLS/src"
	fetch_crate_source "$crate" "$version" "$src"
	(cd "$src" && cargo update --quiet -p webpki-roots --precise "$MOQ_RELAY_WEBPKI_ROOTS_FALLBACK")
	cargo install --locked --force --root "$TOOLS" --no-default-features \
		--features "$features" --path "$src"
}

install_relay() {
	if has_version moq-relay "$MOQ_RELAY_VERSION"; then
		echo "moq-relay $MOQ_RELAY_VERSION already installed"
		return
	fi
	echo "installing moq-relay $MOQ_RELAY_VERSION (about 15 min on 2 cores)"
	install_pinned moq-relay "$MOQ_RELAY_VERSION" "$MOQ_RELAY_FEATURES"
}

install_cli() {
	if has_version moq "$MOQ_CLI_VERSION"; then
		echo "moq (moq-cli) $MOQ_CLI_VERSION already installed"
		return
	fi
	echo "installing moq-cli $MOQ_CLI_VERSION (binary moq)"
	install_pinned moq-cli "$MOQ_CLI_VERSION" "$MOQ_CLI_FEATURES"
}

# moq-relay first, then moq-cli, which builds on moq-relay's crates.
if [ "$with_relay" = "1" ]; then
	install_relay
fi
if [ "$with_cli" = "1" ]; then
	install_cli
fi
install_clock

echo
echo "moq-dev tools in $BIN:"
for b in moq-clock moq-relay moq; do
	if [ -x "$BIN/$b" ]; then
		echo "  $BIN/$b ($("$BIN/$b" --version 2>/dev/null | head -n1))"
	fi
done
