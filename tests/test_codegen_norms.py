"""Row-norm (layer/RMS norm, add+norm) and group-norm (group/instance norm) kernels.

CPU: every case is fused, emitted and compiled with NVRTC for sm_80 and sm_90; the test
checks the launch shape, the parameter bindings and which path the kernel takes (16-byte
vectors, element accesses, a row walked in chunks). GPU (`gpu` marker): the same cases run
through ``check_on_gpu`` against the reference, plus misaligned pointers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import graphdnn as gd
from codegen import Kernel, ParamKind, compile_cubin, emit_partition
from codegen.context import EmitContext
from codegen.families import groupnorm, rownorm
from fusion_rules import Family, FusedNode, fuse
from graphdnn.errors import GraphError
from graphdnn.ir import Tensor
from graphdnn.random_inputs import random_inputs

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
    config = rownorm.heuristic(rownorm.analyze(fused))
    assert kernel.block[0] == config.threads and kernel.grid[0] == -(
        -rownorm.analyze(fused).rows // config.rows_per_block
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
    nhwc = rownorm.analyze(norm_node(Case("layernorm", "float", (2, 64, 5, 7), (1, 64, 1, 1), layout="nhwc")))
    nchw = rownorm.analyze(norm_node(Case("layernorm", "float", (2, 64, 5, 7), (1, 64, 1, 1))))
    assert (nhwc.rows, nhwc.width, nhwc.vec) == (70, 64, 4)
    assert (nchw.rows, nchw.width, nchw.vec) == (70, 64, 1)
    assert nhwc.x.id in nhwc.packed and nchw.x.id not in nchw.packed
    # Over (C, H, W) of NHWC the row is packed in (H, W, C) order: x is, the row-major scale is not.
    chw = norm_node(Case("layernorm", "half", (2, 16, 3, 5), (1, 16, 3, 5), layout="nhwc"))
    layout = rownorm.analyze(chw)
    scale = chw.anchor.input("scale") if chw.anchor else None
    assert scale is not None and layout.x.id in layout.packed and scale.id not in layout.packed
    assert layout.vec == 8
    sliced = rownorm.analyze(norm_node(Case("layernorm", "bfloat16", (3, 1000), (1, 1000), layout="sliced")))
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
    layout = rownorm.analyze(norm_node(Case("layernorm", dtype, dims, (1, dims[1]))))
    config = rownorm.heuristic(layout)
    assert (config.threads_per_row, config.rows_per_block, config.vectors_per_thread) == expected
    assert config.chunks(layout) == (4 if dims[1] == 65536 else 1)


def test_every_candidate_emits_a_distinct_kernel_that_compiles() -> None:
    case = Case("rmsnorm", "bfloat16", (4096, 4096), (1, 4096), residual=True)
    fused = norm_node(case)
    choices = rownorm.candidates(fused)
    assert choices[0] == rownorm.heuristic(rownorm.analyze(fused)).as_dict() and 3 <= len(choices) <= 12
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
    choices = groupnorm.candidates(fused)
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
@pytest.mark.parametrize(
    "case",
    [
        Case("layernorm", "bfloat16", (37, 1000), (1, 1000), residual=True, epilogue=("gelu",), training=True),
        Case("rmsnorm", "float", (5, 65536), (1, 65536), residual=True),
    ],
    ids=str,
)
def test_misaligned_pointers_take_the_element_path(case: Case) -> None:
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
    gd.compile(graph).execute({**pack, **outputs})
    torch.cuda.synchronize()
    for t in ir.outputs:
        error = relative_error(to_numpy(outputs[t.name]), expected[t.name].astype(np.float64))
        assert error <= TOLERANCE[t.data_type], f"{t.name}: {error:.3g}"
