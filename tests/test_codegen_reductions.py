"""Code generation for reductions, softmax and training batch norm (REDUCTION, BATCHNORM_TRAIN).

CPU: every kernel is emitted and compiled with NVRTC for sm_80 and sm_90 over dtypes, reduction
modes, reduced-axis sets and layouts, and its launch shape and parameter bindings are checked;
the mapping each layout gets (rows or columns, vector width, split) is pinned down.
GPU (``gpu`` marker): the same awkward cases run against the reference backend.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np
import pytest

import graphdnn as gd
from codegen import FusedProgram, Kernel, ParamKind, compile_cubin, emit_partition
from codegen.indexing import merged_runs, run_offset
from fusion_rules import Family, Partition, fuse
from graphdnn.ops.reduction import ReductionMode

ARCHS = (80, 90)
Build = Callable[[], gd.OperationGraphSpec]


# -- graphs --------------------------------------------------------------------------------------
def new_graph(dtype: str) -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(
        name="reductions", io_data_type=dtype, intermediate_data_type="float", compute_data_type="float"
    )


def reduction_graph(
    dims: Sequence[int],
    axes: Sequence[int],
    mode: str = "add",
    dtype: str = "float",
    layout: str = "nchw",
    epilogue: bool = False,
) -> gd.OperationGraphSpec:
    """x -> reduction over ``axes``; with ``epilogue``: + a per-position bias, then ReLU."""
    g = new_graph(dtype)
    x = g.tensor(list(dims), stride=_strides(dims, layout), name="x")
    y = g.reduction(x, mode, axes=list(axes), name="reduce")
    if epilogue:
        kept = [1 if a in axes else d for a, d in enumerate(dims)]
        y = g.relu(g.add(y, g.tensor(kept, name="shift")))
    y.set_output(True)
    return g


def softmax_graph(
    dims: Sequence[int],
    axis: int,
    dtype: str = "float",
    layout: str = "nchw",
    epilogue: bool = False,
    op: str = "softmax",
) -> gd.OperationGraphSpec:
    """``op`` (softmax, log_softmax, softmax_backward) along ``axis``; with ``epilogue``: times a
    weight per position along the axis. softmax_backward's dy and y both take ``layout``."""
    g = new_graph(dtype)
    x = g.tensor(list(dims), stride=_strides(dims, layout), name="x")
    if op == "softmax_backward":
        dy = g.tensor(list(dims), stride=_strides(dims, layout), name="dy")
        y = g.softmax_backward(dy, x, axis=axis, name=op)
    else:
        y = getattr(g, op)(x, axis=axis, name=op)
    if epilogue:
        along = [d if a == axis % len(dims) else 1 for a, d in enumerate(dims)]
        y = g.mul(y, g.tensor(along, name="weight"))
    y.set_output(True)
    return g


def batchnorm_graph(
    dims: Sequence[int],
    layout: str,
    dtype: str = "bfloat16",
    running: bool = True,
    epilogue: bool = True,
    runtime_scalars: bool = False,
) -> gd.OperationGraphSpec:
    """Training batch norm (float scale/bias/running stats), with ``epilogue``: relu(y + residual)."""
    g = new_graph(dtype)
    channels = [1, dims[1], *[1] * (len(dims) - 2)]
    x = g.tensor(list(dims), stride=_strides(dims, layout), name="x")
    scale, bias = (g.tensor(channels, data_type="float", name=n) for n in ("scale", "bias"))
    epsilon: gd.TensorSpec | float = 1e-5
    momentum: gd.TensorSpec | float | None = 0.1 if running else None
    if runtime_scalars:
        epsilon = g.tensor([1], data_type="float", is_pass_by_value=True, name="epsilon")
        momentum = g.tensor([1], data_type="float", is_pass_by_value=True, name="momentum") if running else None
    stats = {}
    if running:
        stats = {n: g.tensor(channels, data_type="float", name=n) for n in ("in_running_mean", "in_running_var")}
    y, *outputs = g.batchnorm(x, scale, bias, epsilon=epsilon, momentum=momentum, name="bn", **stats)
    for t in outputs:
        if t is not None:
            t.set_output(True)
    if epilogue:
        residual = g.tensor(list(dims), stride=_strides(dims, layout), name="residual")
        y = g.relu(g.add(y, residual))
    y.set_output(True)
    return g


