#!/usr/bin/env bash
# Copies the upstream Gateway API (standard channel) and Inference Extension (InferencePool v1)
# CRDs, and the Prometheus Operator's PodMonitor and PrometheusRule CRDs, at the versions pinned
# here, from their Go modules into a cache outside the repository. Prints the directory of CRD
# files on stdout. The sandbox applies them, as a cluster that offers Gateway API routing and
# runs the Prometheus Operator (kube-prometheus-stack) would have them installed: the chart's
# PodMonitors and PrometheusRule are then checked against the upstream schemas.
set -euo pipefail
GATEWAY_API_VERSION=v1.6.3
INFERENCE_EXTENSION_VERSION=v1.5.0
PROMETHEUS_OPERATOR_VERSION=v0.85.0
cache_root="${LLMFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmfleet}"
crd_dir="$cache_root/gateway-crds/gateway-api-$GATEWAY_API_VERSION-inference-extension-$INFERENCE_EXTENSION_VERSION-prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
if [ -f "$crd_dir/.complete" ]; then echo "$crd_dir"; exit 0; fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
module_dir() {  # the module's directory in the Go module cache, downloaded if missing
  (cd "$scratch" && go mod download -json "$1@$2") | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
}
gateway="$(module_dir sigs.k8s.io/gateway-api "$GATEWAY_API_VERSION")"
inference="$(module_dir sigs.k8s.io/gateway-api-inference-extension "$INFERENCE_EXTENSION_VERSION")"
prometheus_operator="$(module_dir github.com/prometheus-operator/prometheus-operator "$PROMETHEUS_OPERATOR_VERSION")"
staging="$crd_dir.partial"
rm -rf "$staging" && mkdir -p "$staging"
for kind in gatewayclasses gateways httproutes grpcroutes referencegrants; do
  cp "$gateway/config/crd/standard/gateway.networking.k8s.io_$kind.yaml" "$staging/"
done
cp "$inference/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" "$staging/"
for kind in podmonitors prometheusrules; do
  cp "$prometheus_operator/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$staging/"
done
chmod -R u+w "$staging"
touch "$staging/.complete"
rm -rf "$crd_dir" && mv "$staging" "$crd_dir"
echo "$crd_dir"
