#!/usr/bin/env bash
# Runs every test of quichub on a fresh machine: installs the independent MoQT
# implementation used by the interop tests (moq-dev's moq-clock, from
# crates.io, into ./.tools), then the whole workspace's test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-moq-dev.sh

# The interop tests fail (rather than skip) when this is set and the tool is missing.
export QUICHUB_MOQ_CLOCK="$PWD/.tools/bin/moq-clock"

cargo test --workspace --locked