def _strides(dims: Sequence[int], layout: str) -> tuple[int, ...]:
    return gd.nhwc_strides(list(dims)) if layout == "nhwc" else gd.nchw_strides(list(dims))


# -- emission and the checks every kernel gets ----------------------------------------------------
def emitted(graph: gd.OperationGraphSpec, arch: int = 90) -> tuple[Partition, tuple[FusedProgram, ...]]:
    partition = fuse(graph, arch=arch)
    return partition, emit_partition(partition, arch)


def check_program(partition: Partition, program: FusedProgram, family: Family) -> None:
    """Launch shapes within hardware limits, shared memory within 48 KB, every parameter bound to
    a tensor of the fused node or one of its scratch buffers, every output written by a kernel."""
    (fused,) = [f for f in partition.nodes if f.name == program.fused]
    assert fused.family is family
    ids = {t.id for t in (*fused.inputs, *fused.outputs)}
    scratch = {s.name for s in program.scratch}
    assert all(s.bytes > 0 for s in program.scratch)
    written: set[int] = set()
    for kernel in program.kernels:
        threads = kernel.block[0]
        assert kernel.block[1:] == (1, 1) and 1 <= threads <= 1024
        assert 1 <= kernel.grid[0] < 2**31 and 1 <= kernel.grid[1] <= 65535 and kernel.grid[2] == 1
        assert 0 <= kernel.shared_bytes <= 48 * 1024
        assert f"__launch_bounds__({threads})" in kernel.source
        kinds = [p.kind for p in kernel.params]
        assert kinds.count(ParamKind.ALIGNED) == 1 and kinds[-1] is ParamKind.ALIGNED
        for param in kernel.params:
            if param.kind in (ParamKind.TENSOR, ParamKind.SCALAR):
                assert param.tensor in ids
            if param.kind is ParamKind.SCRATCH:
                assert param.scratch in scratch
        written |= written_tensors(kernel)
        assert ("extern __shared__" in kernel.source) == (kernel.shared_bytes > 0)
    assert written == {t.id for t in fused.outputs}
    assert {p.scratch for k in program.kernels for p in k.params if p.kind is ParamKind.SCRATCH} == scratch


def written_tensors(kernel: Kernel) -> set[int]:
    """Ids of the tensors a kernel gets as non-const pointers (its declarations follow its bindings)."""
    signature = re.search(rf"\b{kernel.name}\((.*?)\) \{{", kernel.source)
    assert signature is not None
    declarations = signature.group(1).split(", ")
    assert len(declarations) == len(kernel.params)
    return {
        p.tensor
        for p, declaration in zip(kernel.params, declarations)
        if p.kind is ParamKind.TENSOR and not declaration.startswith("const ")
    }


def check_compiles(graph: gd.OperationGraphSpec, family: Family) -> list[Kernel]:
    """Emit and compile every kernel of ``family`` for each target; return the sm_90 kernels."""
    kernels: list[Kernel] = []
    for arch in ARCHS:
        partition, programs = emitted(graph, arch)
        mine = [p for p, f in zip(programs, partition.nodes) if f.family is family]
        assert mine, f"no {family.value} fused node in {partition.describe()}"
        for program in mine:
            check_program(partition, program, family)
            for kernel in program.kernels:
                assert compile_cubin(kernel.source, kernel.name, arch)
        if arch == 90:
            kernels = [k for p in mine for k in p.kernels]
    return kernels


def vector_widths(kernel: Kernel) -> set[int]:
    """The element counts of the vector loads in a kernel."""
    return {int(n) for n in re.findall(r"gd::load_vec<[^,]+, (\d+)>", kernel.source)}


def labels(kernels: Sequence[Kernel]) -> list[str]:
    """The pattern part of each kernel name (gd_<pattern>_<hash>): what each kernel does."""
    return [k.name.rsplit("_", 1)[0].removeprefix("gd_") for k in kernels]


