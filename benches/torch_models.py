"""The example models of torsh-backend written in PyTorch eager, as the peers of `benches/train.py`.

    python3 benches/torch_models.py lenet_digits [--threads N] [--epochs N]
    python3 benches/torch_models.py char_transformer [--threads N] [--steps N] [--precision bf16]

`lenet_digits` mirrors `torsh-backend/examples/lenet_digits`: the same data file, the same 80/20
split and per-epoch shuffles (the same SplitMix64 stream from the same seed), the same network
(conv 1->8 3x3 pad 1, relu, max-pool 2, conv 8->16 3x3 pad 1, relu, max-pool 2, linear 64->10),
cross-entropy, batch 32 and Adam (lr 0.01, PyTorch's default implementation for the CPU). Only the
initial weights differ (PyTorch's own generator, the same distribution). An epoch's time counts its
training steps and its evaluation on the test set, as the example's does.

`char_transformer` mirrors `torsh-backend/examples/char_transformer`: the same text and 90/10
split, the same batches (windows at offsets from the crate's counter-based generator, ported
below), the same network (token and position embeddings, 2 pre-norm blocks of d_model 64 with 4
causal heads through `scaled_dot_product_attention` and a GELU MLP of 256, a final layer norm, a
linear layer to the vocabulary), its initialisation (matrices N(0, 0.02), biases zero), cross-entropy,
batch 32 x 64 characters and Adam (lr 0.003). `--precision bf16` runs the forward under
`torch.autocast("cpu", torch.bfloat16)` with a `GradScaler`, as the example's mixed precision. A
report every `--every` steps gives the mean training loss since the last, the loss on 8 fixed
validation batches and the time per step (the validation excluded), as the example's do.
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


TEXT = Path(__file__).resolve().parent.parent / "torsh-backend/examples/data/macbeth.txt"
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """The SplitMix64 finaliser, as the crate's `rng::mix64`."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def random_bits(seed: int, index: int) -> int:
    """The crate's `rng::bits(seed, index)`: element `index` of the counter-based stream `seed`."""
    key = mix64((seed ^ GOLDEN) & MASK)
    return mix64((key + index * GOLDEN) & MASK)


def windows(text: torch.Tensor, batch: int, context: int, seed: int, draw: int):
    """The example's `data::batch`: `batch` windows and their targets one token later."""
    starts = len(text) - context
    offsets = [random_bits(seed, draw * batch + j) % starts for j in range(batch)]
    x = torch.stack([text[o:o + context] for o in offsets])
    y = torch.stack([text[o + 1:o + context + 1] for o in offsets])
    return x, y


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.out = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Transformer(torch.nn.Module):
    def __init__(self, vocab: int, context: int, d: int = 64, heads: int = 4,
                 layers: int = 2) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, d)
        self.positions = torch.nn.Parameter(torch.zeros(context, d))
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.lnf = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, 0.0, 0.02)
            elif not name.endswith("weight"):
                torch.nn.init.zeros_(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tokens(x) + self.positions[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.lnf(h))


def train_char_transformer(steps: int, threads: int, seed: int = 0, batch: int = 32,
                           context: int = 64, lr: float = 0.003, every: int = 50,
                           precision: str = "f32", log=None) -> list[dict]:
    """Trains a fresh transformer; returns each report's losses and time per step in ms."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    chars = sorted(set(TEXT.read_text()))
    ids = torch.tensor([chars.index(c) for c in TEXT.read_text()], dtype=torch.int64)
    cut = len(ids) * 9 // 10
    train, validation = ids[:cut], ids[cut:]
    model = Transformer(len(chars), context)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    low = precision == "bf16"
    scaler = torch.amp.GradScaler("cpu", init_scale=65536.0, enabled=low)

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
            logits = model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    out, losses = [], []
    start, first = time.perf_counter(), 0
    for step in range(steps):
        x, y = windows(train, batch, context, seed, step)
        loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.detach())
        if (step + 1) % every == 0 or step + 1 == steps:
            per_step = (time.perf_counter() - start) * 1e3 / (step + 1 - first)
            with torch.no_grad():
                val = sum(float(loss_of(*windows(validation, batch, context, seed + 1, d)))
                          for d in range(8)) / 8
            row = {"step": step + 1, "train_loss": float(torch.stack(losses).mean()),
                   "validation_loss": val, "ms_per_step": per_step}
            out.append(row)
            if log:
                log(f"step {step + 1:>5}/{steps}  train loss {row['train_loss']:.4f}  "
                    f"validation loss {val:.4f}  {per_step:7.2f} ms/step")
            losses = []
            start, first = time.perf_counter(), step + 1
    return out


MODELS = {"lenet_digits": train_lenet, "char_transformer": train_char_transformer}


def epoch_ms(epochs: list[dict]) -> float:
    """The median epoch time (training and evaluation), the first epoch (warm-up) left out."""
    rest = epochs[1:] or epochs
    return statistics.median(e["train_ms"] + e["eval_ms"] for e in rest)


def step_ms(reports: list[dict]) -> float:
    """The median of the reports' times per step, the first report (warm-up) left out."""
    rest = reports[1:] or reports
    return statistics.median(r["ms_per_step"] for r in rest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=30, help="lenet_digits")
    parser.add_argument("--steps", type=int, default=600, help="char_transformer")
    parser.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                        help="char_transformer")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.model == "lenet_digits":
        epochs = train_lenet(args.epochs, args.threads, args.seed, log=print)
        print(f"PyTorch {torch.__version__}, {args.threads} thread(s): "
              f"{epoch_ms(epochs):.1f} ms per epoch (median), "
              f"test accuracy {100 * epochs[-1]['accuracy']:.1f} %")
    else:
        reports = train_char_transformer(args.steps, args.threads, args.seed,
                                         precision=args.precision, log=print)
        print(f"PyTorch {torch.__version__}, {args.threads} thread(s), {args.precision}: "
              f"{step_ms(reports):.2f} ms per step (median), "
              f"validation loss {reports[-1]['validation_loss']:.4f}")


if __name__ == "__main__":
    main()
