#!/usr/bin/env bash
# Fills .gpu-data/ (git-ignored) with the data the GPU machine lacks, for tools/gpu_check.sh
# (docs/gpu.md): Debian's Fashion-MNIST files and Tiny Shakespeare. The device tool then
# carries the folder: run(command="bash tools/gpu_check.sh", carry=[".gpu-data"]).
#
#   bash tools/gpu_prepare.sh [DEST]     # DEST: default .gpu-data
#
# Sources (environment): FASHION_MNIST_DIR (/usr/share/datasets/fashion-mnist, Debian's
# dataset-fashion-mnist), SHAKESPEARE_FILE (../shared/data/text/tinyshakespeare.txt, beside
# the checkout). The text is optional: without it the GPT runs read the package's own copy
# or are skipped.
set -eu

if [ ! -f pyproject.toml ] || [ ! -f tools/gpu_check.sh ]; then
    echo "gpu_prepare: run it from the repository root (bash tools/gpu_prepare.sh); $PWD is not one" >&2
    exit 2
fi
dest=${1:-.gpu-data}
fm=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
text=${SHAKESPEARE_FILE:-../shared/data/text/tinyshakespeare.txt}

for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte \
    t10k-labels-idx1-ubyte; do
    if [ ! -f "$fm/$f.gz" ]; then
        echo "gpu_prepare: $fm/$f.gz: no such file (apt-get install dataset-fashion-mnist, or set FASHION_MNIST_DIR)" >&2
        exit 1
    fi
done
mkdir -p "$dest/fashion-mnist" "$dest/text"
cp "$fm"/train-images-idx3-ubyte.gz "$fm"/train-labels-idx1-ubyte.gz \
    "$fm"/t10k-images-idx3-ubyte.gz "$fm"/t10k-labels-idx1-ubyte.gz "$dest/fashion-mnist/"
if [ -f "$text" ]; then
    cp "$text" "$dest/text/tinyshakespeare.txt"
else
    echo "gpu_prepare: warning: $text: no such file; the GPT runs will read the package's copy or be skipped" >&2
fi
echo "gpu_prepare: $dest holds $(du -sh "$dest" | cut -f1) (the device tool carries up to 64 MiB with the checkout)"