# -- the cases (shared by the CPU and GPU tests) ------------------------------------------------------
# name -> (dims, reduced axes, layout)
LAYOUTS = {
    "inner": ((64, 1000), (1,), "nchw"),
    "inner_odd": ((33, 77), (1,), "nchw"),
    "inner_long_single": ((1, 65536), (1,), "nchw"),
    "outer": ((4096, 24), (0,), "nchw"),
    "middle_nchw": ((8, 64, 7, 7), (1,), "nchw"),
    "channels_nhwc": ((8, 64, 7, 8), (0, 2, 3), "nhwc"),
    "spatial_nchw": ((8, 64, 7, 7), (2, 3), "nchw"),
    "all": ((16, 3, 33, 65), (0, 1, 2, 3), "nchw"),
    "outer_and_inner": ((6, 5, 40), (0, 2), "nchw"),
    "none": ((7, 9), (), "nchw"),
}
LAYOUT_CASES = [(name, "bfloat16") for name in LAYOUTS] + [
    (name, dtype) for name in ("inner", "outer", "all", "middle_nchw") for dtype in ("float", "half")
]

# name -> (dims, axis, layout)
SOFTMAXES = {
    "short_rows": ((37, 100), -1, "nchw"),
    "rows_4096": ((6, 4096), -1, "nchw"),
    "long_rows": ((3, 65536), -1, "nchw"),
    "single_long_row": ((1, 65536), -1, "nchw"),
    "single_short_row": ((1, 10), -1, "nchw"),
    "odd_rows": ((5, 16385), 1, "nchw"),
    "channels_nchw": ((4, 19, 7, 9), 1, "nchw"),
    "channels_nhwc": ((4, 64, 5, 5), 1, "nhwc"),
    "long_columns": ((2, 65536, 3), 1, "nchw"),
}
SOFTMAX_OPS = ("softmax", "log_softmax", "softmax_backward")
SOFTMAX_CASES = [
    ("short_rows", "float"),
    ("rows_4096", "bfloat16"),
    ("long_rows", "float"),
    ("single_long_row", "bfloat16"),
    ("single_short_row", "half"),
    ("odd_rows", "half"),
    ("channels_nchw", "half"),
    ("channels_nhwc", "bfloat16"),
    ("long_columns", "float"),
]

# name -> (dims, layout, dtype, running statistics, add + relu epilogue)
BATCHNORMS = {
    "resnet_nhwc": ((32, 64, 56, 56), "nhwc", "bfloat16", True, True),
    "resnet_nchw": ((32, 64, 56, 56), "nchw", "bfloat16", True, True),
    "nhwc_plain": ((8, 128, 14, 14), "nhwc", "half", False, False),
    "nchw_odd_spatial": ((3, 5, 7, 7), "nchw", "float", True, True),
    "nhwc_three_channels": ((2, 3, 5, 5), "nhwc", "bfloat16", False, True),
    "one_per_channel_nchw": ((1, 8, 1, 1), "nchw", "float", True, True),
    "one_per_channel_nhwc": ((1, 8, 1, 1), "nhwc", "half", True, False),
    "rank3_nwc": ((4, 16, 33), "nhwc", "float", True, False),
    "float_large_nchw": ((32, 16, 28, 28), "nchw", "float", True, True),
}


def layout_graph(name: str, dtype: str, mode: str = "add", epilogue: bool = False) -> gd.OperationGraphSpec:
    dims, axes, layout = LAYOUTS[name]
    return reduction_graph(dims, axes, mode, dtype, layout, epilogue)


def softmax_case(name: str, dtype: str, epilogue: bool = False, op: str = "softmax") -> gd.OperationGraphSpec:
    dims, axis, layout = SOFTMAXES[name]
    return softmax_graph(dims, axis, dtype, layout, epilogue, op)


def batchnorm_case(name: str, runtime_scalars: bool = False) -> gd.OperationGraphSpec:
    dims, layout, dtype, running, epilogue = BATCHNORMS[name]
    return batchnorm_graph(dims, layout, dtype, running, epilogue, runtime_scalars)


