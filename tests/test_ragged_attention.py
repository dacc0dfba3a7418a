"""Packed (ragged) sequences in ``sdpa`` (graphdnn/ops/attention_ragged.py): the reference is
each sequence alone; offsets in any order follow the ownership rule; bad graphs are refused
naming the tensor; the kernels (fill, then flash or SIMT) compile for sm_80 and sm_90, the flash
one runs on the CPU emulation against the reference (the GPU runs every case in
test_gpu_ragged_attention.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import graphdnn as gd
from codegen import emitter
from codegen.context import EmitContext
from codegen.emit import candidates
from fusion_rules import Family, fuse
from graphdnn import reference
from graphdnn.compare import relative_error
from graphdnn.dtypes import DataType
from graphdnn.errors import DataTypeError, GraphError, ShapeError, StructureError, UnsupportedError
from graphdnn.lower import lower
from graphdnn.ops.attention_ragged import owned_ranges
from graphdnn.serialize import graph_to_json
from graphdnn.signature import signature
from tests import cpu_emulation
from tests.attention_cases import RAGGED_CASES, RaggedCase
from tests.compile_check import compile_graphs


def dense_reference(
    case: RaggedCase, feeds: dict[str, np.ndarray], b: int, rows: int, keys: int
) -> dict[str, np.ndarray]:
    """Sequence b alone as a dense sdpa of ``rows`` queries and ``keys`` keys."""
    g = gd.OperationGraphSpec(name="one", io_data_type=case.data_type, compute_data_type=DataType.FLOAT)
    q = g.tensor(name="q", dim=[1, case.hq, rows, case.d])
    k = g.tensor(name="k", dim=[1, case.hk, keys, case.d])
    v = g.tensor(name="v", dim=[1, case.hk, keys, case.dv])
    options = {name: value for name, value in case.options.items() if name != "max_seq_len_q"}
    o, stats = g.sdpa(q, k, v, attn_scale=case.d**-0.5, generate_stats=True, **options)
    o.set_output(True).set_name("o")
    stats.set_output(True).set_name("stats")  # type: ignore[union-attr]
    cu_q = feeds["cu_q"].reshape(-1)
    start_q = int(cu_q[b])
    if case.packed_kv:
        start_kv = int(feeds["cu_kv"].reshape(-1)[b])
        k_rows, v_rows = (feeds[n][:, :, start_kv : start_kv + keys] for n in ("k", "v"))
    else:
        k_rows, v_rows = (feeds[n][b : b + 1, :, :keys] for n in ("k", "v"))
    return reference.execute(g.validate(), {"q": feeds["q"][:, :, start_q : start_q + rows], "k": k_rows, "v": v_rows})


@pytest.mark.parametrize("name", ["packed_qkv_causal", "packed_q_padded_kv", "d72_dv40_window", "max_rows_cut_to_100"])
def test_the_reference_is_each_sequence_alone(name: str) -> None:
    """A sequence's first seq_len rows (at most max_seq_len_q) attend to its first seq_len keys."""
    case = dataclasses.replace(RAGGED_CASES[name], data_type=DataType.FLOAT)
    feeds = case.feeds(7)
    got = reference.execute(case.build().validate(), feeds)
    covered = np.zeros(got["o"].shape[2], bool)
    longest = case.options.get("max_seq_len_q", got["o"].shape[2])
    for b in range(case.b):
        rows, keys = min(int(feeds["seq_q"].flat[b]), longest), int(feeds["seq_kv"].flat[b])
        if rows == 0:
            continue
        start = int(feeds["cu_q"].flat[b])
        alone = dense_reference(case, feeds, b, rows, keys)
        np.testing.assert_allclose(got["o"][:, :, start : start + rows], alone["o"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["stats"][:, :, start : start + rows], alone["stats"], rtol=1e-5)
        covered[start : start + rows] = True
    # a sequence's unused rows, and the spare tokens past the last, are O = 0 and STATS = -inf
    assert not covered.all()
    assert (got["o"][:, :, ~covered] == 0).all() and (got["stats"][:, :, ~covered] == -np.inf).all()


def test_offsets_in_any_order_or_range_give_sequences_that_never_overlap() -> None:
    # sequence b owns [off[b], min(off[b + 1:])), offsets clamped to [0, T]
    offsets = np.array([0, 10, 5, 20, 99, 18])
    assert owned_ranges(offsets, 18).tolist() == [[0, 5], [10, 10], [5, 18], [18, 18], [18, 18]]
    owned = np.concatenate([np.arange(s, e) for s, e in owned_ranges(np.array([3, -4, 7, 7, 2]), 9)])
    assert len(owned) == len(set(owned.tolist()))


def test_shuffled_offsets_match_the_reference_of_the_owned_ranges() -> None:
    case = RaggedCase(lengths_q=(4, 6, 5), lengths_kv=(4, 6, 5), data_type=DataType.FLOAT, short=0, options={})
    feeds = case.feeds(3)
    # token t is the last sequence's whose offset is at most t: sequence 1 (offset 0) owns 0..11,
    # so sequence 0 (offset 6) owns nothing; sequence 2 owns 12..14
    feeds["cu_q"] = np.array([6, 0, 12, 15], np.int32).reshape(-1, 1, 1, 1)
    feeds["cu_kv"] = feeds["cu_q"].copy()
    feeds["seq_q"] = feeds["seq_kv"] = np.array([6, 6, 3], np.int32).reshape(-1, 1, 1, 1)
    got = reference.execute(case.build().validate(), feeds)
    for start, rows in ((0, 6), (12, 3)):
        at = {**feeds, "cu_q": np.array([start, 0, 0, 0]), "cu_kv": np.array([start, 0, 0, 0])}
        alone = dense_reference(case, at, 0, rows, rows)
        np.testing.assert_allclose(got["o"][:, :, start : start + rows], alone["o"], rtol=1e-5, atol=1e-6)
    assert (got["o"][:, :, 6:12] == 0).all()


def ragged_graph(**changes: object) -> gd.OperationGraphSpec:
    """packed_qkv_causal with one argument of its sdpa or one tensor changed."""
    g = gd.OperationGraphSpec(name="bad", io_data_type=DataType.BFLOAT16, compute_data_type=DataType.FLOAT)
    dims = {"q": [1, 4, 10, 64], "k": [1, 2, 12, 64], "v": [1, 2, 12, 64]} | changes.pop("dims", {})  # type: ignore[operator]
    q, k, v = (g.tensor(name=n, dim=d) for n, d in dims.items())
    offsets_type = changes.pop("offsets_type", DataType.INT32)
    seq = [g.tensor(name=n, dim=[3, 1, 1, 1], data_type=DataType.INT32) for n in ("seq_q", "seq_kv")]
    cu = [
        g.tensor(name=n, dim=changes.pop("offsets_dim", [4, 1, 1, 1]), data_type=offsets_type)
        for n in ("cu_q", "cu_kv")
    ]  # type: ignore[arg-type]
    args = {"use_padding_mask": True, "seq_len_q": seq[0], "seq_len_kv": seq[1], "ragged_offset_q": cu[0]}
    args |= {"ragged_offset_kv": cu[1]} | changes
    o, _ = g.sdpa(q, k, v, name="attn", **args)  # type: ignore[arg-type]
    o.set_output(True)
    return g


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"use_padding_mask": False, "seq_len_q": None, "seq_len_kv": None}, StructureError, "needs use_padding_mask"),
        ({"offsets_dim": [3, 1, 1, 1]}, ShapeError, r"RAGGED_OFFSET_Q has dims \[3, 1, 1, 1\], expected \[B \+ 1"),
        ({"offsets_type": DataType.FLOAT}, DataTypeError, "'cu_q' is float; ragged offsets are integer"),
        (
            {"dims": {"q": [3, 4, 10, 64]}},
            ShapeError,
            r"Q has dims \[3, 4, 10, 64\]; with RAGGED_OFFSET_Q it is packed",
        ),
        ({"dims": {"k": [3, 2, 12, 64], "v": [3, 2, 12, 64]}}, ShapeError, r"K has dims \[3, 2, 12, 64\]"),
        ({"max_seq_len_q": 0}, StructureError, "max_seq_len_q is 0; it bounds the sequences of a packed Q"),
        (
            {"ragged_offset_q": None, "max_seq_len_q": 4, "dims": {"q": [3, 4, 10, 64]}},
            StructureError,
            "max_seq_len_q is 4",
        ),
    ],
)
def test_bad_ragged_graphs_are_refused_naming_what_is_wrong(
    changes: dict[str, object], error: type[GraphError], message: str
) -> None:
    with pytest.raises(error, match=message) as raised:
        ragged_graph(**changes).validate()
    assert raised.value.node == "attn"


