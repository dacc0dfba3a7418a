"""Paged-KV and dense decode attention on the GPU against the reference: decode (Sq = 1) over
batch, GQA ratio, page size, head dim and type, with shuffled pages and ragged lengths (1,
odd, the longest); the KV split forced through the tuning; every decode tuning choice (threads,
key slots per lane, split) autotuning offers, and each threads and slots choice with a forced
split; prefill chunks through the pages (on the flash kernel, and each split of the decode
kernel); dense decode on the same kernels."""

from __future__ import annotations

import zlib

import pytest

from codegen.emit import candidates
from codegen.families.attention_decode import (
    KEYS_PER_LANE_CHOICES,
    RING_KEYS_PER_LANE_CHOICES,
    THREADS_CHOICES,
    VECTORS_PER_LANE_CHOICES,
)
from codegen.families.attention_decode_loads import STAGES_CHOICES
from fusion_rules import Family, fuse
from graphdnn.dtypes import DataType
from tests.attention_cases import DECODE_CASES, PAGED_CASES, AttentionCase, PagedCase
from tests.gpu_check import check_on_gpu

pytestmark = pytest.mark.gpu


def decode_name(fused_graph) -> str:  # type: ignore[no-untyped-def]
    (fused,) = [f for f in fuse(fused_graph.validate()).nodes if f.family is Family.ATTENTION]
    return fused.name


@pytest.mark.parametrize("data_type", [DataType.HALF, DataType.BFLOAT16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize(("hq", "hk"), [(8, 8), (32, 8), (8, 1)], ids=["8/8", "32/8", "8/1"])
@pytest.mark.parametrize("b", [1, 3])
def test_paged_decode_matches_reference(b: int, hq: int, hk: int, page_size: int, d: int, data_type: DataType) -> None:
    case = PagedCase(b=b, hq=hq, hk=hk, sq=1, max_len=1000, page_size=page_size, d=d, dv=d, data_type=data_type)
    key = f"{b}-{hq}-{hk}-{page_size}-{d}-{data_type.value}"
    plan = check_on_gpu(case.build(), feeds=case.feeds(zlib.crc32(key.encode())))
    assert any("_decode_" in kernel.name for kernel in plan.kernels)


@pytest.mark.parametrize("case", ["decode_gqa_4to1", "decode_mqa_8to1_d128", "prefill_chunk_causal", "sliding_window"])
def test_every_split_matches_reference(case: str) -> None:
    """Each split autotuning may pick, and a few forced ones (more slices than keys of a short
    sequence: empty slices)."""
    paged = PAGED_CASES[case]
    graph = paged.build()
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION]
    offered = (c for c in candidates(fused, 90) if c.get("path") == "decode")
    splits = {int(c["split"]) for c in offered} | {1, 2, 7, 64}  # type: ignore[call-overload]
    for split in sorted(splits):
        plan = check_on_gpu(graph, feeds=paged.feeds(split), tuning={fused.name: {"path": "decode", "split": split}})
        assert len(plan.kernels) == (1 if split == 1 else 2), split


@pytest.mark.parametrize("case", sorted(PAGED_CASES))
def test_paged_cases_match_reference(case: str) -> None:
    """Prefill chunks (Sq 5 and 40) run through the page tables on the mma.sync flash kernel
    (all fp16 or bf16), the others on the decode kernel."""
    paged = PAGED_CASES[case]
    check_on_gpu(paged.build(), feeds=paged.feeds(zlib.crc32(case.encode())))


@pytest.mark.parametrize("case", sorted(DECODE_CASES))
@pytest.mark.parametrize("split", [None, 1, 5])
def test_dense_decode_matches_reference(case: str, split: int | None) -> None:
    graph = DECODE_CASES[case].build()
    tuning = {} if split is None else {"tuning": {decode_name(graph): {"path": "decode", "split": split}}}
    plan = check_on_gpu(graph, seed=zlib.crc32(case.encode()), **tuning)
    assert any("_decode_" in kernel.name for kernel in plan.kernels)


# the benchmark's heads and head dim (GQA 4:1, D 128, bf16, 64-key pages) at 3 ragged lengths up
# to 5000 keys: many batches of keys per slice for every choice; then element loads (vLLM's page
# layout, D 64 fp16 MQA) and dense decode with a bias
CHOICE_CASES = {
    "benchmark_heads": PagedCase(b=3, hq=32, hk=8, max_len=5000, page_size=64, d=128, dv=128),
    "mqa_fp16_page_16": PagedCase(b=2, hq=8, hk=1, max_len=3000, page_size=16, data_type=DataType.HALF),
    "nhd_pools": PAGED_CASES["decode_nhd_pools"],
    "dense_bias": AttentionCase(b=2, hq=8, hk=2, sq=1, skv=2500, d=128, dv=128, bias=(True, True, False, True)),
}


@pytest.mark.parametrize("case", sorted(CHOICE_CASES))
def test_every_decode_choice_matches_reference(case: str) -> None:
    """Each choice autotuning may time (threads, key slots per lane, split), and each threads and
    slots choice with a split of 3 and with no split."""
    attention = CHOICE_CASES[case]
    graph = attention.build()
    name = decode_name(graph)
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION]
    choices = [c for c in candidates(fused, 90) if c.get("path") == "decode"]
    for threads in THREADS_CHOICES:
        for keys in KEYS_PER_LANE_CHOICES:
            choices += [{"path": "decode", "threads": threads, "keys_per_lane": keys, "split": s} for s in (1, 3)]
    seed = zlib.crc32(case.encode())
    feeds = attention.feeds(seed) if isinstance(attention, PagedCase) else None
    for choice in choices:
        plan = check_on_gpu(graph, seed=seed, feeds=feeds, tuning={name: choice})
        assert len(plan.kernels) == (1 if choice["split"] == 1 else 2), choice


