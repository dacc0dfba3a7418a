"""Attention forward: graphdnn's sdpa beside PyTorch SDPA on its FlashAttention-2 and cuDNN
backends, on the issue's shapes (B4 H16, bf16), same inputs, L2 flushed by do_bench; with
``--backward``, graphdnn's sdpa_backward beside torch's SDPA backward on the same backends.

    PYTHONPATH=. python benchmarks/attention.py            # on a GPU
    PYTHONPATH=. python benchmarks/attention.py --backward # the backward pass, on a GPU
    PYTHONPATH=. python benchmarks/attention.py --dry      # anywhere: build the plans only
    PYTHONPATH=. python benchmarks/attention.py --decode   # the paged-KV decode table instead
    PYTHONPATH=. python benchmarks/attention.py --decode --sweep  # every decode tuning choice timed
    PYTHONPATH=. python benchmarks/attention.py --decode --compare  # CUDA cores, tensor cores, torch
    PYTHONPATH=. python benchmarks/attention.py --prefill  # paged prefill chunks
    PYTHONPATH=. python benchmarks/attention.py --ragged   # packed variable-length sequences

TFLOP/s count 4·B·H·Sq·Skv·D (two matmuls) forward and 10·B·H·Sq·Skv·D backward (five:
S again, dP, dV, dQ, dK), halved for a causal mask (the work a causal kernel skips). Every
graphdnn plan is checked against torch's result first.

Decode (``--decode``): one query token per sequence, Hq 32, Hk 8, D 128, bf16, K/V in a paged
cache of 64-key pages (shuffled), every sequence Skv long; torch SDPA reads the same K/V
gathered dense (``enable_gqa``). Its roofline is reading K and V once, 2·B·Hk·Skv·D·2 bytes, at
the measured copy bandwidth; the table gives each time's fraction of it.

Packed sequences (``--ragged``): causal self-attention over sequences of mixed lengths packed
token-major (THD), H16 D128 bf16, beside the same sequences padded to the longest (graphdnn's
dense plan with a padding mask) and torch SDPA on a jagged nested tensor (its varlen path).
TFLOP/s count only the work of the sequences themselves.

Sweep (``--decode --sweep``): every autotuning choice (about 35 per shape) of the
decode node (threads, key slots per lane, split, ring stages, vectors per lane) on SWEEP_SHAPES,
checked against torch and timed; a table of the best choice and the default beside torch per
shape, then every (threads, slots, split relative to the heuristic's, stages, vectors) averaged
over the shapes, to set the defaults from. ``--choice 128/4/h/3/2`` (repeatable) times only the
default and the choices named (``mma/4/1/3/h``: warps / tiles / stages / split of the
tensor-core kernel).

Compare (``--decode --compare``): on SWEEP_SHAPES, the CUDA-core kernel's default choice
(``decode``), the tensor-core kernel's (``decode_mma``, the untuned plan's) and a few of its
other choices (COMPARED; the best of them in its own column), beside torch.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from codegen.emit import candidates  # noqa: E402

# (batch, heads, sequence, head dim, causal)
SHAPES = [(4, 16, 1024, 128, False), (4, 16, 4096, 128, True), (2, 16, 8192, 128, True), (4, 16, 2048, 64, False)]
# --backward: also head dim 64 causal and a longer sequence without a mask (which wgmma dK/dV kernel wins
# depends on the mask and the head dim)
BACKWARD_SHAPES = [*SHAPES, (4, 16, 2048, 64, True), (4, 16, 4096, 128, False)]
# --backward: (column, the sdpa_backward tuning (None: the default plan), the head dims it takes)
BACKWARD_CHOICES: list[tuple[str, dict[str, object] | None, tuple[int, ...]]] = [
    ("default", None, (64, 128)),
    ("copies", {"path": "wgmma", "producer": False}, (64, 128)),
    ("producer", {"path": "wgmma", "producer": True}, (64, 128)),
    ("K/V in registers", {"path": "wgmma", "producer": True, "kv_registers": True}, (64,)),
    ("128-row tiles", {"path": "wgmma", "producer": True, "rows": 128}, (64,)),
    ("dQ a tile behind", {"path": "wgmma", "producer": True, "dq_behind": True}, (128,)),
    ("ping-pong", {"path": "wgmma", "producer": True, "dq_behind": True, "pingpong": True}, (128,)),
]
# decode: (batch, Skv); Hq, Hk, D and the page size fixed
DECODE_SHAPES = [(b, skv) for b in (1, 2, 4, 8) for skv in (8192, 16384, 32768)]
DECODE_HQ, DECODE_HK, DECODE_D, PAGE_SIZE = 32, 8, 128, 64
# --sweep: half the decode shapes, spanning B and Skv (NVRTC compiles a sweep's ~210 plans one at
# a time, ~0.5 s each: all 12 shapes would take twice as long; --choice for a few)
SWEEP_SHAPES = [(1, 8192), (1, 32768), (2, 16384), (4, 16384), (8, 8192), (8, 32768)]
# --compare: the tensor-core kernel's (warps, tiles, stages) timed beside its default, at the
# heuristic's split (and the default at twice it): a few, as NVRTC compiles each plan (~1 s)
COMPARED = [(4, 1, 2), (2, 2, 3)]
# --prefill: (batch, chunk of query rows, Skv) over the same paged cache
PREFILL_SHAPES = [(4, 512, 4096), (1, 2048, 8192), (8, 256, 2048)]
# --ragged: the lengths of the packed sequences; heads and head dim fixed
RAGGED_LENGTHS = [(512, 4096, 1024, 3000, 2048, 777, 4000, 1000), tuple(range(100, 1700, 25))]
RAGGED_H, RAGGED_D = 16, 128


def parsed_shape(spec: str) -> tuple[int, int, int, int, bool]:
    """``B,H,S,D[,causal]`` (causal 1 or 0) as a shape of the tables."""
    parts = [int(part) for part in spec.split(",")]
    if len(parts) not in (4, 5):
        raise SystemExit(f"--shape {spec!r}: expected B,H,S,D[,causal], e.g. 4,16,2048,64,1")
    return parts[0], parts[1], parts[2], parts[3], bool(parts[4]) if len(parts) == 5 else False


def graph(b: int, h: int, s: int, d: int, causal: bool, stats: bool = False) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(name=f"sdpa_b{b}h{h}s{s}d{d}{'_causal' if causal else ''}", io_data_type="bf16")
    q, k, v = (g.tensor(name=n, dim=[b, h, s, d]) for n in "qkv")
    o, lse = g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=causal, generate_stats=stats)
    o.set_name("o").set_output(True)
    if lse is not None:
        lse.set_name("stats").set_output(True)
    return g


def backward_graph(b: int, h: int, s: int, d: int, causal: bool) -> gd.OperationGraphSpec:
    """sdpa_backward alone: Q, K, V, O, dO and the forward's STATS in, dQ, dK, dV out."""
    g = gd.OperationGraphSpec(name=f"sdpa_backward_b{b}h{h}s{s}d{d}{'_causal' if causal else ''}", io_data_type="bf16")
    q, k, v, o, d_o = (g.tensor(name=n, dim=[b, h, s, d]) for n in ("q", "k", "v", "o", "do"))
    stats = g.tensor(name="stats", dim=[b, h, s, 1], data_type="float")
    grads = g.sdpa_backward(q, k, v, o, d_o, stats, attn_scale=d**-0.5, use_causal_mask=causal)
    for name, grad in zip(("dq", "dk", "dv"), grads):
        grad.set_name(name).set_output(True)
    return g