# -- CPU: compilation -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", list(ReductionMode))
def test_every_mode_compiles_split_over_chunks(mode: ReductionMode) -> None:
    kernels = check_compiles(reduction_graph((3, 20000), (1,), mode.value), Family.REDUCTION)
    assert labels(kernels) == ["reduction_rows_partial", "reduction_combine"]


@pytest.mark.parametrize(("name", "dtype"), LAYOUT_CASES)
def test_reduced_axis_sets_compile(name: str, dtype: str) -> None:
    check_compiles(layout_graph(name, dtype, epilogue=name in ("inner", "outer", "all")), Family.REDUCTION)


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize(("name", "dtype"), SOFTMAX_CASES)
def test_softmax_compiles(name: str, dtype: str, op: str) -> None:
    graph = softmax_case(name, dtype, epilogue=name in ("rows_4096", "long_rows"), op=op)
    (kernel,) = check_compiles(graph, Family.REDUCTION)
    assert kernel.grid[1] == 1


@pytest.mark.parametrize("name", list(BATCHNORMS))
def test_batchnorm_compiles(name: str) -> None:
    kernels = check_compiles(batchnorm_case(name), Family.BATCHNORM_TRAIN)
    assert labels(kernels)[-1].endswith("_apply")


def test_batchnorm_with_runtime_epsilon_and_momentum_compiles() -> None:
    kernels = check_compiles(batchnorm_case("resnet_nhwc", runtime_scalars=True), Family.BATCHNORM_TRAIN)
    combine = kernels[1]
    assert "const double s" in combine.source  # the scalars arrive as double parameters
    assert sum(p.kind is ParamKind.SCALAR for p in combine.params) == 2


def test_batchnorm_without_a_normalized_output_has_no_apply_kernel() -> None:
    g = new_graph("float")
    x = g.tensor([4, 6, 5, 5], name="x")
    channels = [1, 6, 1, 1]
    scale, bias = g.tensor(channels, name="scale"), g.tensor(channels, name="bias")
    _, mean, inv, *_ = g.batchnorm(x, scale, bias, epsilon=1e-5)
    mean.set_output(True)
    inv.set_output(True)
    kernels = check_compiles(g, Family.BATCHNORM_TRAIN)
    assert not any(label.endswith("_apply") for label in labels(kernels))


# -- CPU: the mapping each layout gets ------------------------------------------------------------
def test_batchnorm_nhwc_statistics_walk_channels_with_vectors_over_many_blocks() -> None:
    _, (program,) = emitted(batchnorm_case("resnet_nhwc"))
    stats, combine, apply = program.kernels
    assert labels(program.kernels) == ["bn_add_relu_columns_partial", "bn_add_relu_combine", "bn_add_relu_apply"]
    assert vector_widths(stats) == vector_widths(apply) == {8}
    assert stats.grid[0] * stats.grid[1] >= 256  # the (N, H, W) extent is split over blocks
    assert combine.grid == (2, 1, 1)  # 32 channels per block
    assert {s.name for s in program.scratch} == {"partials", "affine"}


def test_batchnorm_nchw_statistics_give_each_channel_a_split_group() -> None:
    _, (program,) = emitted(batchnorm_case("resnet_nchw"))
    stats = program.kernels[0]
    assert labels(program.kernels)[0] == "bn_add_relu_rows_partial"
    assert stats.grid[0] == 64 and stats.grid[1] > 1 and stats.block[0] == 256
    assert vector_widths(stats) == {8}


@pytest.mark.parametrize(
    ("dims", "layout", "vec", "channel"),
    [
        ((4, 8, 14, 14), "nchw", 4, "q1 = b1;"),  # vectors within H*W: one channel each
        ((4, 8, 7, 7), "nchw", 8, "q1 = qr2 % 8;"),  # H*W = 49: vectors across the packed tensor
        ((4, 64, 7, 7), "nhwc", 8, "q1 = (inside + e);"),  # vectors along C
        ((4, 3, 7, 7), "nhwc", 4, "q1 = (inside + e) % 3;"),
        ((3, 5, 7, 7), "nchw", 1, None),
    ],
)
def test_batchnorm_apply_vectors(dims: tuple[int, ...], layout: str, vec: int, channel: str | None) -> None:
    _, (program,) = emitted(batchnorm_graph(dims, layout, "bfloat16"))
    apply = program.kernels[-1]
    assert vector_widths(apply) == ({vec} if vec > 1 else set())
    if channel is not None:
        assert channel in apply.source


