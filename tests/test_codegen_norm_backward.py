"""Layer and RMS norm backward: the row_norm_backward family (codegen/families/rownorm_backward.py).

CPU: which kernels each graph gets (one pass over the rows, then the partial sums reduced; the
direct kernels for rows too long for registers), their launch shapes, bindings and workspace, and
that they compile with NVRTC for sm_80 and sm_90. GPU (``gpu`` marker): every case of the
awkward-shape matrix against the reference with poisoned outputs, misaligned pointers, and the
same bits on every run.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np
import pytest

import graphdnn as gd
from codegen import FusedProgram, ParamKind, compile_cubin
from codegen.context import EmitContext
from codegen.families import rownorm_backward
from fusion_rules import Family, FusedNode, fuse
from fusion_rules.partition_reference import execute_partition
from graphdnn.arch import sm_count
from graphdnn.errors import GraphError
from graphdnn.ir import Tensor
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import signature

ARCHS = (80, 90)


@dataclass(frozen=True)
class Case:
    norm: str  # layernorm_backward, rmsnorm_backward (with dbias), rmsnorm_backward_nobias
    dtype: str
    dims: tuple[int, ...]
    scale_dims: tuple[int, ...]
    layout: str = "rows"  # rows (row-major) or nhwc
    outputs: tuple[str, ...] = ("dx", "dscale", "dbias")  # those marked as graph outputs

    def __str__(self) -> str:
        return "-".join([self.norm, self.dtype, "x".join(map(str, self.dims)), self.layout, *self.outputs])


def build(case: Case) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(name=str(case), io_data_type=case.dtype)
    dims = list(case.dims)
    stride = gd.nhwc_strides(dims) if case.layout == "nhwc" else gd.nchw_strides(dims)
    grad, x = (g.tensor(dims, stride=stride, name=name) for name in ("dy", "x"))
    scale = g.tensor(list(case.scale_dims), name="scale")
    padded = [1] * (len(dims) - len(case.scale_dims)) + list(case.scale_dims)
    stats = [extent if s == 1 else 1 for extent, s in zip(dims, padded)]
    inv = g.tensor(stats, name="inv_variance", data_type="float")
    if case.norm == "layernorm_backward":
        mean = g.tensor(stats, name="mean", data_type="float")
        results = g.layernorm_backward(grad, x, scale, mean, inv, name="bwd")
    else:
        results = g.rmsnorm_backward(grad, x, scale, inv, has_dbias=case.norm == "rmsnorm_backward", name="bwd")
    for role, t in zip(("dx", "dscale", "dbias"), results):
        if t is not None and role in case.outputs:
            t.set_output(True)
    return g


# The awkward-shape matrix (run on the GPU): rows 1, 7, 1000; widths 1, 33, 768, 1000, 4096.
MATRIX = [
    Case(norm, dtype, (rows, width), (1, width))
    for norm, dtype, rows, width in itertools.product(
        ("layernorm_backward", "rmsnorm_backward", "rmsnorm_backward_nobias"),
        ("bfloat16", "half", "float"),
        (1, 7, 1000),
        (1, 33, 768, 1000, 4096),
    )
]
# Compiled on the CPU: each path of the kernel (vectors, elements only, a block of several rows
# or one, a group wider than a warp, strided columns) and each set of written outputs.
COMPILED = [
    Case("layernorm_backward", "bfloat16", (2048, 1024), (1, 1024)),
    Case("layernorm_backward", "half", (7, 33), (1, 33)),
    Case("layernorm_backward", "float", (1000, 4096), (1, 4096)),
    Case("layernorm_backward", "bfloat16", (3, 6, 5, 7), (1, 6, 5, 7), layout="nhwc"),
    Case("layernorm_backward", "half", (4, 3, 5), (1, 3, 1)),  # the normalized axis is strided
    Case("rmsnorm_backward", "bfloat16", (1, 1), (1, 1)),
    Case("rmsnorm_backward_nobias", "bfloat16", (16384, 4096), (1, 4096)),
    Case("rmsnorm_backward_nobias", "half", (3, 5, 16), (1, 1, 16)),
    Case("layernorm_backward", "bfloat16", (1000, 768), (1, 768), outputs=("dx",)),
    Case("layernorm_backward", "half", (1000, 768), (1, 768), outputs=("dscale",)),
    Case("layernorm_backward", "double", (3, 17), (1, 17)),  # fp64 sums and partials
    Case("rmsnorm_backward", "double", (2, 9), (1, 9)),
]


def emitted(case: Case) -> tuple[FusedNode, FusedProgram]:
    ir = build(case).validate()
    (fused,) = fuse(ir, arch=90).nodes
    return fused, rownorm_backward.emit(fused, EmitContext(ir, signature(ir), 90))


def tensor_named(fused: FusedNode, name: str) -> Tensor:
    (found,) = [t for t in (*fused.inputs, *fused.outputs) if t.name == name]
    return found


def bound(kernel, kind: ParamKind) -> list:
    return [p.tensor if kind is ParamKind.TENSOR else p.scratch for p in kernel.params if p.kind is kind]


# -- CPU tests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", COMPILED, ids=str)
def test_kernels_compile(case: Case, arch: int) -> None:
    _, program = emitted(case)
    for kernel in program.kernels:
        compile_cubin(kernel.source, kernel.name, arch)


@pytest.mark.parametrize("case", COMPILED, ids=str)
def test_one_pass_then_the_partial_sums(case: Case) -> None:
    """Kernel 1 reads the inputs and writes dx only; kernel 2 reads the partials and writes
    dscale (and dbias); the workspace holds one row of partials per block of kernel 1."""
    fused, program = emitted(case)
    assert fused.family is Family.ROW_NORM_BACKWARD
    rows_kernel, *reduce = program.kernels
    dx = fused.anchor.output("dx")
    sums = [t for t in fused.outputs if t.id != dx.id]
    assert set(bound(rows_kernel, ParamKind.TENSOR)) == {t.id for t in fused.inputs} | (
        {dx.id} if "dx" in case.outputs else set()
    )
    if not sums:
        assert not reduce and not program.scratch and not bound(rows_kernel, ParamKind.SCRATCH)
        return
    (partials,) = program.scratch
    width = int(np.prod(case.scale_dims))
    assert partials.name == rownorm_backward.PARTIALS
    assert partials.bytes == rows_kernel.grid[0] * len(sums) * width * (8 if case.dtype == "double" else 4)
    assert bound(rows_kernel, ParamKind.SCRATCH) == [partials.name]
    (reduce_kernel,) = reduce  # few enough partial rows: no split of the reduction
    assert bound(reduce_kernel, ParamKind.SCRATCH) == [partials.name]
    assert bound(reduce_kernel, ParamKind.TENSOR) == [t.id for t in sums]
    assert "atomic" not in rows_kernel.source + reduce_kernel.source


@pytest.mark.parametrize(
    ("case", "blocks", "threads", "partial_rows"),
    [
        # 512 groups of 4 rows; two 128-thread blocks per SM by the register estimate
        (Case("layernorm_backward", "bfloat16", (2048, 1024), (1, 1024)), 2 * 132, 128, 2 * 132),
        # one row per block: 16384 rows on a resident grid, each block walks 62 or 63 of them
        (Case("rmsnorm_backward_nobias", "bfloat16", (16384, 4096), (1, 4096)), 2 * 132, 128, 2 * 132),
        # 7 rows: one block each
        (Case("layernorm_backward", "float", (7, 4096), (1, 4096)), 7, 1024, 7),
    ],
    ids=lambda v: str(v) if isinstance(v, Case) else None,
)
def test_launch_shape(case: Case, blocks: int, threads: int, partial_rows: int) -> None:
    fused, program = emitted(case)
    rows_kernel = program.kernels[0]
    assert rows_kernel.grid == (blocks, 1, 1) and rows_kernel.block == (threads, 1, 1)
    sums = len(fused.outputs) - 1
    assert program.scratch[0].bytes == partial_rows * sums * case.dims[-1] * 4
    assert blocks <= 16 * sm_count(90)


@pytest.mark.parametrize("case", MATRIX, ids=str)
def test_every_awkward_shape_takes_the_one_pass_kernel(case: Case) -> None:
    """(The check after each test compiles these graphs' kernels for sm_80 and sm_90.)"""
    fused, program = emitted(case)
    assert fused.family is Family.ROW_NORM_BACKWARD and len(program.kernels) == 2
    assert [s.name for s in program.scratch] == [rownorm_backward.PARTIALS]


def test_vector_and_element_paths() -> None:
    _, program = emitted(Case("layernorm_backward", "bfloat16", (2048, 1024), (1, 1024)))
    source = program.kernels[0].source
    assert "if (aligned)" in source and "gd::load_vec<__nv_bfloat16, 8>" in source
    assert "__shared__ float combine[4096]" in source  # 4 rows per block, added in group order
    _, program = emitted(Case("layernorm_backward", "half", (7, 33), (1, 33)))
    assert "if (aligned)" not in program.kernels[0].source  # 33 columns: element accesses only


def test_rows_too_long_for_registers_keep_the_direct_kernels() -> None:
    fused, program = emitted(Case("layernorm_backward", "bfloat16", (3, 65536), (1, 65536)))
    assert fused.family is Family.ROW_NORM_BACKWARD
    names = [k.name for k in program.kernels]
    assert any("params_sums" in n for n in names) and any("sets_sums" in n for n in names)
    assert "dx" in names[-1] and rownorm_backward.PARTIALS not in {s.name for s in program.scratch}


def test_launch_candidates_fit_and_emit() -> None:
    """The row-norm family's choices (the heuristic's first) whose rows fit; a resident grid of B
    blocks per SM when the choice sets one; a choice whose rows do not fit is refused."""
    ir = build(COMPILED[0]).validate()
    (fused,) = fuse(ir).nodes
    choices = rownorm_backward.candidates(fused, 90)
    assert len(choices) > 3 and choices[0]["blocks_per_sm"] == 0
    kernels = {}
    for choice in choices:
        program = rownorm_backward.emit(fused, EmitContext(ir, signature(ir), 90, choice))
        rows_kernel = program.kernels[0]
        if choice["blocks_per_sm"]:
            assert rows_kernel.grid[0] == choice["blocks_per_sm"] * sm_count(90)
        kernels[rows_kernel.name] = rows_kernel
    assert len(kernels) == len(choices)
    last = list(kernels.values())[-1]
    compile_cubin(last.source, last.name, 90)
    too_few = {"threads_per_row": 32, "rows_per_block": 4, "vectors_per_thread": 1}  # 256 of 1024 columns
    with pytest.raises(GraphError, match=r"row_norm_backward tuning .* rows of 1024 elements do not fit"):
        rownorm_backward.emit(fused, EmitContext(ir, signature(ir), 90, too_few))


@pytest.mark.parametrize("arch", ARCHS)
def test_a_resident_grid_prefetches_the_next_rows(arch: int) -> None:
    """B blocks per SM, each walking several row groups: the next rows' loads are issued as soon
    as a row is converted (the vector path; the misaligned-pointer fallback walks without)."""
    ir = build(COMPILED[0]).validate()
    (fused,) = fuse(ir).nodes
    choice = {"threads_per_row": 32, "rows_per_block": 4, "vectors_per_thread": 4, "blocks_per_sm": 2}
    rows_kernel = rownorm_backward.emit(fused, EmitContext(ir, signature(ir), arch, choice)).kernels[0]
    assert rows_kernel.grid == (2 * sm_count(arch), 1, 1)
    assert rows_kernel.source.count("the next rows' loads") == 1 and "__launch_bounds__(128, 2)" in rows_kernel.source
    compile_cubin(rows_kernel.source, rows_kernel.name, arch)


def test_the_partition_reference_is_the_ops_reference() -> None:
    graph = build(Case("layernorm_backward", "float", (7, 33), (1, 33)))
    ir = graph.validate()
    feeds = random_inputs(ir, 0)
    fused = execute_partition(fuse(ir), feeds)
    expected = gd.reference.execute(ir, feeds)
    assert all(np.array_equal(fused[name], expected[name]) for name in expected)


def test_the_rows_kernel_sees_dx_as_its_only_output() -> None:
    fused, _ = emitted(COMPILED[0])
    rows = dataclasses.replace(fused, outputs=(fused.anchor.output("dx"),))
    layout = rownorm_backward.backward_layout(rows, 2)
    # xhat, g and two accumulators in float; grad's, x's and scale's bf16 vectors
    assert layout.compute_bytes == 16 and layout.raw_bytes == 6 and layout.vec == 8


# -- fusion: the grad's pointwise op before, the residual-add backward after ----------------------
def fused_graph(
    dtype: str, rows: int, width: int, norm: str = "layernorm_backward", prologue: str = "mask", epilogue: str = "add"
) -> gd.OperationGraphSpec:
    """grad = dy * mask (a dropout or ReLU mask; ``prologue`` "" for none, "mask_out" to write the
    grad as well: a residual branch's gradient, "zero_centred" for the scale gamma + 1 instead),
    the norm's backward,
    dx + dresidual (``epilogue`` "add"), "reads_dscale" (dx * dscale) or "" for none."""
    g = gd.OperationGraphSpec(name=f"fused_{norm}_{dtype}_{rows}x{width}_{prologue}_{epilogue}", io_data_type=dtype)
    dy, x = g.tensor([rows, width], name="dy"), g.tensor([rows, width], name="x")
    inv = g.tensor([rows, 1], name="inv_variance", data_type="float")
    if prologue == "zero_centred":
        scale = g.add(g.tensor([1, width], name="gamma"), 1.0, name="gamma_plus_one")
    else:
        scale = g.tensor([1, width], name="scale")
    grad = g.mul(dy, g.tensor([rows, width], name="mask"), name="mask_mul") if "mask" in prologue else dy
    if prologue == "mask_out":
        grad.set_name("dgrad").set_output(True)
    if norm == "layernorm_backward":
        mean = g.tensor([rows, 1], name="mean", data_type="float")
        dx, dscale, dbias = g.layernorm_backward(grad, x, scale, mean, inv, name="bwd")
    else:
        dx, dscale, dbias = g.rmsnorm_backward(grad, x, scale, inv, has_dbias=False, name="bwd")
    for t in (dscale, dbias):
        if t is not None:
            t.set_output(True)
    if epilogue == "add":
        dx = g.add(dx, g.tensor([rows, width], name="dresidual"), name="dadd")
    elif epilogue == "reads_dscale":
        dx = g.mul(dx, dscale, name="peek")
    dx.set_name("dx_out").set_output(True)
    return g


FUSED = [
    fused_graph(dtype, rows, width)
    for dtype, rows, width in itertools.product(("bfloat16", "half", "float"), (1, 7, 1000), (1, 33, 768, 1000, 4096))
] + [
    fused_graph("bfloat16", 2048, 1024, "rmsnorm_backward", prologue=""),
    fused_graph("half", 7, 4096, "rmsnorm_backward", epilogue=""),
    fused_graph("bfloat16", 1000, 768, prologue="mask_out"),
    fused_graph("float", 7, 33, "rmsnorm_backward", prologue="mask_out", epilogue=""),
    fused_graph("bfloat16", 4096, 768, prologue="zero_centred", epilogue=""),  # the frontend sample's shape
    fused_graph("half", 7, 1000, "rmsnorm_backward", prologue="zero_centred"),
]


def test_the_prologue_and_the_epilogue_join_the_one_pass_kernel() -> None:
    ir = fused_graph("bfloat16", 7, 33).validate()
    partition = fuse(ir)
    (fused,) = partition.nodes
    assert (fused.rule, fused.family) == ("norm_backward_prologue", Family.ROW_NORM_BACKWARD)
    assert [n.name for n in fused.nodes] == ["mask_mul", "bwd", "dadd"] and fused.prologue.name == "mask_mul"
    assert {t.name for t in fused.outputs} == {"bwd::dscale", "bwd::dbias", "dx_out"}
    program = rownorm_backward.emit(fused, EmitContext(ir, signature(ir), 90))
    assert [k.name.rsplit("_", 1)[0] for k in program.kernels] == [
        "gd_mul_layernorm_backward_add",
        "gd_layernorm_backward_params_sums",
    ]
    for arch in ARCHS:
        for kernel in program.kernels:
            compile_cubin(kernel.source, kernel.name, arch)
    feeds = random_inputs(ir, 0)
    got, expected = execute_partition(partition, feeds), gd.reference.execute(ir, feeds)
    assert all(np.array_equal(got[name], expected[name]) for name in expected)


def test_zero_centred_gamma_is_a_prologue_on_the_scale() -> None:
    ir = fused_graph("bfloat16", 4096, 768, prologue="zero_centred", epilogue="").validate()
    partition = fuse(ir)
    (fused,) = partition.nodes
    assert (fused.rule, [n.name for n in fused.nodes]) == ("norm_backward_scale_prologue", ["gamma_plus_one", "bwd"])
    program = rownorm_backward.emit(fused, EmitContext(ir, signature(ir), 90))
    assert len(program.kernels) == 2 and "gamma" in {t.name for t in fused.inputs}
    feeds = random_inputs(ir, 0)
    got, expected = execute_partition(partition, feeds), gd.reference.execute(ir, feeds)
    assert all(np.array_equal(got[name], expected[name]) for name in expected)


def test_an_epilogue_alone_fuses_too() -> None:
    (fused,) = fuse(fused_graph("half", 7, 4096, "rmsnorm_backward", prologue="").validate()).nodes
    assert fused.rule == "norm_backward_epilogue" and fused.prologue is None


@pytest.mark.parametrize("graph", FUSED, ids=lambda g: g.name)
def test_every_fused_shape_takes_the_one_pass_kernel(graph: gd.OperationGraphSpec) -> None:
    """Rows up to the rule's limit fit the kernel with its prologue and epilogue, in every type
    (the check after each test compiles these kernels for sm_80 and sm_90)."""
    ir = graph.validate()
    (fused,) = fuse(ir).nodes
    program = rownorm_backward.emit(fused, EmitContext(ir, signature(ir), 90))
    assert len(program.kernels) == 2 and fused.rule.startswith("norm_backward")


@pytest.mark.parametrize(
    ("graph", "reason", "members"),
    [
        (
            fused_graph("bfloat16", 3, 8192),
            "bwd normalizes rows of 8192 elements; the one-pass kernel that fuses ops around it holds rows of at most 4096",
            ["bwd"],  # alone: the direct kernels
        ),
        (
            fused_graph("half", 7, 33, epilogue="reads_dscale"),
            "peek reads bwd's dscale 'bwd::dscale', not only its output",
            ["mask_mul", "bwd"],
        ),
    ],
    ids=["long-rows", "reads-dscale"],
)
def test_near_misses_say_why(graph: gd.OperationGraphSpec, reason: str, members: list[str]) -> None:
    partition = fuse(graph.validate())
    assert reason in {r.reason for r in partition.rejections}
    (norm,) = [f for f in partition.nodes if f.anchor is not None and f.anchor.name == "bwd"]
    assert [n.name for n in norm.nodes] == members


def test_an_escaping_prologue_is_written_but_not_read_by_the_epilogue() -> None:
    """The grad read elsewhere (a residual branch's gradient) is written by the first pass; an
    epilogue op reading it is refused (the row kernel keeps grad * scale, not the grad)."""
    g = gd.OperationGraphSpec(io_data_type="half")
    dy, x, mask = (g.tensor([7, 33], name=n) for n in ("dy", "x", "mask"))
    scale, stats = g.tensor([1, 33], name="scale"), [g.tensor([7, 1], name=n, data_type="float") for n in "mv"]
    grad = g.mul(dy, mask, name="mask_mul")
    dx = g.layernorm_backward(grad, x, scale, *stats, name="bwd")[0]
    g.add(dx, grad, name="both").set_output(True)
    ir = g.validate()
    partition = fuse(ir)
    assert "both reads 'mask_mul::y', which mask_mul computes before the norm" in {
        r.reason for r in partition.rejections
    }
    norm, both = partition.nodes
    assert (norm.rule, [n.name for n in norm.nodes]) == ("norm_backward_prologue", ["mask_mul", "bwd"])
    assert [t.name for t in norm.outputs] == ["mask_mul::y", "bwd::dx"] and both.nodes[0].name == "both"
    program = rownorm_backward.emit(norm, EmitContext(ir, signature(ir), 90))
    (rows_kernel,) = program.kernels
    assert set(bound(rows_kernel, ParamKind.TENSOR)) >= {t.id for t in norm.outputs}
    compile_cubin(rows_kernel.source, rows_kernel.name, 90)


# -- GPU tests ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("case", MATRIX + COMPILED, ids=str)
def test_matches_reference_on_gpu(case: Case) -> None:
    from tests.gpu_check import check_on_gpu

    check_on_gpu(build(case))


@pytest.mark.gpu
@pytest.mark.parametrize("graph", FUSED, ids=lambda g: g.name)
def test_fused_matches_reference_on_gpu(graph: gd.OperationGraphSpec) -> None:
    from tests.gpu_check import check_on_gpu

    check_on_gpu(graph)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    [
        Case("layernorm_backward", "bfloat16", (1000, 1000), (1, 1000)),
        Case("rmsnorm_backward", "half", (2048, 1024), (1, 1024)),
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
        return view

    pack = {t.name: shifted(feeds[t.name], t) for t in ir.inputs}
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    gd.compile(graph).execute({**pack, **outputs})
    torch.cuda.synchronize()
    for t in ir.outputs:
        error = relative_error(to_numpy(outputs[t.name]), expected[t.name].astype(np.float64))
        assert error <= TOLERANCE[t.data_type], f"{t.name}: {error:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    [
        Case("layernorm_backward", "bfloat16", (2048, 1024), (1, 1024)),
        Case("rmsnorm_backward", "half", (7, 33), (1, 33)),
    ],
    ids=str,
)
def test_every_launch_candidate_matches_reference_on_gpu(case: Case) -> None:
    from tests.gpu_check import check_on_gpu

    graph = build(case)
    (fused,) = fuse(graph.validate()).nodes
    for choice in rownorm_backward.candidates(fused, 90):
        check_on_gpu(graph, tuning={fused.name: choice})


@pytest.mark.gpu
def test_the_same_bits_every_run() -> None:
    """No atomics: dscale and dbias are added in a fixed order."""
    import torch

    from tests.gpu_check import poisoned, to_device

    graph = build(Case("layernorm_backward", "float", (16384, 1024), (1, 1024)))
    ir = graph.validate()
    feeds = random_inputs(ir, 1)
    plan = gd.compile(graph)
    pack = {t.name: to_device(feeds[t.name], t) for t in ir.inputs}
    runs = []
    for _ in range(3):
        outputs = {t.name: poisoned(t) for t in ir.outputs}
        plan.execute({**pack, **outputs})
        torch.cuda.synchronize()
        runs.append({name: value.cpu() for name, value in outputs.items()})
    assert all(torch.equal(run[name], runs[0][name]) for run in runs[1:] for name in runs[0])