def flops(b: int, h: int, s: int, d: int, causal: bool, backward: bool = False) -> float:
    return (10 if backward else 4) * b * h * s * s * d / (2 if causal else 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--autotune", action="store_true", help="time the launch choices first")
    parser.add_argument("--backward", action="store_true", help="sdpa_backward against torch's SDPA backward")
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="B,H,S,D[,causal]",
        help="with --backward: time these shapes instead of the table's (repeatable; causal 1 or 0)",
    )
    parser.add_argument(
        "--columns",
        default="",
        metavar="NAME,...",
        help="with --backward: only these of graphdnn's columns (BACKWARD_CHOICES' names; default all)",
    )
    parser.add_argument("--decode", action="store_true", help="the paged-KV decode table")
    parser.add_argument("--sweep", action="store_true", help="with --decode: time every decode tuning choice")
    parser.add_argument(
        "--choice",
        action="append",
        default=[],
        metavar="T/K/SPLIT/S[/V]",
        help="with --sweep: time only the default and these choices (threads/slots/split/stages[/vectors]; split "
        "a number, or h or 2h: the heuristic's or twice it), e.g. 128/4/h/4",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="with --decode: the CUDA-core and the tensor-core kernels' defaults (and the tensor-core choices) and torch",
    )
    parser.add_argument("--prefill", action="store_true", help="paged prefill chunks against torch on dense K/V")
    parser.add_argument("--ragged", action="store_true", help="packed sequences against padded ones and torch")
    args = parser.parse_args()
    if args.dry:
        graphs = (
            [decode_graph(*shape) for shape in DECODE_SHAPES]
            if args.decode
            else [decode_graph(b, skv, sq) for b, sq, skv in PREFILL_SHAPES]
            if args.prefill
            else [ragged_graph(lengths, packed) for lengths in RAGGED_LENGTHS for packed in (True, False)]
            if args.ragged
            else [build(*shape) for shape in SHAPES for build in (graph, backward_graph)]
        )
        for built in graphs:
            plan = gd.compile(built, arch="sm_90", cache=None)
            print(f"{built.name}: {len(plan.kernels)} kernel(s)")
        return 0
    if args.backward:
        wanted = [name for name in args.columns.split(",") if name]
        unknown = set(wanted) - {name for name, _, _ in BACKWARD_CHOICES}
        if unknown:
            raise SystemExit(f"--columns: no column {sorted(unknown)}; the columns: {[c[0] for c in BACKWARD_CHOICES]}")
        choices = [c for c in BACKWARD_CHOICES if not wanted or c[0] in wanted]
        names = [name for name, _, _ in choices]
        print("| shape | " + " | ".join([*names, "torch FA2", "torch cuDNN", *(f"{n} / cuDNN" for n in names)]) + " |")
        print("|---|" + "---|" * (2 * len(names) + 2))
        for shape in [parsed_shape(spec) for spec in args.shape] or BACKWARD_SHAPES:
            b, h, s, d, causal = shape
            timed = timed_backward(shape, choices)
            tflops = [flops(*shape, backward=True) / us / 1e6 if us else float("nan") for us in timed]
            print(
                f"| B{b} H{h} S{s} D{d}{' causal' if causal else ''} | "
                + " | ".join("–" if t != t else f"{t:.0f}" for t in tflops)
                + "".join(" | –" if t != t else f" | {t / tflops[-1]:.2f}" for t in tflops[: len(names)])
                + " |"
            )
        return 0
    if args.prefill:
        return prefill_table()
    if args.ragged:
        return ragged_table()
    if args.decode and args.compare:
        return decode_compare()
    if args.decode and args.sweep:
        return decode_sweep(args.choice)
    if args.decode:
        return decode_table(args.autotune)
    rows = [timed(shape, args.autotune) for shape in SHAPES]
    columns = list(rows[0])
    print("| shape | " + " | ".join(columns) + " | best / cuDNN |")
    print("|---|" + "---|" * (len(columns) + 1))
    for shape, times in zip(SHAPES, rows):
        b, h, s, d, causal = shape
        tflops = {name: flops(*shape) / us / 1e6 if us else float("nan") for name, us in times.items()}
        ours = max(v for name, v in tflops.items() if not name.startswith("torch"))
        print(
            f"| B{b} H{h} S{s} D{d}{' causal' if causal else ''} | "
            + " | ".join(f"{t:.0f}" for t in tflops.values())
            + f" | {ours / tflops['torch cuDNN']:.2f} |"
        )
    return 0