def test_batchnorm_of_one_element_per_channel_uses_the_biased_variance_for_the_running_average() -> None:
    _, (program,) = emitted(batchnorm_case("one_per_channel_nchw"))
    assert len(program.kernels) == 2  # no split: the walk finalizes the statistics itself
    assert "momentum * var)" in program.kernels[0].source
    _, (large,) = emitted(batchnorm_case("resnet_nhwc"))
    assert "momentum * var * 100352.0 / 100351.0" in large.kernels[1].source


@pytest.mark.parametrize(
    ("name", "label", "vec"),
    [
        ("inner", "reduction_rows", 8),
        ("inner_odd", "reduction_rows", 1),
        ("inner_long_single", "reduction_rows_partial", 8),
        ("outer", "reduction_columns_partial", 8),
        ("middle_nchw", "reduction_columns", 1),
        ("channels_nhwc", "reduction_columns", 8),
        ("spatial_nchw", "reduction_rows", 1),
        ("all", "reduction_rows_partial", 8),
        ("outer_and_inner", "reduction_rows", 8),
        ("none", "reduction_columns", 1),
    ],
)
def test_reduction_mapping_follows_the_layout(name: str, label: str, vec: int) -> None:
    _, (program,) = emitted(layout_graph(name, "bfloat16"))
    assert labels(program.kernels)[0] == label
    assert vector_widths(program.kernels[0]) == ({vec} if vec > 1 else set())
    assert len(program.kernels) == (2 if label.endswith("_partial") else 1)


@pytest.mark.parametrize(
    ("name", "dtype", "label", "threads", "backward_threads"),
    [
        ("short_rows", "float", "softmax_rows", 256, 256),
        # dy and y held: 8 values of each a thread, so twice the threads of softmax's 16
        ("rows_4096", "bfloat16", "softmax_rows", 256, 512),
        ("long_rows", "float", "softmax_long_rows", 1024, 1024),
        ("single_long_row", "bfloat16", "softmax_long_rows", 1024, 1024),
        ("channels_nchw", "half", "softmax_columns", 256, 256),
        ("channels_nhwc", "bfloat16", "softmax_rows", 256, 256),
        ("long_columns", "float", "softmax_columns", 256, 256),
    ],
)
@pytest.mark.parametrize("op", SOFTMAX_OPS)
def test_softmax_mapping(name: str, dtype: str, label: str, threads: int, backward_threads: int, op: str) -> None:
    """The same mapping for each op; softmax_backward reads two tensors (dy and y) per element."""
    _, (program,) = emitted(softmax_case(name, dtype, op=op))
    (kernel,) = program.kernels
    assert labels([kernel]) == [label.replace("softmax", op)]
    assert kernel.block[0] == (backward_threads if op == "softmax_backward" else threads)
    reads = 2 if op == "softmax_backward" else 1
    if label == "softmax_long_rows":
        assert kernel.source.count("gd::load_vec") == 2 * reads  # the row is read twice
    if label == "softmax_rows":
        assert kernel.source.count("gd::load_vec") == reads  # the row stays in registers


@pytest.mark.parametrize(
    "build",
    [
        lambda: reduction_graph((2**16, 2**15 + 3), (0, 1)),
        lambda: softmax_graph((2**16, 2**15 + 3), -1, "half"),
        lambda: batchnorm_graph((2**10, 64, 181, 181), "nhwc"),
    ],
)
def test_inputs_past_two_billion_elements_index_with_64_bits(build: Build) -> None:
    _, programs = emitted(build())
    for kernel in (k for program in programs for k in program.kernels):
        assert "const long long" in kernel.source and compile_cubin(kernel.source, kernel.name, 90)


def test_launch_choices_are_refused() -> None:
    graph = layout_graph("inner", "float")
    partition = fuse(graph)
    with pytest.raises(gd.GraphError, match="reduction family takes no launch choices"):
        emit_partition(partition, 90, {partition.nodes[0].name: {"threads": 128}})


