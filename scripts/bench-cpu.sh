#!/usr/bin/env bash
# The CPU benchmark with every peer, in one invocation: `torsh-backend bench --backend cpu`, which
# times ours beside OpenBLAS, the gemm crate and matrixmultiply for GEMM and beside onnxruntime on
# the same shapes outside GEMM (benches/onnxruntime_peer.py --serve, a co-process the bench starts),
# interleaved repeat by repeat, at 1 thread and all cores, against the measured FMA peak and copy
# bandwidth; then, where PyTorch imports, its CPU autograd on the backward ops
# (benches/torch_peer.py; not installed by anything here: `pip install torch`, about 3 GB).
#
#   scripts/bench-cpu.sh [BENCH ARGS...]      e.g. --quick, --threads 1,2, --op conv2d, --plot cpu.svg
#
# Environment: OUT_DIR (default target/bench-cpu) receives cpu.json (ours, every peer, the ratios
# and the fractions of the ceilings) and, with PyTorch, torch.json; PYTHON (default python3) runs
# the peers, which need `pip install -r benches/requirements.txt`; without it this says so and stops
# before anything runs. Set OPENBLAS_CORETYPE to override the bench's choice.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT_DIR:-target/bench-cpu}

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "bench-cpu: the onnxruntime peer needs Python: $PYTHON not found (set PYTHON=...)" >&2
    exit 1
fi
if ! missing=$("$PYTHON" -c 'import numpy, onnx, onnxruntime' 2>&1); then
    echo "bench-cpu: onnxruntime peer not found: ${missing##*$'\n'}" >&2
    echo "bench-cpu: install it with: $PYTHON -m pip install -r benches/requirements.txt" >&2
    exit 1
fi

mkdir -p "$OUT_DIR"
export PYTHON
cargo run --release -p torsh-cli -- bench --backend cpu --json "$OUT_DIR/cpu.json" "$@"
if "$PYTHON" -c 'import torch' >/dev/null 2>&1; then
    "$PYTHON" benches/torch_peer.py "$OUT_DIR/cpu.json" --json "$OUT_DIR/torch.json" --forward
else
    echo "bench-cpu: PyTorch not importable: the backward ops' peer (benches/torch_peer.py) skipped"
fi
