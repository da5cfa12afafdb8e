#!/usr/bin/env python3
"""onnxruntime as the peer of `torsh-backend bench --backend cpu` outside GEMM.

    python3 benches/onnxruntime_peer.py RESULTS.json [--json ORT.json] [--repeats N]

RESULTS.json is what `torsh-backend bench --backend cpu --json RESULTS.json` wrote. For every case
there that ONNX expresses (conv2d with bias, attention, softmax, layer norm, the other memory-bound
ops, and Adam as an elementwise graph), this builds an ONNX graph of the same shape, runs it on
onnxruntime's CPU execution provider with full graph optimisation (ORT_ENABLE_ALL) at each thread
count of the run (intra_op_num_threads), inputs and preallocated outputs bound with IO binding, timed
as ours is (a warm-up run, then repeats of k back-to-back runs lasting at least --min-repeat-s, the
median per run), and prints ours, onnxruntime and ours / onnxruntime per shape and thread count.

    python3 benches/onnxruntime_peer.py --serve

With --serve it is the peer `torsh-backend bench --backend cpu` starts itself, so that ours and
onnxruntime are timed interleaved, repeat by repeat, in the same minutes of a shared machine. It
answers one JSON object per line read on stdin:
  {"prepare": ROW, "threads": N, "target_s": T} -> {"prepared": GRAPH} | {"skip": WHY} | {"error": E}
  {"batch": K}                            -> {"seconds": S, "quiesced_s": Q} | {"error": E}
where ROW has the fields of a RESULTS.json row (section, op, variant, dtype, dims) and S is the wall
time of K back-to-back runs of the prepared case. Before it answers, it waits (Q seconds) until
onnxruntime's intra-op workers have stopped spinning, so that they do not share the cores with the
bench's next repeat of ours; within a batch onnxruntime keeps its default spinning. It prints {"ready": true, "onnxruntime": VERSION}
first and exits at the end of stdin.

Attention is measured three ways where onnxruntime has them, and its best is kept: the
MatMul-Mul-(Add mask)-Softmax-MatMul graph, the com.microsoft MultiHeadAttention contrib op, and the
ONNX Attention op (opset 23); --serve keeps the fastest of a short first measurement. No GPU and no
PyTorch: `pip install -r benches/requirements.txt`.
Exit status: 0 when every case ran; 1 when onnxruntime or its inputs are missing (said on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
except ImportError as missing:  # pragma: no cover - depends on the machine
    print(
        f"onnxruntime peer: not found: {missing}; install it with "
        "`pip install -r benches/requirements.txt`",
        file=sys.stderr,
    )
    sys.exit(1)

from peer_timing import measure

DEFAULT_OPSET = 18
NOT_COVERED = {
    "memcpy": "a plain memcpy: no ONNX op (Identity is elided by the optimiser)",
    "copy": "a dense copy is Identity, elided by the optimiser (the transposed copy is Transpose)",
    "fill": "a constant output is folded by the optimiser",
    "matmul": "GEMM's peers run inside `torsh-backend bench` (OpenBLAS, gemm, matrixmultiply)",
    "gelu_backward": "a backward op: an inference runtime has none (PyTorch's autograd is the peer)",
    "softmax_backward": "a backward op: an inference runtime has none (PyTorch's autograd is the peer)",
    "dropout": "inference-mode Dropout is elided by the optimiser",
    "max_pool2d_backward": "a backward op: an inference runtime has none (PyTorch's autograd is the peer)",
    "avg_pool2d_backward": "a backward op: an inference runtime has none (PyTorch's autograd is the peer)",
    "cross_entropy": "a training loss: PyTorch is the peer",
    "cross_entropy_backward": "a backward op: an inference runtime has none (PyTorch's autograd is the peer)",
    "conv2d_backward": "a backward op: an inference runtime has none (PyTorch's autograd is the peer)",
    "layer_norm_backward": "a backward op: an inference runtime has none (PyTorch's autograd is the peer)",
    "batch_norm_backward": "a backward op: an inference runtime has none (PyTorch's autograd is the peer)",
    "attention_backward": "a backward op: an inference runtime has none (PyTorch's autograd is the peer)",
}


@dataclass
class Graph:
    """An ONNX model with the inputs and output buffers of one run."""

    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]
    # name -> preallocated array, or None to let onnxruntime allocate (bf16 has no numpy dtype).
    outputs: dict[str, np.ndarray | None]
    how: str
    keep: list = field(default_factory=list)


def model(nodes, inputs, outputs, initializers=(), opset=DEFAULT_OPSET, domains=()):
    """An ONNX model of `nodes` with value infos `inputs` and `outputs`."""
    graph = helper.make_graph(nodes, "peer", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    m = helper.make_model(graph, opset_imports=opsets, producer_name="torsh-bench")
    m.ir_version = min(m.ir_version, 10)
    return m


def tensor(name, shape, elem=TensorProto.FLOAT):
    """A value info."""
    return helper.make_tensor_value_info(name, elem, list(shape))


def randn(shape, seed):
    """Random f32 values (never all zeros)."""
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def conv_graph(d: dict) -> list[Graph]:
    n, c, h, k, r = d["n"], d["c"], d["h"], d["k"], d["r"]
    stride, pad, groups, o = d["stride"], d["padding"], d.get("groups", 1), d["out_hw"]
    w = numpy_helper.from_array(randn((k, c // groups, r, r), 2), "W")
    b = numpy_helper.from_array(randn((k,), 3), "B")
    node = helper.make_node(
        "Conv", ["X", "W", "B"], ["Y"], kernel_shape=[r, r], strides=[stride, stride],
        pads=[pad] * 4, group=groups,
    )
    m = model([node], [tensor("X", (n, c, h, h))], [tensor("Y", (n, k, o, o))], [w, b])
    return [Graph(m, {"X": randn((n, c, h, h), 1)},
                  {"Y": np.empty((n, k, o, o), np.float32)}, "Conv with bias")]


def attention_graphs(d: dict) -> list[Graph]:
    b, h, s, dh, causal = d["batch"], d["heads"], d["seq_q"], d["head_dim"], d["causal"]
    q, k, v = randn((b, h, s, dh), 1), randn((b, h, s, dh), 2), randn((b, h, s, dh), 3)
    scale = 1.0 / math.sqrt(dh)
    shape = (b, h, s, dh)
    graphs = []

    # MatMul + Mul + (Add of a mask) + Softmax + MatMul.
    nodes = [
        helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["Q", "Kt"], ["S"]),
        helper.make_node("Mul", ["S", "scale"], ["Ss"]),
    ]
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "scale")]
    last = "Ss"
    if causal:
        mask = np.triu(np.full((s, s), -np.inf, np.float32), 1)
        inits.append(numpy_helper.from_array(mask, "mask"))
        nodes.append(helper.make_node("Add", ["Ss", "mask"], ["Sm"]))
        last = "Sm"
    nodes += [
        helper.make_node("Softmax", [last], ["P"], axis=-1),
        helper.make_node("MatMul", ["P", "V"], ["O"]),
    ]
    m = model(nodes, [tensor(x, shape) for x in "QKV"], [tensor("O", shape)], inits)
    graphs.append(Graph(m, {"Q": q, "K": k, "V": v}, {"O": np.empty(shape, np.float32)},
                        "MatMul+Softmax graph" + (" + causal mask" if causal else "")))

    # com.microsoft MultiHeadAttention on [B, S, H*D].
    flat = (b, s, h * dh)
    to_bsd = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(flat))
    attrs = {"num_heads": h, "scale": scale}
    if causal:
        attrs["unidirectional"] = 1
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"],
                            domain="com.microsoft", **attrs)
    m = model([node], [tensor(x, flat) for x in "qkv"], [tensor("o", flat)],
              domains=["com.microsoft"])
    graphs.append(Graph(m, {"q": to_bsd(q), "k": to_bsd(k), "v": to_bsd(v)},
                        {"o": np.empty(flat, np.float32)}, "com.microsoft.MultiHeadAttention"))

    # ONNX Attention (opset 23) on [B, H, S, D].
    node = helper.make_node("Attention", ["Q", "K", "V"], ["O"], is_causal=int(causal),
                            scale=scale)
    m = model([node], [tensor(x, shape) for x in "QKV"], [tensor("O", shape)], opset=23)
    graphs.append(Graph(m, {"Q": q, "K": k, "V": v}, {"O": np.empty(shape, np.float32)},
                        "Attention (opset 23)"))
    return graphs


def memory_graph(op: str, variant: str | None, d: dict) -> list[Graph]:
    rows, cols = d["rows"], d["cols"]
    x = randn((rows, cols), 1)
    dense = (rows, cols)
    unary = {"exp": ("Exp", {}, DEFAULT_OPSET), "gelu": ("Gelu", {}, 20),
             "erf": ("Erf", {}, DEFAULT_OPSET), "tanh": ("Tanh", {}, DEFAULT_OPSET),
             "sigmoid": ("Sigmoid", {}, DEFAULT_OPSET),
             "softmax": ("Softmax", {"axis": -1}, DEFAULT_OPSET)}
    if op in unary:
        name, attrs, opset = unary[op]
        m = model([helper.make_node(name, ["X"], ["Y"], **attrs)], [tensor("X", dense)],
                  [tensor("Y", dense)], opset=opset)
        return [Graph(m, {"X": x}, {"Y": np.empty(dense, np.float32)}, name)]
    if op in ("add", "mul"):
        name = op.capitalize()
        m = model([helper.make_node(name, ["X", "Z"], ["Y"])],
                  [tensor("X", dense), tensor("Z", dense)], [tensor("Y", dense)])
        return [Graph(m, {"X": x, "Z": randn(dense, 2)}, {"Y": np.empty(dense, np.float32)},
                      name)]
    if op == "layer_norm":
        scale = numpy_helper.from_array(np.ones(cols, np.float32), "scale")
        node = helper.make_node("LayerNormalization", ["X", "scale"], ["Y"], axis=-1,
                                epsilon=1e-5)
        m = model([node], [tensor("X", dense)], [tensor("Y", dense)], [scale], opset=17)
        return [Graph(m, {"X": x}, {"Y": np.empty(dense, np.float32)},
                      "LayerNormalization (opset 17)")]
    if op in ("sum", "max"):
        name = "ReduceSum" if op == "sum" else "ReduceMax"
        # Over each row, or over each column for the "columns" variant.
        axis, kept = (0, cols) if variant == "columns" else (1, rows)
        axes = numpy_helper.from_array(np.array([axis], np.int64), "axes")
        node = helper.make_node(name, ["X", "axes"], ["Y"], keepdims=0)
        m = model([node], [tensor("X", dense)], [tensor("Y", (kept,))], [axes])
        return [Graph(m, {"X": x}, {"Y": np.empty((kept,), np.float32)}, name)]
    if op == "batch_norm" and variant == "inference":
        # [N, C, spatial] with per-channel scale, bias, mean and variance (training has no peer:
        # onnxruntime's CPU build runs BatchNormalization in inference).
        n, c, spatial = d["n"], d["c"], d["spatial"]
        shape = (n, c, spatial)
        inits = [numpy_helper.from_array(v.astype(np.float32), name) for name, v in (
            ("scale", randn((c,), 2)), ("B", randn((c,), 3)), ("mean", randn((c,), 4)),
            ("var", np.exp(randn((c,), 5))))]
        node = helper.make_node("BatchNormalization", ["X", "scale", "B", "mean", "var"], ["Y"],
                                epsilon=1e-5)
        m = model([node], [tensor("X", shape)], [tensor("Y", shape)], inits, opset=15)
        return [Graph(m, {"X": x.reshape(shape)}, {"Y": np.empty(shape, np.float32)},
                      "BatchNormalization (opset 15, inference)")]
    if op == "max_pool2d":
        shape = (d["n"], d["c"], d["h"], d["w"])
        k, st = d["kernel"], d["stride"]
        out = (d["n"], d["c"], (d["h"] - k) // st + 1, (d["w"] - k) // st + 1)
        node = helper.make_node("MaxPool", ["X"], ["Y"], kernel_shape=[k, k], strides=[st, st])
        m = model([node], [tensor("X", shape)], [tensor("Y", out)])
        return [Graph(m, {"X": x.reshape(shape)}, {"Y": np.empty(out, np.float32)}, "MaxPool")]
    if op == "cast":
        node = helper.make_node("Cast", ["X"], ["Y"], to=TensorProto.BFLOAT16)
        m = model([node], [tensor("X", dense)], [tensor("Y", dense, TensorProto.BFLOAT16)])
        return [Graph(m, {"X": x}, {"Y": None}, "Cast to bfloat16")]
    if op in ("gather", "index_select"):
        # The same work as ours, on other random indices: each element from a random column of its
        # row (GatherElements), or `rows` random rows of the table (Gather, an embedding lookup).
        if op == "gather":
            index = np.random.default_rng(3).integers(0, cols, dense, dtype=np.int64)
            node = helper.make_node("GatherElements", ["X", "I"], ["Y"], axis=1)
            how = "GatherElements (axis 1)"
        else:
            # index_select: `rows` rows of the table; its embedding variant: twice as many tokens.
            tokens = 2 * rows if variant == "embedding" else rows
            index = np.random.default_rng(3).integers(0, rows, (tokens,), dtype=np.int64)
            node = helper.make_node("Gather", ["X", "I"], ["Y"], axis=0)
            how = "Gather (axis 0)"
        out = (index.shape[0], cols) if op == "index_select" else dense
        m = model([node], [tensor("X", dense), tensor("I", index.shape, TensorProto.INT64)],
                  [tensor("Y", out)])
        return [Graph(m, {"X": x, "I": index}, {"Y": np.empty(out, np.float32)}, how)]
    if op == "cat":
        half = cols // 2
        left, right = (rows, half), (rows, cols - half)
        node = helper.make_node("Concat", ["A", "B"], ["Y"], axis=1)
        m = model([node], [tensor("A", left), tensor("B", right)], [tensor("Y", dense)])
        return [Graph(m, {"A": randn(left, 1), "B": randn(right, 2)},
                      {"Y": np.empty(dense, np.float32)}, "Concat (axis 1)")]
    if op == "where":
        # Where over a random boolean mask (ours is a U8 mask of the same density).
        cond = np.random.default_rng(5).integers(0, 2, dense).astype(bool)
        node = helper.make_node("Where", ["C", "X", "Z"], ["Y"])
        m = model([node], [tensor("C", dense, TensorProto.BOOL), tensor("X", dense),
                           tensor("Z", dense)], [tensor("Y", dense)])
        return [Graph(m, {"C": cond, "X": x, "Z": randn(dense, 2)},
                      {"Y": np.empty(dense, np.float32)}, "Where")]
    if op == "cumsum":
        axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
        node = helper.make_node("CumSum", ["X", "axis"], ["Y"])
        m = model([node], [tensor("X", dense)], [tensor("Y", dense)], [axis])
        return [Graph(m, {"X": x}, {"Y": np.empty(dense, np.float32)}, "CumSum (axis 1)")]
    if op == "topk":
        k = numpy_helper.from_array(np.array([min(50, cols)], np.int64), "K")
        node = helper.make_node("TopK", ["X", "K"], ["V", "I"], axis=1, largest=1, sorted=1)
        shape = (rows, min(50, cols))
        m = model([node], [tensor("X", dense)],
                  [tensor("V", shape), tensor("I", shape, TensorProto.INT64)], [k])
        return [Graph(m, {"X": x}, {"V": np.empty(shape, np.float32),
                                    "I": np.empty(shape, np.int64)}, "TopK (k 50, axis 1)")]
    if op == "index_add":
        # ScatterElements with reduction "add" along axis 0, the indices spread along the rows.
        rows_ix = np.random.default_rng(4).integers(0, rows, (rows, 1), dtype=np.int64)
        index = np.repeat(rows_ix, cols, axis=1)
        node = helper.make_node("ScatterElements", ["X", "I", "U"], ["Y"], axis=0, reduction="add")
        m = model([node], [tensor("X", dense), tensor("I", dense, TensorProto.INT64),
                           tensor("U", dense)], [tensor("Y", dense)], opset=18)
        return [Graph(m, {"X": np.zeros(dense, np.float32), "I": index, "U": x},
                      {"Y": np.empty(dense, np.float32)}, "ScatterElements (add, axis 0)")]
    if op == "copy" and variant == "transposed":
        node = helper.make_node("Transpose", ["X"], ["Y"], perm=[1, 0])
        m = model([node], [tensor("X", dense)], [tensor("Y", (cols, rows))])
        return [Graph(m, {"X": x}, {"Y": np.empty((cols, rows), np.float32)}, "Transpose")]
    return []


def adam_graph(d: dict) -> list[Graph]:
    """One Adam step (lr 1e-3, betas 0.9/0.999, eps 1e-8, step 1) over all parameters as one flat
    tensor: onnxruntime has no fused Adam outside its training build, so an elementwise graph."""
    n = d["tensors"] * d["len"]
    b1, b2, lr, eps, step = 0.9, 0.999, 1e-3, 1e-8, 1
    consts = {"b1": b1, "c1": 1 - b1, "b2": b2, "c2": 1 - b2,
              "lr_t": lr / (1 - b1**step), "inv_bc2": 1 / (1 - b2**step), "eps": eps}
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
    mk = helper.make_node
    nodes = [
        mk("Mul", ["M", "b1"], ["m1"]), mk("Mul", ["G", "c1"], ["m2"]), mk("Add", ["m1", "m2"], ["Mo"]),
        mk("Mul", ["G", "G"], ["g2"]), mk("Mul", ["V", "b2"], ["v1"]), mk("Mul", ["g2", "c2"], ["v2"]),
        mk("Add", ["v1", "v2"], ["Vo"]), mk("Mul", ["Vo", "inv_bc2"], ["vh"]), mk("Sqrt", ["vh"], ["sq"]),
        mk("Add", ["sq", "eps"], ["den"]), mk("Div", ["Mo", "den"], ["upd"]),
        mk("Mul", ["upd", "lr_t"], ["step"]), mk("Sub", ["P", "step"], ["Po"]),
    ]
    flat = (n,)
    m = model(nodes, [tensor(x, flat) for x in "PGMV"], [tensor(x, flat) for x in ("Po", "Mo", "Vo")],
              inits)
    inputs = {"P": randn(flat, 1), "G": randn(flat, 2), "M": randn(flat, 3) * 0.1,
              "V": np.abs(randn(flat, 4)) * 0.01}
    outputs = {x: np.empty(flat, np.float32) for x in ("Po", "Mo", "Vo")}
    return [Graph(m, inputs, outputs, "elementwise Adam graph over one flat tensor")]


def graphs_for(row: dict) -> list[Graph]:
    section, op, dims = row["section"], row["op"], row["dims"]
    if row["dtype"] != "f32":
        return []
    if section == "conv2d":
        return conv_graph(dims)
    if section == "attention":
        return attention_graphs(dims)
    if section == "memory":
        return memory_graph(op, row.get("variant"), dims)
    if section == "optimizer":
        return adam_graph(dims)
    return []


def runner(g: Graph, threads: int) -> Callable[[], None]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    sess = ort.InferenceSession(g.model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    for name, arr in g.inputs.items():
        binding.bind_cpu_input(name, arr)
    for name, arr in g.outputs.items():
        if arr is None:
            binding.bind_output(name, "cpu")
        else:
            binding.bind_output(name, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
    g.keep.append((sess, binding))
    return lambda: sess.run_with_iobinding(binding)


def coverage(row: dict) -> tuple[list[Graph], str | None]:
    """The graphs that measure `row` on onnxruntime, or none and why it is not covered."""
    if row["op"] in NOT_COVERED and row.get("variant") != "transposed":
        return [], NOT_COVERED[row["op"]]
    graphs = graphs_for(row)
    if not graphs:
        return [], f"no ONNX graph here for {row['op']} {row['dtype']}"
    return graphs, None


def first_line(e: Exception) -> str:
    """An exception in one short line."""
    text = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# How long `quiesce` waits at most, and the window over which it reads the process's CPU time.
QUIESCE_MAX_S = 1.0
QUIESCE_WINDOW_S = 0.005


def quiesce() -> float:
    """Waits until onnxruntime's intra-op workers have stopped spinning (they spin for tens of
    milliseconds after a run before they block) and returns the seconds waited: until this
    process's CPU time grows by less than a tenth of a window over one window, at most
    QUIESCE_MAX_S. So the bench's next repeat of ours does not share the cores with them, while
    onnxruntime keeps its default spinning within a batch."""
    start = time.perf_counter()
    while time.perf_counter() - start < QUIESCE_MAX_S:
        cpu = time.process_time()
        time.sleep(QUIESCE_WINDOW_S)
        if time.process_time() - cpu < 0.1 * QUIESCE_WINDOW_S:
            break
    return time.perf_counter() - start


def serve() -> int:
    """The co-process peer of `torsh-backend bench` (see the module's doc): prepares one case at a
    time and times batches of it on request."""
    def say(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    say({"ready": True, "onnxruntime": ort.__version__, "onnx": onnx.__version__,
         "numpy": np.__version__})
    run, graph = None, None
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if "prepare" in req:
                if graph is not None:
                    graph.keep.clear()
                run, graph = None, None
                graphs, why = coverage(req["prepare"])
                if why:
                    say({"skip": why})
                    continue
                threads = int(req.get("threads") or 1)
                target = float(req.get("target_s") or 0.02)
                best, errors = None, []
                for g in graphs:
                    try:
                        r = runner(g, threads)
                        # With one graph there is nothing to choose; with several, a short
                        # measurement of each picks the one to time.
                        t = measure(r, 3, target) if len(graphs) > 1 else 0.0
                    except Exception as e:  # onnxruntime raises its own types
                        errors.append(f"{g.how}: {first_line(e)}")
                        g.keep.clear()
                        continue
                    if best is None or t < best[0]:
                        if best is not None:
                            best[2].keep.clear()
                        best = (t, r, g)
                    else:
                        g.keep.clear()
                if best is None:
                    say({"error": "; ".join(errors)})
                    continue
                _, run, graph = best
                quiesce()
                say({"prepared": graph.how, "other_graphs_failed": errors})
            elif "batch" in req:
                if run is None:
                    say({"error": "no case prepared"})
                    continue
                k = int(req["batch"])
                start = time.perf_counter()
                for _ in range(k):
                    run()
                seconds = time.perf_counter() - start
                say({"seconds": seconds, "quiesced_s": quiesce()})
            else:
                say({"error": f"unknown request: {line.strip()[:80]}"})
        except Exception as e:  # a bad request or a failing run: said, and the loop goes on
            say({"error": first_line(e)})
    return 0


def work(row: dict) -> float:
    return row["flops"] if row.get("flops") else row["bytes"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?",
                        help="the JSON of `torsh-backend bench --backend cpu --json`")
    parser.add_argument("--serve", action="store_true",
                        help="be the co-process peer of `torsh-backend bench` (JSON lines)")
    parser.add_argument("--json", help="also write onnxruntime's figures and the ratios here")
    parser.add_argument("--repeats", type=int, default=None,
                        help="repeats per case (default: the run's)")
    parser.add_argument("--min-repeat-s", type=float, default=None,
                        help="minimum seconds of one repeat (default: the run's)")
    args = parser.parse_args()
    if args.serve:
        return serve()
    if not args.results:
        parser.error("RESULTS.json is needed without --serve")
    try:
        with open(args.results) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"onnxruntime peer: cannot read {args.results}: {e}", file=sys.stderr)
        return 1
    if doc.get("backend") != "cpu":
        print(f"onnxruntime peer: {args.results} is a {doc.get('backend')} run, not a CPU one",
              file=sys.stderr)
        return 1
    repeats = args.repeats or doc.get("repeats", 5)
    target = args.min_repeat_s or doc.get("min_repeat_s", 0.02)
    print(f"\nonnxruntime {ort.__version__} (onnx {onnx.__version__}, numpy {np.__version__}), "
          "CPUExecutionProvider, ORT_ENABLE_ALL, IO binding with preallocated outputs; "
          f"median of {repeats} repeats of >= {target * 1e3:g} ms")
    print("ratio = ours / onnxruntime throughput (above 1: ours is faster)")
    header = (f"{'op':<10} {'shape':<30} {'thr':>3} {'ours':>9} {'onnxrt':>9} {'unit':<7} "
              f"{'ours/ort':>8}  onnxruntime graph")
    rows_out, skipped, failures = [], {}, 0
    table = None
    for row in doc.get("results", []):
        if row.get("error") or row.get("throughput") is None:
            continue
        graphs, why = coverage(row)
        if why:
            skipped.setdefault(f"{row['op']} {row['dtype']}", why)
            continue
        threads = row.get("threads") or 1
        if (row["section"], threads) != table:
            table = (row["section"], threads)
            print(f"\n{row['section']} — {threads} thread(s)\n{header}")
        best, how, errors = None, None, []
        for g in graphs:
            try:
                t = measure(runner(g, threads), repeats, target)
            except Exception as e:  # onnxruntime raises its own types; report and go on
                errors.append(f"{g.how}: {str(e).splitlines()[0][:160]}")
                continue
            finally:
                g.keep.clear()
            if best is None or t < best:
                best, how = t, g.how
        label = row["shape"]
        if best is None:
            failures += 1
            print(f"{row['op']:<10} {label:<30} {threads:>3} error: {'; '.join(errors)}")
            continue
        ort_rate = work(row) / best / 1e9
        ours = row["throughput"]
        ratio = ours / ort_rate
        print(f"{row['op']:<10} {label:<30} {threads:>3} {ours:>9.2f} {ort_rate:>9.2f} "
              f"{row['unit']:<7} {ratio:>7.2f}x  {how}")
        rows_out.append({
            "section": row["section"], "op": row["op"], "variant": row.get("variant"),
            "shape": label, "dims": row["dims"], "threads": threads, "unit": row["unit"],
            "ours": ours, "onnxruntime": ort_rate, "onnxruntime_median_s": best,
            "ours_over_onnxruntime": ratio, "onnxruntime_graph": how,
            "other_graphs_failed": errors,
        })
    if skipped:
        print("\nnot covered by onnxruntime here:")
        for op, why in skipped.items():
            print(f"  {op}: {why}")
    if args.json:
        out = {"onnxruntime": ort.__version__, "onnx": onnx.__version__, "numpy": np.__version__,
               "repeats": repeats, "min_repeat_s": target, "results": rows_out,
               "not_covered": skipped}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"onnxruntime results written to {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
