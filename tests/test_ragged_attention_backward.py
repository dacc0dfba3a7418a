"""Packed (ragged) sequences in ``sdpa_backward`` (graphdnn/ops/attention_ragged.py): the
reference is the dense backward of each sequence alone, zero at tokens no sequence uses; bad
graphs are refused naming the tensor; the kernels (fill, delta, dK/dV, dQ) compile for sm_80 and
sm_90 on both paths and run on the CPU emulation against the reference (the GPU runs every
case in test_gpu_ragged_attention_backward.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import graphdnn as gd
from codegen import emitter
from codegen.context import EmitContext
from codegen.families.attention_backward import SIMT
from codegen.nvrtc import compile_cubin
from fusion_rules import Family, fuse
from graphdnn import reference
from graphdnn.dtypes import DataType
from graphdnn.errors import DataTypeError, GraphError, ShapeError, StructureError
from graphdnn.serialize import graph_to_json
from graphdnn.signature import signature
from tests import cpu_emulation
from tests.attention_backward_cases import (
    RAGGED_CASES,
    RAGGED_CPU_CASES,
    RaggedBackwardCase,
    cpu_runs,
    matches_on_the_cpu,
)
from tests.compile_check import compile_graphs


def alone(
    case: RaggedBackwardCase, feeds: dict[str, np.ndarray], b: int, rows: int, keys: int
) -> dict[str, np.ndarray]:
    """The dense sdpa_backward reference of sequence b alone: ``rows`` queries, ``keys`` keys."""
    g = gd.OperationGraphSpec(name="one", io_data_type=case.data_type, compute_data_type=DataType.FLOAT)
    widths = {"q": case.d, "k": case.d, "v": case.dv, "o": case.dv, "do": case.dv}
    q, k, v, o, d_o = (
        g.tensor(name=n, dim=[1, case.hk if n in "kv" else case.hq, keys if n in "kv" else rows, w])
        for n, w in widths.items()
    )
    stats = g.tensor(name="stats", dim=[1, case.hq, rows, 1], data_type=DataType.FLOAT)
    options = {name: value for name, value in case.options.items() if name != "max_seq_len_q"}
    grads = g.sdpa_backward(q, k, v, o, d_o, stats, attn_scale=case.d**-0.5, **options)
    for name, grad in zip(("dq", "dk", "dv"), grads):
        grad.set_output(True).set_name(name)
    start_q = int(feeds["cu_q"].flat[b])
    inputs = {n: feeds[n][:, :, start_q : start_q + rows] for n in ("q", "o", "do", "stats")}
    if case.packed_kv:
        start_kv = int(feeds["cu_kv"].flat[b])
        inputs |= {n: feeds[n][:, :, start_kv : start_kv + keys] for n in ("k", "v")}
    else:
        inputs |= {n: feeds[n][b : b + 1, :, :keys] for n in ("k", "v")}
    return reference.execute(g.validate(), inputs)


@pytest.mark.parametrize(
    "name", ["packed_qkv_causal", "packed_q_padded_kv", "d72_dv40_window", "max_rows_cut_to_100", "max_rows_simt"]
)
def test_the_reference_is_each_sequence_alone(name: str) -> None:
    """dQ of a sequence's first seq_len rows (at most max_seq_len_q), dK and dV of its first
    seq_len keys are those of the sequence alone; every other token's gradient is zero."""
    case = dataclasses.replace(RAGGED_CASES[name], data_type=DataType.FLOAT, forward=False)
    feeds = case.feeds(7)
    got = reference.execute(case.build().validate(), feeds)
    covered_q = np.zeros(got["dq"].shape[2], bool)
    covered_kv = np.zeros(got["dk"].shape[:3], bool)
    longest = case.options.get("max_seq_len_q", got["dq"].shape[2])
    for b in range(case.b):
        rows, keys = min(int(feeds["seq_q"].flat[b]), longest), int(feeds["seq_kv"].flat[b])
        if rows == 0:
            continue
        one = alone(case, feeds, b, rows, keys)
        start = int(feeds["cu_q"].flat[b])
        np.testing.assert_allclose(got["dq"][:, :, start : start + rows], one["dq"], rtol=1e-6, atol=1e-9)
        covered_q[start : start + rows] = True
        at, first = (0, int(feeds["cu_kv"].flat[b])) if case.packed_kv else (b, 0)
        for grad in ("dk", "dv"):
            np.testing.assert_allclose(got[grad][at : at + 1, :, first : first + keys], one[grad], rtol=1e-6, atol=1e-9)
        covered_kv[at, :, first : first + keys] = True
    assert not covered_q.all() and not covered_kv.all()
    assert (got["dq"][:, :, ~covered_q] == 0).all()
    assert (got["dk"][~covered_kv] == 0).all() and (got["dv"][~covered_kv] == 0).all()
    assert np.abs(got["dk"]).max() > 0 and np.abs(got["dq"]).max() > 0


