#!/usr/bin/env python3
"""PyTorch's CPU autograd as the peer of `torsh-backend bench --backend cpu` for the backward ops.

    python3 benches/torch_peer.py RESULTS.json [--json TORCH.json] [--repeats N] [--forward]

RESULTS.json is what `torsh-backend bench --backend cpu --json RESULTS.json` wrote. For every f32
backward case there (conv2d_backward, max_pool2d_backward, avg_pool2d_backward,
layer_norm_backward, batch_norm_backward, softmax_backward, cross_entropy_backward, gelu_backward,
attention_backward), this builds the same forward in PyTorch on the CPU (oneDNN for convolutions,
the flash-attention CPU kernel behind scaled_dot_product_attention), runs it once, and times only
the backward, `torch.autograd.grad(output, inputs, grad, retain_graph=True)`, asking for the
gradients ours computes (conv2d: input, weight and bias; the norms: input, weight and bias;
attention: q, k and v), at each thread count of the run (`torch.set_num_threads`), as ours is
timed (a warm-up, then repeats of k back-to-back calls lasting at least --min-repeat-s, the median
per call). It prints ours, PyTorch and ours / PyTorch per shape and thread count (above 1: ours is
faster). With --forward it also times PyTorch's forward of each case, for the backward ÷ forward
ratio the issue's targets use.

The same models as the examples, trained in PyTorch, are in torch_models.py; benches/train.py
runs them beside ours.

PyTorch is not a dependency of the project and CI never runs this. The PyPI `torch` wheel needs
its `nvidia-*` / `cuda-toolkit` dependencies installed to import, even on a machine without a GPU
(about 3 GB): `pip install torch`. Exit status: 0 when every case ran; 1 when PyTorch or the
results are missing (said on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

try:
    import torch
    import torch.nn.functional as F
except ImportError as missing:  # pragma: no cover - depends on the machine
    print(
        f"torch peer: not found: {missing}; install it with `pip install torch` "
        "(about 3 GB with its nvidia-* dependencies, needed to import even without a GPU)",
        file=sys.stderr,
    )
    sys.exit(1)

from peer_timing import measure

# Channels of the bench's batch-norm cases (`BATCH_NORM_CHANNELS` in torsh-cli/src/bench/cases.rs).
BATCH_NORM_CHANNELS = 32
# Rows of a pooling case's planes (`POOL_ROWS`): each [rows, cols] tensor is [rows / 64, 1, 64, cols].
POOL_ROWS = 64


def leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float32).requires_grad_(True)


def backward_of(row: dict) -> tuple[Callable[[], object], Callable[[], object]] | None:
    """(forward, backward) closures of the case in PyTorch, or None when not a backward case."""
    op, dims = row["op"], row["dims"]
    if op == "conv2d_backward":
        n, c, h, w, k, r = (dims[x] for x in ("n", "c", "h", "w", "k", "r"))
        groups, stride, pad = dims["groups"], dims["stride"], dims["padding"]
        x, wt = leaf(n, c, h, w), leaf(k, c // groups, r, r)
        b = leaf(k) if dims["bias"] else None

        def fwd():
            return F.conv2d(x, wt, b, stride=stride, padding=pad, groups=groups)

        inputs = [x, wt] + ([b] if b is not None else [])
    elif op in ("max_pool2d_backward", "avg_pool2d_backward"):
        x = leaf(dims["n"], dims["c"], dims["h"], dims["w"])
        kernel, stride = dims["kernel"], dims["stride"]

        def fwd():
            if op == "max_pool2d_backward":
                return F.max_pool2d(x, kernel, stride)
            return F.avg_pool2d(x, kernel, stride)

        inputs = [x]
    elif op == "layer_norm_backward":
        rows, cols = dims["rows"], dims["cols"]
        x, wt, b = leaf(rows, cols), leaf(cols), leaf(cols)

        def fwd():
            return F.layer_norm(x, (cols,), wt, b, 1e-5)

        inputs = [x, wt, b]
    elif op == "batch_norm_backward":
        n, c, s = dims["n"], dims["c"], dims["spatial"]
        x, wt, b = leaf(n, c, s), leaf(c), leaf(c)

        def fwd():
            return F.batch_norm(x, None, None, wt, b, training=True)

        inputs = [x, wt, b]
    elif op == "softmax_backward":
        x = leaf(dims["rows"], dims["cols"])

        def fwd():
            return torch.softmax(x, 1)

        inputs = [x]
    elif op == "gelu_backward":
        x = leaf(dims["rows"], dims["cols"])

        def fwd():
            return F.gelu(x)

        inputs = [x]
    elif op == "cross_entropy_backward":
        rows, cols = dims["rows"], dims["cols"]
        x = leaf(rows, cols)
        target = torch.tensor([(r * 7919) % cols for r in range(rows)], dtype=torch.int64)

        def fwd():
            return F.cross_entropy(x, target)

        inputs = [x]
    elif op == "attention_backward":
        b, h, sq, skv, d = (dims[x] for x in ("batch", "heads", "seq_q", "seq_kv", "head_dim"))
        q, k, v = leaf(b, h, sq, d), leaf(b, h, skv, d), leaf(b, h, skv, d)
        causal = dims["causal"]

        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        inputs = [q, k, v]
    else:
        return None
    out = fwd()
    grad = torch.randn_like(out)

    def bwd():
        return torch.autograd.grad(out, inputs, grad, retain_graph=True)

    def forward_only():
        with torch.no_grad():
            return fwd()

    return forward_only, bwd


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="the JSON of `torsh-backend bench --backend cpu --json`")
    parser.add_argument("--json", help="also write PyTorch's figures and the ratios here")
    parser.add_argument("--repeats", type=int, default=None,
                        help="repeats per case (default: the run's)")
    parser.add_argument("--min-repeat-s", type=float, default=None,
                        help="minimum seconds of one repeat (default: the run's)")
    parser.add_argument("--forward", action="store_true",
                        help="also time PyTorch's forward of each case")
    args = parser.parse_args()
    try:
        with open(args.results) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"torch peer: cannot read {args.results}: {e}", file=sys.stderr)
        return 1
    if doc.get("backend") != "cpu":
        print(f"torch peer: {args.results} is a {doc.get('backend')} run, not a CPU one",
              file=sys.stderr)
        return 1
    repeats = args.repeats or doc.get("repeats", 5)
    target = args.min_repeat_s or doc.get("min_repeat_s", 0.02)
    torch.manual_seed(0)
    print(f"\nPyTorch {torch.__version__} CPU autograd (oneDNN {torch.backends.mkldnn.is_available()}), "
          f"backward only (torch.autograd.grad, retain_graph); median of {repeats} repeats of "
          f">= {target * 1e3:g} ms")
    print("ratio = ours / PyTorch throughput (above 1: ours is faster)")
    header = (f"{'op':<22} {'shape':<30} {'thr':>3} {'ours ms':>9} {'torch ms':>9} "
              f"{'ours/torch':>10}" + (f" {'torch fwd ms':>12}" if args.forward else ""))
    rows_out, failures, table = [], 0, None
    for row in doc.get("results", []):
        if row.get("error") or row.get("median_s") is None or row["dtype"] != "f32":
            continue
        threads = row.get("threads") or 1
        torch.set_num_threads(threads)
        try:
            built = backward_of(row)
        except Exception as e:  # report and go on
            failures += 1
            print(f"{row['op']:<22} {row['shape']:<30} {threads:>3} error: {e}")
            continue
        if built is None:
            continue
        forward, backward = built
        if (row["section"], threads) != table:
            table = (row["section"], threads)
            print(f"\n{row['section']} — {threads} thread(s)\n{header}")
        theirs = measure(backward, repeats, target)
        ours = row["median_s"]
        ratio = theirs / ours
        line = (f"{row['op']:<22} {row['shape']:<30} {threads:>3} {ours * 1e3:>9.3f} "
                f"{theirs * 1e3:>9.3f} {ratio:>9.2f}x")
        entry = {
            "op": row["op"], "shape": row["shape"], "dims": row["dims"], "threads": threads,
            "ours_s": ours, "torch_s": theirs, "ours_over_torch": ratio,
        }
        if args.forward:
            fwd = measure(forward, repeats, target)
            line += f" {fwd * 1e3:>12.3f}"
            entry["torch_forward_s"] = fwd
        print(line)
        rows_out.append(entry)
    if not rows_out:
        print("\nno f32 backward case in the run: pass --op conv2d_backward, attention_backward, ...")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "repeats": repeats, "min_repeat_s": target,
                       "results": rows_out}, f, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
