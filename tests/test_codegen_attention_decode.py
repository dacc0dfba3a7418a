"""The attention decode kernels (pack GQA, split-KV, combine): which problems take them, the
split heuristic and its tuning, every kernel compiling for sm_80 and sm_90, and the kernels run
on the CPU (tests/cpu_emulation.py) against the reference, paged and dense, at several splits."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from codegen.context import EmitContext
from codegen.emit import candidates, emitter
from codegen.families.attention_decode import MAX_SPLIT, MIN_KEYS_PER_SPLIT, heuristic_split, shape
from codegen.families.attention_problem import attention_of
from fusion_rules import Family, fuse
from graphdnn import reference
from graphdnn.arch import sm_count
from graphdnn.dtypes import DataType
from graphdnn.errors import UnsupportedError
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import signature
from tests import cpu_emulation
from tests.attention_cases import CASES, DECODE_CASES, PAGED_CASES, AttentionCase, PagedCase
from tests.compile_check import compile_graphs
from tests.gpu_check import relative_error


def attention(graph):  # type: ignore[no-untyped-def]
    ir = graph.validate()
    (fused,) = [f for f in fuse(ir).nodes if f.family is Family.ATTENTION]
    return ir, fused


@pytest.mark.parametrize("case", sorted(PAGED_CASES))
def test_paged_attention_runs_on_the_decode_kernel(case: str) -> None:
    ir, fused = attention(PAGED_CASES[case].build())
    program = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90))
    assert "_decode_" in program.kernels[0].name
    assert all(c["path"] == "decode" for c in candidates(fused, 90))


def test_few_query_rows_take_the_decode_kernel_and_more_the_flash_kernel() -> None:
    for sq, path in ((1, "_decode_"), (4, "_decode_"), (5, "_flash_")):
        ir, fused = attention(AttentionCase(sq=sq, skv=300, hq=8, hk=2).build())
        (kernel, *_) = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 80)).kernels
        assert path in kernel.name, sq
    _, fused = attention(AttentionCase(sq=1, skv=3000).build())
    paths = {str(c.get("path", "flash")) for c in candidates(fused, 90)}
    assert paths == {"decode", "flash", "wgmma"}  # a dense decode may still time the flash kernels


def test_a_flash_choice_on_a_paged_problem_says_it_needs_the_decode_kernel() -> None:
    ir, fused = attention(PAGED_CASES["decode_gqa_4to1"].build())
    with pytest.raises(UnsupportedError, match=r"paged KV cache runs on the decode kernel only"):
        emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, {"warps": 4, "block_n": 64, "m_tiles": 1}))


@pytest.mark.parametrize("split", [0, 65, "2"])
def test_a_bad_split_is_refused(split: object) -> None:
    ir, fused = attention(PAGED_CASES["decode_gqa_4to1"].build())
    with pytest.raises(UnsupportedError, match=r"split must be an integer from 1 to 64"):
        emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, {"path": "decode", "split": split}))


@pytest.mark.parametrize(("b", "hk", "skv"), [(1, 8, 8192), (1, 8, 32768), (4, 8, 16384), (8, 8, 300), (64, 8, 32768)])
def test_the_split_heuristic_fills_the_gpu_only_when_the_blocks_do_not(b: int, hk: int, skv: int) -> None:
    case = PagedCase(b=b, hq=4 * hk, hk=hk, max_len=skv, page_size=64, d=128, dv=128)
    _, fused = attention(case.build())
    a = attention_of(fused)
    blocks = b * hk * shape(a).row_groups
    split = heuristic_split(a, 90)
    if blocks >= 2 * sm_count(90):
        assert split == 1
    else:
        assert 1 <= split <= min(MAX_SPLIT, max(1, skv // MIN_KEYS_PER_SPLIT))
        assert split == MAX_SPLIT or split == max(1, skv // MIN_KEYS_PER_SPLIT) or blocks * split >= 2 * sm_count(90)
    choices = [c["split"] for c in candidates(fused, 90)]
    assert split in choices and 1 in choices


def test_gqa_rows_share_a_block_up_to_the_registers_and_split_into_row_groups_past_them() -> None:
    for hq, hk, sq, groups in ((32, 8, 1, 1), (8, 1, 1, 1), (32, 1, 1, 4), (8, 1, 5, 5)):
        _, fused = attention(PagedCase(b=1, hq=hq, hk=hk, sq=sq, d=128, dv=128).build())
        s = shape(attention_of(fused))
        assert s.rows_per_block * s.cv * s.vv <= 64 and s.row_groups == groups, (hq, hk, sq)
        assert s.shared_bytes() <= 46 * 1024


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
    build: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build.mkdir(exist_ok=True)
    got = cpu_emulation.run(fused, program, feeds, aligned, build)
    for name, want in expected.items():
        value = got[name].astype(np.float64)
        assert np.array_equal(np.isneginf(value), np.isneginf(want)), name
        finite = np.isfinite(want)
        assert relative_error(value[finite], want[finite].astype(np.float64)) < 2e-3, name


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
    build: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build.mkdir(exist_ok=True)
    got = cpu_emulation.run(fused, program, feeds, 1, build)
    for name, want in expected.items():
        value = got[name].astype(np.float64)
        assert np.array_equal(np.isneginf(value), np.isneginf(want)), name
        finite = np.isfinite(want)
        assert relative_error(value[finite], want[finite].astype(np.float64)) < 2e-3, name
