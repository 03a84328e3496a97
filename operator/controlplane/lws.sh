#!/usr/bin/env bash
# Builds the LeaderWorkerSet controller (sigs.k8s.io/lws, the controller and its webhooks in one
# binary) at LWS_VERSION and copies its CRDs and webhook configurations, all from the same
# module, into a cache outside the repository. Prints that directory on stdout; rebuilds only
# when the pin (or this script, or Go) changes. Progress goes to stderr.
#
# LWS has its own module graph (k8s.io/* v0.36.2, controller-runtime v0.24): adding it to
# go.mod here would move the control plane's dependencies, so it is built from its own go.mod
# and go.sum, inside the downloaded module. (Not `go install pkg@version` as for helm: that also
# asks the proxy for the module's version list, which the proxy here refuses for sigs.k8s.io/lws.)
#
# Where everything comes from (kubernetes-sigs/lws@v0.9.0):
#   cmd/main.go                                    the controller's main package and flags
#   api/config/v1alpha1/                           its --config file (Configuration)
#   config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml
#   config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml   the CRDs
#   config/webhook/manifests.yaml (+ mutating-patch.yaml, validating-patch.yaml)   the webhooks
#   config/rbac/role.yaml, config/rbac/auth_proxy_role.yaml   the controller's ClusterRoles
#   config/default/kustomization.yaml              the names a release gives them (prefix lws-)
set -euo pipefail
LWS_VERSION=v0.9.0
here="$(cd "$(dirname "$0")" && pwd)"
cache_root="${LLMFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmfleet}"
pin_hash="$( (echo "$LWS_VERSION"; cat "$here/lws.sh"; go env GOVERSION) | sha256sum | cut -c1-12)"
out_dir="$cache_root/lws/$LWS_VERSION-$pin_hash"
if [ -f "$out_dir/.complete" ]; then echo "$out_dir"; exit 0; fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
module="$( (cd "$scratch" && go mod download -json "sigs.k8s.io/lws@$LWS_VERSION") \
  | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
[ -d "$module" ] || { echo "could not download sigs.k8s.io/lws@$LWS_VERSION" >&2; exit 1; }
staging="$out_dir.partial"
rm -rf "$staging" && mkdir -p "$staging/crds" "$staging/webhooks" "$staging/rbac"
echo "building the LeaderWorkerSet controller $LWS_VERSION into $out_dir (a cold build takes minutes)" >&2
start=$SECONDS
(cd "$module" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "$staging/lws-controller-manager" \
  -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION -X sigs.k8s.io/lws/pkg/version.BuildDate=1970-01-01T00:00:00Z -X sigs.k8s.io/lws/pkg/version.GitCommit=module-$LWS_VERSION" \
  ./cmd)
echo "  built lws-controller-manager ($((SECONDS - start)) s)" >&2
cp "$module"/config/crd/bases/*.yaml "$staging/crds/"
cp "$module"/config/webhook/manifests.yaml "$module"/config/webhook/mutating-patch.yaml \
  "$module"/config/webhook/validating-patch.yaml "$staging/webhooks/"
cp "$module"/config/rbac/role.yaml "$module"/config/rbac/auth_proxy_role.yaml "$staging/rbac/"
chmod -R u+w "$staging"
touch "$staging/.complete"
rm -rf "$out_dir" && mv "$staging" "$out_dir"
# Builds for older pins are dead weight; the Go caches keep rebuilds fast.
find "$cache_root/lws" -mindepth 1 -maxdepth 1 -type d ! -path "$out_dir" -exec rm -rf {} +
echo "$out_dir"
