#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and kubelet from the Go module
# proxy (no registry, no Docker, no release tarball needed) into a cache
# directory outside the clone, for the tests of the Kubernetes provisioner
# (internal/testing/testkube). A cache that is already complete is reused at once.
#
#   deploy/kubernetes/build-control-plane.sh [DIR]
#
# DIR defaults to /var/cache/gorovod/k8s-$VERSION. The binaries land in DIR/bin;
# DIR/bin/.complete records what was built. About 5 minutes on an idle
# 2-core machine (much longer on a busy one), 3 binaries of 60-130 MB.
#
# How: k8s.io/kubernetes is not meant to be used as a module: its go.mod
# requires every k8s.io/* staging module at v0.0.0 and replaces it with a
# directory of its own repository. A module that requires k8s.io/kubernetes
# and replaces each of those staging modules by its published v0.x.y twin
# builds the commands as they are released.
set -euo pipefail

version=${KUBERNETES_VERSION:-v1.31.4}
dir=${1:-/var/cache/gorovod/k8s-$version}
commands="kube-apiserver kube-controller-manager kubelet"
stamp="$version $commands"

if [ -f "$dir/bin/.complete" ] && [ "$(cat "$dir/bin/.complete")" = "$stamp" ]; then
  echo "Kubernetes $version binaries already in $dir/bin"
  exit 0
fi

t0=$SECONDS
staging=v0.${version#v1.} # k8s.io/kubernetes v1.31.4 <-> k8s.io/api v0.31.4
work=$(mktemp -d "${TMPDIR:-/tmp}/gorovod-k8s-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

# The staging modules are the ones k8s.io/kubernetes replaces with its own
# directories; read them from its go.mod rather than keeping a list here.
modfile=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
mods=$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$modfile")
[ -n "$mods" ] || { echo "no staging modules found in $modfile" >&2; exit 1; }

{
  echo "module gorovod.test/k8sbuild"
  echo
  echo "go 1.23"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  for c in $commands; do echo "tool k8s.io/kubernetes/cmd/$c"; done
  echo
  for m in $mods; do echo "replace $m => $m $staging"; done
} > go.mod
go mod tidy

pkg=k8s.io/component-base/version
minor=${version#v1.}; minor=${minor%%.*}
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
mkdir -p "$dir/bin.new"
for c in $commands; do
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dir/bin.new/$c" "k8s.io/kubernetes/cmd/$c"
done
echo "$stamp" > "$dir/bin.new/.complete"
rm -rf "$dir/bin"
mv "$dir/bin.new" "$dir/bin"
echo "Kubernetes $version ($commands) built into $dir/bin in $((SECONDS - t0)) s"
