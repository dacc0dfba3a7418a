"""A dynamic attention plan (one plan over a range of batches, of prompt lengths or of key
lengths) against the static plan of each size, on the same buffers: the serving cases, one plan
for any batch of requests, any prompt length of a prefill, any key length of a decode.

    PYTHONPATH=. python benchmarks/dynamic_attention.py [--only prefill|decode] [--over batch|lengths]   # on a GPU

bf16 Q [batch, H, Sq, D], K and V [batch, Hk, Skv, D], both plans with their heuristic choices:
- over the batch (1..64): prefill (causal at D 128, none at D 64; on sm_90 the Hopper kernel,
  persistent) and GQA decode over 4096 keys (a variant per range of batches sharing the static
  plan's kernel and KV split);
- over the lengths: a causal prefill whose Sq = Skv is one symbol in 1..8192 (B 4, H 16, D 128:
  the grid's row blocks and the Hopper kernel's item count from the call's length, its TMA maps'
  sequence dims and strides encoded per call) and a GQA decode whose Skv is a symbol in
  128..32768 (B 4, H 32 / 8, D 128: a variant per range of key lengths sharing the static plan's
  KV split).
Each plan is checked against torch's SDPA from a NaN-poisoned output, then timed as the median
of CUDA events (triton's do_bench), the two plans in turn ROUNDS times, each plan's figure the
median of its rounds (so that a drift of the GPU's clocks falls on both); torch's SDPA (its
default backend) is the peer. Prints a markdown table.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks.measure import against_cells, median_us, static_against_dynamic  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch  # noqa: E402
from graphdnn.symbolic import Sym  # noqa: E402

MAX_BATCH = 64
N = TypeVar("N", int, Sym)


@dataclass(frozen=True)
class Shape:
    """One benchmark row group: the static dims, the dim(s) ``over`` ("batch", "seq": Sq and Skv,
    "skv") the dynamic plan takes as a symbol in ``low..top``, and the sizes timed."""

    over: str
    heads: int
    kv_heads: int
    batch: int
    sq: int
    skv: int
    d: int
    causal: bool
    sizes: tuple[int, ...]
    top: int
    low: int = 1

    @property
    def decode(self) -> bool:
        return self.sq == 1 and self.over != "seq"

    def extents(self, n: N) -> tuple[N | int, N | int, N | int]:
        """(batch, Sq, Skv) with the symbolic dims at ``n``: a size, or the dynamic graph's symbol."""
        lengths = self.over in ("seq", "skv")
        return (
            n if self.over == "batch" else self.batch,
            n if self.over == "seq" else self.sq,
            n if lengths else self.skv,
        )


SHAPES = (
    Shape("batch", 16, 16, MAX_BATCH, 1024, 1024, 128, True, (1, 13, 64), MAX_BATCH),
    Shape("batch", 8, 8, MAX_BATCH, 512, 512, 64, False, (1, 13, 64), MAX_BATCH),
    Shape("batch", 32, 8, MAX_BATCH, 1, 4096, 128, False, (1, 3, 6, 13, 24, 64), MAX_BATCH),
    Shape("skv", 32, 8, 4, 1, 32768, 128, False, (200, 3000, 32768), 32768, low=128),
    Shape("seq", 16, 16, 4, 8192, 8192, 128, True, (200, 1500, 8192), 8192),
)
ROUNDS = 3


def graph(shape: Shape, size: int | None) -> gd.OperationGraphSpec:
    """sdpa of ``shape`` at ``size`` (None: over a symbol)."""
    g = gd.OperationGraphSpec("dyn_attention", io_data_type="bfloat16", compute_data_type="float")
    b, sq, skv = shape.extents(g.dim(shape.over, shape.low, shape.top) if size is None else size)
    q = g.tensor([b, shape.heads, sq, shape.d], name="q")
    k, v = (g.tensor([b, shape.kv_heads, skv, shape.d], name=n) for n in "kv")
    o, _ = g.sdpa(q, k, v, attn_scale=shape.d**-0.5, use_causal_mask=shape.causal, name="attn")
    o.set_output(True).set_name("o")
    return g


def main(argv: list[str] | None = None) -> int:
    import argparse

    import torch
    import torch.nn.functional as F

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("prefill", "decode"), help="the prefill or the decode shapes alone")
    parser.add_argument("--over", choices=("batch", "lengths"), help="the plans over the batch or the lengths alone")
    args = parser.parse_args(argv)

    print(f"{torch.cuda.get_device_name()}: sdpa bf16, one plan for a range against each size's static plan")
    print()
    print(
        "| H | Hk | B | Sq | Skv | D | causal | symbol | kernels (dynamic) | dynamic µs | static µs | "
        "dynamic / static | torch SDPA µs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        if args.only is not None and (args.only == "decode") != shape.decode:
            continue
        if args.over is not None and (args.over == "batch") != (shape.over == "batch"):
            continue
        dynamic = gd.compile(graph(shape, None))
        symbol = f"{shape.over} in {shape.low}..{shape.top}"
        for n in shape.sizes:
            b, sq, skv = shape.extents(n)
            static_graph = graph(shape, n)
            ir = static_graph.validate()
            inputs = {
                name: torch.randn(b, h, s, shape.d, device="cuda", dtype=torch.bfloat16)
                for name, h, s in (("q", shape.heads, sq), ("k", shape.kv_heads, skv), ("v", shape.kv_heads, skv))
            }
            out = empty_torch(ir.outputs[0])
            row = f"| {shape.heads} | {shape.kv_heads} | {b} | {sq} | {skv} | {shape.d} | {shape.causal} | {symbol} |"
            try:  # one broken shape must not hide the others' numbers
                qkv = tuple(inputs.values())
                gqa, causal = shape.kv_heads != shape.heads, shape.causal
                expected = F.scaled_dot_product_attention(*qkv, is_causal=causal, enable_gqa=gqa).float()
                plans = {"static": gd.compile(static_graph), "dynamic": dynamic}
                times, bound = static_against_dynamic(plans, {**inputs, "o": out}, out, expected, ROUNDS)
                kernels = " + ".join(launch.name.split("_", 2)[2].rsplit("_", 1)[0] for launch in bound.launches)
                peer = median_us(
                    lambda qkv=qkv, mask=causal, gqa=gqa: F.scaled_dot_product_attention(
                        *qkv, is_causal=mask, enable_gqa=gqa
                    )
                )
                print(f"{row} {kernels} | {against_cells(times, peer)}", flush=True)
            except Exception as error:
                print(f"{row} failed: {type(error).__name__}: {str(error)[:200]} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