def ragged_backward_graph(**changes: object) -> gd.OperationGraphSpec:
    """A packed Q, K and V backward with one tensor's dims or one argument changed."""
    g = gd.OperationGraphSpec(name="bad", io_data_type=DataType.BFLOAT16, compute_data_type=DataType.FLOAT)
    dims = {"q": [1, 4, 10, 64], "k": [1, 2, 12, 64], "v": [1, 2, 12, 64], "o": [1, 4, 10, 64], "do": [1, 4, 10, 64]}
    q, k, v, o, d_o = (g.tensor(name=n, dim=d) for n, d in (dims | changes.pop("dims", {})).items())  # type: ignore[operator]
    stats = g.tensor(name="stats", dim=changes.pop("stats_dim", [1, 4, 10, 1]), data_type=DataType.FLOAT)  # type: ignore[arg-type]
    seq = [g.tensor(name=n, dim=[3, 1, 1, 1], data_type=DataType.INT32) for n in ("seq_q", "seq_kv")]
    offsets_type = changes.pop("offsets_type", DataType.INT32)
    cu = [g.tensor(name=n, dim=[4, 1, 1, 1], data_type=offsets_type) for n in ("cu_q", "cu_kv")]  # type: ignore[arg-type]
    args = {"use_padding_mask": True, "seq_len_q": seq[0], "seq_len_kv": seq[1], "ragged_offset_q": cu[0]}
    args |= {"ragged_offset_kv": cu[1]} | changes
    for grad in g.sdpa_backward(q, k, v, o, d_o, stats, name="attn_bwd", **args):  # type: ignore[arg-type]
        grad.set_output(True)
    return g


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"use_padding_mask": False, "seq_len_q": None, "seq_len_kv": None}, StructureError, "needs use_padding_mask"),
        ({"offsets_type": DataType.HALF}, DataTypeError, "'cu_q' is half; ragged offsets are integer"),
        (
            {"dims": {"q": [3, 4, 10, 64]}},
            ShapeError,
            r"Q has dims \[3, 4, 10, 64\]; with RAGGED_OFFSET_Q it is packed",
        ),
        ({"dims": {"v": [3, 2, 12, 64]}}, ShapeError, r"V has dims \[3, 2, 12, 64\]"),
        (
            {"dims": {"do": [3, 4, 10, 64]}},
            ShapeError,
            r"DO has dims \[3, 4, 10, 64\]; expected O's \[1, Hq, T, Dv\] \(packed by RAGGED_OFFSET_Q\)",
        ),
        ({"stats_dim": [3, 4, 10, 1]}, ShapeError, r"STATS has dims \[3, 4, 10, 1\]; expected \[1, Hq, T, 1\]"),
        ({"max_seq_len_q": 0}, StructureError, "max_seq_len_q is 0; it bounds the sequences of a packed Q"),
        (
            {"ragged_offset_q": None, "max_seq_len_q": 4, "dims": {n: [3, 4, 10, 64] for n in ("q", "o", "do")}}
            | {"stats_dim": [3, 4, 10, 1]},
            StructureError,
            "max_seq_len_q is 4",
        ),
    ],
)
def test_bad_ragged_backward_graphs_are_refused_naming_what_is_wrong(
    changes: dict[str, object], error: type[GraphError], message: str
) -> None:
    with pytest.raises(error, match=message) as raised:
        ragged_backward_graph(**changes).validate()
    assert raised.value.node == "attn_bwd"


