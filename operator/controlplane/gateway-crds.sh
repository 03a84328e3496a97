#!/usr/bin/env bash
# Copies the upstream Gateway API (standard channel) and Inference Extension (InferencePool v1)
# CRDs, at the versions pinned here, from their Go modules into a cache outside the repository.
# Prints the directory of CRD files on stdout. The sandbox applies them, as a cluster that
# offers Gateway API routing would have them installed.
set -euo pipefail
GATEWAY_API_VERSION=v1.6.3
INFERENCE_EXTENSION_VERSION=v1.5.0
cache_root="${LLMFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmfleet}"
crd_dir="$cache_root/gateway-crds/gateway-api-$GATEWAY_API_VERSION-inference-extension-$INFERENCE_EXTENSION_VERSION"
if [ -f "$crd_dir/.complete" ]; then echo "$crd_dir"; exit 0; fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
module_dir() {  # the module's directory in the Go module cache, downloaded if missing
  (cd "$scratch" && go mod download -json "$1@$2") | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
}
gateway="$(module_dir sigs.k8s.io/gateway-api "$GATEWAY_API_VERSION")"
inference="$(module_dir sigs.k8s.io/gateway-api-inference-extension "$INFERENCE_EXTENSION_VERSION")"
staging="$crd_dir.partial"
rm -rf "$staging" && mkdir -p "$staging"
for kind in gatewayclasses gateways httproutes grpcroutes referencegrants; do
  cp "$gateway/config/crd/standard/gateway.networking.k8s.io_$kind.yaml" "$staging/"
done
cp "$inference/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" "$staging/"
chmod -R u+w "$staging"
touch "$staging/.complete"
rm -rf "$crd_dir" && mv "$staging" "$crd_dir"
echo "$crd_dir"
