"""Adaptive layer norm forward (the row_norm family: a per-sample scale and bias reached through
the row offsets) and backward (the row_norm_backward family's one pass for dx, then the direct
family's per-sample parameter sums), and the instance and group norm backward (the direct
family's norm-backward kernels; group norm on the (groups, C/groups) view of every tensor).

CPU: which kernels each graph gets and that they compile with NVRTC for sm_80 and sm_90 (the
CPU emulation of tests/test_cpu_emulation.py checks their index math). GPU (``gpu`` marker):
the awkward-shape matrix against the reference with poisoned outputs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import graphdnn as gd
from codegen import compile_cubin, emit_partition
from codegen.context import EmitContext
from codegen.families.direct_norm import NormBackward, emit_norm_backward
from codegen.families.norm_backward_tiling import plan
from fusion_rules import Family, fuse
from graphdnn.compare import relative_error, tolerance
from graphdnn.layout import channels_last_order, packed_strides
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import signature
from graphdnn.specialize import specialize
from tests import cpu_emulation

ARCHS = (80, 90)


@dataclass(frozen=True)
class Case:
    op: str  # adalayernorm, adalayernorm_backward, instancenorm_backward, groupnorm_backward
    dtype: str
    dims: tuple[int, ...]  # [B, S, D] (adaptive layer norm) or [N, C, *spatial]
    groups: int = 0  # group norm
    layout: str = "nchw"  # nchw or nhwc (instance and group norm); seq_major: [B, S, D] with S outermost
    bias: bool = True  # adaptive layer norm's optional bias
    phase: str = "training"

    def __str__(self) -> str:
        parts = [self.op, self.dtype, "x".join(map(str, self.dims)), self.layout]
        parts += [f"g{self.groups}"] * bool(self.groups) + ["nobias"] * (not self.bias)
        return "-".join([*parts, *(["inference"] if self.phase == "inference" else [])])


def build(case: Case) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(name=str(case).replace("-", "_"), io_data_type=case.dtype)
    dims = list(case.dims)
    orders = {"nhwc": channels_last_order(len(dims)), "seq_major": (1, 0, *range(2, len(dims)))}
    stride = packed_strides(dims, orders.get(case.layout))
    x = g.tensor(dims, stride=stride, name="x")
    if case.op.startswith("adalayernorm"):
        params = [dims[0], *[1] * (len(dims) - 2), dims[-1]]
        stats = [*dims[:-1], 1]
    else:
        params = [1, dims[1], *[1] * (len(dims) - 2)]
        stats = [dims[0], case.groups or dims[1], *[1] * (len(dims) - 2)]
    scale = g.tensor(params, name="scale")
    if case.op == "adalayernorm":
        bias = g.tensor(params, name="bias") if case.bias else None
        results = g.adalayernorm(case.phase, x, scale, bias, 1e-5, name="norm")
    else:
        grad = g.tensor(dims, stride=stride, name="dy")
        mean, inv = (g.tensor(stats, name=name, data_type="float") for name in ("mean", "inv_variance"))
        method = getattr(g, case.op)
        extra = {"groups": case.groups} if case.groups else {}
        results = method(grad, x, scale, mean, inv, name="norm", **extra)
    for t in results:
        if t is not None:
            t.set_output(True)
    return g


# The awkward-shape matrix (run on the GPU): odd rows and widths, one sample, widths that are not
# a multiple of a vector, one spatial position, channels per group 1 to 8, both layouts.
MATRIX = [
    *(
        Case("adalayernorm", dtype, dims, bias=bias)
        for dtype, dims, bias in itertools.product(
            ("bfloat16", "half", "float"), ((1, 7, 33), (3, 5, 1000), (2, 129, 768), (2, 3, 4099)), (True, False)
        )
    ),
    Case("adalayernorm", "bfloat16", (3, 17, 1024), phase="inference"),
    *(
        Case("adalayernorm_backward", dtype, dims)
        for dtype, dims in itertools.product(
            ("bfloat16", "half", "float"), ((1, 7, 33), (3, 5, 1000), (2, 129, 768), (4, 333, 1024))
        )
    ),
    Case("adalayernorm_backward", "bfloat16", (3, 7, 768), layout="seq_major"),
    *(
        Case(op, dtype, dims, groups, layout)
        for (op, groups, dims), dtype, layout in itertools.product(
            (
                ("instancenorm_backward", 0, (1, 5, 7, 3)),
                ("instancenorm_backward", 0, (3, 32, 9, 9)),
                ("groupnorm_backward", 3, (1, 6, 5, 7)),
                ("groupnorm_backward", 8, (2, 64, 9, 11)),
                ("groupnorm_backward", 1, (2, 5, 1, 1)),
                ("groupnorm_backward", 16, (2, 16, 8, 8)),  # groups of one channel
                ("groupnorm_backward", 2, (2, 6, 3, 4, 5)),  # 3 spatial dims
                ("instancenorm_backward", 0, (2, 24, 33, 17)),
                ("groupnorm_backward", 32, (2, 256, 32, 32)),  # the one-pass kernel's tiles of 1024 threads
                ("instancenorm_backward", 0, (2, 3, 300, 300)),  # sets too large: the direct kernels
            ),
            ("bfloat16", "half", "float"),
            ("nchw", "nhwc"),
        )
    ),
]
COMPILED = [
    Case("adalayernorm", "bfloat16", (8, 4096, 1024)),
    Case("adalayernorm", "half", (1, 7, 33), bias=False),
    Case("adalayernorm", "float", (2, 3, 5, 64), phase="inference"),
    Case("adalayernorm_backward", "bfloat16", (8, 4096, 1024)),
    Case("instancenorm_backward", "bfloat16", (16, 256, 64, 64), layout="nhwc"),
    Case("groupnorm_backward", "bfloat16", (16, 256, 64, 64), 32),
    Case("groupnorm_backward", "half", (2, 6, 5, 3, 2), 2, "nhwc"),  # 3 spatial dims
    # The one-pass kernel: resident grids of 512 and 256 threads, one set a vector (uniform
    # statistics), double, scalar accesses with idle lanes.
    Case("instancenorm_backward", "bfloat16", (16, 256, 64, 64)),
    Case("groupnorm_backward", "bfloat16", (16, 256, 64, 64), 32, "nhwc"),
    Case("groupnorm_backward", "double", (2, 6, 3, 2, 3), 3, "nhwc"),
    Case("instancenorm_backward", "float", (2, 24, 33, 17)),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", COMPILED, ids=str)
def test_kernels_compile(case: Case, arch: int) -> None:
    ir = build(case).validate()
    for program in emit_partition(fuse(ir, arch=arch), arch):
        for kernel in program.kernels:
            compile_cubin(kernel.source, kernel.name, arch)


@pytest.mark.parametrize(
    ("case", "family", "kernels"),
    [
        (Case("adalayernorm", "bfloat16", (8, 4096, 1024)), Family.ROW_NORM, ["adalayernorm"]),
        # dx and each block's partial sums of its sample's rows, then the partials added.
        (
            Case("adalayernorm_backward", "bfloat16", (2, 5, 8)),
            Family.ROW_NORM_BACKWARD,
            ["adalayernorm_backward", "params"],
        ),
        # A sample's rows are not consecutive: dx alone, then the direct family's parameter sums.
        (
            Case("adalayernorm_backward", "half", (2, 5, 8), layout="seq_major"),
            Family.ROW_NORM_BACKWARD,
            ["adalayernorm_backward_", "params_sums"],
        ),
        # The one-pass kernel (dx and the cells), then dscale / dbias from the cells.
        (Case("instancenorm_backward", "half", (2, 3, 4, 4)), Family.DIRECT, ["backward_sets", "params"]),
        (
            Case("groupnorm_backward", "float", (2, 6, 4, 4), 3, "nhwc"),
            Family.DIRECT,
            ["backward_sets", "params"],
        ),
        # Sets too large for it: the cell sums, dscale / dbias and the set sums from them, then dx.
        (Case("instancenorm_backward", "half", (2, 2, 300, 300)), Family.DIRECT, ["cells", "params", "sets", "dx"]),
    ],
    ids=lambda v: str(v) if isinstance(v, Case) else "",
)
def test_family_and_kernels(case: Case, family: Family, kernels: list[str]) -> None:
    ir = build(case).validate()
    (fused,) = fuse(ir, arch=90).nodes
    assert fused.family is family
    (program,) = emit_partition(fuse(ir, arch=90), 90)
    names = [k.name for k in program.kernels]
    assert len(names) >= len(kernels) and all(any(part in n for n in names) for part in kernels), names


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        # NHWC: tiles of 8 channels (16 bytes a row), 512 threads holding 8 rows each.
        (Case("instancenorm_backward", "bfloat16", (16, 256, 64, 64), layout="nhwc"), (True, 8, 8, 512, 8)),
        (Case("groupnorm_backward", "bfloat16", (16, 256, 64, 64), 32, "nhwc"), (True, 8, 8, 512, 8)),
        # NCHW: a tile is a group's contiguous run, 64 threads a channel.
        (Case("groupnorm_backward", "bfloat16", (16, 256, 64, 64), 32), (False, 8, 8, 512, 8)),
        (Case("instancenorm_backward", "bfloat16", (16, 256, 64, 64)), (False, 8, 1, 256, 2)),
        # C = 6 takes vectors of 2 floats; groups of 3 channels: a tile of both (3 vectors a row,
        # no shuffles), 16 rows of them.
        (Case("groupnorm_backward", "float", (2, 6, 5, 3), 2, "nhwc"), (True, 2, 6, 48, 1)),
        # 7 x 3 positions: one element at a time; a warp walks both channels (11 of 32 lanes idle).
        (Case("groupnorm_backward", "half", (3, 10, 7, 3), 5), (False, 1, 2, 32, 2)),
    ],
    ids=lambda v: str(v) if isinstance(v, Case) else "",
)
def test_one_pass_tiling(case: Case, expected: tuple[bool, int, int, int, int]) -> None:
    """(NHWC, vector width, channels a tile, threads, vectors of grad and of x a thread holds)."""
    (fused,) = fuse(build(case).validate(), arch=90).nodes
    t = plan(NormBackward.of(fused))
    assert not isinstance(t, str), t
    assert (t.nhwc, t.width, t.tile, t.threads, t.slots) == expected


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (Case("instancenorm_backward", "float", (2, 3, 300, 300)), "does not fit"),
        (Case("groupnorm_backward", "bfloat16", (2, 64, 128, 128), 2, "nhwc"), "does not fit"),
    ],
    ids=lambda v: str(v) if isinstance(v, Case) else "",
)
def test_sets_too_large_for_one_pass(case: Case, reason: str) -> None:
    (fused,) = fuse(build(case).validate(), arch=90).nodes
    t = plan(NormBackward.of(fused))
    assert isinstance(t, str) and reason in t


def test_adalayernorm_backward_walks_each_sample_apart() -> None:
    """A row of blocks per sample (grid y), the partials [sample][block][parameter][D]."""
    ir = build(Case("adalayernorm_backward", "bfloat16", (8, 4096, 1024))).validate()
    (program,) = emit_partition(fuse(ir, arch=90), 90)
    rows, sums = program.kernels
    assert rows.grid[1] == 8 and "row = (int)blockIdx.y * ROWS + local" in rows.source
    assert "(blockIdx.y * gridDim.x + blockIdx.x)" in rows.source
    assert f"(c0 * {rows.grid[0]} + c3)" in sums.source


def test_groupnorm_backward_views_the_channels_as_groups() -> None:
    """The kernels index the (N, groups, C/groups, H, W) view of an NHWC [2, 6, 4, 4] input:
    strides (96, 2, 1, 24, 6), the channel stride 1 split into the group's 2 and the channel's 1."""
    ir = build(Case("groupnorm_backward", "float", (2, 6, 4, 4), 3, "nhwc")).validate()
    (fused,) = fuse(ir, arch=90).nodes
    program = emit_norm_backward(fused, EmitContext(ir, signature(ir), 90, {}))  # the direct kernels
    dx = program.kernels[-1].source
    assert "[c0 * 96 + c1 * 2 + c2 + c3 * 24 + c4 * 6] = " in dx


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
def test_a_dynamic_batch_and_sequence_run_on_the_cpu(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Adaptive layer norm over [batch, seq, 24] with both symbolic: the row-norm kernel (a variant
    per size bucket) reads the per-sample scale through the rows' runtime strides."""
    g = gd.OperationGraphSpec(name="dyn_adaln", io_data_type="half")
    b, s = g.dim("batch", 1, 4), g.dim("seq", 1, 40)
    x, scale, bias = g.tensor([b, s, 24], name="x"), g.tensor([b, 1, 24], name="scale"), g.tensor([b, 1, 24])
    for t in g.adalayernorm("training", x, scale, bias, 1e-5):
        assert t is not None
        t.set_output(True)
    ir = g.validate()
    partition = fuse(ir, arch=80)
    (program,) = emit_partition(partition, 80)
    build_dir: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build_dir.mkdir(exist_ok=True)
    for values in ({"batch": 1, "seq": 1}, {"batch": 3, "seq": 7}, {"batch": 4, "seq": 40}):
        feeds = random_inputs(specialize(ir, values), sum(values.values()))
        expected = gd.reference.execute(ir, feeds)
        got = cpu_emulation.run(partition.nodes[0], program, feeds, 1, build_dir, values)
        for t in ir.outputs:
            error = relative_error(got[t.name].astype(np.float64), expected[t.name].astype(np.float64))
            assert error <= tolerance(t.data_type), f"{t.name} at {values}: {error:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", MATRIX, ids=str)
def test_matches_reference_on_gpu(case: Case) -> None:
    from tests.gpu_check import check_on_gpu

    check_on_gpu(build(case))