def timed(shape: tuple[int, int, int, int, bool], autotune: bool) -> dict[str, float | None]:
    """µs of the default plan (autotuned with ``autotune``), the mma.sync kernel, each choice of
    the wgmma one (sm_90: keys per stage, "pp" the consumers' turn-taking), FlashAttention-2 and
    cuDNN through torch."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.measure import median_us

    b, h, s, d, causal = shape
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=d**-0.5)
    fused = next(f for f in gd.fuse(graph(*shape)).nodes if f.anchor is not None and f.anchor.op == "sdpa")

    def ours(**options: Any) -> float:
        bound = gd.compile(graph(*shape), **options).bind({"q": q, "k": k, "v": v, "o": o})
        o.fill_(float("nan"))
        bound()
        error = ((o.float() - want.float()).norm() / want.float().norm()).item()
        assert error < 2e-2, f"{shape} {options}: graphdnn differs from torch by {error:.3g}"
        return median_us(bound)

    def peer(backend: Any) -> float | None:
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=d**-0.5)
                return median_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=d**-0.5))
        except RuntimeError as error:  # a backend this build or GPU lacks
            print(f"{shape}: {backend} unavailable: {str(error).splitlines()[0]}")
            return None

    times: dict[str, float | None] = {
        "default plan": ours(autotune=autotune),
        "mma.sync": ours(
            tuning={fused.name: {"warps": 4, "block_n": 64 if d <= 128 else 32, "m_tiles": 2 if d <= 128 else 1}}
        ),
    }
    for choice in (c for c in candidates(fused, 90) if c.get("path") == "wgmma"):
        label = (
            f"wgmma bn{choice['block_n']}{' pp' if choice['pingpong'] else ''}{' pers' if choice['persistent'] else ''}"
        )
        times[label] = ours(tuning={fused.name: choice})
    times["torch FA2"] = peer(SDPBackend.FLASH_ATTENTION)
    times["torch cuDNN"] = peer(SDPBackend.CUDNN_ATTENTION)
    return times


def decode_graph(b: int, skv: int, sq: int = 1) -> gd.OperationGraphSpec:
    """One decode step (or, ``sq`` > 1, a prefill chunk: the last ``sq`` of ``skv`` tokens, causal
    bottom-right) over a paged cache: a pool of exactly the batch's pages."""
    pages = skv // PAGE_SIZE
    name = f"paged_decode_b{b}_skv{skv}" if sq == 1 else f"paged_prefill_b{b}_sq{sq}_skv{skv}"
    g = gd.OperationGraphSpec(name=name, io_data_type="bf16", compute_data_type="float")
    q = g.tensor(name="q", dim=[b, DECODE_HQ, sq, DECODE_D])
    k, v = (g.tensor(name=n, dim=[b * pages, DECODE_HK, PAGE_SIZE, DECODE_D]) for n in "kv")
    tables = [g.tensor(name=n, dim=[b, 1, pages, 1], data_type="int32") for n in ("tk", "tv")]
    lengths = [g.tensor(name=n, dim=[b, 1, 1, 1], data_type="int32") for n in ("seq_q", "seq_kv")]
    o, _ = g.sdpa(
        q, k, v, attn_scale=DECODE_D**-0.5, use_padding_mask=True, seq_len_q=lengths[0], seq_len_kv=lengths[1],
        paged_attention_k_table=tables[0], paged_attention_v_table=tables[1], paged_attention_max_seq_len_kv=skv,
        use_causal_mask_bottom_right=sq > 1,
    )  # fmt: skip
    o.set_name("o").set_output(True)
    return g


