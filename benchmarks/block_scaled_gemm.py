"""Block-scaled fp8 GEMM (issue 12, DeepSeek-V3's recipe) beside torch on the same GPU: e4m3
A [M, K] with fp32 scales per 1 x 128 block, B [K, N] stored K-major with fp32 scales per
128 x 128 block (the matmul's A_scale / B_scale) or per 128 x 1 block (the graph
block_scale_dequantize(A), block_scale_dequantize(B) -> matmul, which the block_scaled_matmul
rule fuses), bf16 C; and MXFP8: fp8_e8m0 scales per 1 x 32 block of A and 32 x 1 of B, as
the matmul's scales or the dequantize graph. The peers: torch._scaled_mm with per-tensor
scales (cuBLASLt, the fp8 ceiling) and, where this torch and GPU have it, _scaled_mm's
blockwise 1 x 128 / 128 x 128 form (MXFP8: its e8m0 form, Blackwell's). Outputs are checked
against the dequantized product computed by torch in fp32.

    PYTHONPATH=. python benchmarks/lowp_gemm.py --block-scaled   # on the GPU, every form
    PYTHONPATH=. python benchmarks/lowp_gemm.py --mxfp8          # the MXFP8 rows only
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import graphdnn as gd

SIZES = (4096, 8192)
SKINNY = (128, 8192, 8192)  # an MXFP8 decode-like shape: 64 tiles, half the SMs
MX_FORMS = ("matmul mxfp8 1x32 / 32x1", "dequantize graph mxfp8 1x32 / 32x1")
FORMS = ("matmul 1x128 / 128x128", "dequantize graph 1x128 / 128x1", *MX_FORMS)
BLOCK = 128
MX_BLOCK = 32


def _block(form: str) -> int:
    return MX_BLOCK if "mxfp8" in form else BLOCK


def shapes(form: str) -> list[tuple[int, int, int]]:
    """(M, N, K) of the form's rows: the square SIZES, and for MXFP8 the SKINNY shape too."""
    return [(size, size, size) for size in SIZES] + ([SKINNY] if "mxfp8" in form else [])


