"""The backward-norm kernels and the classic cuDNN ops' direct kernels (local response
normalisation, the spatial transformer, CTC loss, RNN inference) run on the CPU
(tests/cpu_emulation.py) against the reference: their index math (rows and columns of each
thread, the blocks' partial sums, the per-channel sums, the vector and element paths, the
channel windows, the sample points, CTC's and the RNNs' recursions) checked on a machine
without a GPU. Float, double and half kernels, small shapes; the `gpu` tests run every type
and the large shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import graphdnn as gd
from codegen import emitter
from codegen.context import EmitContext
from codegen.kernel import ParamKind
from fusion_rules import fuse
from graphdnn.compare import relative_error, tolerance
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import signature
from tests import cpu_emulation
from tests import test_codegen_direct as direct_cases
from tests.test_codegen_batchnorm_backward import bn_backward
from tests.test_codegen_norm_backward import Case, build, fused_graph
from tests.test_codegen_norm_training import Case as TrainingCase
from tests.test_codegen_norm_training import build as training_graph

pytestmark = pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")


def direct_case(name: str) -> gd.OperationGraphSpec:
    """A case of tests/test_codegen_direct.py, named after it."""
    graph = direct_cases.CASES[name]()
    graph.name = name
    return graph


def grouped_conv(
    kind: str, channels: int, groups: int, stride: int = 1, io: str = "float", size: int = 7, **options: object
) -> gd.OperationGraphSpec:
    """An NHWC 3x3 convolution pass of ``groups`` groups (depthwise: groups == channels) on a
    ``size`` x ``size`` image (odd by default, so that the threads' coordinates wrap unevenly).
    ``options``: ``dilation``, ``mode`` (true convolution: the filter flipped) and ``bias_relu``
    (a fused epilogue, forward only)."""
    name = "_".join([kind, f"g{groups}", f"c{channels}", f"s{stride}", io, f"{size}px", *options])
    g = gd.OperationGraphSpec(name=name, io_data_type=io)
    dilation = int(options.get("dilation", 1))  # type: ignore[call-overload]
    out = (size - 1) // stride + 1
    x_dim, w_dim, y_dim = [2, channels, size, size], [channels, channels // groups, 3, 3], [2, channels, out, out]

    def tensor(name: str, dim: list[int]) -> gd.TensorSpec:
        return g.tensor(name=name, dim=dim, stride=gd.nhwc_strides(dim))

    conv: dict[str, object] = {"padding": [dilation] * 2, "stride": [stride] * 2, "dilation": [dilation] * 2}
    if options.get("mode"):
        conv["convolution_mode"] = "CONVOLUTION"
    if kind == "fprop":
        result, dim = g.conv_fprop(tensor("x", x_dim), tensor("w", w_dim), **conv), y_dim  # type: ignore[arg-type]
        if options.get("bias_relu"):
            result = g.relu(g.add(result, g.tensor(name="bias", dim=[1, channels, 1, 1])))
    elif kind == "dgrad":
        result = g.conv_dgrad(tensor("dy", y_dim), tensor("w", w_dim), image_dim=x_dim, **conv)  # type: ignore[arg-type]
        dim = x_dim
    else:
        result = g.conv_wgrad(tensor("x", x_dim), tensor("dy", y_dim), filter_dim=w_dim, **conv)  # type: ignore[arg-type]
        dim = w_dim
    result.set_name("out").set_output(True).set_stride(gd.nhwc_strides(dim))
    return g


GRAPHS = [
    grouped_conv("fprop", 9, 9),  # depthwise on the SIMT GEMM kernel: threads in NHWC order
    grouped_conv("fprop", 12, 3, 2),
    grouped_conv("fprop", 12, 12, bias_relu=True),  # the depthwise kernel: runs of 4 float channels
    grouped_conv("fprop", 8, 8, 2, dilation=2, mode=True),
    grouped_conv("fprop", 24, 24, io="half", bias_relu=True),  # runs of 8 half channels
    grouped_conv("fprop", 8, 4, 2, mode=True),  # 2 channels a group: a run holds two groups
    grouped_conv("fprop", 16, 4, io="half"),  # 4 channels a group
    grouped_conv("fprop", 1368, 1368),  # a filter over 48 KiB: read from memory, not staged
    grouped_conv("wgrad", 9, 9),  # the direct sums kernel: lanes along c, then k, then the taps
    grouped_conv("wgrad", 12, 4, 2),
    grouped_conv("wgrad", 12, 12),  # runs of 4 float channels (direct_conv_runs)
    grouped_conv("wgrad", 16, 8, 2, io="half"),  # 2 channels a group, runs of 8 half channels
    grouped_conv("wgrad", 8, 2, dilation=2, mode=True),  # 4 channels a group
    grouped_conv("wgrad", 8, 8, size=64),  # 8192 pixels: the sums split in two, then finalized
    grouped_conv("dgrad", 12, 12, 2),  # runs of 4 float channels, only the taps the stride divides
    grouped_conv("dgrad", 16, 4, io="half", dilation=2, mode=True),  # 4 channels a group
    grouped_conv("dgrad", 16, 8, 2, io="half"),  # 2 channels a group
    build(Case("layernorm_backward", "float", (7, 33), (1, 33))),  # 2 rows per block, a 64-thread group
    build(Case("layernorm_backward", "half", (7, 1000), (1, 1000))),  # 8-element vectors
    build(Case("rmsnorm_backward", "float", (1000, 1), (1, 1))),  # 128 rows per block
    build(Case("rmsnorm_backward_nobias", "float", (3, 768), (1, 768))),
    build(Case("layernorm_backward", "float", (3, 6, 5, 7), (1, 6, 5, 7), layout="nhwc")),
    build(Case("layernorm_backward", "float", (4, 3, 5), (1, 3, 1))),  # a strided normalized axis
    build(Case("layernorm_backward", "double", (3, 17), (1, 17))),
    build(Case("layernorm_backward", "float", (3, 5000), (1, 5000))),  # too long: the direct kernels
    fused_graph("float", 7, 1000, prologue="mask_out"),
    fused_graph("float", 7, 33, "rmsnorm_backward", prologue="zero_centred"),
    fused_graph("half", 7, 768, "rmsnorm_backward", prologue="mask_out"),
    bn_backward("float", [7, 3, 5, 5], "nhwc", fused=True),
    bn_backward("float", [3, 33, 7]),
    bn_backward("half", [2, 37, 5, 3], "nhwc", fused=True),
    bn_backward("float", [8, 2, 16, 16], fused=True),  # the sums split in 4, then finalized
    bn_backward("double", [2, 3, 4, 5]),
    training_graph(TrainingCase("adalayernorm", "half", (2, 3, 40))),  # per-sample scale rows, 8-element vectors
    training_graph(TrainingCase("adalayernorm", "float", (3, 5, 33), bias=False)),
    training_graph(TrainingCase("adalayernorm_backward", "float", (2, 5, 33))),
    training_graph(TrainingCase("adalayernorm_backward", "half", (3, 2, 16))),
    training_graph(TrainingCase("adalayernorm_backward", "half", (3, 200, 16))),  # blocks per sample walk rows
    training_graph(TrainingCase("adalayernorm_backward", "float", (2, 3, 8), layout="seq_major")),  # direct sums
    training_graph(TrainingCase("instancenorm_backward", "float", (2, 3, 5, 3), layout="nhwc")),
    training_graph(TrainingCase("instancenorm_backward", "double", (1, 4, 3, 3))),
    training_graph(TrainingCase("groupnorm_backward", "float", (2, 6, 5, 3), 3, "nhwc")),
    training_graph(TrainingCase("groupnorm_backward", "half", (2, 8, 3, 3), 2)),
    training_graph(TrainingCase("groupnorm_backward", "float", (1, 4, 3, 2, 2), 1, "nhwc")),  # one group, 3 spatial
    # The one-pass kernel (norm_backward_sets.py): NHWC tiles of w channels, shuffled columns or not;
    # NCHW teams per channel with idle lanes; 1x1 spatial; a set too large (the direct kernels).
    training_graph(TrainingCase("instancenorm_backward", "half", (2, 16, 4, 4), layout="nhwc")),
    training_graph(TrainingCase("instancenorm_backward", "float", (2, 3, 8, 4))),
    training_graph(TrainingCase("groupnorm_backward", "half", (2, 16, 6, 4), 2, "nhwc")),
    training_graph(TrainingCase("groupnorm_backward", "half", (2, 16, 8, 8), 4)),
    training_graph(TrainingCase("groupnorm_backward", "half", (3, 10, 7, 3), 5)),
    training_graph(TrainingCase("groupnorm_backward", "float", (2, 6, 5, 3), 2, "nhwc")),  # 3 vectors a row
    training_graph(TrainingCase("groupnorm_backward", "float", (2, 5, 1, 1), 5, "nhwc")),
    training_graph(TrainingCase("groupnorm_backward", "double", (2, 6, 3, 2, 3), 3, "nhwc")),
    training_graph(TrainingCase("instancenorm_backward", "float", (1, 2, 160, 160))),  # 1024 threads, 7 walks
    training_graph(TrainingCase("instancenorm_backward", "float", (1, 2, 200, 200))),  # too large: direct
    *map(
        direct_case,
        [
            "lrn_nchw_half",
            "lrn_even_window_nhwc_float",
            "lrn_backward_3d_double",
            "lrn_backward_even_nhwc_half",
            "spatial_tf_grid_float",
            "spatial_tf_grid_one_column_half",
            "spatial_tf_dtheta_double",
            "spatial_tf_sampler_nchw_float",
            "spatial_tf_sampler_nhwc_half",
            "spatial_tf_sampler_backward_float",
            "spatial_tf_sampler_backward_nhwc_double",
            "ctc_softmax_float",
            "ctc_probabilities_batch_major_double",
            "ctc_loss_only_half",
            "rnn_lstm_two_layers_bidirectional_float",
            "rnn_gru_three_layers_double",
            "rnn_tanh_bidirectional_half",
            "rnn_relu_float",
            "rnn_lstm_lengths_bidirectional_float",
            "rnn_gru_lengths_int64_double",
            "lrn_backward_of_x_itself_float",
            "ctc_one_lengths_tensor_float",
            "rnn_shared_state_and_bias_float",
            "rnn_lstm_odd_hidden_one_sequence_half",
            "rnn_tanh_three_layers_odd_half",
            "rnn_lstm_chunked_37_sequences_double",
            "rnn_lstm_tensor_core_tiles_half",
            "rnn_gru_async_copies_half",
            "rnn_training_lstm_lengths_bidirectional_float",
            "rnn_training_gru_tensor_cores_half",
            "rnn_training_tanh_double",
            "rnn_backward_lstm_lengths_bidirectional_float",
            "rnn_backward_gru_lengths_double",
            "rnn_backward_relu_half",
            "rnn_backward_tanh_three_layers_float",
            "rnn_training_backward_lstm_lengths_float",
            "rnn_training_backward_gru_tensor_cores_half",
            "rnn_training_backward_lstm_rearranged_half",
            "rnn_backward_gru_rearranged_half",
        ],
    ),
]


# Resident grids of one block per SM whose blocks walk several row groups: the next rows' loads
# are prefetched (tuned: the heuristic does not choose them).
PIPELINED = [
    (build(Case("layernorm_backward", "float", (1000, 33), (1, 33))), (64, 2, 1, 1)),
    (fused_graph("half", 999, 256, "rmsnorm_backward", prologue="zero_centred"), (32, 4, 1, 1)),
    (training_graph(TrainingCase("adalayernorm_backward", "half", (3, 1500, 16))), (2, 16, 1, 1)),  # per sample
]


@pytest.mark.parametrize("graph", GRAPHS, ids=lambda g: g.name)
def test_matches_reference_on_the_cpu(graph: gd.OperationGraphSpec, tmp_path_factory: pytest.TempPathFactory) -> None:
    check(graph, {}, tmp_path_factory)


@pytest.mark.parametrize("item", PIPELINED, ids=lambda item: item[0].name)
def test_pipelined_matches_reference_on_the_cpu(
    item: tuple[gd.OperationGraphSpec, tuple[int, int, int, int]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    graph, choice = item
    keys = ("threads_per_row", "rows_per_block", "vectors_per_thread", "blocks_per_sm")
    check(graph, dict(zip(keys, choice)), tmp_path_factory, marker="the next rows' loads")


# The one-pass instance / group norm backward on a resident grid of 3 blocks walking the tiles
# (each asking its next tile into L2; shared staging alternating between two buffers).
RESIDENT = [
    training_graph(TrainingCase("instancenorm_backward", "half", (2, 16, 4, 4), layout="nhwc")),
    training_graph(TrainingCase("groupnorm_backward", "half", (2, 16, 8, 8), 4)),
    training_graph(TrainingCase("groupnorm_backward", "half", (3, 10, 7, 3), 5)),
]


@pytest.mark.parametrize("graph", RESIDENT, ids=lambda g: g.name)
def test_resident_grid_matches_reference_on_the_cpu(
    graph: gd.OperationGraphSpec, tmp_path_factory: pytest.TempPathFactory
) -> None:
    check(graph, {"grid": 3}, tmp_path_factory, marker="the next tile into L2")


@pytest.mark.parametrize("per_block", [1, 2, 16])
def test_rnn_backward_step_blocks_of_several_sequences_on_the_cpu(
    per_block: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The backward step's blocks summing dh for ``per_block`` sequences (5 of them: the last
    group ragged; 16: more than the block's warps, so each updates two), 37 units (two blocks of
    32, lanes past H idle), GRU (its two gate gradients) both ways with lengths."""
    graph = direct_cases.rnn_graph("float", "gru", 3, 5, 4, 37, 1, True, lengths="int32", kind="rnn_backward")
    check(graph, {"rnn_backward_sequences": per_block}, tmp_path_factory)


def check(
    graph: gd.OperationGraphSpec,
    tuning: dict[str, object],
    tmp_path_factory: pytest.TempPathFactory,
    marker: str = "",
) -> None:
    """The graph's kernels against the reference with aligned pointers (vector accesses) and,
    where a kernel has an element path (an ALIGNED parameter), with the flag at 0 too;
    ``marker``: a text each program's first kernel must contain (the tuning took effect)."""
    build_dir: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build_dir.mkdir(exist_ok=True)
    ir = graph.validate()
    programs = [
        (fused, emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, tuning))) for fused in fuse(ir).nodes
    ]
    paths = any(p.kind is ParamKind.ALIGNED for _, pr in programs for k in pr.kernels for p in k.params)
    feeds = random_inputs(ir, 0)
    expected = gd.reference.execute(ir, feeds)
    for aligned in (1, 0) if paths else (1,):
        memory = dict(feeds)
        for fused, program in programs:
            assert marker in program.kernels[0].source
            memory.update(cpu_emulation.run(fused, program, memory, aligned, build_dir))
        for t in ir.outputs:
            error = relative_error(memory[t.name].astype(np.float64), expected[t.name].astype(np.float64))
            assert error <= tolerance(t.data_type), f"{t.name} (aligned={aligned}): {error:.3g}"
