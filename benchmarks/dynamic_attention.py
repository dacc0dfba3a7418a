"""A dynamic attention plan (sdpa over a batch in 1..max, one plan) against the static plan of
each batch, on the same buffers: the serving case, one plan for any batch of requests.

    PYTHONPATH=. python benchmarks/dynamic_attention.py [--only prefill|decode]   # on a GPU

bf16 Q [batch, H, Sq, D], K and V [batch, Hk, Skv, D]: prefill (causal at D 128, none at D 64;
on sm_90 the Hopper kernel, persistent: the same kernel as the static plan's but for its item
count) and GQA decode (one query row over 4096 keys: the decode kernel with the KV split of the
static plan at the smallest batch of the call's power-of-two range), both plans with their
heuristic choices. Each plan is checked against torch's SDPA
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
from benchmarks.measure import against_cells, median_us, static_against_dynamic  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch  # noqa: E402

MAX_BATCH = 64
# (heads, kv heads, query rows, keys, head dim, causal, batches)
SHAPES = (
    (16, 16, 1024, 1024, 128, True, (1, 13, 64)),
    (8, 8, 512, 512, 64, False, (1, 13, 64)),
    (32, 8, 1, 4096, 128, False, (1, 3, 6, 13, 24, 64)),
)
ROUNDS = 3


def graph(
    batch: int | None, heads: int, kv_heads: int, sq: int, skv: int, d: int, causal: bool, top: int = MAX_BATCH
) -> gd.OperationGraphSpec:
    """sdpa over ``batch`` (None: a symbol in 1..``top``)."""
    g = gd.OperationGraphSpec("dyn_attention", io_data_type="bfloat16", compute_data_type="float")
    b = g.dim("batch", 1, top) if batch is None else batch
    q = g.tensor([b, heads, sq, d], name="q")
    k, v = (g.tensor([b, kv_heads, skv, d], name=n) for n in "kv")
    g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=causal, name="attn")[0].set_output(True).set_name("o")
    return g


def main(argv: list[str] | None = None) -> int:
    import argparse

    import torch
    import torch.nn.functional as F

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("prefill", "decode"), help="the prefill or the decode shapes alone")
    only = parser.parse_args(argv).only

    print(
        f"{torch.cuda.get_device_name()}: sdpa bf16, one plan for batch 1..{MAX_BATCH} against each batch's static plan"
    )
    print()
    print(
        "| H | Hk | Sq | Skv | D | causal | batch | kernels (dynamic) | dynamic µs | static µs | dynamic / static | torch SDPA µs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for heads, kv_heads, sq, skv, d, causal, batches in SHAPES:
        if only is not None and (only == "decode") != (sq == 1):
            continue
        shape = (heads, kv_heads, sq, skv, d, causal)
        dynamic = gd.compile(graph(None, *shape))
        for n in batches:
            static_graph = graph(n, *shape)
            ir = static_graph.validate()
            inputs = {
                name: torch.randn(n, h, s, d, device="cuda", dtype=torch.bfloat16)
                for name, h, s in (("q", heads, sq), ("k", kv_heads, skv), ("v", kv_heads, skv))
            }
            out = empty_torch(ir.outputs[0])
            row = f"| {heads} | {kv_heads} | {sq} | {skv} | {d} | {causal} | {n} |"
            try:  # one broken shape must not hide the others' numbers
                args = tuple(inputs.values())
                gqa = kv_heads != heads
                expected = F.scaled_dot_product_attention(*args, is_causal=causal, enable_gqa=gqa).float()
                plans = {"static": gd.compile(static_graph), "dynamic": dynamic}
                times, bound = static_against_dynamic(plans, {**inputs, "o": out}, out, expected, ROUNDS)
                kernels = " + ".join(launch.name.split("_", 2)[2].rsplit("_", 1)[0] for launch in bound.launches)
                peer = median_us(
                    lambda args=args, mask=causal, gqa=gqa: F.scaled_dot_product_attention(
                        *args, is_causal=mask, enable_gqa=gqa
                    )
                )
                print(f"{row} {kernels} | {against_cells(times, peer)}", flush=True)
            except Exception as error:
                print(f"{row} failed: {type(error).__name__}: {str(error)[:200]} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
