"""RoPE + attention: RoPE folded into the attention fused node (the ``rotary_attention`` rule)
against the same graph with the rule disabled (RoPE's kernels, then sdpa) and torch eager
(RoPE from cached cos/sin tables, then F.scaled_dot_product_attention), in one run; and the
attention alone (sdpa on the same Q and K, no RoPE), the floor of what folding RoPE can reach.

    PYTHONPATH=. python benchmarks/rotary_attention.py [--only prefill|decode]   # on a GPU

bf16, RoPE on Q and K written as ``rope`` of examples/build_graphs.py (theta 10000): causal
prefill B4 H16 S4096 at D 128 and 64, and GQA decode (one query row, 32 heads over 8 kv heads
and 4096 keys, RoPE over the whole K). Each plan is checked against torch's result from a
NaN-poisoned output (2e-2 relative error), then timed as the median of CUDA events (triton's
do_bench). Prints a markdown table.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from build_graphs import rope  # noqa: E402

import graphdnn as gd  # noqa: E402
from benchmarks.measure import median_us  # noqa: E402

# (batch, heads, kv heads, query rows, keys, head dim, causal)
SHAPES = (
    (4, 16, 16, 4096, 4096, 128, True),
    (4, 16, 16, 4096, 4096, 64, True),
    (8, 32, 8, 1, 4096, 128, False),
)
THETA = 10000.0


def graph(
    b: int, heads: int, kv_heads: int, sq: int, skv: int, d: int, causal: bool, rotary: bool = True
) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(
        "rope_attention", io_data_type="bfloat16", intermediate_data_type="bfloat16", compute_data_type="float"
    )
    q = g.tensor([b, heads, sq, d], name="q")
    k, v = (g.tensor([b, kv_heads, skv, d], name=n) for n in "kv")
    q_rot, k_rot = (rope(g, q, THETA, name="q_rope"), rope(g, k, THETA, name="k_rope")) if rotary else (q, k)
    o = g.sdpa(q_rot, k_rot, v, attn_scale=d**-0.5, use_causal_mask=causal, name="attn")[0]
    o.set_output(True).set_name("o")
    return g


def main(argv: list[str] | None = None) -> int:
    import argparse

    import torch
    import torch.nn.functional as F

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("prefill", "decode"), help="the prefill or the decode shapes alone")
    only = parser.parse_args(argv).only

    def tables(s: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        inverse = THETA ** (-torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d)
        angles = torch.arange(s, device="cuda", dtype=torch.float32)[:, None] * inverse[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)

    def torch_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    print(f"{torch.cuda.get_device_name()}: RoPE on Q and K + sdpa, bf16")
    print()
    print(
        "| B | H | Hk | Sq | Skv | D | causal | fused kernels | fused µs | unfused µs | unfused / fused | "
        "sdpa alone µs | torch µs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        b, heads, kv_heads, sq, skv, d, causal = shape
        if only is not None and (only == "decode") != (sq == 1):
            continue
        row = f"| {b} | {heads} | {kv_heads} | {sq} | {skv} | {d} | {causal} |"
        try:  # one broken shape must not hide the others' numbers
            g = graph(*shape)
            inputs = {
                name: torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
                for name, h, s in (("q", heads, sq), ("k", kv_heads, skv), ("v", kv_heads, skv))
            }
            cq, sq_table = tables(sq, d)
            ck, sk_table = tables(skv, d)
            gqa = heads != kv_heads

            def eager(
                cq=cq, sq_table=sq_table, ck=ck, sk_table=sk_table, causal=causal, gqa=gqa, inputs=inputs, d=d
            ) -> torch.Tensor:
                q = torch_rope(inputs["q"], cq, sq_table)
                k = torch_rope(inputs["k"], ck, sk_table)
                return F.scaled_dot_product_attention(
                    q, k, inputs["v"], scale=d**-0.5, is_causal=causal, enable_gqa=gqa
                )

            expected = eager().float()
            out = torch.empty(b, heads, sq, d, device="cuda", dtype=torch.bfloat16)
            times, kernels = {}, ""
            for key, disable in (("fused", ()), ("unfused", ("rotary_attention",))):
                bound = gd.compile(g, disable=disable).bind({**inputs, "o": out})
                out.fill_(float("nan"))
                bound()
                torch.cuda.synchronize()
                error = float((out.float() - expected).norm() / expected.norm())
                assert error < 2e-2, f"{key} plan: relative error {error:.3g}"
                times[key] = median_us(bound)
                if key == "fused":
                    kernels = " + ".join(
                        launch.name.split("_", 2)[2].rsplit("_", 1)[0][-24:] for launch in bound.launches
                    )
            alone = median_us(gd.compile(graph(*shape, rotary=False)).bind({**inputs, "o": out}))
            peer = median_us(eager)
            print(
                f"{row} {kernels} | {times['fused']:.1f} | {times['unfused']:.1f} | "
                f"{times['unfused'] / times['fused']:.2f} | {alone:.1f} | {peer:.1f} |",
                flush=True,
            )
        except Exception as error:
            print(f"{row} failed: {type(error).__name__}: {str(error)[:300]} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