def decode_table(autotune: bool) -> int:
    from benchmarks.measure import measure_ceilings

    ceilings = measure_ceilings()
    print(f"{ceilings.device}: copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s (bytes read + written)")
    print("| B | Skv | K+V MB | graphdnn µs | of roofline | torch SDPA (dense) µs | of roofline | graphdnn / torch |")
    print("|---|---|---|---|---|---|---|---|")
    for b, skv in DECODE_SHAPES:
        kv_bytes = 2 * b * DECODE_HK * skv * DECODE_D * 2
        floor = ceilings.floor_us(kv_bytes)
        ours, torch_us = decode_timed(b, skv, autotune)
        print(
            f"| {b} | {skv} | {kv_bytes / 1e6:.0f} | {ours:.1f} | {floor / ours:.0%} | {torch_us:.1f} | "
            f"{floor / torch_us:.0%} | {torch_us / ours:.2f}x |"
        )
    return 0


class DecodeInputs:
    """One decode (or prefill chunk) shape's inputs on the GPU (pages shuffled), torch's dense
    result and time."""

    def __init__(self, b: int, skv: int, sq: int = 1) -> None:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention.bias import causal_lower_right

        from benchmarks.measure import median_us

        pages = skv // PAGE_SIZE
        q = torch.randn(b, DECODE_HQ, sq, DECODE_D, device="cuda", dtype=torch.bfloat16)
        k, v = (
            torch.randn(b * pages, DECODE_HK, PAGE_SIZE, DECODE_D, device="cuda", dtype=torch.bfloat16) for _ in "kv"
        )
        table = torch.randperm(b * pages, device="cuda", dtype=torch.int32).reshape(b, 1, pages, 1)
        lengths = torch.full((b, 1, 1, 1), sq, device="cuda", dtype=torch.int32)
        kv_lengths = torch.full((b, 1, 1, 1), skv, device="cuda", dtype=torch.int32)

        def dense(pool: Any) -> Any:  # [b, Hk, Skv, D] in table order
            return (
                pool[table[:, 0, :, 0].long()].permute(0, 2, 1, 3, 4).reshape(b, DECODE_HK, skv, DECODE_D).contiguous()
            )

        kd, vd = dense(k), dense(v)
        mask = causal_lower_right(sq, skv) if sq > 1 else None

        def peer() -> Any:
            return F.scaled_dot_product_attention(q, kd, vd, attn_mask=mask, scale=DECODE_D**-0.5, enable_gqa=True)

        self.want = peer()
        self.o = torch.empty_like(q)
        self.feeds = {"q": q, "k": k, "v": v, "tk": table, "tv": table, "seq_q": lengths, "seq_kv": kv_lengths}
        self.feeds["o"] = self.o
        self.torch_us = median_us(peer)
        self.label = f"decode B{b} Skv{skv}" if sq == 1 else f"prefill B{b} Sq{sq} Skv{skv}"

    def time(self, plan: Any, choice: object, **timing: float) -> float:
        """µs of ``plan`` after checking its result against torch's."""
        from benchmarks.measure import median_us

        bound = plan.bind(self.feeds)
        self.o.fill_(float("nan"))
        bound()
        error = ((self.o.float() - self.want.float()).norm() / self.want.float().norm()).item()
        assert error < 2e-2, f"{self.label} {choice}: graphdnn differs from torch by {error:.3g}"
        return median_us(bound, **timing)


