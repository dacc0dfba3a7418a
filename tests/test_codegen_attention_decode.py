"""The attention decode kernels (pack GQA, split-KV, combine): which problems take them, the
split heuristic and the tuning choices (threads, key slots per lane, split), every kernel
compiling for sm_80 and sm_90 (the benchmark shape's choices without spills), and the kernels
run on the CPU (tests/cpu_emulation.py) against the reference, paged and dense, at several
splits and every threads and key slots choice."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from benchmarks.attention import decode_graph
from codegen.context import EmitContext
from codegen.emit import candidates, emitter
from codegen.families.attention_decode import (
    DECODE_MAX_SQ,
    KEYS_PER_LANE_CHOICES,
    MAX_RING,
    MAX_SPLIT,
    MIN_KEYS_PER_SPLIT,
    RING_KEYS_PER_LANE_CHOICES,
    THREADS_CHOICES,
    default_config,
    fits,
    heuristic_split,
    resident_target,
    shape,
)
from codegen.families.attention_decode_loads import STAGES_CHOICES
from codegen.families.attention_decode_mma import unsupported
from codegen.families.attention_problem import attention_of
from codegen.kernel import FusedProgram
from fusion_rules import Family, FusedNode, fuse
from graphdnn import reference
from graphdnn.arch import sm_count
from graphdnn.dtypes import DataType
from graphdnn.errors import UnsupportedError
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import signature
from tests import cpu_emulation
from tests.attention_cases import CASES, DECODE_CASES, PAGED_CASES, AttentionCase, PagedCase
from tests.compile_check import compile_graphs, ptxas_report
from tests.gpu_check import relative_error


def emulate_and_compare(
    fused: FusedNode,
    program: FusedProgram,
    feeds: dict[str, np.ndarray],
    aligned: int,
    expected: dict[str, np.ndarray],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Run ``program`` on the CPU emulation; -inf STATS where the reference's are, the rest within 2e-3."""
    build: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build.mkdir(exist_ok=True)
    got = cpu_emulation.run(fused, program, feeds, aligned, build)
    for name, want in expected.items():
        value = got[name].astype(np.float64)
        assert np.array_equal(np.isneginf(value), np.isneginf(want)), name
        finite = np.isfinite(want)
        assert relative_error(value[finite], want[finite].astype(np.float64)) < 2e-3, name


def attention(graph):  # type: ignore[no-untyped-def]
    ir = graph.validate()
    (fused,) = [f for f in fuse(ir).nodes if f.family is Family.ATTENTION]
    return ir, fused


@pytest.mark.parametrize("case", sorted(PAGED_CASES))
def test_paged_decode_runs_on_the_decode_kernel_and_paged_prefill_on_the_flash_kernel(case: str) -> None:
    """Few query rows (or types the tensor cores cannot take) decode; more rows take the
    mma.sync flash kernel through the page tables, never the TMA-fed Hopper one."""
    paged = PAGED_CASES[case]
    ir, fused = attention(paged.build())
    decode = paged.sq <= DECODE_MAX_SQ or paged.data_type is DataType.FLOAT
    program = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90))
    assert ("_decode_" if decode else "_flash_") in program.kernels[0].name
    paths = {str(c.get("path", "flash")) for c in candidates(fused, 90)}
    kernels = {"decode"} if unsupported(attention_of(fused), 90) else {"decode", "decode_mma"}
    assert paths == (kernels if decode else kernels | {"flash"})


def test_few_query_rows_take_the_decode_kernel_and_more_the_flash_kernel() -> None:
    for sq, path in ((1, "_decode_"), (4, "_decode_"), (5, "_flash_")):
        ir, fused = attention(AttentionCase(sq=sq, skv=300, hq=8, hk=2).build())
        (kernel, *_) = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 80)).kernels
        assert path in kernel.name, sq
    _, fused = attention(AttentionCase(sq=1, skv=3000).build())
    paths = {str(c.get("path", "flash")) for c in candidates(fused, 90)}
    assert paths == {"decode", "decode_mma", "flash", "wgmma"}  # a dense decode may still time the flash kernels


def test_the_hopper_kernel_on_a_paged_problem_is_refused_naming_the_paths_that_read_pages() -> None:
    ir, fused = attention(PAGED_CASES["prefill_long_q"].build())
    with pytest.raises(UnsupportedError, match=r"paged KV cache runs on the decode kernel .* mma.sync flash kernel"):
        emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, {"path": "wgmma"}))


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("case", ["prefill_chunk_causal", "prefill_long_q"])
def test_paged_prefill_on_the_flash_kernel_matches_the_reference_on_the_cpu(
    case: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    paged = dataclasses.replace(PAGED_CASES[case], data_type=DataType.HALF)  # the emulation's half
    ir, fused = attention(paged.build())
    program = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 80))
    assert "_flash_" in program.kernels[0].name
    feeds = paged.feeds(seed=5)
    expected = reference.execute(ir, feeds)
    emulate_and_compare(fused, program, feeds, 16, expected, tmp_path_factory)