def test_identical_graphs_give_identical_kernels() -> None:
    first = emitted(batchnorm_case("resnet_nhwc"))[1][0].kernels
    again = emitted(batchnorm_case("resnet_nhwc"))[1][0].kernels
    assert [k.name for k in first] == [k.name for k in again]


# -- CPU: index helpers used by the walks -------------------------------------------------------------
def test_merged_runs_join_contiguous_axes() -> None:
    nchw = gd.nchw_strides([8, 64, 7, 7])
    assert merged_runs((8, 64, 7, 7), nchw, (0, 2, 3)) == [(8, 64 * 49), (49, 1)]
    nhwc = gd.nhwc_strides([8, 64, 7, 7])
    assert merged_runs((8, 64, 7, 7), nhwc, (0, 2, 3)) == [(8 * 49, 64)]
    assert merged_runs((1, 5, 1), (5, 1, 1), (0, 2)) == []


def test_run_offset_walks_every_element_once() -> None:
    runs = [(3, 100), (5, 7), (4, 1)]
    statements, expression = run_offset("j", runs, "r", "int")
    offsets = []
    for j in range(60):
        scope: dict[str, int] = {"j": j}
        for line in statements:
            name, value = re.fullmatch(r"const int (\w+) = (.+);", line).groups()  # type: ignore[union-attr]
            scope[name] = eval(value.replace("/", "//"), {}, scope)
        offsets.append(eval(expression, {}, scope))
    expected = [a * 100 + b * 7 + c for a in range(3) for b in range(5) for c in range(4)]
    assert offsets == expected


# -- GPU --------------------------------------------------------------------------------------------------
GPU_MODES = [
    (mode, dims) for mode in ReductionMode for dims in ([(5, 9), (1,)], [(6, 33, 7), (1,)], [(4, 3, 5), (0, 2)])
]


@pytest.mark.gpu
@pytest.mark.parametrize(("mode", "case"), GPU_MODES)
def test_gpu_reduction_modes(mode: ReductionMode, case: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    from tests.gpu_check import check_on_gpu

    dims, axes = case
    check_on_gpu(reduction_graph(dims, axes, mode.value, "float", epilogue=True))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["add", "avg", "norm1", "norm2", "max", "min", "amax"])
def test_gpu_long_reductions_split_over_chunks(mode: str) -> None:
    from tests.gpu_check import check_on_gpu

    for dims, axes in (((3, 70001), (1,)), ((20000, 17), (0,)), ((1, 65536), (1,))):
        check_on_gpu(reduction_graph(dims, axes, mode, "float"))


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "dtype"), LAYOUT_CASES)
def test_gpu_reduced_axis_sets(name: str, dtype: str) -> None:
    from tests.gpu_check import check_on_gpu

    check_on_gpu(layout_graph(name, dtype, epilogue=name in ("inner", "outer", "all")))


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "dtype"), SOFTMAX_CASES)
@pytest.mark.parametrize("epilogue", [False, True])
@pytest.mark.parametrize("op", SOFTMAX_OPS)
def test_gpu_softmax(name: str, dtype: str, epilogue: bool, op: str) -> None:
    from tests.gpu_check import check_on_gpu

    check_on_gpu(softmax_case(name, dtype, epilogue, op))


def mixed_layout_softmax_backward(axis: int) -> gd.OperationGraphSpec:
    """dy row-major, y NHWC: the two reads' strides differ along every axis but one."""
    dims = [3, 12, 5, 7]
    g = new_graph("half")
    dy, y = g.tensor(dims, name="dy"), g.tensor(dims, stride=gd.nhwc_strides(dims), name="y")
    g.softmax_backward(dy, y, axis=axis, name="dsm").set_output(True)
    return g


@pytest.mark.parametrize("axis", [1, 3])
def test_softmax_backward_of_mixed_layouts_compiles(axis: int) -> None:
    (kernel,) = check_compiles(mixed_layout_softmax_backward(axis), Family.REDUCTION)
    assert "gd::load_vec" not in kernel.source  # no axis is contiguous in both


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [1, 3])
def test_gpu_softmax_backward_of_mixed_layouts(axis: int) -> None:
    from tests.gpu_check import check_on_gpu

    check_on_gpu(mixed_layout_softmax_backward(axis))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(BATCHNORMS))