def graph(shape: tuple[int, int, int], form: str) -> gd.OperationGraphSpec:
    m, n, k = shape
    g = gd.OperationGraphSpec(
        name=f"block_scaled_{m}x{n}x{k}",
        io_data_type="fp8_e4m3",
        intermediate_data_type="float",
        compute_data_type="float",
    )
    a, b = g.tensor(name="a", dim=[m, k]), g.tensor(name="b", dim=[k, n], stride=[1, k])
    block = _block(form)
    scale = "fp8_e8m0" if block == MX_BLOCK else "float"
    sa = g.tensor(name="scale_a", dim=[m, k // block], data_type=scale)
    columns = n // BLOCK if form == FORMS[0] else n  # MXFP8's B scales are per column
    sb = g.tensor(name="scale_b", dim=[k // block, columns], data_type=scale)
    if form.startswith("matmul"):
        c = g.matmul(a, b, A_scale=sa, B_scale=sb, name="mm")
    else:
        c = g.matmul(g.block_scale_dequantize(a, sa, block), g.block_scale_dequantize(b, sb, block, axis=0), name="mm")
    c.set_name("c").set_output(True).set_data_type("bfloat16")
    return g


def table(forms: tuple[str, ...] = FORMS) -> None:
    print(
        "| GEMM | M x N x K | default plan TFLOP/s | engine, best stages | _scaled_mm per-tensor | "
        "_scaled_mm blockwise | default / per-tensor |"
    )
    print("|---|---|---|---|---|---|---|")
    for form in forms:
        for shape in shapes(form):
            print(row(shape, form), flush=True)


def row(shape: tuple[int, int, int], form: str) -> str:
    """One table row: ours (default plan, each engine candidate) and the peers, in TFLOP/s."""
    from benchmarks.measure import checked_plan_us
    from codegen.families.gemm import candidates

    inputs, want, peers = _inputs(shape, form)
    flop = 2 * shape[0] * shape[1] * shape[2]
    fused = next(f for f in gd.fuse(graph(shape, form)).nodes if f.anchor is not None)
    assert fused.anchor is not None and fused.anchor.input("A_scale") is not None, "not block-scaled"
    default = flop / checked_plan_us(graph(shape, form), inputs, want, None) / 1e6
    every = [
        (flop / checked_plan_us(graph(shape, form), inputs, want, {fused.name: c}) / 1e6, f"{c['stages']}")
        for c in candidates(fused, 90)
    ]
    best = max(every)
    print("  candidates (TFLOP/s, stages): " + ", ".join(f"{rate:.0f} {label}" for rate, label in every))
    rates = {name: flop / _median(fn) / 1e6 if fn else why for name, (fn, why) in peers.items()}
    shown = {name: f"{rate:.0f}" if isinstance(rate, float) else rate for name, rate in rates.items()}
    return (  # the ratio divides by the per-tensor rate shown: one timing of the peer, not two
        f"| fp8 e4m3 block-scaled, {form} | {' x '.join(map(str, shape))} | {default:.0f} | {best[0]:.0f} ({best[1]} stages) | "
        f"{shown['tensor']} | {shown['blockwise']} | {default / float(rates['tensor']):.2f} |"
    )


def _median(fn: Callable[[], Any] | None) -> float:
    from benchmarks.measure import median_us

    assert fn is not None
    return median_us(fn)


def _inputs(
    shape: tuple[int, int, int], form: str
) -> tuple[dict[str, Any], Any, dict[str, tuple[Callable[[], Any] | None, str]]]:
    """The feeds, the fp32 dequantized product (bf16) and the peers: name -> (call, or None and why)."""
    import torch

    m, n, k = shape
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # K-major [K, N]
    block = _block(form)
    columns = n // BLOCK if form == FORMS[0] else n
    if block == MX_BLOCK:  # e8m0 bytes 2^-4 .. 2^3, widened for the expected product
        scale_a = torch.randint(123, 131, (m, k // block), device="cuda", dtype=torch.uint8).view(torch.float8_e8m0fnu)
        scale_b = torch.randint(123, 131, (k // block, n), device="cuda", dtype=torch.uint8).view(torch.float8_e8m0fnu)
        value_a, value_b = (torch.exp2(s.view(torch.uint8).float() - 127) for s in (scale_a, scale_b))
    else:
        scale_a = value_a = torch.rand(m, k // block, device="cuda") + 0.5
        scale_b = value_b = torch.rand(k // block, columns, device="cuda") + 0.5
    expand_b = value_b.repeat_interleave(block, 0)
    expand_b = expand_b.repeat_interleave(BLOCK, 1) if columns != n else expand_b
    want = ((a.float() * value_a.repeat_interleave(block, 1)) @ (b.float() * expand_b)).to(torch.bfloat16)
    one = torch.tensor(1.0, device="cuda")
    peers: dict[str, tuple[Callable[[], Any] | None, str]] = {
        "tensor": (lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), "")
    }
    if block == MX_BLOCK:
        peers["blockwise"] = _mx_peer(a, b, scale_a, scale_b, want)
    else:
        peers["blockwise"] = _blockwise_peer(a, b, scale_a, scale_b if columns != n else None)
    return {"a": a, "b": b, "scale_a": scale_a, "scale_b": scale_b}, want, peers


def _mx_peer(a: Any, b: Any, scale_a: Any, scale_b: Any, want: Any) -> tuple[Callable[[], Any] | None, str]:
    """torch._scaled_mm's MXFP8 form (e8m0 scales, 32-element blocks: cuBLASLt on Blackwell),
    checked once; None and the reason where this torch or GPU lacks it (Hopper has no MX)."""
    import torch

    return _checked_peer(
        lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b.t(), out_dtype=torch.bfloat16), want
    )


def _blockwise_peer(a: Any, b: Any, scale_a: Any, scale_b: Any) -> tuple[Callable[[], Any] | None, str]:
    """torch._scaled_mm's 1 x 128 / 128 x 128 form (cuBLASLt, scales outer-dim major), checked once;
    None and the reason where this torch or GPU lacks it, or for 128 x 1 B scales (no such form)."""
    import torch

    if scale_b is None:
        return None, "n/a (no 128x1 form)"
    sa = scale_a.t().contiguous().t()  # [M, K/128], M contiguous
    sb = scale_b.t().contiguous().t()
    want = (a.float() * scale_a.repeat_interleave(BLOCK, 1)) @ (
        b.float() * scale_b.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    )
    return _checked_peer(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), want)


def _checked_peer(call: Callable[[], Any], want: Any) -> tuple[Callable[[], Any] | None, str]:
    """``call`` if this torch and GPU run it and it computes ``want`` (a scale layout it reads
    differently fails the check); else None and the reason, for the table."""
    try:
        got = call()
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as refusal:  # torch or the GPU lacks the form
        return None, f"n/a ({str(refusal).splitlines()[0][:60]})"
    error = ((got.double() - want.double()).norm() / want.double().norm()).item()
    return (call, "") if error <= 1e-2 else (None, f"n/a (relative error {error:.2g}: another scale layout)")