def prefill_table() -> int:
    """Paged prefill chunks (the last Sq of Skv tokens, causal bottom-right) on the default plan
    (the mma.sync flash kernel reading pages) and on the decode kernel (what paged prefill ran
    on before), beside torch SDPA on the gathered dense K/V."""
    print("| B | Sq | Skv | default plan TFLOP/s | decode kernel | torch SDPA (dense) | default / torch |")
    print("|---|---|---|---|---|---|---|")
    for b, sq, skv in PREFILL_SHAPES:
        graph = decode_graph(b, skv, sq)
        fused = next(f for f in gd.fuse(graph).nodes if f.anchor is not None and f.anchor.op == "sdpa")
        inputs = DecodeInputs(b, skv, sq)
        ours = inputs.time(gd.compile(graph), "default")
        decode = inputs.time(gd.compile(graph, tuning={fused.name: {"path": "decode"}}), "decode")
        visible = sq * skv - sq * (sq - 1) // 2  # bottom-right causal: row i sees skv - sq + i + 1 keys
        work = 4 * b * DECODE_HQ * visible * DECODE_D / 1e6  # MFLOP: TFLOP/s from µs
        print(
            f"| {b} | {sq} | {skv} | {work / ours:.0f} | {work / decode:.0f} | {work / inputs.torch_us:.0f} | "
            f"{inputs.torch_us / ours:.2f}x |"
        )
    return 0


def ragged_graph(lengths: tuple[int, ...], packed: bool) -> gd.OperationGraphSpec:
    """Causal self-attention over ``lengths``: packed THD with cu_seqlens offsets, or padded to
    the longest ([B, H, S, D], BSHD strides) with the same lengths as a padding mask."""
    b, total, longest = len(lengths), sum(lengths), max(lengths)
    g = gd.OperationGraphSpec(name=f"{'ragged' if packed else 'padded'}_b{b}_t{total}", io_data_type="bf16")
    h, d = RAGGED_H, RAGGED_D
    rows, tokens = (1, total) if packed else (b, longest)
    q, k, v = (g.tensor(name=n, dim=[rows, h, tokens, d], stride=[tokens * h * d, d, h * d, 1]) for n in "qkv")
    seq = [g.tensor(name=n, dim=[b, 1, 1, 1], data_type="int32") for n in ("seq_q", "seq_kv")]
    offsets = g.tensor(name="cu", dim=[b + 1, 1, 1, 1], data_type="int32") if packed else None
    o, _ = g.sdpa(
        q, k, v, attn_scale=d**-0.5, use_causal_mask=True, use_padding_mask=True, seq_len_q=seq[0], seq_len_kv=seq[1],
        ragged_offset_q=offsets, ragged_offset_kv=offsets, max_seq_len_q=longest if packed else None,
    )  # fmt: skip
    o.set_name("o").set_output(True).set_stride([tokens * h * d, d, h * d, 1])
    return g


def ragged_table() -> int:
    print("| sequences | tokens | packed TFLOP/s | padded to the longest | torch jagged SDPA | packed / torch |")
    print("|---|---|---|---|---|---|")
    for lengths in RAGGED_LENGTHS:
        print(ragged_row(lengths))
    return 0


