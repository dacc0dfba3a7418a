"""Batch norm backward: the batchnorm_backward family (codegen/families/batchnorm_backward.py),
alone and fused with the op making its grad and dx's epilogue (the frontend's drelu-dadd-dbn).

CPU: the kernels each graph gets (the per-channel sums, split or not, then dx), their workspace,
the fusion and its near misses, NVRTC for sm_80 and sm_90. GPU (``gpu`` marker): NCHW and NHWC,
awkward shapes, every type against the reference with poisoned outputs, and the same bits on
every run.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import graphdnn as gd
from codegen import FusedProgram, compile_cubin
from codegen.context import EmitContext
from codegen.families import batchnorm_backward
from fusion_rules import Family, FusedNode, fuse
from fusion_rules.partition_reference import execute_partition
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import signature

ARCHS = (80, 90)


def bn_backward(
    dtype: str,
    dims: list[int],
    layout: str = "nchw",
    fused: bool = False,
    outputs: tuple[str, ...] = ("dx", "ds", "db"),
) -> gd.OperationGraphSpec:
    """dbn on dy, or with ``fused`` the frontend's drelu-dadd-dbn: grad = dy * relu_mask (the
    mask given), written as the residual branch's gradient, and dx + dresidual after."""
    name = f"dbn_{dtype}_{'x'.join(map(str, dims))}_{layout}{'_fused' if fused else ''}"
    g = gd.OperationGraphSpec(name=name, io_data_type=dtype)
    stride = gd.nhwc_strides(dims) if layout == "nhwc" else gd.nchw_strides(dims)
    dy, x = g.tensor(dims, stride=stride, name="dy"), g.tensor(dims, stride=stride, name="x")
    channel = [1, dims[1], *[1] * (len(dims) - 2)]
    scale, mean, inv = (g.tensor(channel, name=n, data_type="float") for n in ("scale", "mean", "inv_variance"))
    grad = dy
    if fused:
        grad = g.mul(dy, g.tensor(dims, stride=stride, name="relu_mask"), name="drelu")
        grad.set_name("dresidual").set_output(True)
    dx, dscale, dbias = g.batchnorm_backward(grad, x, scale, mean, inv, name="dbn")
    if fused:
        dx = g.add(dx, g.tensor(dims, stride=stride, name="dskip"), name="dadd")
    for role, t in zip(("dx", "ds", "db"), (dx, dscale, dbias)):
        if role in outputs:
            t.set_output(True)  # type: ignore[union-attr]
    return g


CASES = [
    bn_backward("bfloat16", [4, 16, 56, 56], "nhwc", fused=True),  # the frontend sample's shape
    bn_backward("half", [4, 16, 56, 56], "nchw", fused=True),
    bn_backward("float", [3, 5, 7, 9]),
    bn_backward("bfloat16", [2, 37, 5, 3], "nhwc"),
    bn_backward("half", [4, 3, 33]),
    bn_backward("float", [7, 1, 1, 1]),
    bn_backward("double", [2, 3, 4, 5]),
]
GPU_CASES = [
    bn_backward(dtype, dims, layout, fused)
    for dtype, (dims, layout), fused in itertools.product(
        ("bfloat16", "half", "float"),
        [
            ([1, 1, 1, 1], "nchw"),
            ([7, 3, 5, 5], "nhwc"),
            ([2, 37, 5, 3], "nhwc"),
            ([3, 33, 7], "nchw"),
            ([8, 64, 28, 28], "nchw"),
            ([8, 64, 28, 28], "nhwc"),
            ([32, 3, 32, 32], "nchw"),  # few long channels: the sums split
        ],
        (False, True),
    )
]


def emitted(graph: gd.OperationGraphSpec) -> tuple[FusedNode, FusedProgram]:
    ir = graph.validate()
    (fused,) = [f for f in fuse(ir).nodes if f.family is Family.BATCHNORM_BACKWARD]
    return fused, batchnorm_backward.emit(fused, EmitContext(ir, signature(ir), 90))


def short(name: str) -> str:
    return name.rsplit("_", 1)[0]


# -- CPU tests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("graph", CASES, ids=lambda g: g.name)
def test_kernels_compile(graph: gd.OperationGraphSpec, arch: int) -> None:
    for kernel in emitted(graph)[1].kernels:
        compile_cubin(kernel.source, kernel.name, arch)