def test_json_keeps_the_offsets_and_the_signature_sees_them() -> None:
    graph = RAGGED_CASES["packed_qkv_causal"].build().validate()
    text = graph_to_json(graph)
    again = gd.OperationGraphSpec.from_json(text).validate()
    assert signature(again) == signature(graph)
    assert "RAGGED_OFFSET_KV" in text
    unpacked = RaggedCase(packed_kv=False).build().validate()
    assert signature(unpacked) != signature(graph)


def attention_fused(case: RaggedCase, arch: int):  # type: ignore[no-untyped-def]
    graph = case.build().validate()
    (fused,) = [f for f in fuse(graph, arch=arch).nodes if f.family is Family.ATTENTION]
    return graph, fused


@pytest.mark.parametrize("name", sorted(RAGGED_CASES))
@pytest.mark.parametrize("arch", [80, 90])
def test_a_packed_output_is_filled_then_written_by_one_attention_kernel(name: str, arch: int) -> None:
    """The Hopper kernel on sm_90 for head dims 64 and 128 (one block per work item: a block
    past its sequence exits), else flash (fp16/bf16) or SIMT; never the decode kernel."""
    case = RAGGED_CASES[name]
    graph, fused = attention_fused(case, arch)
    program = emitter(fused.family)(fused, EmitContext(graph, signature(graph), arch, {}))
    hopper = arch == 90 and case.d in (64, 128) and case.dv == case.d and case.data_type is not DataType.FLOAT
    path = "simt" if case.data_type is DataType.FLOAT else "wgmma" if hopper else "flash"
    fill, attention = program.kernels
    assert "_sdpa_ragged_fill_" in fill.name and f"_{path}_" in attention.name
    choices = candidates(fused, arch)
    assert all(c.get("path") in (None, "wgmma") and not c.get("persistent") for c in choices)
    assert any(c.get("path") == "wgmma" for c in choices) is hopper