def test_json_keeps_the_offsets_and_max_seq_len_q() -> None:
    graph = RAGGED_CASES["max_rows_130"].build().validate()
    text = graph_to_json(graph)
    again = gd.OperationGraphSpec.from_json(text).validate()
    assert signature(again) == signature(graph)
    (node,) = [n for n in again.nodes if n.op == "sdpa_backward"]
    assert node.attributes.max_seq_len_q == 130  # type: ignore[attr-defined]
    assert node.input("RAGGED_OFFSET_Q") is not None and node.input("RAGGED_OFFSET_KV") is not None


def backward_program(case: RaggedBackwardCase, arch: int, tuning: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    graph = case.build().validate()
    (fused,) = [f for f in fuse(graph, arch=arch).nodes if f.family is Family.ATTENTION_BACKWARD]
    return graph, fused, emitter(fused.family)(fused, EmitContext(graph, signature(graph), arch, tuning or {}))


@pytest.mark.parametrize("name", sorted(RAGGED_CASES))
def test_packed_gradients_are_filled_then_written_by_the_backward_kernels(name: str) -> None:
    """The fill zeroes dQ, and dK and dV where K and V are packed (dense ones the kernels write
    whole); delta has a row per sequence row (max_seq_len_q of them where set); the mma.sync
    kernels for fp16/bf16, SIMT for fp32."""
    case = RAGGED_CASES[name]
    _, fused, program = backward_program(case, 90)
    fill, delta, dkdv, dq = program.kernels
    assert "_sdpa_ragged_fill_" in fill.name and "_delta" in delta.name
    grads = {t.name: t.id for t in fused.outputs}
    filled = {"dq", "dk", "dv"} if case.packed_kv else {"dq"}
    assert {p.tensor for p in fill.params} == {grads[n] for n in filled}
    path = "_simt_" if case.data_type is DataType.FLOAT else "_mma_"
    assert path in dkdv.name and path in dq.name
    (scratch,) = program.scratch
    tokens = case.tokens(case.lengths_q)
    assert scratch.bytes == 4 * case.b * case.hq * min(case.options.get("max_seq_len_q", tokens), tokens)
    assert ("kv_start" in dkdv.source) is case.packed_kv and "q_start" in dq.source


def test_every_case_compiles_for_sm80_and_sm90() -> None:
    report = compile_graphs([case.build().validate() for case in RAGGED_CASES.values()])
    assert not report.failures, "\n\n".join(report.failures)


def test_the_simt_kernels_compile_for_sm80_and_sm90() -> None:
    for arch in (80, 90):
        for name in ("packed_qkv_causal", "max_rows_cut_to_100", "packed_q_padded_kv"):
            for kernel in backward_program(RAGGED_CASES[name], arch, SIMT)[2].kernels:
                compile_cubin(kernel.source, kernel.name, arch, kernel.arch_suffix)


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize(("name", "path", "aligned"), cpu_runs(RAGGED_CPU_CASES))
def test_kernels_match_reference_on_the_cpu(
    name: str, path: str, aligned: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    case = RAGGED_CPU_CASES[name]
    graph, fused, program = backward_program(case, 80, SIMT if path == "simt" else {})
    assert all(f"_{path}_" in k.name for k in program.kernels[2:])
    matches_on_the_cpu(graph, fused, program, case.feeds(5), aligned, tmp_path_factory)
