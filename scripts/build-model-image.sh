#!/usr/bin/env bash
# Packages a model folder as an OCI image that an AIModel serves with `source.uri: oci://<ref>` (mounted
# read-only into the pod as a Kubernetes image volume; nothing is downloaded when the pod starts).
#
# Usage: scripts/build-model-image.sh <model dir> <registry.host/repository:tag>
# Then:  docker push <ref>   (or import it into a node's containerd), and write oci://<ref> in the AIModel.
#
# The image is `FROM scratch` with the folder's files at its root (config.json, *.safetensors, tokenizer
# files: what the runtime loads from the mount point), one layer, no program in it. Symlinks (a Hugging Face
# cache snapshot is made of them) are followed; files become readable by every user (the runtime runs as a
# non-root uid and image volumes keep the image's owners and modes) and owned by root. The folder is streamed
# to Docker as a tar, not copied. Prints the image's ID on stdout.
set -euo pipefail

if [[ $# -ne 2 || $1 == -h || $1 == --help ]]; then
  sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
model_dir=$1
ref=$2
[[ -d $model_dir ]] || { echo "build-model-image: $model_dir is not a folder" >&2; exit 2; }
[[ -f $model_dir/config.json ]] || { echo "build-model-image: $model_dir has no config.json: not a model" >&2; exit 2; }
command -v docker >/dev/null || { echo "build-model-image: docker is needed" >&2; exit 3; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The build context is one tar: the Dockerfile, and the model's files under model/ (so the Dockerfile is no
# part of the image).
cat >"$tmp/Dockerfile" <<'EOF'
FROM scratch
COPY model/ /
EOF
tar -c -C "$tmp" Dockerfile -f "$tmp/context.tar"
tar -r -f "$tmp/context.tar" -C "$model_dir" --dereference --owner=0 --group=0 --numeric-owner --mode='a+rX,u+w' \
  --exclude=./.cache --transform='s,^\.,model,' .
docker build --quiet --label "org.opencontainers.image.title=$(basename "$model_dir")" -t "$ref" - <"$tmp/context.tar"