@pytest.mark.parametrize(
    ("tuning", "message"),
    [
        ({"split": 0}, r"split must be an integer from 1 to 64"),
        ({"split": 65}, r"split must be an integer from 1 to 64"),
        ({"split": "2"}, r"split must be an integer from 1 to 64"),
        ({"threads": 64}, r"threads must be an integer one of \(128, 256\)"),
        ({"keys_per_lane": 3}, r"keys_per_lane must be an integer one of \(2, 4, 8\)"),
        ({"keys_per_lane": True}, r"keys_per_lane must be an integer"),
        ({"warps": 4}, r"the decode kernel has no choice warps"),
        ({"stages": 2}, r"stages must be an integer one of \(0, 3, 4\)"),
        ({"vectors_per_lane": 4}, r"vectors_per_lane must be an integer one of \(1, 2\)"),
        ({"stages": 3, "keys_per_lane": 8}, r"keys_per_lane must be an integer one of \(2, 4\)"),
        ({"stages": 4, "threads": 256, "keys_per_lane": 4}, r"ring of 4 stages would take 131072 bytes"),
    ],
)
def test_a_bad_decode_choice_is_refused(tuning: dict[str, object], message: str) -> None:
    ir, fused = attention(PAGED_CASES["decode_gqa_4to1"].build())
    with pytest.raises(UnsupportedError, match=message):
        emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, {"path": "decode", **tuning}))


@pytest.mark.parametrize(("b", "hk", "skv"), [(1, 8, 8192), (1, 8, 32768), (4, 8, 16384), (8, 8, 300), (64, 8, 32768)])
def test_the_split_heuristic_fills_the_gpu_only_when_the_blocks_do_not(b: int, hk: int, skv: int) -> None:
    """The blocks with their slices reach the resident target on every SM (the bytes in flight
    that cover HBM's latency) without a second wave, unless the slices would get too short."""
    case = PagedCase(b=b, hq=4 * hk, hk=hk, max_len=skv, page_size=64, d=128, dv=128)
    _, fused = attention(case.build())
    a = attention_of(fused)
    choices = [c for c in candidates(fused, 90) if c["path"] == "decode"]  # the CUDA-core kernel's
    for threads, keys, stages in ALL_CHOICES:
        s = shape(a, threads)
        blocks, target = b * hk * s.row_groups, resident_target(s, keys, stages) * sm_count(90)
        split = heuristic_split(a, 90, threads, keys, stages)
        if blocks >= target:
            assert split == 1
        else:
            assert 1 <= split <= min(MAX_SPLIT, max(1, skv // MIN_KEYS_PER_SPLIT))
            assert blocks * split <= target
            batches = max(4, stages)
            assert split in (MAX_SPLIT, max(1, skv // max(256, batches * s.key_groups * keys))) or (
                blocks * (split + 1) > target
            )
        choice = {"path": "decode", "threads": threads, "keys_per_lane": keys, "split": split, "stages": stages}
        assert ({**choice, "vectors_per_lane": 1} in choices) == fits(a, threads, keys, stages)
    default = default_config(a, 90)
    assert choices[0] == default.choice() and {**default.choice(), "split": 1} in choices
    assert (default.threads, default.keys_per_lane, default.stages, default.vectors_per_lane) == (128, 4, 3, 2)
    assert len(choices) <= 38


def test_resident_target_covers_the_latency_within_an_sm() -> None:
    """Benchmark shape (D 128 bf16, 4 packed rows): 16 KiB in flight per block of 128 threads
    with 4 slots, 3 blocks for 40 KiB; 256 threads with 8 slots are held to one block by registers.
    A ring of 4 stages keeps 64 KiB in flight with one block, but takes more for 16 warps: three
    fit (64 KiB of ring, which the merge reuses, and 2 KiB of query rows each)."""
    _, fused = attention(decode_graph(1, 8192))
    a = attention_of(fused)
    assert shape(a, 128).bytes_in_flight(4) == 16 * 1024 and resident_target(shape(a, 128), 4) == 3
    assert resident_target(shape(a, 256), 8) == 1
    assert shape(a, 128).bytes_in_flight(4, 4) == shape(a, 128).ring_bytes(4, 4) == 64 * 1024
    assert shape(a, 128).block_shared_bytes(4, 4) == 66 * 1024 and resident_target(shape(a, 128), 4, 4) == 3


def test_gqa_rows_share_a_block_up_to_the_registers_and_split_into_row_groups_past_them() -> None:
    for hq, hk, sq, groups in ((32, 8, 1, 1), (8, 1, 1, 1), (32, 1, 1, 4), (8, 1, 5, 5)):
        _, fused = attention(PagedCase(b=1, hq=hq, hk=hk, sq=sq, d=128, dv=128).build())
        s = shape(attention_of(fused))
        assert s.rows_per_block * s.cv * s.vv <= 64 and s.row_groups == groups, (hq, hk, sq)
        assert s.shared_bytes() <= 46 * 1024
    _, fused = attention(PagedCase(b=1, hq=16, hk=1, d=128, dv=128).build())
    wide = shape(attention_of(fused), 256)  # 16 key groups: their merge buffers hold fewer rows
    assert wide.shared_bytes() <= 46 * 1024 and wide.rows_per_block * wide.row_groups >= 16


def test_a_split_adds_the_combine_kernel_and_its_scratch() -> None:
    case = PAGED_CASES["decode_gqa_4to1"]
    ir, fused = attention(case.build())
    program = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, {"path": "decode", "split": 5}))
    assert [k.name.rsplit("_", 1)[0] for k in program.kernels] == ["gd_sdpa_decode", "gd_sdpa_decode_combine"]
    rows = case.b * case.hq * case.sq * 5
    assert {s.name: s.bytes for s in program.scratch} == {"partial_o": 4 * rows * case.dv, "partial_lse": 4 * rows}
    assert program.kernels[0].grid[0] == case.b * case.hk * 5
    single = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, {"path": "decode", "split": 1}))
    assert len(single.kernels) == 1 and not single.scratch


