"""Timing and the two ceilings every result is compared with, measured in the same run.

Times are medians of CUDA-event timings after warm-up (triton.testing.do_bench, which
also flushes the L2 cache before each repetition, so memory-bound cases are not timed
out of the cache). The ceilings: device-to-device copy bandwidth (bytes read + written)
and the bf16 matrix-product rate, both through torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def median_us(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 200, clean: bool = False) -> float:
    """Median GPU time of ``fn`` in microseconds. do_bench's flush writes zeros over 256 MB,
    which leaves the L2 cache full of dirty lines: a kernel that reads a few MB then pays for
    writing up to an L2's worth of them back to memory. ``clean`` flushes by reading 256 MB
    instead, so that a memory-bound kernel is timed against reads alone."""
    if clean:
        return _median_after_a_read_flush_us(fn, warmup_ms, rep_ms)
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")) * 1e3


def _median_after_a_read_flush_us(fn: Callable[[], object], warmup_ms: float, rep_ms: float) -> float:
    import torch

    flush = torch.ones(2**26, device="cuda")  # 256 MB of fp32, read by a sum: clean lines in L2
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    once_ms = max(begin.elapsed_time(end), 1e-3)
    for _ in range(max(1, int(warmup_ms / once_ms))):
        fn()
    times = []
    for _ in range(max(10, min(1000, int(rep_ms / once_ms)))):
        flush.sum()
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return float(sorted(times)[len(times) // 2]) * 1e3


def checked_plan_us(
    graph: Any,
    inputs: dict[str, Any],
    want: Any,
    tuning: dict[str, Any] | None = None,
    rep_ms: float = 200,
    clean: bool = False,
) -> float:
    """Median time of ``graph``'s plan (with ``tuning``) writing output "c", after checking
    that, from a NaN-poisoned start, it computes ``want`` within 1e-2 relative error."""
    import torch

    import graphdnn as gd

    c = torch.empty_like(want)
    bound = gd.compile(graph, tuning=tuning).bind({**inputs, "c": c})
    c.fill_(float("nan"))
    bound()
    error = ((c.double() - want.double()).norm() / want.double().norm()).item()
    assert error <= 1e-2, f"{graph.name} {tuning}: relative error {error:.3g}"
    return median_us(bound, rep_ms=rep_ms, clean=clean)


def static_against_dynamic(
    plans: dict[str, Any], pack: dict[str, Any], out: Any, expected: Any, rounds: int = 3
) -> tuple[dict[str, float], Any]:
    """The median µs of each plan ("static", "dynamic") bound to ``pack`` (which holds ``out``),
    each checked first to write ``expected`` (2e-2 relative error) into a NaN-poisoned ``out``:
    the two timed in turn ``rounds`` times, each figure the median of its rounds (a drift of the
    GPU's clocks falls on both); and the dynamic plan's bound call."""
    import statistics

    import torch

    bound = {}
    for key in ("static", "dynamic"):
        bound[key] = plans[key].bind(pack)
        out.fill_(float("nan"))
        bound[key]()
        torch.cuda.synchronize()
        error = float((out.float() - expected).norm() / expected.norm())
        assert error < 2e-2, f"{key} plan: relative error {error:.3g}"
    timed = [[median_us(bound[key], rep_ms=100) for key in ("static", "dynamic")] for _ in range(rounds)]
    return dict(zip(("static", "dynamic"), (statistics.median(r) for r in zip(*timed)))), bound["dynamic"]


def against_cells(times: dict[str, float], peer: float) -> str:
    """Table cells of :func:`static_against_dynamic`'s times and a peer's: dynamic µs, static µs,
    their ratio, the peer's µs."""
    return f"{times['dynamic']:.1f} | {times['static']:.1f} | {times['dynamic'] / times['static']:.3f} | {peer:.1f} |"


def host_us_per_call(fn: Callable[[], object], calls: int = 2000) -> float:
    """Wall time per call of ``fn`` in a loop (enqueue cost; the GPU keeps up for tiny kernels)."""
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float  # bytes read + written per second, device to device
    bf16_flops_per_s: float
    device: str

    def floor_us(self, bytes_moved: float, flops: float = 0.0) -> float:
        """The roofline time: the larger of moving the bytes and doing the arithmetic."""
        return max(bytes_moved / self.copy_bytes_per_s, flops / self.bf16_flops_per_s) * 1e6


def measure_ceilings() -> Ceilings:
    import torch

    source = torch.randn(2**29 // 2, device="cuda", dtype=torch.bfloat16)  # 512 MiB, far beyond L2
    target = torch.empty_like(source)
    copy_us = median_us(lambda: target.copy_(source))
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    mm_us = median_us(lambda: a @ b)
    return Ceilings(
        copy_bytes_per_s=2 * source.numel() * source.element_size() / (copy_us * 1e-6),
        bf16_flops_per_s=2 * n**3 / (mm_us * 1e-6),
        device=torch.cuda.get_device_name(),
    )