@pytest.mark.parametrize("graph", CASES, ids=lambda g: g.name)
def test_sums_then_dx(graph: gd.OperationGraphSpec) -> None:
    fused, program = emitted(graph)
    names = [short(k.name) for k in program.kernels]
    assert names[0].endswith("batchnorm_backward_channels_sums") and names[-1].endswith("_dx")
    channels = fused.anchor.input("input").dim[1]
    coefficients = [s for s in program.scratch if s.name == batchnorm_backward.COEFFICIENTS]
    assert [s.bytes for s in coefficients] == [4 * channels * (8 if "double" in graph.name else 4)]
    if len(names) == 3:  # split: the chunks' partial sums, then the finalize kernel
        assert names[1].endswith("channels_finalize") and len(program.scratch) == 2


@pytest.mark.parametrize("graph", GPU_CASES, ids=lambda g: g.name)
def test_every_gpu_case_emits(graph: gd.OperationGraphSpec) -> None:
    """(The check after each test compiles these graphs' kernels for sm_80 and sm_90.)"""
    fused, program = emitted(graph)
    assert short(program.kernels[-1].name).endswith("_dx") and fused.rule in ("single", "bn_backward_prologue")


def test_the_frontend_sample_is_one_fused_node() -> None:
    """drelu (a given mask) + dadd (the grad written for the residual branch) + dbn + the skip's
    gradient added to dx: one fused node, the grad computed in both phases from dy and the mask."""
    graph = CASES[0]
    ir = graph.validate()
    partition = fuse(ir)
    (fused,) = partition.nodes
    assert (fused.rule, [n.name for n in fused.nodes]) == ("bn_backward_prologue", ["drelu", "dbn", "dadd"])
    assert {t.name for t in fused.outputs} == {"dresidual", "dbn::dscale", "dbn::dbias", "dadd::y"}
    program = batchnorm_backward.emit(fused, EmitContext(ir, signature(ir), 90))
    assert "gd_mul_batchnorm_backward_add_dx" in program.kernels[-1].name
    feeds = random_inputs(ir, 0)
    got, expected = execute_partition(partition, feeds), gd.reference.execute(ir, feeds)
    assert all(np.array_equal(got[name], expected[name]) for name in expected)


def test_without_dx_only_the_sums_run() -> None:
    _, program = emitted(bn_backward("half", [4, 3, 5, 5], outputs=("ds", "db")))
    assert len(program.kernels) == 1 and not program.scratch


def test_an_epilogue_reading_dscale_is_refused() -> None:
    g = gd.OperationGraphSpec(io_data_type="half")
    dy, x = g.tensor([2, 3, 4, 4], name="dy"), g.tensor([2, 3, 4, 4], name="x")
    scale, mean, inv = (g.tensor([1, 3, 1, 1], name=n, data_type="float") for n in ("s", "m", "v"))
    dx, dscale, _ = g.batchnorm_backward(dy, x, scale, mean, inv, name="dbn")
    g.mul(dx, dscale, name="peek").set_output(True)
    partition = fuse(g.validate())
    assert "peek reads dbn's dscale 'dbn::dscale', not only its output" in {r.reason for r in partition.rejections}
    assert [f.family for f in partition.nodes] == [Family.BATCHNORM_BACKWARD, Family.ELEMENTWISE]


def test_the_dx_kernel_keeps_x_minus_mean() -> None:
    """dx = a * grad - a * mean(grad) - k * (x - mean): no cancellation when |mean| >> std."""
    _, program = emitted(CASES[2])
    assert "- dx_coefficients[15 + q1])" in program.kernels[-1].source


# -- GPU tests ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("graph", CASES + GPU_CASES, ids=lambda g: g.name)
def test_matches_reference_on_gpu(graph: gd.OperationGraphSpec) -> None:
    from tests.gpu_check import check_on_gpu

    check_on_gpu(graph)


@pytest.mark.gpu
def test_the_same_bits_every_run() -> None:
    import torch

    from tests.gpu_check import poisoned, to_device

    graph = bn_backward("float", [32, 3, 64, 64], fused=True)
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
