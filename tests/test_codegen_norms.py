"""Row-norm (layer/RMS norm, add+norm) and group-norm (group/instance norm) kernels.

CPU: every case is fused, emitted and compiled with NVRTC for sm_80 and sm_90; the test
checks the launch shape, the parameter bindings and which path the kernel takes (16-byte
vectors, element accesses, a row walked in chunks). GPU (`gpu` marker): the same cases run
through ``check_on_gpu`` against the reference, plus misaligned pointers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest

import graphdnn as gd
from codegen import Kernel, ParamKind, compile_cubin, emit_partition
from codegen.context import EmitContext
from codegen.families import groupnorm, rownorm, rownorm_launch, rownorm_layout
from fusion_rules import Family, FusedNode, fuse
from graphdnn.arch import sm_count
from graphdnn.errors import GraphError
from graphdnn.ir import Tensor
from graphdnn.random_inputs import random_inputs
from tests.compile_check import ptxas_report

ARCHS = (80, 90)
EPS = 1e-5


@dataclass(frozen=True)
class Case:
    """A norm graph: the op, its input and scale layout, what surrounds it, what the kernel should do."""

    norm: str  # layernorm, rmsnorm, groupnorm, instancenorm
    dtype: str
    dims: tuple[int, ...]
    scale_dims: tuple[int, ...] = ()  # row norms: where the scale is not 1 are the normalized axes
    layout: str = "rows"  # rows (packed row-major), nhwc, or "sliced" (each row padded by 3 elements)
    residual: bool = False  # add (the residual) before the norm, the sum written
    epilogue: tuple[str, ...] = ()  # gelu, relu, swish, scale_bias, stats (y * inv_variance), add (full-size)
    training: bool = False
    runtime_epsilon: bool = False
    groups: int = 1
    path: str = "vector"  # vector (16-byte accesses when aligned) or scalar (element accesses only)
    chunked: bool = False  # the row is walked in chunks (too long for registers)

    def __str__(self) -> str:
        parts = [
            "add" if self.residual else "",
            self.norm,
            *self.epilogue,
            self.dtype,
            "x".join(map(str, self.dims)),
            self.layout,
            "train" if self.training else "",
            "rteps" if self.runtime_epsilon else "",
        ]
        return "-".join(p for p in parts if p)


ROW_CASES = [
    Case("layernorm", "bfloat16", (4096, 1024), (1, 1024), epilogue=("gelu",)),
    Case("rmsnorm", "bfloat16", (4096, 4096), (1, 4096), residual=True),
    Case("layernorm", "half", (3, 1000), (1, 1000), residual=True, epilogue=("scale_bias", "relu"), training=True),
    Case("rmsnorm", "float", (3, 7), (1, 7), epilogue=("relu",), path="scalar"),
    Case("layernorm", "float", (1, 1), (1, 1), training=True, path="scalar"),
    Case("layernorm", "bfloat16", (3, 65536), (1, 65536), training=True, chunked=True),
    Case("rmsnorm", "half", (1, 65536), (1, 65536), residual=True, training=True, chunked=True),
    Case("layernorm", "half", (4096, 64), (1, 64), epilogue=("gelu",)),
    Case("layernorm", "bfloat16", (4096, 2048), (1, 2048), epilogue=("relu",)),
    Case("layernorm", "float", (2, 64, 5, 7), (1, 64, 1, 1), layout="nhwc", training=True),
    Case("layernorm", "bfloat16", (2, 64, 5, 7), (1, 64, 1, 1), training=True, path="scalar"),
    Case("layernorm", "half", (2, 16, 3, 5), (1, 16, 3, 5), layout="nhwc", epilogue=("relu",)),
    Case("rmsnorm", "float", (4, 6, 5, 8), (1, 6, 1, 8), path="scalar"),
    Case("layernorm", "bfloat16", (4, 5, 96), (96,), residual=True, epilogue=("stats", "add"), training=True),
    Case("rmsnorm", "bfloat16", (37, 4096), (1, 4096), runtime_epsilon=True, epilogue=("scale_bias",)),
    Case("layernorm", "double", (5, 300), (1, 300)),
    Case("layernorm", "bfloat16", (3, 1000), (1, 1000), layout="sliced", epilogue=("gelu",), path="scalar"),
]

GROUP_CASES = [
    Case("groupnorm", "half", (2, 64, 5, 7), layout="nhwc", groups=8, training=True, epilogue=("relu",)),
    Case("groupnorm", "bfloat16", (3, 32, 9, 11), groups=1, epilogue=("swish",)),
    Case("instancenorm", "float", (2, 5, 33)),
    Case("instancenorm", "half", (2, 8, 3, 4, 5), layout="nhwc", training=True),
    Case("groupnorm", "float", (3, 12), groups=6, runtime_epsilon=True, epilogue=("scale_bias",)),
    Case("groupnorm", "bfloat16", (1, 32, 64, 64), layout="nhwc", groups=32),
]


# -- building the graphs through the public API ------------------------------------------------------
def _strides(case: Case) -> list[int]:
    if case.layout == "nhwc":
        return list(gd.nhwc_strides(case.dims))
    if case.layout == "sliced":
        return [*gd.packed_strides((*case.dims[:-1], case.dims[-1] + 3))[:-1], 1]
    return list(gd.packed_strides(case.dims))


def _affine_dims(case: Case) -> tuple[int, ...]:
    if case.norm in ("groupnorm", "instancenorm"):
        return (1, case.dims[1], *[1] * (len(case.dims) - 2))
    return case.scale_dims


def build(case: Case) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(str(case), io_data_type=case.dtype, intermediate_data_type="float")
    if case.dtype == "double":
        g = gd.OperationGraphSpec(str(case), io_data_type="double", intermediate_data_type="double")
    x = g.tensor(list(case.dims), stride=_strides(case), name="x")
    affine = _affine_dims(case)
    scale = g.tensor(list(affine), name="scale")
    bias = g.tensor(list(affine), name="bias") if case.norm != "rmsnorm" else None
    epsilon = g.tensor([1], data_type="float", is_pass_by_value=True, name="eps") if case.runtime_epsilon else EPS
    if case.residual:
        x = g.add(x, g.tensor(list(case.dims), stride=_strides(case), name="residual"), name="sum")
        x.set_output(True)
    phase = "training" if case.training else "inference"
    outputs: list[gd.TensorSpec | None]
    if case.norm == "layernorm":
        outputs = g.layernorm(phase, x, scale, bias, epsilon)
    elif case.norm == "rmsnorm":
        outputs = g.rmsnorm(phase, x, scale, None, epsilon)
    elif case.norm == "instancenorm":
        outputs = g.instancenorm(phase, x, scale, bias, epsilon)
    else:
        outputs = g.groupnorm(x, scale, bias, epsilon, case.groups, phase)
    y, *stats = outputs
    assert y is not None
    for name in case.epilogue:
        y = _epilogue_op(g, case, name, y, stats)
    y.set_output(True)
    for t in stats:
        if t is not None and "stats" not in case.epilogue:
            t.set_output(True)
    return g


def _epilogue_op(
    g: gd.OperationGraphSpec, case: Case, name: str, y: gd.TensorSpec, stats: list[gd.TensorSpec | None]
) -> gd.TensorSpec:
    if name == "gelu":
        return g.gelu_approx_tanh(y)
    if name == "relu":
        return g.relu(y)
    if name == "swish":
        return g.swish(y, 1.5)
    if name == "scale_bias":
        per_feature = list(_affine_dims(case))
        return g.bias(g.scale(y, g.tensor(per_feature, name="w")), g.tensor(per_feature, name="c"))
    if name == "stats":
        inv = stats[-1]
        assert inv is not None
        return g.mul(y, inv)
    assert name == "add"
    return g.add(y, g.tensor(list(case.dims), stride=_strides(case), name="skip"))


def norm_node(case: Case, arch: int = 90) -> FusedNode:
    """The one fused node of the case's graph (every member fused into it)."""
    partition = fuse(build(case), arch=arch)
    assert len(partition.nodes) == 1, partition.describe()
    return partition.nodes[0]