SPLIT_CASES = {
    "long_decode": PagedCase(b=1, hq=32, hk=8, max_len=3000, page_size=64, d=128, dv=128),  # the heuristic splits
    "dense_decode_mqa": AttentionCase(b=1, hq=8, hk=1, sq=1, skv=2000, d=128, dv=128),
    "fp32_paged": PagedCase(b=2, hq=4, hk=1, data_type=DataType.FLOAT, d=40, dv=24),
    "alibi_bias_dense": AttentionCase(
        b=2,
        hq=4,
        hk=2,
        sq=2,
        skv=90,
        bias=(True, True, False, True),
        options={"use_causal_mask": True, "use_alibi_mask": True},
    ),
}


def test_every_decode_kernel_compiles_for_sm80_and_sm90() -> None:
    cases = (*PAGED_CASES.values(), *SPLIT_CASES.values(), *DECODE_CASES.values(), CASES["one_row_one_key"])
    specs = [case.build() for case in cases]
    assert any(heuristic_split(attention_of(attention(spec)[1]), 90) > 1 for spec in specs)
    report = compile_graphs([spec.validate() for spec in specs])
    assert not report.failures, "\n\n".join(report.failures)


CHOICES = [(threads, keys) for threads in THREADS_CHOICES for keys in KEYS_PER_LANE_CHOICES]
RING_CHOICES = [
    (threads, keys, stages)
    for threads in THREADS_CHOICES
    for keys in RING_KEYS_PER_LANE_CHOICES
    for stages in STAGES_CHOICES
    if stages
]
ALL_CHOICES = [(threads, keys, 0) for threads, keys in CHOICES] + RING_CHOICES


def test_every_threads_and_key_slots_choice_compiles_for_sm80_and_sm90() -> None:
    """Element loads, fp32, a bias with ALiBi, vLLM's page layout: each choice, each arch."""
    from codegen.nvrtc import compile_cubin

    for case in (SPLIT_CASES["fp32_paged"], SPLIT_CASES["alibi_bias_dense"], PAGED_CASES["decode_nhd_pools"]):
        ir, fused = attention(case.build())
        a = attention_of(fused)
        for threads, keys, stages in ALL_CHOICES:
            if stages and not fits(a, threads, keys, stages):
                continue
            tuning = {"path": "decode", "threads": threads, "keys_per_lane": keys, "split": 2, "stages": stages}
            for arch in (80, 90):
                for kernel in emitter(fused.family)(fused, EmitContext(ir, signature(ir), arch, tuning)).kernels:
                    compile_cubin(kernel.source, kernel.name, arch)