def ragged_row(lengths: tuple[int, ...]) -> str:
    """Packed sequences (the flash kernel), the same padded (the dense default plan) and torch's
    jagged nested-tensor SDPA, each checked against torch."""
    import torch
    import torch.nn.functional as F

    from benchmarks.measure import median_us

    h, d = RAGGED_H, RAGGED_D
    b, total, longest = len(lengths), sum(lengths), max(lengths)
    cu = torch.tensor((0, *lengths), device="cuda").cumsum(0)
    q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
    jagged = [torch.nested.nested_tensor_from_jagged(x, cu).transpose(1, 2) for x in (q, k, v)]

    def peer() -> Any:
        return F.scaled_dot_product_attention(*jagged, is_causal=True, scale=d**-0.5)

    want = peer().transpose(1, 2).values()  # [total, h, d]
    seq = torch.tensor(lengths, device="cuda", dtype=torch.int32).reshape(b, 1, 1, 1)
    o = torch.empty_like(q)
    padded = {n: torch.zeros(b, longest, h, d, device="cuda", dtype=torch.bfloat16) for n in "qkvo"}
    for i, (start, n) in enumerate(zip(cu.tolist(), lengths)):
        for name, x in (("q", q), ("k", k), ("v", v)):
            padded[name][i, :n] = x[start : start + n]
    thd = {n: t.reshape(1, total, h, d).transpose(1, 2) for n, t in (("q", q), ("k", k), ("v", v), ("o", o))}
    feeds = {
        True: {**thd, "cu": cu.int().reshape(-1, 1, 1, 1), "seq_q": seq, "seq_kv": seq},
        False: {**{n: t.transpose(1, 2) for n, t in padded.items()}, "seq_q": seq, "seq_kv": seq},
    }

    def run(packed: bool) -> float:
        graph = ragged_graph(lengths, packed)
        bound = gd.compile(graph).bind(feeds[packed])
        o.fill_(float("nan"))
        padded["o"].fill_(float("nan"))
        bound()
        got = o if packed else torch.cat([padded["o"][i, :n] for i, n in enumerate(lengths)])
        error = ((got.float() - want.float()).norm() / want.float().norm()).item()
        assert error < 2e-2, f"{graph.name}: graphdnn differs from torch by {error:.3g}"
        return median_us(bound)

    work = sum(4 * h * d * n * (n + 1) / 2 for n in lengths) / 1e6  # MFLOP, causal
    ours, dense, torch_us = run(True), run(False), median_us(peer)
    return (
        f"| {b} ({min(lengths)}-{longest}) | {total} | {work / ours:.0f} | {work / dense:.0f} | "
        f"{work / torch_us:.0f} | {torch_us / ours:.2f}x |"
    )


def decode_timed(b: int, skv: int, autotune: bool) -> tuple[float, float]:
    """µs of graphdnn's paged decode and of torch SDPA on the gathered dense K/V."""
    inputs = DecodeInputs(b, skv)
    ours = inputs.time(gd.compile(decode_graph(b, skv), autotune=autotune), "default")
    return ours, inputs.torch_us


