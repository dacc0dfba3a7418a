"""The RNN kernels' structure on the CPU: a projection GEMM then one step launch per time step
for each layer, the tensor-core projection where the weights are 16-bit and the target has
mma.sync, the step kernel's shared memory within the static limit at any hidden size, and
every kernel compiling with NVRTC for the target it was emitted for. (The shapes of
tests/test_codegen_direct.py's rnn cases compile there too, run in the CPU emulator in
tests/test_cpu_emulation.py and against the reference on the GPU.)"""

from __future__ import annotations

import pytest

from codegen import compile_cubin
from codegen.context import EmitContext
from codegen.families.direct_rnn import emit_rnn
from codegen.families.rnn_projection import STAGING
from codegen.families.rnn_step import SCHEDULE, UNITS, step_shape
from codegen.families.rnn_step_mma import PRODUCT, shared_budget
from fusion_rules import fuse
from graphdnn.errors import UnsupportedError
from graphdnn.signature import signature
from tests.test_codegen_direct import rnn_graph

MODES = ["lstm", "gru", "tanh", "relu"]


def program(spec, arch: int = 90, tuning: dict | None = None):
    ir = spec.validate()
    (fused,) = [f for f in fuse(ir, arch=arch).nodes if f.anchor is not None and f.anchor.op == "rnn"]
    return fused, emit_rnn(fused, EmitContext(ir, signature(ir), arch, tuning or {}))


def test_each_layer_is_a_projection_then_a_step_launch_per_time_step():
    _, emitted = program(rnn_graph("float", "lstm", 5, 3, 4, 6, 3, True))
    names = [k.name for k in emitted.kernels]
    assert len(names) == 3 * (1 + 5)
    for layer in range(3):
        projection, *steps = names[layer * 6 : (layer + 1) * 6]
        assert f"layer{layer}_projection" in projection
        assert len(set(steps)) == 1 and f"layer{layer}_step" in steps[0]  # one compiled kernel, launched T times
    step = emitted.kernels[1]
    assert step.grid[1] == 2  # both directions in one launch
    scratch = [s.name for s in emitted.scratch]
    assert scratch == ["rnn_xproj", "rnn_h", "rnn_c", "rnn_step", "rnn_layer0", "rnn_layer1"]


def test_gru_and_simple_rnns_keep_no_cell_state():
    for mode in ("gru", "tanh"):
        _, emitted = program(rnn_graph("float", mode, 3, 2, 4, 5, 1, False))
        assert [s.name for s in emitted.scratch] == ["rnn_xproj", "rnn_h", "rnn_step"]


@pytest.mark.parametrize(
    ("io", "arch", "tensor_cores"),
    [("half", 90, True), ("bfloat16", 80, True), ("half", 75, False), ("float", 90, False), ("double", 90, False)],
)
def test_projection_uses_mma_sync_for_16_bit_weights_from_sm_80(io, arch, tensor_cores):
    _, emitted = program(rnn_graph(io, "gru", 3, 2, 5, 7, 2, False), arch)
    projections = [k for k in emitted.kernels if "projection" in k.name]
    assert len(projections) == 2
    for kernel in projections:
        assert ("mma.sync.aligned.m16n8k16" in kernel.source) is tensor_cores
        assert ("_projection_mma_" in kernel.name) is tensor_cores


@pytest.mark.parametrize(
    ("io", "arch", "tuning", "tensor_cores"),
    [
        ("half", 90, {}, True),
        ("bfloat16", 80, {}, True),
        ("half", 90, {PRODUCT: "fma"}, False),  # the launch choice keeps the CUDA-core product
        ("half", 90, {SCHEDULE: "serial"}, True),  # the tensor-core product with its phases one after the other
        ("half", 75, {}, False),
        ("float", 90, {}, False),
        ("double", 80, {}, False),
    ],
)
def test_step_product_uses_mma_sync_for_16_bit_weights_from_sm_80(io, arch, tuning, tensor_cores):
    _, emitted = program(rnn_graph(io, "lstm", 3, 2, 5, 7, 2, True), arch, tuning)
    steps = {k.name: k for k in emitted.kernels if "_step" in k.name}
    assert len(steps) == 2
    for kernel in steps.values():
        assert ("mma.sync.aligned.m16n8k16" in kernel.source) is tensor_cores
        assert ("_step_mma_" in kernel.name) is tensor_cores
        assert compile_cubin(kernel.source, kernel.name, arch)


