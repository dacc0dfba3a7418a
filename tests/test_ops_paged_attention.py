"""sdpa over a paged KV cache: the reference equals dense attention on the gathered K/V (GQA,
bottom-right causal, decode and prefill chunks, shuffled pages, ragged lengths), every
validation error, random page tables, the JSON round trip and the cuDNN frontend's spelling."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphdnn as gd
import graphdnn.cudnn as cudnn
from graphdnn import reference
from graphdnn.random_inputs import random_inputs
from tests.attention_cases import PAGED_CASES, PagedCase, gathered

SCHEMA = json.loads((Path(gd.__file__).parent / "schema" / "graph-v1.schema.json").read_text())


@pytest.mark.parametrize("case", sorted(PAGED_CASES))
def test_paged_attention_is_dense_attention_on_the_gathered_pages(case: str) -> None:
    paged = PAGED_CASES[case]
    feeds = paged.feeds(seed=7)
    got = reference.execute(paged.build().validate(), feeds)
    want = reference.execute(paged.dense().validate(), gathered(paged, feeds))
    assert set(got) == set(want)
    for name in got:
        np.testing.assert_array_equal(got[name], want[name])
    assert np.abs(got["o"].astype(np.float64)).max() > 0  # rows that see keys


def test_pages_past_a_sequence_are_never_read() -> None:
    """Entries for pages beyond seq_len_kv may hold anything (an allocator leaves them stale)."""
    case = PagedCase(b=2, max_len=40, page_size=16)
    feeds = case.feeds(seed=1)
    feeds["seq_kv"] = np.array([3, 17], np.int32).reshape(2, 1, 1, 1)
    want = reference.execute(case.build().validate(), feeds)
    for table in ("tk", "tv"):
        feeds[table][0, 0, 1:, 0] = -5  # sequence 0 needs page 0 only
        feeds[table][1, 0, 2:, 0] = 10**6  # sequence 1 pages 0 and 1
    got = reference.execute(case.build().validate(), feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_page_outside_the_pool_is_an_error_naming_the_table() -> None:
    case = PagedCase(b=1, max_len=20, page_size=16)
    feeds = case.feeds(seed=1)
    feeds["seq_kv"][...] = 20
    feeds["tv"][0, 0, 1, 0] = case.pages
    with pytest.raises(gd.GraphError, match=r"node 'attention'.*PAGE_TABLE_V names page \d+ for sequence 0, page 1"):
        reference.execute(case.build().validate(), feeds)


def test_skv_defaults_to_the_k_tables_pages_times_the_page_size() -> None:
    g = paged_graph(max_len=None)
    node = g.validate().nodes[0]
    from graphdnn.ops.attention import kv_length

    assert kv_length(node) == 3 * 4


def test_random_page_tables_name_pool_pages_and_lengths_stay_within_skv() -> None:
    ir = paged_graph(b=64, max_len=10).validate()
    feeds = random_inputs(ir, seed=2)
    for table in ("tk", "tv"):
        assert feeds[table].dtype == np.int32 and feeds[table].min() >= 0 and feeds[table].max() <= 8
    assert feeds["skv"].max() <= 10


# -- validation ---------------------------------------------------------------------------------
def paged_graph(
    *,
    b: int = 2,
    pools: tuple[tuple[int, ...], tuple[int, ...]] = ((9, 2, 4, 16), (9, 2, 4, 16)),
    tables: tuple[tuple[int, ...] | None, tuple[int, ...] | None] | None = None,
    table_type: str = "int32",
    max_len: int | None = 11,
    padded: bool = True,
) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(io_data_type="half")
    q = g.tensor([b, 4, 1, 16], name="q")
    k, v = (g.tensor(dims, name=n) for dims, n in zip(pools, "kv"))
    dims = tables if tables is not None else ((b, 1, 3, 1), (b, 1, 3, 1))
    tk, tv = (None if d is None else g.tensor(d, name=n, data_type=table_type) for d, n in zip(dims, ("tk", "tv")))
    kw: dict[str, Any] = {}
    if padded:
        kw = {"use_padding_mask": True, "seq_len_q": g.tensor([b, 1, 1, 1], name="sq", data_type="int32")}
        kw["seq_len_kv"] = g.tensor([b, 1, 1, 1], name="skv", data_type="int32")
    o, _ = g.sdpa(
        q, k, v, name="att", paged_attention_k_table=tk, paged_attention_v_table=tv,
        paged_attention_max_seq_len_kv=max_len, use_causal_mask_bottom_right=True, **kw,
    )  # fmt: skip
    o.set_output(True)
    return g


PAGED_ERRORS: dict[str, tuple[dict[str, Any], type[gd.GraphError], str]] = {
    "one_table": (
        {"tables": ((2, 1, 3, 1), None)},
        gd.StructureError,
        r"node 'att'.*needs both paged_attention_k_table and paged_attention_v_table; PAGE_TABLE_V is not given",
    ),
    "no_padding": ({"padded": False}, gd.StructureError, r"node 'att'.*paged KV cache needs use_padding_mask"),
    "float_table": ({"table_type": "float"}, gd.DataTypeError, r"PAGE_TABLE_K 'tk' is float; page tables hold integer"),
    "table_dims": (
        {"tables": ((2, 3, 1), (2, 1, 3, 1))},
        gd.ShapeError,
        r"tensor 'tk'.*PAGE_TABLE_K has dims \[2, 3, 1\], expected \[B, 1, max_pages, 1\] with B = 2",
    ),
    "table_batch": (
        {"tables": ((2, 1, 3, 1), (3, 1, 3, 1))},
        gd.ShapeError,
        r"tensor 'tv'.*PAGE_TABLE_V has dims \[3, 1, 3, 1\]",
    ),
    "pool_heads": (
        {"pools": ((9, 2, 4, 16), (9, 1, 4, 16))},
        gd.ShapeError,
        r"tensor 'k'.*paged, expected K \[pages, Hk, page_size, D\]",
    ),
    "too_long": (
        {"max_len": 13},
        gd.ShapeError,
        r"tensor 'tk'.*PAGE_TABLE_K addresses 3 pages of 4 keys = 12 keys, fewer than Skv = 13",
    ),
    "v_too_short": (
        {"pools": ((9, 2, 4, 16), (9, 2, 2, 16))},
        gd.ShapeError,
        r"tensor 'tv'.*PAGE_TABLE_V addresses 3 pages of 2 keys = 6 keys, fewer than Skv = 11",
    ),
    "zero_length": ({"max_len": 0}, gd.AttributeValueError, r"paged_attention_max_seq_len_kv is 0"),
}


@pytest.mark.parametrize("case", PAGED_ERRORS)
def test_paged_validation_errors_name_the_node_and_the_role(case: str) -> None:
    kwargs, error, pattern = PAGED_ERRORS[case]
    with pytest.raises(error, match=pattern):
        paged_graph(**kwargs).validate()


def test_a_max_length_without_page_tables_is_refused() -> None:
    g = gd.OperationGraphSpec(io_data_type="half")
    q, k, v = (g.tensor([1, 1, 2, 8], name=n) for n in "qkv")
    with pytest.raises(gd.AttributeValueError, match=r"node 'att'.*paged_attention_max_seq_len_kv is set without"):
        g.sdpa(q, k, v, paged_attention_max_seq_len_kv=2, name="att")


def test_json_round_trip_keeps_a_paged_graph_and_its_signature() -> None:
    g = PAGED_CASES["prefill_chunk_causal"].build()
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert again.signature() == g.signature() and again.to_json() == text
    node = json.loads(text)["nodes"][0]
    assert node["attributes"]["paged_attention_max_seq_len_kv"] == 77
    assert {"PAGE_TABLE_K", "PAGE_TABLE_V"} <= set(node["inputs"])
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(text), SCHEMA)


def test_the_signature_sees_the_max_length() -> None:
    assert paged_graph(max_len=11).signature() != paged_graph(max_len=12).signature()


# -- the cuDNN frontend's spelling --------------------------------------------------------------
def test_the_frontend_paged_attention_arguments_map_onto_the_node() -> None:
    """As the frontend's paged-attention samples write it: page pools as K and V, INT32 tables,
    the padding mask with both lengths, the maximum KV length."""
    case = PagedCase(b=2, hq=4, hk=2, max_len=40, page_size=16, d=32, dv=32)
    graph = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, compute_data_type=cudnn.data_type.FLOAT)
    q = graph.tensor(name="q", dim=[2, 4, 1, 32], stride=[128, 32, 32, 1])
    k = graph.tensor(name="k", dim=[case.pages, 2, 16, 32], stride=[1024, 512, 32, 1])
    v = graph.tensor(name="v", dim=[case.pages, 2, 16, 32], stride=[1024, 512, 32, 1])
    tables = [
        graph.tensor(name=n, dim=[2, 1, 3, 1], stride=[3, 3, 1, 1], data_type=cudnn.data_type.INT32)
        for n in ("tk", "tv")
    ]
    lengths = [
        graph.tensor(name=n, dim=[2, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32)
        for n in ("seq_q", "seq_kv")
    ]
    o, stats = graph.sdpa(
        q, k, v, is_inference=False, attn_scale=32**-0.5, use_padding_mask=True, seq_len_q=lengths[0],
        seq_len_kv=lengths[1], diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT, diagonal_band_right_bound=0,
        paged_attention_k_table=tables[0], paged_attention_v_table=tables[1], paged_attention_max_seq_len_kv=40,
        name="attention",
    )  # fmt: skip
    o.set_output(True).set_name("o")
    stats.set_output(True).set_name("stats")
    ir = graph.spec.validate()
    node = ir.nodes[0]
    assert node.attributes.paged_attention_max_seq_len_kv == 40  # type: ignore[attr-defined]
    assert node.attributes.use_causal_mask_bottom_right  # type: ignore[attr-defined]
    assert node.input("PAGE_TABLE_K").name == "tk" and node.input("PAGE_TABLE_V").name == "tv"  # type: ignore[union-attr]
    assert gd.OperationGraphSpec.from_json(graph.spec.to_json()).signature() == case.build().signature()