def kernels(case: Case, arch: int) -> tuple[FusedNode, list[Kernel]]:
    partition = fuse(build(case), arch=arch)
    assert len(partition.nodes) == 1, partition.describe()
    (program,) = emit_partition(partition, arch)
    return partition.nodes[0], list(program.kernels)


# -- CPU: emit and compile -----------------------------------------------------------------------------
def _check_launch(fused: FusedNode, kernel: Kernel) -> None:
    threads = kernel.block[0] * kernel.block[1] * kernel.block[2]
    assert 32 <= threads <= 1024 and threads % 32 == 0, kernel.block
    assert 1 <= kernel.grid[0] <= 2**31 - 1 and kernel.grid[1:] == (1, 1)
    assert kernel.shared_bytes <= 48 * 1024
    assert f"__launch_bounds__({threads})" in kernel.source
    bound = [p.tensor for p in kernel.params if p.kind in (ParamKind.TENSOR, ParamKind.SCALAR)]
    assert bound == [t.id for t in (*fused.inputs, *fused.outputs)]
    for param, t in zip(kernel.params, (*fused.inputs, *fused.outputs)):
        assert param.kind is (ParamKind.SCALAR if t.is_pass_by_value else ParamKind.TENSOR)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", ROW_CASES, ids=str)
def test_row_norm_kernel_compiles(case: Case, arch: int) -> None:
    fused, (kernel,) = kernels(case, arch)
    assert fused.family is Family.ROW_NORM
    assert (fused.prologue is not None) == case.residual
    _check_launch(fused, kernel)
    assert [p.kind for p in kernel.params].count(ParamKind.ALIGNED) == 1
    vectorized = "if (aligned)" in kernel.source
    assert vectorized == (case.path == "vector")
    if vectorized:
        assert kernel.alignment >= 16 and f"gd::load_vec<{_ctype(case)}, {16 // _itemsize(case)}>" in kernel.source
    assert ("#pragma unroll 1" in kernel.source) == case.chunked
    config = rownorm_launch.heuristic(rownorm_layout.analyze(fused))
    assert kernel.block[0] == config.threads and kernel.grid[0] == -(
        -rownorm_layout.analyze(fused).rows // config.rows_per_block
    )
    compile_cubin(kernel.source, kernel.name, arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", GROUP_CASES, ids=str)
def test_group_norm_kernel_compiles(case: Case, arch: int) -> None:
    fused, (kernel,) = kernels(case, arch)
    assert fused.family is Family.GROUP_NORM
    _check_launch(fused, kernel)
    sets = case.dims[0] * (case.groups if case.norm == "groupnorm" else case.dims[1])
    assert kernel.grid[0] == sets
    compile_cubin(kernel.source, kernel.name, arch)


def _ctype(case: Case) -> str:
    return {"bfloat16": "__nv_bfloat16", "half": "__half", "float": "float", "double": "double"}[case.dtype]


def _itemsize(case: Case) -> int:
    return {"bfloat16": 2, "half": 2, "float": 4, "double": 8}[case.dtype]


# -- CPU: geometry and launch choices ------------------------------------------------------------------
def test_rows_and_packing_follow_the_layout() -> None:
    """NHWC rows over C are contiguous (vectors); the same norm on NCHW reaches C with stride H*W."""
    nhwc = rownorm_layout.analyze(norm_node(Case("layernorm", "float", (2, 64, 5, 7), (1, 64, 1, 1), layout="nhwc")))
    nchw = rownorm_layout.analyze(norm_node(Case("layernorm", "float", (2, 64, 5, 7), (1, 64, 1, 1))))
    assert (nhwc.rows, nhwc.width, nhwc.vec) == (70, 64, 4)
    assert (nchw.rows, nchw.width, nchw.vec) == (70, 64, 1)
    assert nhwc.x.id in nhwc.packed and nchw.x.id not in nchw.packed
    # Over (C, H, W) of NHWC the row is packed in (H, W, C) order: x is, the row-major scale is not.
    chw = norm_node(Case("layernorm", "half", (2, 16, 3, 5), (1, 16, 3, 5), layout="nhwc"))
    layout = rownorm_layout.analyze(chw)
    scale = chw.anchor.input("scale") if chw.anchor else None
    assert scale is not None and layout.x.id in layout.packed and scale.id not in layout.packed
    assert layout.vec == 8
    sliced = rownorm_layout.analyze(norm_node(Case("layernorm", "bfloat16", (3, 1000), (1, 1000), layout="sliced")))
    assert sliced.vec == 1  # rows 1003 elements apart cannot all start on 16 bytes


@pytest.mark.parametrize(
    ("dims", "dtype", "expected"),
    [
        ((16384, 4096), "bfloat16", (128, 1, 4)),  # 4 vectors of 8 per thread, a row per 128 threads
        ((4096, 1024), "bfloat16", (32, 4, 4)),  # a warp per row, 4 rows per block
        ((4096, 64), "half", (8, 16, 1)),  # sub-warp groups for short rows, widened to fill the GPU
        ((65536, 64), "float", (4, 32, 4)),  # sub-warp groups holding 4 vectors each
        ((3, 4096), "bfloat16", (512, 1, 1)),  # few rows: wider groups spread the row
        ((3, 65536), "bfloat16", (1024, 1, 2)),  # too long for registers: chunks of 16384
    ],
)
def test_heuristic_choices(dims: tuple[int, int], dtype: str, expected: tuple[int, int, int]) -> None:
    layout = rownorm_layout.analyze(norm_node(Case("layernorm", dtype, dims, (1, dims[1]))))
    config = rownorm_launch.heuristic(layout)
    assert (config.threads_per_row, config.rows_per_block, config.vectors_per_thread) == expected
    assert config.chunks(layout) == (4 if dims[1] == 65536 else 1)


def test_every_candidate_emits_a_distinct_kernel_that_compiles() -> None:
    case = Case("rmsnorm", "bfloat16", (4096, 4096), (1, 4096), residual=True)
    fused = norm_node(case)
    choices = rownorm.candidates(fused, 90)
    assert choices[0] == rownorm_launch.heuristic(rownorm_layout.analyze(fused)).as_dict() and 3 <= len(choices) <= 12
    partition = fuse(build(case))
    sources = set()
    for choice in choices:
        (program,) = emit_partition(partition, 90, {fused.name: choice})
        (kernel,) = program.kernels
        assert kernel.block[0] == choice["threads_per_row"] * choice["rows_per_block"] <= 1024
        assert kernel.block[0] % 32 == 0
        sources.add(kernel.source)
    assert len(sources) == len(choices)
    compile_cubin(kernel.source, kernel.name, 90)  # the last (widest groups)


def test_group_norm_candidates_and_tuning() -> None:
    fused = norm_node(GROUP_CASES[5])
    choices = groupnorm.candidates(fused, 90)
    assert choices[0] == {"threads": 512} and {"threads": 1024} in choices
    partition = fuse(build(GROUP_CASES[5]))
    (program,) = emit_partition(partition, 90, {fused.name: {"threads": 128}})
    assert program.kernels[0].block == (128, 1, 1)
    with pytest.raises(GraphError, match="power of two"):
        emit_partition(partition, 90, {fused.name: {"threads": 96}})


@pytest.mark.parametrize(
    ("tuning", "message"),
    [
        ({"threads_per_row": 48, "rows_per_block": 2, "vectors_per_thread": 1}, "power of two"),
        ({"threads_per_row": 8, "rows_per_block": 2, "vectors_per_thread": 1}, "multiple of 32"),
        ({"threads_per_row": 32, "rows_per_block": 1, "vectors_per_thread": 9}, "vectors_per_thread"),
        ({"threads": 128}, "unknown keys"),
    ],
)
def test_bad_row_norm_tuning_is_refused(tuning: dict[str, int], message: str) -> None:
    fused = norm_node(ROW_CASES[0])
    ir = fuse(build(ROW_CASES[0])).graph
    with pytest.raises(GraphError, match=message):
        rownorm.emit(fused, EmitContext(ir, "sig", 90, dict(tuning)))


# -- CPU: pipelined rows (resident grid, next row prefetched, columns held) ----------------------------
def _tuning(threads_per_row: int, rows_per_block: int, vectors: int, blocks_per_sm: int) -> dict[str, int]:
    return {
        "threads_per_row": threads_per_row,
        "rows_per_block": rows_per_block,
        "vectors_per_thread": vectors,
        "blocks_per_sm": blocks_per_sm,
    }


# Each case with a pipelined choice: awkward shapes where the prefetch runs (more row groups than
# blocks), or deliberately cannot (a single row; rows in chunks, which walk the resident grid plainly).
PIPELINED_CASES = [
    # D = 1000 < 32 * 4 * 8 (j < WIDTH guard), 3001 rows (last group of 4 partial), 751 groups on 132 blocks
    (Case("layernorm", "bfloat16", (3001, 1000), (1, 1000), epilogue=("gelu",)), _tuning(32, 4, 4, 1)),
    (Case("rmsnorm", "bfloat16", (4096, 1024), (1, 1024), residual=True), _tuning(32, 4, 4, 4)),
    # a single wave on an H100 (1024 groups, 8 x 132 blocks resident): the plain loop, 64 registers
    (Case("layernorm", "bfloat16", (4096, 1024), (1, 1024), epilogue=("gelu",)), _tuning(32, 4, 4, 8)),
    (
        Case("layernorm", "half", (999, 2048), (1, 2048), residual=True, epilogue=("stats", "add"), training=True),
        _tuning(64, 2, 4, 2),
    ),
    (Case("rmsnorm", "float", (1, 4096), (1, 4096)), _tuning(128, 1, 8, 2)),  # a single row: one block, no prefetch
    (Case("layernorm", "bfloat16", (3, 65536), (1, 65536), training=True, chunked=True), _tuning(1024, 1, 2, 1)),
    (Case("layernorm", "float", (15, 64, 33, 35), (1, 64, 1, 1), layout="nhwc", training=True), _tuning(4, 32, 4, 2)),
    (
        Case("layernorm", "bfloat16", (2001, 1000), (1, 1000), layout="sliced", epilogue=("gelu",)),
        _tuning(128, 1, 8, 2),
    ),
    (Case("layernorm", "double", (700, 300), (1, 300)), _tuning(32, 4, 5, 1)),
    # D = 1001, not a multiple of 8 halves: the element path is the main one, and pipelined
    (Case("rmsnorm", "half", (2001, 1001), (1, 1001), residual=True, epilogue=("relu",)), _tuning(128, 1, 8, 2)),
    (
        Case("rmsnorm", "bfloat16", (1001, 4096), (1, 4096), runtime_epsilon=True, epilogue=("scale_bias",)),
        _tuning(128, 1, 4, 2),
    ),
]


def _pipelined_id(item: tuple[Case, dict[str, int]]) -> str:
    return f"{item[0]}-{'-'.join(map(str, item[1].values()))}"


def tuned_kernel(case: Case, tuning: dict[str, int], arch: int) -> tuple[FusedNode, Kernel]:
    partition = fuse(build(case), arch=arch)
    (fused,) = partition.nodes
    (program,) = emit_partition(partition, arch, {fused.name: tuning})
    (kernel,) = program.kernels
    return fused, kernel


PREFETCH = "the next rows' loads"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("item", PIPELINED_CASES, ids=_pipelined_id)
def test_pipelined_kernel_compiles(item: tuple[Case, dict[str, int]], arch: int) -> None:
    case, tuning = item
    fused, kernel = tuned_kernel(case, tuning, arch)
    layout = rownorm_layout.analyze(fused)
    config = rownorm_launch.configured(layout, tuning)
    threads, blocks = config.threads, config.blocks_per_sm
    assert kernel.block == (threads, 1, 1) and f"__launch_bounds__({threads}, {blocks})" in kernel.source
    groups, sms = -(-layout.rows // config.rows_per_block), sm_count(arch)
    assert kernel.grid == (min(groups, blocks * sms), 1, 1)
    # The main path prefetches where a block has a next row held in registers; the misaligned
    # fallback never does.
    pipelined = not case.chunked and groups > blocks * sms
    assert config.pipelined(layout, sms) == pipelined and kernel.source.count(PREFETCH) == pipelined
    assert ("gd::hold(" in kernel.source) == config.holds_columns(layout, sms)
    compile_cubin(kernel.source, kernel.name, arch)


def test_pipelined_paths_and_held_columns() -> None:
    """The vector path prefetches and holds the scale and bias; the element path behind it walks
    plainly; a layout without vectors pipelines its element path."""
    fused, kernel = tuned_kernel(*PIPELINED_CASES[0], 90)
    vector_path, element_path = kernel.source.split('extern "C"')[1].split("} else {  // a pointer is not aligned")
    assert PREFETCH in vector_path and "the first rows' loads" in vector_path
    assert PREFETCH not in element_path and "col" not in element_path
    scale, bias = (fused.anchor.input(role) for role in ("scale", "bias")) if fused.anchor else (None, None)
    assert scale is not None and bias is not None
    assert rownorm_layout.analyze(fused).columns == tuple(sorted((scale.id, bias.id)))
    assert vector_path.count("gd::hold(") == 2 and "gd::load_vec<__nv_bfloat16, 8>(t1 + j)" in vector_path
    _, sliced = tuned_kernel(*next(item for item in PIPELINED_CASES if item[0].layout == "sliced"), 90)
    assert "if (aligned)" not in sliced.source and PREFETCH in sliced.source


def test_pipelined_candidates_where_rows_fit_and_outnumber_the_blocks() -> None:
    """Offered for many rows held in registers and read as vectors; not for long rows (chunks),
    few rows, or rows whose elements are strided (nothing to prefetch)."""
    big = norm_node(Case("layernorm", "bfloat16", (16384, 4096), (1, 4096), epilogue=("gelu",)))
    choices = rownorm.candidates(big, 90)
    pipelined = [c for c in choices if c["blocks_per_sm"]]
    assert pipelined and choices[0]["blocks_per_sm"] == 0 and len(choices) == len({str(c) for c in choices})
    for choice in pipelined:
        config = rownorm_launch.configured(rownorm_layout.analyze(big), choice)
        assert config.threads * config.blocks_per_sm // 32 in rownorm_launch.RESIDENT_WARPS
        assert config.chunks(rownorm_layout.analyze(big)) == 1
    for case in [
        Case("layernorm", "bfloat16", (3, 65536), (1, 65536)),
        Case("rmsnorm", "bfloat16", (37, 4096), (1, 4096)),
        Case("layernorm", "float", (64, 64, 28, 28), (1, 64, 1, 1)),  # NCHW: C strided
    ]:
        assert not [c for c in rownorm.candidates(norm_node(case), 90) if c["blocks_per_sm"]], case


def test_single_wave_candidate_for_a_grid_just_over_one_wave() -> None:
    """4096 rows of 1024: 1024 blocks of 4 rows, more than 7 per SM of an H100 at ~70 registers;
    the single-wave choice asks for 8 per SM (64 registers) and leaves each block its one group.
    16384 rows of 4096 are many waves: every resident choice there is pipelined."""
    case = Case("layernorm", "bfloat16", (4096, 1024), (1, 1024), epilogue=("gelu",))
    choices = rownorm.candidates(norm_node(case), 90)
    assert _tuning(32, 4, 4, 8) in choices and choices[0] == _tuning(32, 4, 4, 0)
    _, kernel = tuned_kernel(case, _tuning(32, 4, 4, 8), 90)
    assert kernel.grid == (1024, 1, 1) and "__launch_bounds__(128, 8)" in kernel.source
    assert PREFETCH not in kernel.source and "gd::hold(" not in kernel.source
    big = norm_node(Case("layernorm", "bfloat16", (16384, 4096), (1, 4096), epilogue=("gelu",)))
    layout = rownorm_layout.analyze(big)
    resident = [rownorm_launch.configured(layout, c) for c in rownorm.candidates(big, 90) if c["blocks_per_sm"]]
    assert resident and all(config.pipelined(layout, 132) for config in resident)


BENCHMARK_CASES = [
    Case("layernorm", "bfloat16", (16384, 4096), (1, 4096), epilogue=("gelu",)),
    Case("rmsnorm", "bfloat16", (16384, 4096), (1, 4096), residual=True),
    Case("layernorm", "bfloat16", (4096, 1024), (1, 1024), epilogue=("gelu",)),
    Case("rmsnorm", "bfloat16", (4096, 1024), (1, 1024), residual=True),
]


@pytest.mark.parametrize("case", BENCHMARK_CASES, ids=str)
def test_resident_candidates_do_not_spill(case: Case) -> None:
    """__launch_bounds__ caps a resident grid's registers at the register estimate's choice:
    an estimate too low would spill to local memory (held columns cannot be re-derived)."""
    fused = norm_node(case)
    partition = fuse(build(case))
    for choice in [c for c in rownorm.candidates(fused, 90) if c["blocks_per_sm"]]:
        (program,) = emit_partition(partition, 90, {fused.name: choice})
        report = ptxas_report(program.kernels[0], 90)
        assert re.findall(r"(\d+) bytes spill stores", report) == ["0"], (choice, report[-400:])


def _vector_path(kernel: Kernel) -> str:
    return kernel.source.split('extern "C"')[1].split("} else {  // a pointer is not aligned")[0]


def test_stored_values_are_rounded_once() -> None:
    """An output stores its exact value (rounding a rounded value again is the identity), so a
    bf16 output costs one conversion; the residual sum is rounded for the statistics and stored."""
    (program,) = emit_partition(fuse(build(ROW_CASES[0])), 90)
    source = _vector_path(program.kernels[0])
    assert "gd::from<__nv_bfloat16>(exact" in source and "gd::element<float>(a" in source
    (program,) = emit_partition(fuse(build(ROW_CASES[1])), 90)
    source = _vector_path(program.kernels[0])
    assert "x[k * 8 + e] = v" in source and source.count("gd::from<__nv_bfloat16>(exact") == 2


def test_fast_gelu_constants_fold_the_tanh_form() -> None:
    """gd::gelu_tanh<float> computes x / (1 + 2^(x (A + B x^2))): the same function as
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (checked here with the header's constants)."""
    from pathlib import Path

    header = (Path(rownorm.__file__).parent.parent / "include" / "graphdnn.cuh").read_text()
    folded = header[header.index("float gelu_tanh<float>") :]

    def constant(name: str) -> float:
        found = re.search(rf"constexpr float {name} = \(float\)\(([-0-9.* ]+)\);", folded)
        assert found is not None, name
        return float(np.prod([float(factor) for factor in found.group(1).split("*")]))

    a, b = constant("A"), constant("B")
    x = np.linspace(-12, 12, 2001)
    folded_gelu = x / (1 + np.exp2(x * (a + b * x * x)))
    tanh_gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(folded_gelu, tanh_gelu, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("tuning", "message"),
    [
        (_tuning(32, 4, 4, -1), "blocks_per_sm must be 0 to 32"),
        (_tuning(32, 4, 4, 33), "blocks_per_sm must be 0 to 32"),
        (_tuning(256, 4, 1, 4), "at most 2048"),
    ],
)
def test_bad_pipelined_tuning_is_refused(tuning: dict[str, int], message: str) -> None:
    fused = norm_node(ROW_CASES[0])
    ir = fuse(build(ROW_CASES[0])).graph
    with pytest.raises(GraphError, match=message):
        rownorm.emit(fused, EmitContext(ir, "sig", 90, dict(tuning)))


# -- GPU: against the reference --------------------------------------------------------------------------
def _seed_with_positive_epsilon(graph: gd.OperationGraphSpec) -> int:
    """A random-input seed whose runtime epsilon is positive (random inputs are standard normal)."""
    ir = graph.validate()
    return next(seed for seed in range(100) if random_inputs(ir, seed)["eps"].item() > 0.1)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ROW_CASES + GROUP_CASES, ids=str)
def test_norm_matches_reference_on_gpu(case: Case) -> None:
    from tests.gpu_check import check_on_gpu

    graph = build(case)
    seed = _seed_with_positive_epsilon(graph) if case.runtime_epsilon else 0
    check_on_gpu(graph, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("item", PIPELINED_CASES, ids=_pipelined_id)
def test_pipelined_matches_reference_on_gpu(item: tuple[Case, dict[str, int]]) -> None:
    from tests.gpu_check import check_on_gpu

    case, tuning = item
    graph = build(case)
    seed = _seed_with_positive_epsilon(graph) if case.runtime_epsilon else 0
    check_on_gpu(graph, seed=seed, tuning={norm_node(case).name: tuning})


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("case", "tuning"),
    [
        (Case("layernorm", "bfloat16", (37, 1000), (1, 1000), residual=True, epilogue=("gelu",), training=True), None),
        (Case("rmsnorm", "float", (5, 65536), (1, 65536), residual=True), None),
        # A resident pipelined grid: its element path walks 751 row groups on 132 blocks.
        (
            Case("layernorm", "bfloat16", (3001, 1000), (1, 1000), residual=True, epilogue=("gelu",), training=True),
            _tuning(32, 4, 4, 1),
        ),
    ],
    ids=lambda value: str(value) if isinstance(value, Case) else "-".join(map(str, (value or {}).values())),
)
def test_misaligned_pointers_take_the_element_path(case: Case, tuning: dict[str, int] | None) -> None:
    """Inputs starting one element past a 16-byte boundary: the kernel sees aligned = 0."""
    import torch

    from tests.gpu_check import TOLERANCE, poisoned, relative_error, to_device, to_numpy

    graph = build(case)
    ir = graph.validate()
    feeds = random_inputs(ir, 3)
    expected = gd.reference.execute(ir, feeds)

    def shifted(array: np.ndarray, t: Tensor) -> torch.Tensor:
        dense = to_device(array, t)
        storage = torch.empty(dense.numel() + 1, dtype=dense.dtype, device="cuda")
        view = storage[1:].view(dense.shape)
        view.copy_(dense)
        assert view.data_ptr() % 16
        return view

    pack = {t.name: shifted(feeds[t.name], t) for t in ir.inputs}
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    gd.compile(graph, tuning={norm_node(case).name: tuning} if tuning else None).execute({**pack, **outputs})
    torch.cuda.synchronize()
    for t in ir.outputs:
        error = relative_error(to_numpy(outputs[t.name]), expected[t.name].astype(np.float64))
        assert error <= TOLERANCE[t.data_type], f"{t.name}: {error:.3g}"
