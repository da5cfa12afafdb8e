#!/usr/bin/env python3
"""Trains the example models with torsh-backend and with PyTorch eager, back to back, and prints the
time per epoch (lenet_digits) or per step (char_transformer) of each and the ratio.

    cargo build --release --example lenet_digits --example char_transformer
    python3 benches/train.py [--model lenet_digits|char_transformer] [--threads 1,2] [--epochs 10]
                             [--steps 200] [--precision f32|bf16] [--repeats 3] [--backend cpu]
                             [--json FILE]

For each repeat and thread count, the example (`target/release/examples/MODEL --backend cpu
--threads N --json ...`) and the same model in PyTorch (benches/torch_models.py, at
`torch.set_num_threads(N)`) each train a fresh network, one after the other, so both see the same
machine.
- lenet_digits: --epochs epochs. An epoch's time is its training steps plus its evaluation on the
  test set; each run's figure is its median epoch, the first (warm-up) left out.
- char_transformer: --steps steps in --precision (bf16: mixed precision with a loss scaler, and
  PyTorch's autocast with a GradScaler). A report every 50 steps times the steps since the last
  (validation excluded); each run's figure is the median report, the first (warm-up) left out.
The table shows the median over the repeats, the range, and ours / PyTorch (below 1: ours is
faster; the targets are at most 0.5 for lenet_digits and 0.7 for char_transformer), with the last
run's test accuracy or validation loss. Exit status 1 when a run fails.

PyTorch is not a dependency of the project and CI never runs this (`pip install torch`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import torch
except ImportError as missing:  # pragma: no cover - depends on the machine
    print(f"train bench: {missing}; install PyTorch with `pip install torch`", file=sys.stderr)
    sys.exit(1)

from torch_models import MODELS, epoch_ms, step_ms

ROOT = Path(__file__).resolve().parent.parent


def ours(model: str, backend: str, threads: int, options: list[str]) -> dict:
    """One run of the example with `options`; its JSON report."""
    binary = ROOT / "target/release/examples" / model
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [str(binary), "--backend", backend, "--threads", str(threads), *options,
               "--json", out.name]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return json.loads(Path(out.name).read_text())


def run_pair(args, threads: int) -> tuple[float, float, float, float]:
    """One run of ours and one of PyTorch: (ours ms, PyTorch ms, our quality, PyTorch's), where
    the time is per epoch or per step and the quality the test accuracy or validation loss."""
    if args.model == "lenet_digits":
        mine = ours(args.model, args.backend, threads, ["--epochs", str(args.epochs)])
        theirs = MODELS[args.model](args.epochs, threads)
        return (epoch_ms(mine["epochs"]), epoch_ms(theirs), mine["epochs"][-1]["accuracy"],
                theirs[-1]["accuracy"])
    options = ["--steps", str(args.steps), "--precision", args.precision, "--sample", "0"]
    mine = ours(args.model, args.backend, threads, options)
    theirs = MODELS[args.model](args.steps, threads, precision=args.precision)
    return (step_ms(mine["reports"]), step_ms(theirs), mine["reports"][-1]["validation_loss"],
            theirs[-1]["validation_loss"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="lenet_digits", choices=sorted(MODELS))
    parser.add_argument("--backend", default="cpu", help="our backend (PyTorch runs on the CPU)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--epochs", type=int, default=10, help="lenet_digits")
    parser.add_argument("--steps", type=int, default=200, help="char_transformer")
    parser.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                        help="char_transformer")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    binary = ROOT / "target/release/examples" / args.model
    if not binary.exists():
        print(f"train bench: {binary} missing: run `cargo build --release --example {args.model}`",
              file=sys.stderr)
        return 1
    lenet = args.model == "lenet_digits"
    unit = "epoch" if lenet else "step"
    runs = {t: {"ours": [], "torch": [], "ours_quality": [], "torch_quality": []} for t in threads}
    for repeat in range(args.repeats):
        for t in threads:
            mine, theirs, mine_q, theirs_q = run_pair(args, t)
            for key, value in [("ours", mine), ("torch", theirs), ("ours_quality", mine_q),
                               ("torch_quality", theirs_q)]:
                runs[t][key].append(value)
            print(f"repeat {repeat + 1}/{args.repeats}, {t} thread(s): ours {mine:.2f} ms, "
                  f"PyTorch {theirs:.2f} ms per {unit}", file=sys.stderr)
    if lenet:
        what = f"ms per epoch (training + evaluation), {args.epochs} epochs"
        quality = ("acc ours", "acc torch")
    else:
        what = f"ms per step in {args.precision}, {args.steps} steps"
        quality = ("val ours", "val torch")
    print(f"\n{args.model}: {what}, median of {args.repeats} runs (first {unit} or report left "
          f"out); ours on {args.backend}, PyTorch {torch.__version__} eager on the CPU")
    print(f"{'threads':>7} {'ours ms':>9} {'range':>13} {'torch ms':>9} {'range':>13} "
          f"{'ours/torch':>10} {quality[0]:>9} {quality[1]:>9}")
    show = (lambda q: f"{100 * q:>8.1f}%") if lenet else (lambda q: f"{q:>9.4f}")
    table = []
    for t in threads:
        r = runs[t]
        mine, theirs = statistics.median(r["ours"]), statistics.median(r["torch"])
        print(f"{t:>7} {mine:>9.2f} {min(r['ours']):>6.2f}–{max(r['ours']):<6.2f} "
              f"{theirs:>9.2f} {min(r['torch']):>6.2f}–{max(r['torch']):<6.2f} "
              f"{mine / theirs:>10.2f} {show(r['ours_quality'][-1])} "
              f"{show(r['torch_quality'][-1])}")
        table.append({"threads": t, "ours_ms": mine, "torch_ms": theirs,
                      "ours_over_torch": mine / theirs, "runs": r})
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": args.model, "backend": args.backend, "epochs": args.epochs,
            "steps": args.steps, "precision": args.precision,
            "torch": torch.__version__, "results": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