def test_the_decode_kernel_refuses_packed_sequences() -> None:
    graph, fused = attention_fused(RAGGED_CASES["packed_qkv_causal"], 90)
    with pytest.raises(UnsupportedError, match=r"packed \(ragged\) sequences run on the Hopper, the mma\.sync flash"):
        emitter(fused.family)(fused, EmitContext(graph, signature(graph), 90, {"path": "decode"}))
    persistent = {"path": "wgmma", "block_n": 128, "pingpong": False, "persistent": True}
    with pytest.raises(UnsupportedError, match="is not one of this problem's choices"):
        emitter(fused.family)(fused, EmitContext(graph, signature(graph), 90, persistent))


def test_every_case_compiles_for_sm80_and_sm90() -> None:
    report = compile_graphs([case.build().validate() for case in RAGGED_CASES.values()])
    assert not report.failures, "\n\n".join(report.failures)


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize(
    "case",
    [
        RaggedCase(lengths_q=(5, 0, 40), lengths_kv=(7, 3, 37), data_type=DataType.HALF, d=32, dv=16),
        RaggedCase(lengths_q=(9, 4), lengths_kv=(9, 30), data_type=DataType.HALF, d=16, dv=16, packed_kv=False),
    ],
    ids=["packed_kv", "padded_kv"],
)
def test_the_flash_kernel_matches_the_reference_on_the_cpu(
    case: RaggedCase, tmp_path_factory: pytest.TempPathFactory
) -> None:
    build_dir: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build_dir.mkdir(exist_ok=True)
    graph, fused = attention_fused(case, 80)
    program = emitter(fused.family)(fused, EmitContext(graph, signature(graph), 80, {}))
    feeds = case.feeds(5)
    expected = reference.execute(graph, feeds)
    got = cpu_emulation.run(fused, program, feeds, 1, build_dir)
    for t in graph.outputs:
        assert relative_error(got[t.name], expected[t.name]) < 2e-3, t.name
    kernels = lower(fuse(graph, arch=80), 80, signature(graph), lambda content_hash: content_hash).sources
    assert len(kernels) == 2
