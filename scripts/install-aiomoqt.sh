#!/usr/bin/env bash
# Installs aiomoqt (PyPI), an independent draft-14 MoQT implementation in
# Python, pinned, into a virtual environment at $QUICHUB_TOOLS/aiomoqt
# (default ~/.cache/quichub/tools/aiomoqt): the draft-14 interop test
# (crates/quichub/tests/interop/interop_aiomoqt.rs) runs its interop client against
# quichub's relay. A few seconds; idempotent.
#
# qh3 is pinned below 2: aiomoqt 0.5.3 asks for qh3>=1.7.0 but imports
# qh3.quic.packet_builder, which qh3 2.x no longer has.
set -euo pipefail

TOOLS="${QUICHUB_TOOLS:-$HOME/.cache/quichub/tools}"
AIOMOQT_VERSION="0.5.3"
QH3_VERSION="1.9.4"

PY="$TOOLS/aiomoqt/bin/python"
if ! "$PY" -c "import aiomoqt, qh3" 2>/dev/null ||
	[ "$("$PY" -c 'import importlib.metadata as m; print(m.version("aiomoqt"), m.version("qh3"))' 2>/dev/null)" != "$AIOMOQT_VERSION $QH3_VERSION" ]; then
	echo "install-aiomoqt: python venv with aiomoqt $AIOMOQT_VERSION, qh3 $QH3_VERSION in $TOOLS/aiomoqt" >&2
	mkdir -p "$TOOLS"
	python3 -m venv "$TOOLS/aiomoqt"
	"$TOOLS/aiomoqt/bin/pip" install -q --disable-pip-version-check \
		"aiomoqt==$AIOMOQT_VERSION" "qh3==$QH3_VERSION"
fi
echo "install-aiomoqt: $("$PY" -c 'import importlib.metadata as m; print("aiomoqt", m.version("aiomoqt"), "qh3", m.version("qh3"))')" >&2