def decode_sweep(specs: list[str]) -> int:
    """Every decode choice on each of SWEEP_SHAPES (only the default and ``specs`` if any)."""
    from benchmarks.measure import measure_ceilings
    from codegen.families.attention_problem import attention_of

    ceilings = measure_ceilings()
    print(f"{ceilings.device}: copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s (bytes read + written)")
    print("choice t/k/s/r/v: threads / key slots per lane / KV split / ring stages (0: registers) / vectors per lane")
    print(
        "| B | Skv | choices | best t/k/s | µs | of roofline | default t/k/s | µs | of roofline | torch µs | of roofline |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    of_best: dict[str, list[float]] = defaultdict(list)  # by threads/slots/split rule: best µs / µs, per shape
    for b, skv in SWEEP_SHAPES:
        graph = decode_graph(b, skv)
        fused = next(f for f in gd.fuse(graph).nodes if f.anchor is not None and f.anchor.op == "sdpa")
        a = attention_of(fused)
        choices = candidates(fused, 90)  # the default first
        if specs:
            choices = [choices[0], *(spec_choice(spec, a) for spec in specs)]
        plans = [gd.compile(graph, tuning={fused.name: choice}) for choice in choices]
        inputs = DecodeInputs(b, skv)
        times = [inputs.time(plan, choice, warmup_ms=10, rep_ms=50) for plan, choice in zip(plans, choices)]
        floor = ceilings.floor_us(2 * b * DECODE_HK * skv * DECODE_D * 2)
        best = min(range(len(times)), key=times.__getitem__)
        for choice, us in zip(choices, times):
            of_best[rule_of(choice, a)].append(times[best] / us)
        print(
            f"| {b} | {skv} | {len(choices)} | {short(choices[best])} | {times[best]:.1f} | {floor / times[best]:.0%} | "
            f"{short(choices[0])} | {times[0]:.1f} | {floor / times[0]:.0%} | {inputs.torch_us:.1f} | "
            f"{floor / inputs.torch_us:.0%} |"
        )
    print("\nEach threads/slots/split rule (h: the heuristic's split for those threads and slots; 1: no")
    print(
        "split where h is more): geometric mean of best µs / µs over the shapes that offer it (1.00: best everywhere)."
    )
    print("| threads/slots/split/stages/vectors | shapes | of best |")
    print("|---|---|---|")
    for rule, fractions in sorted(of_best.items(), key=lambda item: -geometric_mean(item[1])):
        print(f"| {rule} | {len(fractions)} | {geometric_mean(fractions):.2f} |")
    return 0


def decode_compare() -> int:
    """The CUDA-core and tensor-core decode kernels side by side with torch on SWEEP_SHAPES."""
    from benchmarks.measure import measure_ceilings
    from codegen.families.attention_decode import MAX_SPLIT
    from codegen.families.attention_decode import default_config as cuda_default
    from codegen.families.attention_decode_mma import MmaDecodeConfig, fits
    from codegen.families.attention_decode_mma import default_config as mma_default
    from codegen.families.attention_decode_mma import heuristic_split as mma_split
    from codegen.families.attention_problem import attention_of

    ceilings = measure_ceilings()
    print(f"{ceilings.device}: copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s (bytes read + written)")
    print(
        "CUDA cores t/k/s/r/v: threads / key slots / split / stages / vectors; tensor cores w/t/r/s: warps / tiles / stages / split"
    )
    print(
        "| B | Skv | roofline µs | CUDA cores | µs | of roofline | tensor cores | µs | of roofline | best tensor cores | µs | "
        "of roofline | torch µs | of roofline | tensor cores / torch |"
    )
    print("|" + "---|" * 15)
    for b, skv in SWEEP_SHAPES:
        graph = decode_graph(b, skv)
        fused = next(f for f in gd.fuse(graph).nodes if f.anchor is not None and f.anchor.op == "sdpa")
        a = attention_of(fused)
        cuda, mma = cuda_default(a, 90).choice(), mma_default(a, 90).choice()
        others = [MmaDecodeConfig(*c, mma_split(a, 90, *c)).choice() for c in COMPARED if fits(a, *c)]
        others.append({**mma, "split": min(MAX_SPLIT, 2 * int(mma["split"]))})  # type: ignore[call-overload]
        inputs = DecodeInputs(b, skv)
        floor = ceilings.floor_us(2 * b * DECODE_HK * skv * DECODE_D * 2)
        cuda_us, mma_us = (checked_us(inputs, graph, fused.name, c) for c in (cuda, mma))
        timed_others = [(checked_us(inputs, graph, fused.name, c), c) for c in others]
        best_us, best = min([(mma_us, mma), *timed_others], key=lambda item: item[0])
        print(
            f"| {b} | {skv} | {floor:.1f} | {short(cuda)} | {cuda_us:.1f} | {floor / cuda_us:.0%} | {short(mma)} | "
            f"{mma_us:.1f} | {floor / mma_us:.0%} | {short(best)} | {best_us:.1f} | {floor / best_us:.0%} | "
            f"{inputs.torch_us:.1f} | {floor / inputs.torch_us:.0%} | {inputs.torch_us / mma_us:.2f}x |"
        )
        for us_other, other in timed_others:
            print(f"  tensor cores {short(other)}: {us_other:.1f} µs")
    return 0


def checked_us(
    inputs: DecodeInputs, graph: gd.OperationGraphSpec, name: str, choice: dict[str, object] | None
) -> float:
    """µs of ``graph`` with ``choice`` for node ``name`` (None: untuned), inf with the error
    printed where its result is wrong (never timed)."""
    try:
        tuning = None if choice is None else {name: choice}
        return inputs.time(gd.compile(graph, tuning=tuning), choice, warmup_ms=10, rep_ms=50)
    except AssertionError as error:
        print(f"WRONG {error}")
        return float("inf")


def rule_of(choice: dict[str, object], a: Any) -> str:
    """A choice with its split relative to the heuristic's for the rest of it (h/2, h, 2h)."""
    from codegen.families.attention_decode import heuristic_split
    from codegen.families.attention_decode_mma import heuristic_split as mma_split

    def rule(split: int, h: int) -> str:
        return {h // 2: "h/2", h: "h", 2 * h: "2h"}.get(split, str(split))

    if choice.get("path") == "decode_mma":
        warps, tiles, stages, split = (int(choice[key]) for key in ("warps", "tiles", "stages", "split"))  # type: ignore[call-overload]
        return f"mma/{warps}/{tiles}/{stages}/{rule(split, mma_split(a, 90, warps, tiles, stages))}"
    threads, keys, split, stages, vectors = (
        int(choice[key])  # type: ignore[call-overload]
        for key in ("threads", "keys_per_lane", "split", "stages", "vectors_per_lane")
    )
    return f"{threads}/{keys}/{rule(split, heuristic_split(a, 90, threads, keys, stages, vectors))}/{stages}/{vectors}"


def geometric_mean(values: list[float]) -> float:
    return math.prod(values) ** (1 / len(values))


def short(choice: dict[str, object]) -> str:
    if choice.get("path") == "decode_mma":
        return "mma/" + "/".join(str(choice[key]) for key in ("warps", "tiles", "stages", "split"))
    keys = ("threads", "keys_per_lane", "split", "stages", "vectors_per_lane")
    return "/".join(str(choice[key]) for key in keys)


def spec_choice(spec: str, a: Any) -> dict[str, object]:
    """``threads/slots/split/stages[/vectors per lane]`` as a decode tuning choice; a split of h
    or 2h is the heuristic's for the rest (or twice it)."""
    from codegen.families.attention_decode import MAX_SPLIT, heuristic_split

    parts = spec.split("/")
    if parts[0] == "mma" and len(parts) == 5:
        from codegen.families.attention_decode_mma import heuristic_split as mma_split

        warps, tiles, stages = (int(part) for part in parts[1:4])
        h = mma_split(a, 90, warps, tiles, stages)
        split = {"h": h, "2h": 2 * h}.get(parts[4])
        split = int(parts[4]) if split is None else split
        return {
            "path": "decode_mma",
            "warps": warps,
            "tiles": tiles,
            "stages": stages,
            "split": min(MAX_SPLIT, max(1, split)),
        }
    if len(parts) not in (4, 5):
        raise SystemExit(f"--choice {spec!r}: expected threads/slots/split/stages[/vectors], e.g. 128/4/h/4")
    threads, keys, stages = int(parts[0]), int(parts[1]), int(parts[3])
    vectors = int(parts[4]) if len(parts) == 5 else 1
    h = heuristic_split(a, 90, threads, keys, stages, vectors)
    split = {"h": h, "2h": 2 * h}.get(parts[2])
    split = int(parts[2]) if split is None else split
    return {"path": "decode", "threads": threads, "keys_per_lane": keys, "split": min(MAX_SPLIT, max(1, split)),
            "stages": stages, "vectors_per_lane": vectors}  # fmt: skip


def timed_backward(
    shape: tuple[int, int, int, int, bool], choices: list[tuple[str, dict[str, object] | None, tuple[int, ...]]]
) -> tuple[float | None, ...]:
    """µs of graphdnn's sdpa_backward plan with each of ``choices``' tunings (None: the default plan)
    at the head dims it takes (None elsewhere), and of torch's SDPA backward (autograd.grad of a recorded forward) on FlashAttention-2 and cuDNN,
    all from the same Q, K, V and dO."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.measure import median_us

    b, h, s, d, causal = shape
    q, k, v, d_o = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=d**-0.5)
    want = torch.autograd.grad(o, leaves, d_o)
    stats = torch.empty(b, h, s, 1, device="cuda", dtype=torch.float32)  # the forward's, from graphdnn's sdpa
    gd.compile(graph(*shape, stats=True)).execute({"q": q, "k": k, "v": v, "o": torch.empty_like(q), "stats": stats})
    grads = [torch.empty_like(q) for _ in range(3)]
    pack = {
        "q": q,
        "k": k,
        "v": v,
        "o": o.detach(),
        "do": d_o,
        "stats": stats,
        "dq": grads[0],
        "dk": grads[1],
        "dv": grads[2],
    }
    fused = next(f for f in gd.fuse(backward_graph(*shape)).nodes if f.anchor is not None)

    def ours(choice: dict[str, object] | None) -> float | None:
        """µs of the default plan (``choice`` None) or of the tuning ``choice``, once its gradients
        match torch's (None, with the error printed, where they do not)."""
        path = None if choice is None else str(choice)
        tuning = None if choice is None else {fused.name: choice}
        bound = gd.compile(backward_graph(*shape), tuning=tuning).bind(pack)
        for grad in grads:
            grad.fill_(float("nan"))
        bound()
        for name, got, ref in zip(("dQ", "dK", "dV"), grads, want):
            error = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
            if not error < 3e-2:
                print(f"{shape} {path or 'default'}: graphdnn's {name} differs from torch by {error:.3g}")
                return None
        return median_us(bound)

    def peer(backend: Any) -> float | None:
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=d**-0.5)
                return median_us(lambda: torch.autograd.grad(out, leaves, d_o, retain_graph=True))
        except RuntimeError as error:  # a backend this build or GPU lacks
            print(f"{shape}: {backend} unavailable: {str(error).splitlines()[0]}")
            return None

    return (
        *(ours(choice) if d in dims else None for _, choice, dims in choices),
        peer(SDPBackend.FLASH_ATTENTION),
        peer(SDPBackend.CUDNN_ATTENTION),
    )


if __name__ == "__main__":
    raise SystemExit(main())
