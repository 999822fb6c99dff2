#!/usr/bin/env bash
# `make e2e-kind`: the end-to-end tier on a throwaway kind cluster, for machines with Docker.
#
#   1. creates a kind cluster (its kubeconfig in a temporary file, yours is left alone);
#   2. runs the integration scenarios against it (pytest --real-cluster tests/integration, as make e2e);
#   3. builds the operator image, loads it into kind, installs the chart in "namespaces" scope
#      (watching agentrun-examples, the namespace of examples/kustomization.yaml), waits for the
#      operator to become ready, checks its RBAC with `kubectl auth can-i`, applies the examples
#      with `kubectl apply -k examples/`, waits for `condition=Succeeded`, checks that applying
#      them again changes nothing, and scrapes the metrics through the API server proxy;
#   4. deletes the cluster.
#
# The model: with ANTHROPIC_API_KEY set, the real Anthropic API (every example must succeed).
# Without it, the scripted fake Messages API runs in the cluster, from its own image
# (sandbox/Dockerfile: the operator's image does not contain it); its stand-in model answers what-time correctly but
# cannot be relied on for calculator's required tool, so only what-time is waited for.
#
# Environment: KIND_CLUSTER_NAME (default agentrun-e2e), KIND_NODE_IMAGE (kindest/node image to
# use), KEEP_CLUSTER=1 (keep the cluster for debugging), E2E_CHART=0 (skip step 3),
# PYTEST_ARGS (extra pytest arguments), ANTHROPIC_API_KEY (optional, see above).
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${KIND_CLUSTER_NAME:-agentrun-e2e}
KEEP_CLUSTER=${KEEP_CLUSTER:-0}
E2E_CHART=${E2E_CHART:-1}
IMAGE=agentrun-operator:e2e
FAKE_API_IMAGE=agentrun-fake-messages-api:e2e
RELEASE=agentrun-operator
OPERATOR_NS=agentrun-system
WATCHED_NS=agentrun-examples # the namespace examples/kustomization.yaml puts the examples in
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

log "running the integration scenarios against the kind cluster"
# shellcheck disable=SC2086  # PYTEST_ARGS is split on purpose
"$PYTHON" -m pytest --real-cluster tests/integration ${PYTEST_ARGS:-}

if [[ $E2E_CHART != 1 ]]; then
    exit 0
fi

log "building $IMAGE and loading it into kind"
docker build --tag "$IMAGE" --build-arg "REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

log "installing the chart (scope namespaces, watching $WATCHED_NS)"
kubectl create namespace "$OPERATOR_NS" --dry-run=client -o yaml | kubectl apply -f -
kubectl create namespace "$WATCHED_NS" --dry-run=client -o yaml | kubectl apply -f -
model_args=()
if [[ -n ${ANTHROPIC_API_KEY:-} ]]; then
    kubectl -n "$OPERATOR_NS" create secret generic anthropic --from-literal=api-key="$ANTHROPIC_API_KEY" \
        --dry-run=client -o yaml | kubectl apply -f -
    EXPECTED_RUNS=(calculator what-time)
else
    log "no ANTHROPIC_API_KEY: serving the scripted fake Messages API in the cluster"
    docker build --tag "$FAKE_API_IMAGE" sandbox/
    kind load docker-image "$FAKE_API_IMAGE" --name "$CLUSTER"
    kubectl -n "$OPERATOR_NS" create secret generic anthropic --from-literal=api-key=offline-e2e \
        --dry-run=client -o yaml | kubectl apply -f -
    kubectl -n "$OPERATOR_NS" apply -f - <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: fake-messages-api}
spec:
  selector: {matchLabels: {app: fake-messages-api}}
  template:
    metadata: {labels: {app: fake-messages-api}}
    spec:
      securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: api
          image: $FAKE_API_IMAGE
          imagePullPolicy: Never
          args: [--host, 0.0.0.0, --port, "8080"]
          ports: [{containerPort: 8080}]
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
---
apiVersion: v1
kind: Service
metadata: {name: fake-messages-api}
spec:
  selector: {app: fake-messages-api}
  ports: [{port: 8080, targetPort: 8080}]
EOF
    kubectl -n "$OPERATOR_NS" rollout status deployment/fake-messages-api --timeout=120s
    model_args=(--set "operator.anthropicBaseURL=http://fake-messages-api.$OPERATOR_NS.svc:8080")
    EXPECTED_RUNS=(what-time)
fi
helm upgrade --install "$RELEASE" charts/agentrun-operator \
    --namespace "$OPERATOR_NS" \
    --set image.repository="${IMAGE%%:*}" \
    --set image.tag="${IMAGE##*:}" \
    --set image.pullPolicy=Never \
    --set rbac.scope=namespaces \
    --set "watchNamespaces={$WATCHED_NS}" \
    --set apiKey.existingSecret=anthropic \
    "${model_args[@]}" \
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

log "applying the examples with kustomize and waiting for condition=Succeeded"
kubectl apply -k examples/
for run in "${EXPECTED_RUNS[@]}"; do
    kubectl -n "$WATCHED_NS" wait --for=condition=Succeeded "agentrun/$run" --timeout=300s ||
        die "agentrun/$run did not succeed: $(kubectl -n "$WATCHED_NS" get agentrun "$run" -o jsonpath='{.status}')"
done
kubectl -n "$WATCHED_NS" get agentruns
reapplied=$(kubectl apply -k examples/)
if grep -qv ' unchanged$' <<<"$reapplied"; then
    die "re-applying the examples changed something: $reapplied"
fi

log "scraping the operator's metrics through the API server proxy"
metrics=$(kubectl get --raw "/api/v1/namespaces/$OPERATOR_NS/services/$RELEASE-metrics:http-metrics/proxy/metrics")
grep -q '^agentrun_' <<<"$metrics" || die "no agentrun_ metrics exposed"

log "uninstalling the chart"
helm uninstall "$RELEASE" --namespace "$OPERATOR_NS" --wait --timeout 120s
log "e2e-kind passed"
