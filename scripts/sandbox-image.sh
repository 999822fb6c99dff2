#!/usr/bin/env bash
# Builds the sandbox image (images/sandbox/Dockerfile) with the real-node recipe's image.sh and
# imports it into the node's containerd (`make e2e-node`; tests/node/test_sandbox.py when the node
# lacks it).
#
#   scripts/sandbox-image.sh REAL_NODE_TOOLS [IMAGE (default localhost/agentrun-sandbox:dev)]
#
# Why a staging folder: image.sh builds PROJECT_DIR/Dockerfile with PROJECT_DIR as the context and
# reads the image's version label from PROJECT_DIR/pyproject.toml (it stops without one). The
# folder, under the repository's build/ so image.sh still finds the commit, holds the sandbox's
# Dockerfile and the project's pyproject.toml: the sandbox image carries the project's version.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: $0 REAL_NODE_TOOLS [IMAGE]" >&2
    exit 2
fi
tools=$1
image=${2:-localhost/agentrun-sandbox:dev}
root=$(cd "$(dirname "$0")/.." && pwd)
[[ -x $tools/image.sh ]] || { echo "$0: no $tools/image.sh to build the image with" >&2; exit 2; }

mkdir -p "$root/build"
stage=$(mktemp -d "$root/build/sandbox-image.XXXXXX")
trap 'rm -rf "$stage"' EXIT
cp "$root/images/sandbox/Dockerfile" "$root/pyproject.toml" "$stage/"
printf '*\n!Dockerfile\n' >"$stage/.dockerignore"
bash "$tools/image.sh" "$stage" "$image"