# the shared-memory ring on awkward shapes: B 1 at its full length (79 pages, the last partly
# filled), odd page counts, Skv not a multiple of the page, GQA 4, 1 and 8, bf16 and fp16
RING_CASES = {
    "b1_gqa4_full": PagedCase(b=1, hq=32, hk=8, max_len=4999, page_size=64, d=128, dv=128),
    "b3_mha_fp16_d64": PagedCase(b=3, hq=8, hk=8, max_len=1000, page_size=16, data_type=DataType.HALF),
    "b2_mqa8_d128": PagedCase(b=2, hq=8, hk=1, max_len=3001, page_size=16, d=128, dv=128),
}


@pytest.mark.parametrize("case", sorted(RING_CASES))
def test_every_ring_choice_matches_reference(case: str) -> None:
    """Each threads, key slots, stages and vectors per lane of the shared-memory ring that fits,
    at the heuristic's split, no split or 7 slices in turn; outputs poisoned by check_on_gpu."""
    from codegen.families.attention_decode import fits
    from codegen.families.attention_problem import attention_of

    paged = RING_CASES[case]
    graph = paged.build()
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION]
    a = attention_of(fused)
    feeds = paged.feeds(zlib.crc32(case.encode()))
    if paged.b == 1:
        feeds["seq_kv"][:] = paged.max_len
    rings = [
        (t, k, s, v)
        for t in THREADS_CHOICES
        for k in RING_KEYS_PER_LANE_CHOICES
        for s in STAGES_CHOICES
        for v in VECTORS_PER_LANE_CHOICES
        if s
    ]
    fitting = [ring for ring in rings if fits(a, *ring)]
    assert len(fitting) >= 8
    for n, (threads, keys, stages, vectors) in enumerate(fitting):
        choice: dict[str, object] = {
            "path": "decode",
            "threads": threads,
            "keys_per_lane": keys,
            "stages": stages,
            "vectors_per_lane": vectors,
        }
        split = (None, 1, 7)[n % 3]
        if split is not None:
            choice["split"] = split
        plan = check_on_gpu(graph, feeds=feeds, tuning={fused.name: choice})
        assert plan.kernels[0].shared_bytes > 0, choice


# the tensor-core decode kernel on awkward shapes: keys not a multiple of 16 nor of the page,
# B 1 and 3, GQA 4, MHA and MQA-like 8:1, D 64 and 128, fp16 and bf16, vLLM's page layout,
# dense with a bias, 2 query rows under a causal mask with a sliding window, 16 packed rows (two
# row groups), and 8-key pages (a page lookup per chunk: a 16-key tile spans pages)
MMA_CASES: dict[str, PagedCase | AttentionCase] = {
    "b1_gqa4_full": PagedCase(b=1, hq=32, hk=8, max_len=4999, page_size=64, d=128, dv=128),
    "b3_mha_fp16_d64": PagedCase(b=3, hq=8, hk=8, max_len=1000, page_size=16, data_type=DataType.HALF),
    "b2_mqa8_d128": PagedCase(b=2, hq=8, hk=1, max_len=3001, page_size=16, d=128, dv=128),
    "nhd_pools": PAGED_CASES["decode_nhd_pools"],
    "dense_bias": CHOICE_CASES["dense_bias"],
    "sq2_window_fp16": AttentionCase(
        b=3, hq=8, hk=2, sq=2, skv=1001, d=64, dv=64, data_type=DataType.HALF, padding=True,
        options={"use_causal_mask_bottom_right": True, "sliding_window_length": 300},
    ),
    "two_row_groups": PagedCase(b=3, hq=16, hk=1, max_len=700, page_size=64, d=128, dv=128),
    "page_8_gqa4": PagedCase(b=3, hq=8, hk=2, max_len=777, page_size=8, d=128, dv=128),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(MMA_CASES))
def test_every_tensor_core_decode_choice_matches_reference(case: str) -> None:
    """Each warps, tiles and stages that fits, at the heuristic's split, no split or 7 slices
    in turn (B 1 at its full length); outputs poisoned by check_on_gpu."""
    from codegen.families.attention_decode_mma import MMA_PATH, STAGES_CHOICES, TILES_CHOICES, WARPS_CHOICES, fits
    from codegen.families.attention_problem import attention_of

    attention = MMA_CASES[case]
    graph = attention.build()
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION]
    a = attention_of(fused)
    seed = zlib.crc32(case.encode())
    feeds = attention.feeds(seed) if isinstance(attention, PagedCase) else None
    if feeds is not None and attention.b == 1:
        feeds["seq_kv"][:] = attention.max_len
    fitting = [(w, t, s) for w in WARPS_CHOICES for t in TILES_CHOICES for s in STAGES_CHOICES if fits(a, w, t, s)]
    assert len(fitting) >= 6
    wrong = []  # every failing choice, not only the first
    for n, (warps, tiles, stages) in enumerate(fitting):
        choice: dict[str, object] = {"path": MMA_PATH, "warps": warps, "tiles": tiles, "stages": stages}
        split = (None, 1, 7)[n % 3]
        if split is not None:
            choice["split"] = split
        try:
            plan = check_on_gpu(graph, seed=seed, feeds=feeds, tuning={fused.name: choice})
        except AssertionError as error:
            wrong.append(f"{choice}: {str(error).splitlines()[0]}")
            continue
        assert "_decode_mma_" in plan.kernels[0].name, choice
    assert not wrong, "; ".join(wrong)
