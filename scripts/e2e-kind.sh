#!/usr/bin/env bash
# `make e2e-kind`: the end-to-end tier on a throwaway kind cluster, for machines with Docker.
#
#   1. creates a kind cluster (its kubeconfig in a temporary file, yours is left alone);
#   2. runs the e2e tests (pytest -m e2e tests/e2e) against it;
#   3. builds the operator image, loads it into kind, installs the chart in "namespaces" scope,
#      waits for the operator to become ready, checks its RBAC with `kubectl auth can-i` and
#      scrapes its metrics through the API server proxy;
#   4. deletes the cluster.
#
# Environment: KIND_CLUSTER_NAME (default agentrun-e2e), KIND_NODE_IMAGE (kindest/node image to
# use), KEEP_CLUSTER=1 (keep the cluster for debugging), E2E_CHART=0 (skip step 3),
# PYTEST_ARGS (extra pytest arguments).
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${KIND_CLUSTER_NAME:-agentrun-e2e}
KEEP_CLUSTER=${KEEP_CLUSTER:-0}
E2E_CHART=${E2E_CHART:-1}
IMAGE=agentrun-operator:e2e
RELEASE=agentrun-operator
OPERATOR_NS=agentrun-system
WATCHED_NS=agentrun-smoke
PYTHON=${PYTHON:-.venv/bin/python}
export PATH="$PWD/.tools/bin:$PATH"

log() { printf '\n==> %s\n' "$*" >&2; }
die() {
    printf 'e2e-kind: ERROR: %s\n' "$*" >&2
    exit 1
}

for tool in docker kind kubectl helm; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is required (helm: run 'make tools')"
done
docker info >/dev/null 2>&1 || die "the Docker engine is not reachable (docker info failed)"
[[ -x $PYTHON ]] || die "$PYTHON not found: run 'make venv' first"

KUBECONFIG=$(mktemp -t agentrun-e2e-kubeconfig.XXXXXX)
export KUBECONFIG

cleanup() {
    local status=$?
    if [[ $KEEP_CLUSTER == 1 ]]; then
        log "keeping cluster $CLUSTER: export KUBECONFIG=$KUBECONFIG; delete it with 'kind delete cluster --name $CLUSTER'"
    else
        log "deleting cluster $CLUSTER"
        kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
        rm -f "$KUBECONFIG"
    fi
    exit "$status"
}
trap cleanup EXIT

log "creating kind cluster $CLUSTER"
create_args=(--name "$CLUSTER" --kubeconfig "$KUBECONFIG" --wait 180s)
[[ -n ${KIND_NODE_IMAGE:-} ]] && create_args+=(--image "$KIND_NODE_IMAGE")
kind create cluster "${create_args[@]}"
kubectl version

log "running the e2e tests"
# shellcheck disable=SC2086  # PYTEST_ARGS is split on purpose
"$PYTHON" -m pytest -m e2e tests/e2e ${PYTEST_ARGS:-}

if [[ $E2E_CHART != 1 ]]; then
    exit 0
fi

log "building $IMAGE and loading it into kind"
docker build --tag "$IMAGE" --build-arg "REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

log "installing the chart (scope namespaces, watching $WATCHED_NS)"
kubectl create namespace "$OPERATOR_NS" --dry-run=client -o yaml | kubectl apply -f -
kubectl create namespace "$WATCHED_NS" --dry-run=client -o yaml | kubectl apply -f -
helm upgrade --install "$RELEASE" charts/agentrun-operator \
    --namespace "$OPERATOR_NS" \
    --set image.repository="${IMAGE%%:*}" \
    --set image.tag="${IMAGE##*:}" \
    --set image.pullPolicy=Never \
    --set rbac.scope=namespaces \
    --set "watchNamespaces={$WATCHED_NS}" \
    --wait --timeout 180s
kubectl -n "$OPERATOR_NS" rollout status "deployment/$RELEASE" --timeout=120s
kubectl wait --for=condition=Established crd/agentruns.agentrun.dev --timeout=60s

log "checking the operator's permissions"
as="system:serviceaccount:$OPERATOR_NS:$RELEASE"
expect_can() {
    local want=$1
    shift
    local got
    got=$(kubectl auth can-i --as="$as" "$@" 2>/dev/null || true)
    [[ $got == "$want" ]] || die "kubectl auth can-i $* as the operator: got '$got', expected '$want'"
    printf '  can-i %-60s %s\n' "$*" "$got"
}
expect_can yes patch agentruns.agentrun.dev -n "$WATCHED_NS"
expect_can yes patch agentruns.agentrun.dev --subresource=status -n "$WATCHED_NS"
expect_can yes create secrets -n "$WATCHED_NS"
expect_can yes impersonate serviceaccounts -n "$WATCHED_NS"
expect_can yes watch customresourcedefinitions.apiextensions.k8s.io
expect_can no get secrets -n default
expect_can no patch agentruns.agentrun.dev -n default
expect_can no impersonate users
expect_can no impersonate groups
expect_can no impersonate serviceaccounts -n kube-system

log "scraping the operator's metrics through the API server proxy"
metrics=$(kubectl get --raw "/api/v1/namespaces/$OPERATOR_NS/services/$RELEASE-metrics:http-metrics/proxy/metrics")
grep -q '^agentrun_' <<<"$metrics" || die "no agentrun_ metrics exposed"

log "uninstalling the chart"
helm uninstall "$RELEASE" --namespace "$OPERATOR_NS" --wait --timeout 120s
log "e2e-kind passed"
