"""The RNN backward kernels' structure on the CPU: per layer from the top a reset, T + 1 step
launches of one kernel, the rearranged operands where the tensor cores take them, then the
three all-step GEMMs; the step blocks' sequences (launch choice) and their errors. (The cases
of tests/test_codegen_direct.py run in the CPU emulator and against the reference on the GPU.)"""

from __future__ import annotations

import pytest

from codegen.context import EmitContext
from codegen.families.direct_rnn_backward import emit_rnn_backward
from codegen.families.rnn_backward_step import SEQUENCES
from fusion_rules import fuse
from graphdnn.errors import UnsupportedError
from graphdnn.signature import signature
from tests.test_codegen_direct import rnn_graph


def program(spec, arch: int = 90, tuning: dict | None = None):
    ir = spec.validate()
    (fused,) = [f for f in fuse(ir, arch=arch).nodes if f.anchor is not None and f.anchor.op == "rnn_backward"]
    return emit_rnn_backward(fused, EmitContext(ir, signature(ir), arch, tuning or {}))


def kinds(emitted) -> list[str]:
    """Each launch's kernel, by what its name says it does."""
    words = ("reset", "step", "dgates_h_t", "dgates_t", "input_t", "h_prev_t", "w_ih_t", "weights_ih", "weights_hh")
    return [next((w for w in words if w in k.name), "input") for k in emitted.kernels]


def test_layers_run_from_the_top_each_a_reset_its_steps_then_the_gemms():
    emitted = program(rnn_graph("float", "lstm", 5, 3, 4, 6, 2, True, kind="rnn_backward"))
    per_layer = ["reset", *["step"] * 6, "weights_ih", "weights_hh", "input"]
    assert kinds(emitted) == per_layer * 2
    assert "layer1_" in emitted.kernels[1].name and "layer0_" in emitted.kernels[-1].name
    assert len({k.name for k in emitted.kernels if "step" in k.name}) == 2  # one kernel a layer, launched T + 1 times
    assert [s.name for s in emitted.scratch] == ["rnn_dgates", "rnn_dh", "rnn_dc", "rnn_step", "rnn_grad0"]


@pytest.mark.parametrize(
    ("io", "arch", "steps", "rearranged"),
    [
        ("half", 90, 4, True),
        ("bfloat16", 80, 4, True),
        ("half", 90, 3, False),
        ("half", 75, 4, False),
        ("float", 90, 4, False),
    ],
)
def test_operands_are_rearranged_for_the_tensor_cores_where_pieces_fit(io, arch, steps, rearranged):
    """T*N = 8 (or 6: not whole pieces) and D*G*H = 48; GRU: the h-side gate gradients too."""
    emitted = program(rnn_graph(io, "gru", steps, 2, 5, 8, 1, True, kind="rnn_backward"), arch)
    moved = [kind for kind in kinds(emitted) if kind.endswith("_t")]
    assert moved == (["dgates_t", "dgates_h_t", "input_t", "h_prev_t", "w_ih_t"] if rearranged else [])
    gemms = [k for k in emitted.kernels if "weights" in k.name or k.name.split("_")[-2] == "input"]
    assert len(gemms) == 3 and all(("mma_16816" in k.source) is (arch >= 80 and io != "float") for k in gemms)
    assert all(("load_pieces(" in k.source) is rearranged for k in gemms)


@pytest.mark.parametrize(
    ("batch", "hidden", "tuning", "blocks"), [(64, 1024, {}, 256), (3, 40, {}, 6), (5, 40, {SEQUENCES: 2}, 6)]
)
def test_step_blocks_take_several_sequences(batch, hidden, tuning, blocks):
    """By default 16 sequences a block, halved while that leaves fewer blocks than SMs (132 on
    sm_90; 64 x 1024: 8, 256 blocks; 3 x 40: down to 1), and no more than the batch needs."""
    emitted = program(rnn_graph("half", "lstm", 2, batch, 8, hidden, 1, False, kind="rnn_backward"), 90, tuning)
    (step,) = {k.name: k for k in emitted.kernels if "_step" in k.name}.values()
    assert step.grid == (blocks, 1, 1)


@pytest.mark.parametrize("value", [0, 3, 32, "8"])
def test_bad_sequences_per_block_name_the_node_and_what_they_take(value):
    with pytest.raises(
        UnsupportedError, match=rf"node '.*': launch choice {SEQUENCES} takes a power of 2 up to 16, not {value!r}"
    ):
        program(rnn_graph("half", "lstm", 2, 3, 8, 16, 1, False, kind="rnn_backward"), 90, {SEQUENCES: value})
