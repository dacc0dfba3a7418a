"""The rnn kernels' launch choices on the GPU against the NumPy reference: the projection's
pipelined 16-byte staging (the default where rows are whole 16-byte pieces: layer 0 from x,
deeper layers from the float output of the layer below) and its element-by-element staging,
the step's overlapped (default) and serial tensor-core schedules, and its hidden units per block, on awkward hidden sizes (1, 7, 129, 1000, 1024) and
batch sizes, LSTM, GRU and the plain RNNs, one and two directions, variable lengths."""

from __future__ import annotations

import pytest

from codegen.families.rnn_projection import STAGING
from codegen.families.rnn_step import SCHEDULE, UNITS
from fusion_rules import fuse
from tests.test_codegen_direct import rnn_graph

# (io, mode, steps, batch, inputs, hidden, layers, bidirectional, lengths)
SHAPES = {
    "lstm_h1000_bidirectional": ("half", "lstm", 3, 5, 24, 1000, 2, True, "int32"),  # float A pieces in layer 1
    "gru_h129_n17": ("bfloat16", "gru", 4, 17, 16, 129, 2, False, None),  # layer 1's rows are not whole pieces
    "tanh_h7_bidirectional": ("half", "tanh", 5, 3, 8, 7, 2, True, "int64"),
    "relu_h1_one_sequence": ("half", "relu", 4, 1, 8, 1, 1, False, None),
    "lstm_h1024_n64": ("half", "lstm", 3, 64, 1024, 1024, 2, False, None),  # the benchmark's blocking
}
CHOICES = {
    "default": {},
    "element": {STAGING: "element"},
    "serial": {SCHEDULE: "serial"},
    "units4": {UNITS: 4},
    "units16": {UNITS: 16},
    "units32": {UNITS: 32},
}
CASES = [
    ("lstm_h1000_bidirectional", "default"),
    ("lstm_h1000_bidirectional", "element"),
    ("lstm_h1000_bidirectional", "units32"),
    ("lstm_h1000_bidirectional", "serial"),
    ("gru_h129_n17", "default"),
    ("gru_h129_n17", "units4"),
    ("tanh_h7_bidirectional", "default"),
    ("relu_h1_one_sequence", "default"),
    ("lstm_h1024_n64", "default"),
    ("lstm_h1024_n64", "serial"),
    ("lstm_h1024_n64", "units16"),
    ("lstm_h1024_n64", "units32"),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "choice"), CASES)
def test_launch_choice_matches_reference_on_gpu(shape, choice):
    from tests.gpu_check import check_on_gpu

    io, mode, steps, batch, inputs, hidden, layers, bidirectional, lengths = SHAPES[shape]
    spec = rnn_graph(io, mode, steps, batch, inputs, hidden, layers, bidirectional, lengths=lengths)
    ir = spec.validate()
    (fused,) = [f for f in fuse(ir).nodes if f.anchor is not None and f.anchor.op == "rnn"]
    check_on_gpu(spec, tuning={fused.name: CHOICES[choice]})
