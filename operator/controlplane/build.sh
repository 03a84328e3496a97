#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl
# from the modules pinned in go.mod, and helm at HELM_VERSION, into a cache
# outside the repository.
# Prints the binary directory on stdout. Rebuilds only when the pins change.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache_root="${LLMFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmfleet}"
k8s_version="$(awk '$1=="k8s.io/kubernetes" {print $2}' "$here/go.mod")"
pins_hash="$( (cat "$here/go.mod" "$here/go.sum" "$here/build.sh"; go env GOVERSION) | sha256sum | cut -c1-12)"
bin_dir="$cache_root/bin/$k8s_version-$pins_hash"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl helm)
# Helm has its own module graph; it is built from its own go.mod, not ours.
HELM_VERSION=v3.22.0

complete() { for b in "${binaries[@]}"; do [ -x "$bin_dir/$b" ] || return 1; done; }
if complete; then echo "$bin_dir"; exit 0; fi

minor="$(echo "$k8s_version" | cut -d. -f2)"
version_pkg=k8s.io/component-base/version
ldflags="-s -w"
for pkg in "$version_pkg" k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
staging="$bin_dir.partial"
rm -rf "$staging" && mkdir -p "$staging"
echo "building control plane $k8s_version into $bin_dir (a cold build takes many minutes)" >&2
cd "$here"
start=$SECONDS
for b in "${binaries[@]}"; do
  echo "  go build $b ..." >&2
  case "$b" in
    etcd) CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$staging/$b" go.etcd.io/etcd/server/v3 ;;
    helm) GOBIN="$staging" CGO_ENABLED=0 go install -trimpath \
            -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
            "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" ;;
    *) CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$staging/$b" "k8s.io/kubernetes/cmd/$b" ;;
  esac
  echo "  built $b ($((SECONDS - start)) s so far)" >&2
done
rm -rf "$bin_dir" && mv "$staging" "$bin_dir"
# Builds for older pins are dead weight (~400 MB each); the Go caches keep rebuilds fast.
find "$cache_root/bin" -mindepth 1 -maxdepth 1 -type d ! -path "$bin_dir" -exec rm -rf {} +
echo "control plane built in $((SECONDS - start)) s" >&2
echo "$bin_dir"
