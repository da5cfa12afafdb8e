"""The example models of torsh-backend written in PyTorch eager, as the peers of `benches/train.py`.

    python3 benches/torch_models.py lenet_digits [--threads N] [--epochs N]

`lenet_digits` mirrors `torsh-backend/examples/lenet_digits`: the same data file, the same 80/20
split and per-epoch shuffles (the same SplitMix64 stream from the same seed), the same network
(conv 1->8 3x3 pad 1, relu, max-pool 2, conv 8->16 3x3 pad 1, relu, max-pool 2, linear 64->10),
cross-entropy, batch 32 and Adam (lr 0.01, PyTorch's default implementation for the CPU). Only the
initial weights differ (PyTorch's own generator, the same distribution). An epoch's time counts its
training steps and its evaluation on the test set, as the example's does.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

DIGITS = Path(__file__).resolve().parent.parent / "torsh-backend/examples/data/digits.csv"
MASK = (1 << 64) - 1


class SplitMix64:
    """The example's generator (data.rs), bit for bit."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def permutation(self, n: int) -> list[int]:
        order = list(range(n))
        for i in range(n - 1, 0, -1):
            j = self.next_u64() % (i + 1)
            order[i], order[j] = order[j], order[i]
        return order


def digits(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train images, train labels, test images, test labels), split as the example splits them."""
    rows = [[int(v) for v in line.split(",")] for line in DIGITS.read_text().splitlines()]
    labels = torch.tensor([r[0] for r in rows], dtype=torch.int64)
    images = torch.tensor([r[1:] for r in rows], dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    order = SplitMix64(seed).permutation(len(rows))
    test = round(len(rows) * 0.2)
    train_rows, test_rows = torch.tensor(order[test:]), torch.tensor(order[:test])
    return images[train_rows], labels[train_rows], images[test_rows], labels[test_rows]


class LeNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def train_lenet(epochs: int, threads: int, seed: int = 0, batch: int = 32,
                lr: float = 0.01, log=None) -> list[dict]:
    """Trains a fresh LeNet; returns each epoch's loss, accuracy and time in ms."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    train_x, train_y, test_x, test_y = digits(seed)
    model = LeNet()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    shuffle = SplitMix64(seed + 1)
    out = []
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        order = torch.tensor(shuffle.permutation(len(train_y)))
        losses = []
        for first in range(0, len(train_y), batch):
            rows = order[first:first + batch]
            x, y = train_x[rows], train_y[rows]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        train_ms = (time.perf_counter() - start) * 1e3
        start = time.perf_counter()
        with torch.no_grad():
            correct = int((model(test_x).argmax(1) == test_y).sum())
        eval_ms = (time.perf_counter() - start) * 1e3
        row = {"loss": float(torch.stack(losses).mean()), "accuracy": correct / len(test_y),
               "train_ms": train_ms, "eval_ms": eval_ms}
        out.append(row)
        if log:
            log(f"epoch {epoch:>3}/{epochs}  loss {row['loss']:.4f}  test accuracy "
                f"{100 * row['accuracy']:5.1f} %  train {train_ms:6.1f} ms  eval {eval_ms:5.1f} ms")
    return out


MODELS = {"lenet_digits": train_lenet}


def epoch_ms(epochs: list[dict]) -> float:
    """The median epoch time (training and evaluation), the first epoch (warm-up) left out."""
    rest = epochs[1:] or epochs
    return statistics.median(e["train_ms"] + e["eval_ms"] for e in rest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    epochs = MODELS[args.model](args.epochs, args.threads, args.seed, log=print)
    print(f"PyTorch {torch.__version__}, {args.threads} thread(s): "
          f"{epoch_ms(epochs):.1f} ms per epoch (median), "
          f"test accuracy {100 * epochs[-1]['accuracy']:.1f} %")


if __name__ == "__main__":
    main()