@pytest.mark.parametrize("hidden", [1, 13, 255, 1000, 2100, 4097])
@pytest.mark.parametrize("gates", [1, 3, 4])
@pytest.mark.parametrize("size", [4, 8])
@pytest.mark.parametrize("arch", [80, 90])
def test_step_shared_memory_fits_at_any_hidden_size(hidden, gates, size, arch):
    for directions in (1, 2):
        shape = step_shape(hidden, gates, directions, size, arch)
        assert shape.shared_bytes(gates, size) <= 48 * 1024
        assert shape.chunk % 32 == 0 and shape.chunk % (shape.vector * shape.k_warps) == 0
        assert 1 <= shape.units <= min(hidden, 32) and shape.unit_warps * shape.k_warps == 8


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize(
    ("io", "mode", "steps", "batch", "inputs", "hidden", "layers", "bidirectional", "lengths"),
    [
        ("half", "lstm", 3, 1, 7, 13, 2, True, "int32"),
        ("bfloat16", "gru", 2, 33, 5, 19, 3, True, "int64"),
        ("half", "tanh", 2, 4, 9, 21, 2, False, None),
        ("float", "relu", 2, 1, 3, 2100, 1, True, "int32"),
        ("double", "lstm", 2, 5, 6, 200, 2, True, None),
        ("half", "lstm", 2, 70, 3, 2100, 1, True, None),  # the largest tensor-core step tiles, in k chunks
        ("bfloat16", "relu", 2, 200, 3, 4097, 1, False, "int32"),
    ],
)
def test_kernels_compile_for_the_target_they_were_emitted_for(
    arch, io, mode, steps, batch, inputs, hidden, layers, bidirectional, lengths
):
    _, emitted = program(
        rnn_graph(io, mode, steps, batch, inputs, hidden, layers, bidirectional, lengths=lengths), arch
    )
    for kernel in {k.name: k for k in emitted.kernels}.values():
        assert compile_cubin(kernel.source, kernel.name, arch)


@pytest.mark.parametrize(
    ("hidden", "arch", "copies"),
    [(24, 90, True), (1024, 90, True), (1024, 80, True), (1536, 90, True), (13, 90, False), (1020, 80, False)],
)
def test_tensor_core_step_stages_with_cp_async_when_hidden_is_a_multiple_of_8(hidden, arch, copies):
    """W_hh rows and h_{t-1} (its 16-bit copy, rnn_h16) staged with 16-byte cp.async copies;
    dynamic shared memory within the target's opt-in limit; element by element otherwise."""
    _, emitted = program(rnn_graph("half", "lstm", 2, 64, 5, hidden, 1, False), arch)
    assert ("rnn_h16" in [s.name for s in emitted.scratch]) is copies
    steps = {k.name: k for k in emitted.kernels if "_step" in k.name}
    for kernel in steps.values():
        assert ("cp.async.cg.shared.global" in kernel.source) is copies
        assert ("rnn_h16[" in kernel.source) is copies
        assert 0 < kernel.shared_bytes <= shared_budget(arch)
        assert compile_cubin(kernel.source, kernel.name, arch)
    if hidden == 1024 and arch == 90:  # the benchmark's shape: the whole of k staged at once
        assert all("KC = 1024," in k.source for k in steps.values())
    for kernel in steps.values():  # k in four cp.async groups, each multiplied as it lands, from H = 512
        assert ("cp.async.wait_group 3;" in kernel.source) is (copies and hidden >= 512)


@pytest.mark.parametrize(
    ("io", "arch", "inputs", "bidirectional", "pieces"),
    [
        ("half", 90, 24, True, [True, True]),  # layer 1 reads the float output of 2 x 1000 units in pieces
        ("bfloat16", 80, 13, False, [False, True]),  # rows of 13 inputs are no whole 16-byte pieces
    ],
)
def test_projection_stages_whole_pieces_through_registers(io, arch, inputs, bidirectional, pieces):
    _, emitted = program(rnn_graph(io, "lstm", 2, 5, inputs, 1000, 2, bidirectional), arch)
    projections = [k for k in emitted.kernels if "projection" in k.name]
    assert [("load_pieces(" in k.source) for k in projections] == pieces
    for kernel in projections:
        assert compile_cubin(kernel.source, kernel.name, arch)
    _, element = program(rnn_graph(io, "lstm", 2, 5, inputs, 1000, 2, bidirectional), arch, {STAGING: "element"})
    assert not any("load_pieces(" in k.source for k in element.kernels)


def test_step_units_launch_choice_sets_the_blocks():
    _, emitted = program(rnn_graph("half", "gru", 2, 3, 8, 1000, 1, True), 90, {UNITS: 16})
    (step,) = {k.name: k for k in emitted.kernels if "_step" in k.name}.values()
    assert step.grid[:2] == (63, 2)


@pytest.mark.parametrize(
    ("key", "value"), [(UNITS, 0), (UNITS, 33), (UNITS, "8"), (SCHEDULE, "fast"), (STAGING, True), (STAGING, "tma")]
)
def test_bad_launch_choices_name_the_node_and_what_they_take(key, value):
    with pytest.raises(UnsupportedError, match=rf"node '.*': launch choice {key} takes .*, not {value!r}"):
        program(rnn_graph("half", "lstm", 2, 3, 8, 16, 1, False), 90, {key: value})