@pytest.mark.parametrize("arch", [80, 90])
def test_the_benchmark_shape_choices_compile_without_spills(arch: int) -> None:
    """benchmarks/attention.py --decode (Hq 32, Hk 8, D 128, bf16, 64-key pages): every threads,
    key slots and stages choice autotuning offers keeps its slots, O and scores in registers
    (every ring but 256 threads with 4 slots and 4 stages, over MAX_RING)."""
    ir, fused = attention(decode_graph(8, 32768))
    keys = ("threads", "keys_per_lane", "stages", "vectors_per_lane")
    cuda_cores = (c for c in candidates(fused, 90) if c["path"] == "decode")
    offered = {tuple(int(c[key]) for key in keys) for c in cuda_cores}  # type: ignore[call-overload]
    assert {choice[:3] for choice in offered} == set(ALL_CHOICES) - {(256, 4, 4)}
    # two vectors per lane double a slot and the merge buffers: 256 threads with 4 slots in 3
    # stages would be over MAX_RING, and 256 threads would pack 2 rows of the 4 (two row groups)
    assert {choice for choice in offered if choice[3] == 2} == {(128, 2, 3, 2), (128, 4, 3, 2)}
    assert shape(attention_of(fused), 256, 2).row_groups == 2
    assert shape(attention_of(fused), 256).ring_bytes(4, 4) > MAX_RING
    for choice in sorted(offered):
        tuning = {"path": "decode", **dict(zip(keys, choice))}
        (kernel, *_) = emitter(fused.family)(fused, EmitContext(ir, signature(ir), arch, tuning)).kernels
        report = ptxas_report(kernel, arch)
        assert re.findall(r"(\d+) bytes spill stores", report) == ["0"], (choice, report[-400:])


def test_the_default_is_a_ring_where_it_fits_without_more_row_groups() -> None:
    """Two vectors per lane at GQA 4:1, D 128 and 64; at 8:1 the register pipeline (two vectors per
    lane would split the 8 rows into two groups, reading K and V twice, and the merge buffers
    of 256 threads hold fewer rows); registers where rows are not 16-byte vectors."""
    cases = (
        (32, 8, 128, (128, 4, 3, 2)),
        (8, 2, 64, (128, 4, 3, 2)),
        (8, 1, 128, (128, 4, 0, 1)),
        (4, 2, 36, (128, 4, 0, 1)),
    )
    for hq, hk, d, want in cases:
        case = PagedCase(b=2, hq=hq, hk=hk, max_len=3000, d=d, dv=d, data_type=DataType.HALF)
        a = attention_of(attention(case.build())[1])
        default = default_config(a, 90)
        assert (default.threads, default.keys_per_lane, default.stages, default.vectors_per_lane) == want, (hq, hk, d)


def test_a_ring_on_rows_that_are_not_16_byte_vectors_is_refused_and_not_offered() -> None:
    case = PagedCase(b=2, hq=4, hk=2, max_len=40, d=36, dv=36, data_type=DataType.HALF)
    ir, fused = attention(case.build())
    assert all(c["stages"] == 0 for c in candidates(fused, 90))
    with pytest.raises(UnsupportedError, match=r"K 'k' or V 'v' are not 16-byte vectors"):
        emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, {"path": "decode", "stages": 3}))


# -- on the CPU ---------------------------------------------------------------------------------
EMULATED = {
    "decode_gqa_4to1": dataclasses.replace(PAGED_CASES["decode_gqa_4to1"], data_type=DataType.HALF, b=2, max_len=40),
    "decode_mqa_8to1": PagedCase(b=1, hq=8, hk=1, max_len=33, page_size=16, d=64, dv=64, data_type=DataType.HALF),
    "prefill_chunk": dataclasses.replace(PAGED_CASES["prefill_chunk_causal"], data_type=DataType.HALF, max_len=30),
    "window_d24": PagedCase(
        b=2,
        hq=2,
        hk=1,
        sq=3,
        max_len=21,
        page_size=4,
        d=24,
        dv=8,
        data_type=DataType.HALF,
        options={"use_causal_mask_bottom_right": True, "sliding_window_length": 5},
    ),
    "nhd_pools": PagedCase(
        b=2, hq=4, hk=2, max_len=24, page_size=8, d=32, dv=16, data_type=DataType.HALF, layout="nhd"
    ),
    "fp32_no_mask": PagedCase(
        b=2, hq=4, hk=2, max_len=19, page_size=8, d=16, dv=12, data_type=DataType.FLOAT, options={}
    ),
}


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize(("split", "aligned"), [(1, 1), (3, 0), (4, 1)], ids=["one_slice", "three_elements", "four"])
@pytest.mark.parametrize("case", sorted(EMULATED))
def test_decode_kernels_match_the_reference_on_the_cpu(
    case: str, split: int, aligned: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    paged = EMULATED[case]
    ir, fused = attention(paged.build())
    feeds = paged.feeds(seed=split)
    expected = reference.execute(ir, feeds)
    program = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, {"path": "decode", "split": split}))
    emulate_and_compare(fused, program, feeds, aligned, expected, tmp_path_factory)


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("split", [1, 3])
def test_dense_decode_with_bias_and_alibi_matches_the_reference_on_the_cpu(
    split: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Per-row heads inside a packed block: the bias and the ALiBi slope follow each row's head."""
    case = AttentionCase(
        b=2, hq=4, hk=2, sq=2, skv=37, d=16, dv=8, data_type=DataType.HALF, bias=(True, True, False, True),
        padding=True, options={"use_causal_mask_bottom_right": True, "use_alibi_mask": True},
    )  # fmt: skip
    ir, fused = attention(case.build())
    feeds = random_inputs(ir, split)
    expected = reference.execute(ir, feeds)
    program = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, {"path": "decode", "split": split}))
    emulate_and_compare(fused, program, feeds, 1, expected, tmp_path_factory)


