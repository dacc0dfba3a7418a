"""Dynamic shapes, first slice: symbolic dims in the IR, inference, JSON, signature, reference
execution, and the GPU compile's clear refusal of families whose kernels take no runtime
extents (the ones that do: tests/test_dynamic_kernels.py)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import graphdnn as gd
from graphdnn.cli import main
from graphdnn.layout import MAX_DIM, check_strides, packed_strides
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import canonical_form
from graphdnn.specialize import specialize
from graphdnn.symbolic import Sym, counterexample
from tests.graph_strategies import Recipe, build, pointwise_recipes, random_feeds

SCHEMA = json.loads((Path(gd.__file__).parent / "schema" / "graph-v1.schema.json").read_text())
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def graph(io: str = "float") -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec("dyn", io_data_type=io)


def ln_matmul(batch: int | Sym | None = None, seq: int | Sym | None = None) -> gd.OperationGraphSpec:
    """[batch, seq, 16] -> layernorm -> gelu -> matmul [16, 8] -> (row sums, softmax, [batch*seq, 8])."""
    g = graph()
    b = g.dim("batch", 1, 16) if batch is None else batch
    s = g.dim("seq", 1, 8) if seq is None else seq
    x = g.tensor([b, s, 16], name="x")
    y = g.layernorm("inference", x, g.tensor([1, 1, 16], name="scale"), g.tensor([1, 1, 16], name="bias"), 1e-5)[0]
    m = g.matmul(g.gelu(y), g.tensor([16, 8], name="w"), name="mm")
    g.reduction(m, mode="add", axes=[2], name="rows").set_output(True)
    g.softmax(m, axis=1, name="sm").set_output(True)
    g.reshape(m, shape=[b * s, 8], name="flat").set_output(True)
    return g


def ln_feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"x": (batch, seq, 16), "scale": (1, 1, 16), "bias": (1, 1, 16), "w": (16, 8)}
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


# -- symbols and the arithmetic on them ----------------------------------------------------------
def test_dim_declares_a_symbol_shared_by_name() -> None:
    g = graph()
    batch = g.dim("batch", min=1, max=256)
    assert batch == g.dim("batch", 1, 256) and str(batch) == "batch"
    assert g.symbols == (gd.Symbol("batch", 1, 256),)
    assert str(batch * 4 * g.dim("seq", 1, 8) * batch) == "4*batch*batch*seq"
    assert batch * 2 != batch and batch * 1 == batch and batch * 0 == 0
    with pytest.raises(
        gd.ShapeError, match=r"symbol 'batch' is declared with range 1\.\.256; it cannot also be 1\.\.8"
    ):
        g.dim("batch", 1, 8)
    with pytest.raises(gd.ShapeError, match=r"symbol name '2b' must be a C identifier"):
        g.dim("2b", 1, 8)
    with pytest.raises(gd.ShapeError, match=r"range 8\.\.4 must satisfy 1 <= min <= max <= 2147483647"):
        g.dim("n", 8, 4)
    with pytest.raises(gd.ShapeError, match=r"range 0\.\.4"):
        g.dim("n", 0, 4)


def test_only_products_are_computed_everything_else_is_refused() -> None:
    batch = graph().dim("batch", 1, 256)
    for refused in (lambda: batch + 1, lambda: batch - 1, lambda: batch // 2, lambda: batch > 1, lambda: int(batch)):
        with pytest.raises(gd.SymbolicDimError, match=r"needs the value of symbolic dim batch \(batch in 1\.\.256\)"):
            refused()


def test_comparisons_over_a_range_are_exact() -> None:
    g = graph()
    b, s = g.dim("b", 1, 8), g.dim("s", 2, 4)
    assert counterexample(b * 8, b * 4) is None
    assert counterexample(b * s, b * 2) is None  # s >= 2 everywhere
    assert counterexample(b * s, b * 3) == {"s": 2}  # fails only where s = 2, whatever b
    assert counterexample(b, 8) == {"b": 1}
    assert counterexample(16, b * 2) is None


def test_strides_of_symbolic_dims_are_products_and_overlap_is_proved_over_the_range() -> None:
    g = graph()
    n, h = g.dim("n", 1, 64), g.dim("h", 1, 32)
    assert packed_strides((n, 3, h, 5)) == (15 * h, 5 * h, 5, 1)
    assert gd.nhwc_strides((n, 3, h, 5)) == (15 * h, 1, 15, 3)
    check_strides((n, h, 8), (16 * h, 8, 1))  # gaps, as in a slice of a wider tensor
    check_strides((n, h, 8), (64, 8, 1), read_only=True)  # a graph input may overlap
    with pytest.raises(gd.StrideError, match=r"dim 1 \(extent h\) steps 4 but the dims inside it span 8;"):
        check_strides((n, h, 8), (8 * h, 4, 1))
    g.relu(g.tensor([n, h, 8], name="x"), name="r").set_stride([64, 8, 1]).set_output(True)
    with pytest.raises(
        gd.StrideError,
        match=r"tensor 'r::y': strides \[64, 8, 1\] overlap for dims \[n, h, 8\]: dim 0 \(extent n\) steps 64 but "
        r"the dims inside it span 8\*h when h = 32;",
    ):
        g.validate()


def test_dims_are_checked_at_the_top_of_the_range() -> None:
    g = graph()
    big = g.dim("big", 1, MAX_DIM)
    x = g.tensor([big * 2], name="x")
    g.relu(x).set_output(True)
    with pytest.raises(gd.ShapeError, match=r"tensor 'x': dim\[0\] = 2\*big reaches 4294967294"):
        g.validate()


# -- shape inference through the ops --------------------------------------------------------------
def test_inference_carries_symbols_through_norms_matmul_reductions_reshape() -> None:
    g = ln_matmul()
    ir = g.validate()
    b, s = (Sym.of(sym) for sym in ir.symbols)
    assert ir.tensor("mm::C").dim == (b, s, 8) and ir.tensor("mm::C").stride == (8 * s, 8, 1)
    assert ir.tensor("rows::y").dim == (b, s, 1)
    assert ir.tensor("sm::y").dim == (b, s, 8)
    assert ir.tensor("flat::y").dim == (b * s, 8)
    with pytest.raises(
        gd.ShapeError,
        match=r"y has dims \[batch, 8\] \(8\*batch elements\), but input \[batch, seq, 8\] has 8\*batch\*seq elements",
    ):
        g.reshape(g.tensor_named("mm::C"), shape=[b, 8])


def test_broadcasting_matches_a_symbol_only_with_itself_or_one() -> None:
    g = graph()
    b, c = g.dim("b", 1, 8), g.dim("c", 1, 8)
    x = g.tensor([b, 4], name="x")
    assert g.add(x, g.tensor([1, 4], name="row")).dim == (b, 4)
    assert g.add(x, g.tensor([b, 1], name="col")).dim == (b, 4)
    with pytest.raises(gd.ShapeError, match=r"dim 0 is b and 3 \(a symbolic dim broadcasts only .* at b = 8\)"):
        g.add(x, g.tensor([3, 4], name="three"))
    with pytest.raises(gd.ShapeError, match=r"dim 0 is b and c"):
        g.add(x, g.tensor([c, 4], name="other"))


def test_matmul_takes_dynamic_rows_and_batch() -> None:
    g = graph()
    b, m = g.dim("b", 1, 8), g.dim("m", 1, 512)
    a = g.tensor([b, 1, m, 32], name="a")
    c = g.matmul(a, g.tensor([4, 32, 16], name="w"), name="mm")
    assert c.dim == (b, 4, m, 16)
    with pytest.raises(gd.ShapeError, match=r"has K = m columns but B \[32, 16\] has K = 32 rows"):
        g.matmul(g.tensor([8, m], name="k"), g.tensor([32, 16], name="w2"))


def test_conv_takes_a_dynamic_batch_and_names_the_dim_it_cannot_take() -> None:
    g = graph()
    n, h = g.dim("n", 1, 32), g.dim("h", 8, 64)
    x = g.tensor([n, 4, 16, 16], stride=gd.nhwc_strides([n, 4, 16, 16]), name="x")
    y = g.conv_fprop(x, g.tensor([8, 4, 3, 3], name="w"), padding=[1, 1], name="conv")
    assert y.dim == (n, 8, 16, 16) and y.stride == gd.nhwc_strides((n, 8, 16, 16))
    tall = g.tensor([1, 4, h, 16], name="tall")
    with pytest.raises(
        gd.ShapeError,
        match=r"node 'c2': conv_fprop cannot take a symbolic dim as image 'tall' dim 2 \(h\): "
        r"comparing needs the value of symbolic dim h \(h in 8\.\.64\); that dim must be static",
    ):
        g.conv_fprop(tall, g.tensor([8, 4, 3, 3], name="w2"), padding=[1, 1], name="c2")


def test_ops_that_need_a_static_dim_say_which() -> None:
    g = graph()
    b = g.dim("b", 1, 8)
    x = g.tensor([b, 6], name="x")
    with pytest.raises(gd.AttributeValueError, match=r"slice cannot cut dim 0 of input 'x': it is symbolic \(b\)"):
        g.slice(x, [slice(0, 2)])
    with pytest.raises(gd.ShapeError, match=r"concatenate cannot take a symbolic dim as inputs 'x' dim 0"):
        g.concatenate([x, x], axis=0, name="cat")
    assert g.concatenate([x, x], axis=1).dim == (b, 12)
    assert g.transpose(x, permutation=[1, 0]).dim == (6, b)


def test_validation_checks_symbols_across_the_graph() -> None:
    g = graph()
    other = graph().dim("b", 1, 4)
    g.add(g.tensor([g.dim("b", 1, 8), 2], name="x"), g.tensor([1, 2], name="y")).set_output(True)
    g.relu(g.tensor([other, 2], name="z")).set_output(True)
    with pytest.raises(gd.ShapeError, match=r"tensor 'z': symbol 'b' has range 1\.\.4 here but 1\.\.8 in tensor 'x'"):
        g.validate()
    g = graph()
    b, s = g.dim("b", 1, 8), g.dim("s", 1, 8)
    g.relu(g.tensor([b * s, 2], name="flat")).set_output(True)
    with pytest.raises(gd.ShapeError, match=r"symbol b \(1\.\.8\) is in tensor 'flat' but is not a whole dim of any"):
        g.validate()


# -- JSON ---------------------------------------------------------------------------------------
def test_json_round_trip_schema_and_errors() -> None:
    text = ln_matmul().to_json()
    doc = json.loads(text)
    assert doc["version"] == 1 and doc["symbols"] == {"batch": {"min": 1, "max": 16}, "seq": {"min": 1, "max": 8}}
    x = next(t for t in doc["tensors"] if t["name"] == "x")
    assert x["dim"] == ["batch", "seq", 16] and x["stride"] == ["16*seq", 16, 1]
    assert gd.OperationGraphSpec.from_json(text).to_json() == text
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(doc, SCHEMA)
    assert "symbols" not in json.loads(graph_static().to_json())

    def error(edit: str, value: object) -> str:
        broken = json.loads(text)
        target: dict = broken
        *path, last = edit.split(".")
        for part in path:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value
        with pytest.raises(gd.GraphError) as info:
            gd.OperationGraphSpec.from_json(json.dumps(broken))
        return str(info.value)

    assert error("tensors.0.dim.0", "bat").startswith('tensors[0].dim[0]: "bat" is not a declared symbol')
    assert error("tensors.0.dim.1", 2.5) == "tensors[0].dim[1]: must be an integer, got 2.5"
    assert error("tensors.0.dim.0", "4*2") == 'tensors[0].dim[0]: must be an integer, got "4*2"'
    assert (
        error("symbols.extra", {"min": 1, "max": 2}) == "symbols.extra: declared but no tensor's dims or strides use it"
    )
    assert error("symbols.seq", {"min": 4, "max": 2}).startswith("symbols.seq: symbol 'seq': range 4..2 must satisfy")
    assert error("symbols.seq", {"min": 1}) == "symbols.seq.max: must be an integer, got null"
    flat = next(i for i, t in enumerate(doc["tensors"]) if t["name"] == "flat::y")
    assert error(f"tensors.{flat}.stride", [4, 1]).startswith(
        f"tensors[{flat}], tensor 'flat::y': strides [4, 1] overlap for dims [batch*seq, 8]"
    )


def graph_static() -> gd.OperationGraphSpec:
    return ln_matmul(batch=3, seq=5)


# -- signature ------------------------------------------------------------------------------------
def test_signature_covers_ranges_and_sharing_not_names_or_values() -> None:
    def two_inputs(names: tuple[str, str], high: int = 8, shared: bool = False) -> str:
        g = graph()
        a = g.dim(names[0], 1, 8)
        b = a if shared else g.dim(names[1], 1, high)
        g.relu(g.tensor([a, 4], name="x")).set_output(True)
        g.relu(g.tensor([b, 4], name="y")).set_output(True)
        return g.signature()

    assert two_inputs(("p", "q")) == two_inputs(("u", "v")) == two_inputs(("q", "p"))
    assert two_inputs(("p", "q"), high=9) != two_inputs(("p", "q"))
    assert two_inputs(("p", "q"), shared=True) != two_inputs(("p", "q"))
    assert sorted(canonical_form(ln_matmul().validate())["symbols"]) == [[1, 8], [1, 16]]
    assert ln_matmul().signature() not in {ln_matmul(batch=b, seq=3).signature() for b in (1, 16)}


# -- reference execution --------------------------------------------------------------------------
@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (3, 7), (16, 8)])
def test_reference_equals_the_static_graph(batch: int, seq: int) -> None:
    feeds = ln_feeds(batch, seq)
    dynamic = gd.reference.execute(ln_matmul(), feeds)
    static = gd.reference.execute(ln_matmul(batch, seq), feeds)
    assert dynamic.keys() == static.keys()
    for name, value in static.items():
        np.testing.assert_array_equal(dynamic[name], value)
    plan = gd.compile(ln_matmul(), backend="reference")
    for name, value in plan.execute(feeds).items():  # outputs allocated for these extents
        np.testing.assert_array_equal(value, static[name])
    given = np.zeros((batch * seq, 8), np.float32)  # an output given: written in place
    plan.execute({**feeds, "flat::y": given})
    np.testing.assert_array_equal(given, static["flat::y"])
    wrong = batch * seq + 1  # batch*seq from x's dims; an output of another extent is refused
    with pytest.raises(
        gd.FeedError, match=rf"'flat::y': has dims \[{wrong}, 8\], the graph declares \[{wrong - 1}, 8\]"
    ):
        plan.execute({**feeds, "flat::y": np.zeros((wrong, 8), np.float32)})


def test_execution_checks_extents_against_ranges_and_each_other() -> None:
    g = ln_matmul()
    with pytest.raises(gd.FeedError, match=r"tensor 'x': dim 0 is 17, outside the range 1\.\.16 of symbol 'batch'"):
        gd.reference.execute(g, ln_feeds(17, 2))
    g = graph()
    b = g.dim("b", 1, 8)
    g.add(g.tensor([b, 2], name="x"), g.tensor([b, 2], name="y")).set_output(True)
    feeds = {"x": np.zeros((3, 2), np.float32), "y": np.zeros((4, 2), np.float32)}
    with pytest.raises(gd.FeedError, match=r"tensor 'y': dim 0 is 4, but symbol 'b' is 3 from dim 0 of 'x'"):
        gd.reference.execute(g, feeds)
    with pytest.raises(gd.FeedError, match=r"no array given holds symbol 'b' \(1\.\.8\)"):
        gd.compile(g, backend="reference").execute({"x": 1.0, "y": 2.0})


def test_the_gpu_backend_refuses_a_dynamic_reduction_but_fusion_runs(tmp_path: Path) -> None:
    refusal = (
        "fused node 'rows' (reduction: rows) has symbolic dims (batch in 1..16, seq in 1..8); reduction kernels do "
        "not take runtime extents yet (only attention, elementwise, gemm and row_norm kernels do, docs/dynamic-shapes.md). "
        "Run it with backend='reference', or build a static graph for each shape"
    )
    with pytest.raises(gd.UnsupportedError) as caught:
        gd.compile(ln_matmul(), arch="sm_90", cache=None)
    assert str(caught.value) == refusal
    report = gd.warmup([ln_matmul()], arch="sm_90", cache=tmp_path, jobs=1)
    assert report.built == 0 and report.failures == [("dyn", refusal)]
    partition = gd.fuse(ln_matmul(), arch=90)
    assert partition.nodes[0].rule == "norm_epilogue"
    g = graph("half")
    b, s, d = g.dim("b", 1, 4), g.dim("s", 1, 64), g.dim("d", 1, 128)
    q, k, v = (g.tensor([b, 2, s, d], name=n) for n in "qkv")
    scores = g.matmul(q, g.transpose(k, permutation=[0, 1, 3, 2]))
    g.matmul(g.softmax(scores, axis=3), v).set_output(True)
    reasons = [r.reason for r in gd.fuse(g, arch=90).rejections if r.rule == "attention"]
    assert reasons == ["the rule needs concrete dims here: comparing needs the value of symbolic dim d (d in 1..128)"]


def test_inspect_lists_the_symbols(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dyn.json"
    gd.save(ln_matmul(), path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  symbols (2):\n    batch: 1..16\n    seq: 1..8\n" in out
    assert "x: [batch, seq, 16] float stride [16*seq, 16, 1]" in out


def conv_family(g: gd.OperationGraphSpec, n: int | Sym) -> None:
    x, w = g.tensor([n, 4, 6, 6], name="x"), g.tensor([8, 4, 3, 3], name="w")
    y = g.conv_fprop(x, w, padding=[1, 1], name="fprop")
    dy = g.tensor([n, 8, 6, 6], name="dy")
    g.conv_dgrad(dy, w, padding=[1, 1], name="dgrad").set_output(True)
    g.conv_wgrad(x, dy, padding=[1, 1], filter_dim=[8, 4, 3, 3], name="wgrad").set_output(True)
    g.pooling(y, "max", window=[2, 2], name="pool").set_output(True)
    g.resample(y, "nearest", size=[3, 3], name="resample").set_output(True)


def norm_family(g: gd.OperationGraphSpec, n: int | Sym) -> None:
    x = g.tensor([n, 4, 3, 3], name="x")

    def channel(name: str) -> gd.TensorSpec:
        return g.tensor([1, 4, 1, 1], name=name)

    for out in g.batchnorm(x, channel("s"), channel("b"), channel("mean"), channel("var"), 1e-5, 0.1, name="bn"):
        out.set_output(True)
    g.instancenorm("training", x, channel("s2"), channel("b2"), 1e-5, name="inorm")[0].set_output(True)
    g.groupnorm(x, channel("s3"), channel("b3"), 1e-5, groups=2, name="gn")[0].set_output(True)
    for out in g.genstats(x, name="stats"):
        out.set_output(True)
    r = g.tensor([n, 3, 8], name="r")
    g.rmsnorm("inference", r, g.tensor([1, 1, 8], name="rs"), epsilon=1e-5, name="rms")[0].set_output(True)
    g.concatenate([x, x], axis=1, name="cat").set_output(True)


def attention_family(g: gd.OperationGraphSpec, n: int | Sym) -> None:
    s = g.dim("seq", 1, 16) if isinstance(n, Sym) else 5
    q, k, v = (g.tensor([n, 2, s, 8], name=name) for name in "qkv")
    g.sdpa(q, k, v, attn_scale=0.3, use_causal_mask=True, name="attn")[0].set_output(True)


@pytest.mark.parametrize("family", [conv_family, norm_family, attention_family])
def test_every_family_takes_a_dynamic_batch(family: Callable[[gd.OperationGraphSpec, int | Sym], None]) -> None:
    """The ops the docs list as taking a symbolic batch run as their static graphs do."""
    dynamic, static = graph(), graph()
    family(dynamic, dynamic.dim("n", 1, 8))
    family(static, 3)
    static_ir = static.validate()
    feeds = random_inputs(static_ir, 0)  # variances positive
    result = gd.reference.execute(dynamic, feeds)
    expected = gd.reference.execute(static_ir, feeds)
    assert sum(len(f.nodes) for f in gd.fuse(dynamic, arch=90).nodes) == len(static_ir.nodes)  # fusion runs
    assert result.keys() == expected.keys()
    for name, array in expected.items():
        np.testing.assert_array_equal(result[name], array)


# -- property: a dynamic graph computes what the static graph of its values computes ---------------
@pytest.mark.compile_sample
@SETTINGS
@given(recipe=pointwise_recipes(), value=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_dynamic_pointwise_graphs_equal_their_static_graphs(recipe: Recipe, value: int, seed: int) -> None:
    """Random graphs of tests/graph_strategies.py: axis 0 of the inputs that span the base
    extent becomes a symbol; any value in range gives the static recipe with that extent."""
    extent = recipe.input_dims[0][0]
    assume(extent > 1)  # axis 0 broadcasts everywhere: nothing to make dynamic
    symbolic, _ = build(_with_axis0(recipe, graph().dim("n", 1, 6), extent))
    static, _ = build(_with_axis0(recipe, value, extent))
    static_ir = static.validate()
    assert specialize(symbolic.validate(), {"n": value}).tensors == static_ir.tensors
    feeds = random_feeds(static_ir, seed)
    result = gd.reference.execute(symbolic, feeds)
    assert sum(len(f.nodes) for f in gd.fuse(symbolic, arch=90).nodes) == len(static_ir.nodes)  # fusion runs
    for name, array in gd.reference.execute(static_ir, feeds).items():
        np.testing.assert_array_equal(result[name], array)


def _with_axis0(recipe: Recipe, value: int | Sym, extent: int) -> Recipe:
    dims = [((value, *d[1:]) if d[0] == extent else d) for d in recipe.input_dims]
    return dataclasses.replace(recipe, input_dims=dims)


ROW_STEPS = ("unary", "bias", "scale_rows", "layernorm", "softmax", "matmul", "residual")


def row_graph(
    steps: list[str], channels: int, batch: int | None = None, seq: int | None = None
) -> gd.OperationGraphSpec:
    """A chain over [batch, seq, C] (symbols where ``batch`` / ``seq`` are None): each step
    keeps the dims but C, so norms, reductions and matmuls see the dynamic rows."""
    g = graph()
    b = g.dim("batch", 1, 9) if batch is None else batch
    s = g.dim("seq", 1, 5) if seq is None else seq
    x = g.tensor([b, s, channels], name="x")
    v, c = x, channels
    for i, step in enumerate(steps):
        if step == "unary":
            v = g.tanh(v)
        elif step == "bias":
            v = g.add(v, g.tensor([1, 1, c], name=f"bias{i}"))
        elif step == "scale_rows":  # a [b, s, 1] row statistic broadcast back over the row
            v = g.mul(v, g.reduction(v, mode="max", axes=[2]))
        elif step == "layernorm":
            scale, shift = g.tensor([1, 1, c], name=f"g{i}"), g.tensor([1, 1, c], name=f"b{i}")
            v = g.layernorm("inference", v, scale, shift, 1e-5)[0]
        elif step == "softmax":
            v = g.softmax(v, axis=1)
        elif step == "matmul":
            v, c = g.matmul(v, g.tensor([c, c + 1], name=f"w{i}")), c + 1
        else:
            v = g.add(v, x) if c == channels else g.add(v, v)
    v.set_output(True)
    return g


@pytest.mark.compile_sample
@SETTINGS
@given(
    steps=st.lists(st.sampled_from(ROW_STEPS), min_size=1, max_size=6),
    channels=st.integers(1, 6),
    batch=st.integers(1, 9),
    seq=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_dynamic_row_graphs_equal_their_static_graphs(
    steps: list[str], channels: int, batch: int, seq: int, seed: int
) -> None:
    static = row_graph(steps, channels, batch, seq).validate()
    feeds = random_feeds(static, seed)
    dynamic = row_graph(steps, channels)
    assert specialize(dynamic.validate(), {"batch": batch, "seq": seq}).tensors == static.tensors
    assert sum(len(f.nodes) for f in gd.fuse(dynamic, arch=90).nodes) == len(static.nodes)  # fusion runs
    result = gd.reference.execute(dynamic, feeds)
    for name, array in gd.reference.execute(static, feeds).items():
        np.testing.assert_array_equal(result[name], array)
