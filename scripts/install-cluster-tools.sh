#!/usr/bin/env bash
# Installs what the cluster tests (crates/quichub/tests/cluster/e2e_etcd.rs) use:
# Debian's etcd-server (etcd 3.4, the registry of a cluster of relays), with
# apt-get (as root, or through sudo). About ten seconds the first time;
# nothing when already installed. The tests run their own etcd (loopback
# ports, a temporary data directory); a service the package may start (in a
# container policy-rc.d usually denies it) is not used.
set -euo pipefail

if ! command -v etcd >/dev/null; then
	SUDO=""
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null || {
			echo "install-cluster-tools: need root or sudo for apt-get install etcd-server" >&2
			exit 1
		}
		SUDO="sudo"
	fi
	echo "install-cluster-tools: apt-get install etcd-server" >&2
	$SUDO apt-get update -qq >/dev/null 2>&1 || true
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null
fi
echo "cluster tools: $(etcd --version | head -n1)"