# D 16 in fp16 takes 2 lanes per key: 256 threads with 8 slots step 1024 keys a batch
MANY_BATCHES = PagedCase(b=2, hq=4, hk=2, max_len=4500, page_size=32, d=16, dv=16, data_type=DataType.HALF)


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize(("threads", "keys"), CHOICES, ids=[f"t{t}_k{k}" for t, k in CHOICES])
@pytest.mark.parametrize("case", ["decode_mqa_8to1", "window_d24", "fp32_no_mask", "many_batches"])
def test_every_threads_and_key_slots_choice_matches_the_reference_on_the_cpu(
    case: str, threads: int, keys: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Slices shorter than a batch (the refills past the slice read nothing) and, many_batches,
    of 1.5 (256 threads, 8 slots) to 12 batches (128 threads, 2 slots), every slot refilled
    through a page looked up a batch ahead; 16-byte and element loads; each threads and key
    slots choice."""
    paged = MANY_BATCHES if case == "many_batches" else EMULATED[case]
    ir, fused = attention(paged.build())
    feeds = paged.feeds(seed=threads + keys)
    expected = reference.execute(ir, feeds)
    tuning = {"path": "decode", "threads": threads, "keys_per_lane": keys, "split": 1 + keys % 3}
    program = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, tuning))
    assert program.kernels[0].block == (threads, 1, 1) and f"KT = {keys};" in program.kernels[0].source
    emulate_and_compare(fused, program, feeds, keys % 4, expected, tmp_path_factory)


# a ring of one vector of K and V per slot: all but 256 threads with 4 slots in 4 stages (over
# MAX_RING); and lanes of 2 vectors, in a ring and in registers
FITTING_RINGS = [(*c, 1) for c in RING_CHOICES if c != (256, 4, 4)]
FITTING_RINGS += [(128, 2, 3, 2), (128, 4, 3, 2), (256, 2, 3, 2), (128, 2, 0, 2), (256, 8, 0, 2)]


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize(
    ("threads", "keys", "stages", "vectors"),
    FITTING_RINGS,
    ids=[f"t{t}_k{k}_s{r}_v{v}" for t, k, r, v in FITTING_RINGS],
)
@pytest.mark.parametrize("case", ["decode_mqa_8to1", "window_d24", "many_batches"])
def test_every_ring_choice_matches_the_reference_on_the_cpu(
    case: str, threads: int, keys: int, stages: int, vectors: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The shared-memory ring: slices shorter than the ring (its first stages hold keys past
    the slice) and, many_batches, many times longer (the stages reused, pages looked up a batch
    ahead); 16-byte copies and, unaligned, element loads stored into the ring; lanes of one and
    two vectors (D 16 fp16 at two: one lane per key)."""
    paged = MANY_BATCHES if case == "many_batches" else EMULATED[case]
    ir, fused = attention(paged.build())
    feeds = paged.feeds(seed=threads + keys + stages)
    expected = reference.execute(ir, feeds)
    tuning = {"path": "decode", "threads": threads, "keys_per_lane": keys, "split": 1 + stages % 3, "stages": stages}
    program = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, {**tuning, "vectors_per_lane": vectors}))
    (kernel, *_) = program.kernels
    s = shape(attention_of(fused), threads, vectors)
    assert kernel.shared_bytes == (s.block_shared_bytes(keys, stages) if stages else 0)
    assert f"L = {s.lanes}," in kernel.source
    emulate_and_compare(fused, program, feeds, (keys + stages) % 2, expected, tmp_path_factory)
