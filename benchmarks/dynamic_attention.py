"""A dynamic attention plan (sdpa over a batch in 1..max, one plan) against the static plan of
each batch, on the same buffers: the serving case, one plan for any batch of requests.

    PYTHONPATH=. python benchmarks/dynamic_attention.py            # on a GPU

bf16 Q, K, V [batch, H, S, D] (causal at D 128, none at D 64), both plans with their heuristic
choices (on sm_90 the Hopper kernel, persistent). Each plan is checked against torch's SDPA
from a NaN-poisoned output, then timed as the median of CUDA events (triton's do_bench), the
two plans in turn ROUNDS times, each plan's figure the median of its rounds (so that a drift of
the GPU's clocks falls on both); torch's SDPA (its default backend) is the peer. Prints a
markdown table.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks.measure import median_us, static_against_dynamic  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch  # noqa: E402

MAX_BATCH = 64
BATCHES = (1, 13, 64)
# (heads, sequence, head dim, causal)
SHAPES = ((16, 1024, 128, True), (8, 512, 64, False))
ROUNDS = 3


def graph(batch: int | None, heads: int, seq: int, d: int, causal: bool) -> gd.OperationGraphSpec:
    """sdpa over ``batch`` (None: a symbol in 1..MAX_BATCH)."""
    g = gd.OperationGraphSpec("dyn_attention", io_data_type="bfloat16", compute_data_type="float")
    b = g.dim("batch", 1, MAX_BATCH) if batch is None else batch
    q, k, v = (g.tensor([b, heads, seq, d], name=n) for n in "qkv")
    g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=causal, name="attn")[0].set_output(True).set_name("o")
    return g


def main() -> int:
    import torch
    import torch.nn.functional as F

    print(
        f"{torch.cuda.get_device_name()}: sdpa bf16, one plan for batch 1..{MAX_BATCH} against each batch's static plan"
    )
    print()
    print("| H | S | D | causal | batch | kernel | dynamic µs | static µs | dynamic / static | torch SDPA µs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for heads, seq, d, causal in SHAPES:
        dynamic = gd.compile(graph(None, heads, seq, d, causal))
        for n in BATCHES:
            static_graph = graph(n, heads, seq, d, causal)
            ir = static_graph.validate()
            inputs = {
                name: torch.randn(n, heads, seq, d, device="cuda", dtype=torch.bfloat16) for name in ("q", "k", "v")
            }
            out = empty_torch(ir.outputs[0])
            expected = F.scaled_dot_product_attention(*inputs.values(), is_causal=causal).float()
            try:  # one broken shape must not hide the others' numbers
                plans = {"static": gd.compile(static_graph), "dynamic": dynamic}
                times, bound = static_against_dynamic(plans, {**inputs, "o": out}, out, expected, ROUNDS)
                kernel = bound.launches[0].name.split("_")[2]
                args = tuple(inputs.values())
                peer = median_us(lambda args=args, mask=causal: F.scaled_dot_product_attention(*args, is_causal=mask))
                print(
                    f"| {heads} | {seq} | {d} | {causal} | {n} | {kernel} | {times['dynamic']:.1f} | "
                    f"{times['static']:.1f} | {times['dynamic'] / times['static']:.3f} | {peer:.1f} |",
                    flush=True,
                )
            except Exception as error:
                print(
                    f"| {heads} | {seq} | {d} | {causal} | {n} | failed: {type(error).__name__}: {str(error)[:200]} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
