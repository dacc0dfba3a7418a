"""The tensor-core decode kernel (codegen/families/attention_decode_mma.py) without a GPU: which
problems take it by default and which refuse it (and why), its choices, its NVRTC compile for
sm_80 and sm_90, and its fragments, ring and merge on the CPU emulation (fp16: mma.sync,
ldmatrix and movmatrix exchanged between lanes with the PTX layouts) against the reference."""

from __future__ import annotations

import dataclasses
import re

import pytest

from benchmarks.attention import decode_graph
from codegen.context import EmitContext
from codegen.emit import candidates, emitter
from codegen.families.attention_decode_mma import (
    MMA_PATH,
    STAGES_CHOICES,
    TILES_CHOICES,
    WARPS_CHOICES,
    default_config,
    fits,
    heuristic_split,
    mma_choices,
    shared_bytes,
)
from codegen.families.attention_problem import attention_of
from codegen.nvrtc import compile_cubin
from graphdnn import reference
from graphdnn.dtypes import DataType
from graphdnn.errors import UnsupportedError
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import signature
from tests import cpu_emulation
from tests.attention_cases import AttentionCase, PagedCase
from tests.compile_check import ptxas_report
from tests.test_codegen_attention_decode import attention, emulate_and_compare

# fp16 (the emulation has no bf16): keys not a multiple of 16 nor of the page, B 1 and 3,
# GQA 4, MHA, MQA-like 8:1, D 16 to 64, paged (hnd and vLLM's nhd pools; pages of 8 keys, a
# lookup per chunk, and of 16 or 32, one per tile), a sliding window (its first tile rounded
# down) and dense with a bias, ALiBi and a causal bottom-right mask over 2 query rows
EMULATED: dict[str, PagedCase | AttentionCase] = {
    "gqa4_b3": PagedCase(b=3, hq=8, hk=2, max_len=75, page_size=16, d=32, dv=32, data_type=DataType.HALF),
    "mha_b1": PagedCase(b=1, hq=2, hk=2, max_len=53, page_size=8, d=16, dv=16, data_type=DataType.HALF),
    "mqa8_d64": PagedCase(b=2, hq=8, hk=1, max_len=99, page_size=32, d=64, dv=64, data_type=DataType.HALF),
    "nhd_dv16": PagedCase(
        b=2, hq=4, hk=2, max_len=40, page_size=8, d=32, dv=16, data_type=DataType.HALF, layout="nhd"
    ),
    "window_20": PagedCase(
        b=2, hq=8, hk=2, max_len=90, page_size=16, d=32, dv=32, data_type=DataType.HALF,
        options={"use_causal_mask_bottom_right": True, "sliding_window_length": 20},
    ),
    "dense_bias_alibi": AttentionCase(
        b=2, hq=4, hk=2, sq=2, skv=37, d=16, dv=16, data_type=DataType.HALF, bias=(True, True, False, True),
        padding=True, options={"use_causal_mask_bottom_right": True, "use_alibi_mask": True},
    ),
}  # fmt: skip


def program(case: PagedCase | AttentionCase, tuning: dict[str, object], arch: int = 90):  # type: ignore[no-untyped-def]
    ir, fused = attention(case.build())
    return ir, fused, emitter(fused.family)(fused, EmitContext(ir, signature(ir), arch, tuning))


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize(
    ("warps", "tiles", "stages", "split", "aligned"),
    [(4, 1, 3, 1, 1), (2, 2, 2, 3, 0), (8, 1, 2, 2, 1), (2, 1, 2, 1, 1)],
    ids=["w4_t1_s3", "w2_t2_s2_split3_elements", "w8_s2_split2", "w2_s2"],
)
@pytest.mark.parametrize("case", sorted(EMULATED))
def test_the_tensor_core_decode_kernel_matches_the_reference_on_the_cpu(
    case: str, warps: int, tiles: int, stages: int, split: int, aligned: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Slices shorter and longer than a ring; 16-byte copies and (aligned 0) element loads."""
    attention_case = EMULATED[case]
    tuning = {"path": MMA_PATH, "warps": warps, "tiles": tiles, "stages": stages, "split": split}
    ir, fused, fused_program = program(attention_case, tuning)
    seed = warps + tiles + stages
    feeds = attention_case.feeds(seed) if isinstance(attention_case, PagedCase) else random_inputs(ir, seed)
    expected = reference.execute(ir, feeds)
    assert "_decode_mma_" in fused_program.kernels[0].name and len(fused_program.kernels) == (1 if split == 1 else 2)
    emulate_and_compare(fused, fused_program, feeds, aligned, expected, tmp_path_factory)


@pytest.mark.parametrize("arch", [80, 90])
def test_the_tensor_core_decode_kernel_compiles_for_sm80_and_sm90(arch: int) -> None:
    """bf16 at the benchmark's shape (paged, D 128) and fp16 dense with a bias, ALiBi and D 64."""
    dense = dataclasses.replace(EMULATED["dense_bias_alibi"], d=64, dv=64)  # type: ignore[type-var]
    for graph in (decode_graph(2, 4096), dense.build()):
        ir, fused = attention(graph)
        kernels = emitter(fused.family)(fused, EmitContext(ir, signature(ir), arch, {})).kernels
        assert "_decode_mma_" in kernels[0].name
        for kernel in kernels:
            compile_cubin(kernel.source, kernel.name, arch)


def test_the_benchmark_shape_choices_compile_without_spills() -> None:
    """Every warps, tiles and stages choice offered at the benchmark's shape (Hq 32, Hk 8, D 128,
    bf16, 64-key pages) keeps its fragments and accumulators in registers on sm_90."""
    ir, fused = attention(decode_graph(8, 32768))
    keys = ("warps", "tiles", "stages")
    offered = {tuple(int(c[k]) for k in keys) for c in mma_choices(attention_of(fused), 90)}  # type: ignore[call-overload]
    assert len(offered) == 7
    for choice in sorted(offered):
        tuning = {"path": MMA_PATH, **dict(zip(keys, choice))}
        (kernel, *_) = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, tuning)).kernels
        report = ptxas_report(kernel, 90)
        assert re.findall(r"(\d+) bytes spill stores", report) == ["0"], (choice, report[-400:])