def test_gpu_batchnorm(name: str) -> None:
    from tests.gpu_check import check_on_gpu

    check_on_gpu(batchnorm_case(name))


@pytest.mark.gpu
def test_gpu_batchnorm_runtime_scalars() -> None:
    from tests.gpu_check import check_on_gpu

    check_on_gpu(batchnorm_case("nchw_odd_spatial", runtime_scalars=True))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_gpu_batchnorm_of_inputs_far_from_zero(layout: str) -> None:
    """mean = 1000, std = 0.01: neither the variance (shifted sums) nor y (x - mean as hi + lo)
    may lose their precision to cancellation; float tolerance on every output."""
    import torch

    from graphdnn import reference
    from graphdnn.compare import relative_error, tolerance
    from tests.gpu_check import poisoned, to_device, to_numpy

    dims = (16, 32, 9, 9)
    graph = batchnorm_graph(dims, layout, "float", running=False, epilogue=False)
    ir = graph.validate()
    rng = np.random.default_rng(3)
    feeds = {
        "x": (1000.0 + 0.01 * rng.standard_normal(dims)).astype(np.float32),
        "scale": rng.uniform(0.5, 2.0, (1, 32, 1, 1)).astype(np.float32),
        "bias": rng.standard_normal((1, 32, 1, 1)).astype(np.float32),
    }
    expected = reference.execute(ir, feeds)
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    gd.compile(graph).execute({**{t.name: to_device(feeds[t.name], t) for t in ir.inputs}, **outputs})
    torch.cuda.synchronize()
    for t in ir.outputs:
        error = relative_error(to_numpy(outputs[t.name]), expected[t.name])
        assert error <= tolerance(t.data_type), f"'{t.name}': relative error {error:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "build",
    [
        lambda: batchnorm_case("resnet_nhwc"),
        lambda: batchnorm_case("resnet_nchw"),
        lambda: layout_graph("all", "float"),
        lambda: layout_graph("outer", "half"),
        lambda: softmax_case("long_rows", "float"),
    ],
)
def test_gpu_results_are_reproducible_and_correct_unaligned(build: Build) -> None:
    """Two runs give identical bits (fixed-order reductions, no atomics); buffers offset by one
    element (the aligned flag is 0: the element-wise fallbacks) still match the reference."""
    import torch

    from graphdnn import reference
    from graphdnn.compare import relative_error, tolerance
    from graphdnn.random_inputs import random_inputs
    from tests.gpu_check import poisoned, to_device, to_numpy

    graph = build()
    ir = graph.validate()
    feeds = random_inputs(ir, 1)
    expected = reference.execute(ir, feeds)
    plan = gd.compile(graph)

    def offset_copy(tensor: torch.Tensor) -> torch.Tensor:
        elements = tensor.untyped_storage().nbytes() // tensor.element_size() + 1
        storage = torch.empty(elements, dtype=tensor.dtype, device="cuda")
        view = torch.as_strided(storage, tensor.shape, tensor.stride(), storage_offset=1)
        view.copy_(tensor)
        return view

    runs = []
    for shift in (False, False, True):
        inputs = {t.name: to_device(feeds[t.name], t) for t in ir.inputs}
        outputs = {t.name: poisoned(t) for t in ir.outputs}
        if shift:
            inputs = {name: offset_copy(value) for name, value in inputs.items()}
            outputs = {name: offset_copy(value) for name, value in outputs.items()}
        plan.execute({**inputs, **outputs})
        torch.cuda.synchronize()
        runs.append({name: to_numpy(value) for name, value in outputs.items()})
    for t in ir.outputs:
        np.testing.assert_array_equal(runs[0][t.name], runs[1][t.name])
        error = relative_error(runs[2][t.name], expected[t.name].astype(np.float64))
        assert error <= tolerance(t.data_type), f"unaligned '{t.name}': relative error {error:.3g}"