def test_the_default_takes_the_tensor_cores_where_they_apply() -> None:
    """bf16 GQA decode with one row group; not fp32, D 72, dropout, 16 packed rows, sm_75."""
    _, fused, default = program(PagedCase(b=2, hq=32, hk=8, d=128, dv=128), {})
    assert "_decode_mma_" in default.kernels[0].name
    assert candidates(fused, 90)[0]["path"] == MMA_PATH
    others = {
        "fp32": PagedCase(data_type=DataType.FLOAT),
        "d72": PagedCase(d=72, dv=72),
        "dropout": PagedCase(dropout=0.1),
        "16_rows": PagedCase(hq=16, hk=1),
    }
    for name, case in others.items():
        *_, other = program(case, {})
        assert "_decode_mma_" not in other.kernels[0].name, name
    *_, old = program(PagedCase(), {}, arch=75)
    assert "_decode_mma_" not in old.kernels[0].name


@pytest.mark.parametrize(
    ("case", "tuning", "message"),
    [
        (PagedCase(data_type=DataType.FLOAT), {}, r"K and V must be fp16 or bf16 \(K float"),
        (PagedCase(d=72, dv=72), {}, r"head dims must be multiples of 16 up to 256 \(D 72"),
        (PagedCase(dropout=0.1), {}, "takes no dropout"),
        (PagedCase(), {"warps": 3}, r"warps must be an integer one of \(2, 4, 8\)"),
        (PagedCase(), {"blocks": 3}, "has no choice blocks"),
        (PagedCase(d=256, dv=256), {"warps": 8, "tiles": 2, "stages": 4}, "bytes of shared memory, over"),
    ],
    ids=["fp32", "d72", "dropout", "warps", "unknown", "shared"],
)
def test_a_bad_tensor_core_decode_choice_is_refused(case: PagedCase, tuning: dict[str, object], message: str) -> None:
    with pytest.raises(UnsupportedError, match=message):
        program(case, {"path": MMA_PATH, **tuning})


def test_the_choices_fit_and_the_split_fills_the_gpu_only_when_the_blocks_do_not() -> None:
    """Every offered choice fits two blocks per SM; B 1 splits 8 kv heads into ~33 slices on an
    H100's 132 SMs, B 8 at 8k into 4, and 264 blocks need none."""
    for b, skv, want in ((1, 32768, 33), (8, 8192, 4), (33, 8192, 1)):
        a = attention_of(attention(decode_graph(b, skv))[1])
        assert default_config(a, 90).split == want, (b, skv)
        choices = mma_choices(a, 90)
        assert choices[0] == default_config(a, 90).choice() and len(choices) == len({str(c) for c in choices})
        for choice in choices:
            warps, tiles, stages = (int(choice[k]) for k in ("warps", "tiles", "stages"))  # type: ignore[call-overload]
            assert warps in WARPS_CHOICES and tiles in TILES_CHOICES and stages in STAGES_CHOICES
            assert fits(a, warps, tiles, stages) and 2 * shared_bytes(a, warps, tiles, stages) <= 227 * 1024
            assert int(choice["split"]) in (  # type: ignore[call-overload]
                heuristic_split(a, 90, warps, tiles, stages),
                2 * heuristic_split(a, 90, warps, tiles, stages),
            )
