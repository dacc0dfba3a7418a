"""``graphdnn.cudnn``: the frontend's calls, names, leniencies and errors, on the reference plan.

Whole frontend programs are in tests/cudnn_programs.py (run by test_cudnn_programs.py and,
on a GPU, test_gpu_cudnn.py); these tests pin each piece of the adapter.
"""

from __future__ import annotations

import ctypes
from typing import Any, ClassVar

import numpy as np
import pytest
from scipy.special import erf, expit

import graphdnn.cudnn as cudnn
from graphdnn import reference
from graphdnn.errors import FeedError, GraphError, StructureError, UnsupportedError
from graphdnn.tensor import TensorSpec

FLOAT = cudnn.data_type.FLOAT


def float_graph(**options: Any) -> cudnn.pygraph:
    return cudnn.pygraph(io_data_type=FLOAT, intermediate_data_type=FLOAT, compute_data_type=FLOAT, **options)


def rand(*dims: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(dims).astype(np.float32)


# -- names, enums, handles ----------------------------------------------------------------------
def test_outputs_are_named_as_the_frontend_names_them() -> None:
    graph = float_graph()
    x = graph.tensor(name="X", dim=[2, 4, 3, 3], stride=[36, 9, 3, 1])
    channel = dict(dim=[1, 4, 1, 1], stride=[4, 1, 1, 1])
    scale, bias = graph.tensor(name="scale", **channel), graph.tensor(name="bias", **channel)
    y, mean, inv_var, next_mean, next_var = graph.batchnorm(x, scale, bias, None, None, 1e-5, None)
    act = graph.relu(input=y)
    named = graph.relu(name="act", input=act)
    assert [t.get_name() for t in (y, mean, inv_var)] == ["0::Y", "0::MEAN", "0::INV_VARIANCE"]
    assert next_mean is None and next_var is None
    assert (act.get_name(), named.get_name()) == ("1::OUT_0", "act::OUT_0")


def test_enums_are_graphdnn_s_under_the_frontend_names() -> None:
    assert cudnn.data_type.HALF.itemsize == 2
    assert cudnn.norm_forward_phase.TRAINING.value == "training"
    assert cudnn.reduction_mode.AMAX.value == "amax"
    assert {m.name for m in cudnn.heur_mode} == {"A", "B", "FALLBACK", "OPENSOURCE"}
    assert {m.name for m in cudnn.build_plan_policy} == {"HEURISTICS_CHOICE", "ALL"}
    assert cudnn.cudnnGraphNotSupportedError is UnsupportedError


def test_a_handle_carries_a_stream_until_destroyed() -> None:
    handle = cudnn.create_handle()
    assert cudnn.get_stream(handle) is None
    cudnn.set_stream(handle=handle, stream=7)
    assert cudnn.get_stream(handle) == 7
    cudnn.destroy_handle(handle)
    with pytest.raises(GraphError, match="destroyed"):
        cudnn.get_stream(handle)
    with pytest.raises(GraphError, match="create_handle"):
        cudnn.set_stream(handle=12345, stream=0)


# -- op methods: argument names, positional order, defaults, arity -------------------------------
def run(graph: cudnn.pygraph, pack: dict[Any, Any]) -> None:
    graph.build([cudnn.heur_mode.A])
    graph.execute(pack, np.empty(graph.get_workspace_size(), np.uint8))


def test_positional_order_and_defaults_follow_the_frontend() -> None:
    graph = float_graph()
    a, b = graph.tensor(name="a", dim=[1, 3, 4]), graph.tensor(name="b", dim=[1, 4, 5])
    c = graph.matmul(a, b, FLOAT, 0.0, "mm")  # (A, B, compute_data_type, padding, name)
    e = graph.elu(c, FLOAT, "e")  # elu's second positional is the compute type: alpha is always 1
    s = graph.swish(e)  # swish_beta None is 1 (SiLU)
    m = graph.max(input0=s, input1=graph.softplus(c))
    total = graph.reduction(m, cudnn.reduction_mode.ADD, FLOAT)  # (input, mode, compute_data_type)
    total.set_dim([1, 3, 1]).set_output(True)
    x, y = rand(1, 3, 4), rand(1, 4, 5, seed=1)
    out = np.empty((1, 3, 1), np.float32)
    run(graph, {a: x, b: y, total: out})
    mm = x.astype(np.float64) @ y
    elu = np.where(mm > 0, mm, np.expm1(mm))
    want = np.maximum(elu * expit(elu), np.logaddexp(0, mm)).sum(axis=2, keepdims=True)
    np.testing.assert_allclose(out, want, rtol=1e-5)
    assert [t.get_name() for t in (c, e, m, total)] == ["mm::C", "e::OUT_0", "4::OUT_0", "5::Y"]


def test_pow_mod_min_take_input0_and_input1() -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[6])
    y = graph.tensor(name="y", dim=[6])
    out = graph.min(input0=graph.mod(input0=graph.pow(input0=x, input1=y), input1=y), input1=x).set_output(True)
    xs, ys = np.abs(rand(6)) + 0.5, np.abs(rand(6, seed=2)) + 0.5
    got = np.empty(6, np.float32)
    run(graph, {x: xs, y: ys, out: got})
    want = np.minimum(np.fmod(xs.astype(np.float64) ** ys, ys), xs)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _central_difference(f: Any, v: np.ndarray, h: float = 1e-5) -> np.ndarray:
    return (f(v + h) - f(v - h)) / (2 * h)


def test_activation_backwards_tan_and_add_square_take_the_frontends_arguments() -> None:
    """swish_backward's fourth positional is swish_beta after the compute type, as in the
    frontend; relu_backward's clips follow loss and input; elu/softplus backward take no
    alpha / beta (1)."""
    graph = float_graph()
    dy, x = graph.tensor(name="dy", dim=[2, 7]), graph.tensor(name="x", dim=[2, 7])
    outs = [
        graph.relu_backward(dy, x, 0.1, -0.5, 1.0),
        graph.leaky_relu_backward(dy, x, 0.2),
        graph.swish_backward(dy, x, FLOAT, 1.5),
        graph.tanh_backward(dy, x),
        graph.sigmoid_backward(dy, x),
        graph.elu_backward(dy, x),
        graph.gelu_backward(dy, x),
        graph.gelu_approx_tanh_backward(dy, x),
        graph.softplus_backward(dy, x),
        graph.tan(x),
        graph.add_square(dy, x, FLOAT, "sumsq"),
    ]
    for out in outs:
        out.set_output(True)
    g, v = rand(2, 7).astype(np.float64), 2 * rand(2, 7, seed=3).astype(np.float64)
    got = [np.empty((2, 7), np.float32) for _ in outs]
    run(graph, {dy: g.astype(np.float32), x: v.astype(np.float32)} | dict(zip(outs, got)))
    sig = expit(v)
    want = [
        g * np.where(v > -0.5, np.where(v < 1.0, 1.0, 0.0), 0.1),
        g * np.where(v > 0, 1.0, 0.2),
        g * (expit(1.5 * v) * (1 + 1.5 * v * (1 - expit(1.5 * v)))),
        g * (1 - np.tanh(v) ** 2),
        g * sig * (1 - sig),
        g * np.where(v > 0, 1.0, np.exp(np.minimum(v, 0))),
        g * _central_difference(lambda t: 0.5 * t * (1 + erf(t / np.sqrt(2))), v),
        g * _central_difference(lambda t: 0.5 * t * (1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t**3))), v),
        g * sig,
        np.tan(v),
        g + v * v,
    ]
    for out, have, expected in zip(outs, got, want):
        np.testing.assert_allclose(have, expected, rtol=1e-5, atol=1e-6, err_msg=out.get_name())
    assert outs[-1].get_name() == "sumsq::OUT_0"


def test_sdpa_returns_o_and_stats_with_the_frontend_switches() -> None:
    graph = float_graph()
    q, k, v = (graph.tensor(name=n, dim=[1, 2, 8, 4]) for n in "qkv")
    o, stats = graph.sdpa(q, k, v, is_inference=True)
    assert stats is None and o.get_name() == "0::O"
    _, stats2 = graph.sdpa(q, k, v, is_inference=False, diagonal_band_right_bound=0, name="attn")
    assert stats2 is not None and stats2.get_name() == "attn::Stats"
    node = graph.spec.nodes[-1]
    assert node.attributes.use_causal_mask and node.attributes.generate_stats  # type: ignore[attr-defined]
    graph.scaled_dot_product_flash_attention(
        q, k, v, diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT, diagonal_band_right_bound=0
    )
    assert graph.spec.nodes[-1].attributes.use_causal_mask_bottom_right  # type: ignore[attr-defined]


def test_sdpa_backward_takes_the_frontends_arguments_and_matches_torch_autograd() -> None:
    """The frontend's backward sample: the forward's O and Stats in, [dQ, dK, dV] out, GQA, causal."""
    torch = pytest.importorskip("torch")
    graph = float_graph()
    dims = {"q": [1, 4, 6, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 4], "o": [1, 4, 6, 4], "dO": [1, 4, 6, 4]}
    t = {n: graph.tensor(name=n, dim=d) for n, d in dims.items()}
    stats = graph.tensor(name="stats", dim=[1, 4, 6, 1], data_type=FLOAT)
    dq, dk, dv = graph.sdpa_backward(
        t["q"], t["k"], t["v"], t["o"], t["dO"], stats, attn_scale=0.5, diagonal_band_right_bound=0,
        use_deterministic_algorithm=True, name="bwd",
    )  # fmt: skip
    assert [x.get_name() for x in (dq, dk, dv)] == ["bwd::dQ", "bwd::dK", "bwd::dV"]
    for x in (dq, dk, dv):
        x.set_output(True)
    attributes = graph.spec.nodes[-1].attributes
    assert attributes.use_causal_mask and attributes.use_deterministic_algorithm  # type: ignore[attr-defined]
    values = {n: rand(*d, seed=i) for i, (n, d) in enumerate(dims.items())}
    q, k, v = (torch.tensor(values[n], dtype=torch.float64, requires_grad=True) for n in "qkv")
    s = 0.5 * q @ k.repeat_interleave(2, 1).transpose(-1, -2)
    s = s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), -torch.inf)
    o = torch.softmax(s, -1) @ v.repeat_interleave(2, 1)
    o.backward(torch.tensor(values["dO"], dtype=torch.float64))
    values["o"] = o.detach().numpy().astype(np.float32)
    got = {x: np.empty(x.get_dim(), np.float32) for x in (dq, dk, dv)}
    lse = torch.logsumexp(s, -1, keepdim=True).detach().numpy().astype(np.float32)
    run(graph, {**{t[n]: values[n] for n in dims}, stats: lse, **got})
    for x, want in zip((dq, dk, dv), (q.grad, k.grad, v.grad)):
        np.testing.assert_allclose(got[x], want.numpy(), rtol=1e-4, atol=1e-5)


def test_sdpa_dropout_takes_the_frontends_probability_seed_and_offset() -> None:
    """The frontend's training sample: int64 seed and offset tensors; forward and backward draw
    the same mask, which the builder's reference defines."""
    graph = float_graph()
    q, k, v, d_o = (graph.tensor(name=n, dim=[1, 2, 6, 8]) for n in ("q", "k", "v", "dO"))
    seed, offset = (graph.tensor(name=n, dim=[1, 1, 1, 1], data_type=cudnn.data_type.INT64) for n in ("s", "o"))
    o, stats = graph.sdpa(q, k, v, is_inference=False, attn_scale=0.5, dropout=(0.25, seed, offset), name="fwd")
    grads = graph.sdpa_backward(q, k, v, o, d_o, stats, attn_scale=0.5, dropout=(0.25, seed, offset), name="bwd")
    for x in (o, *grads):
        x.set_output(True)
    assert {n.attributes.dropout_probability for n in graph.spec.nodes} == {0.25}  # type: ignore[attr-defined]
    values = {x: rand(1, 2, 6, 8, seed=i) for i, x in enumerate((q, k, v, d_o))}
    values |= {seed: np.full((1, 1, 1, 1), 17, np.int64), offset: np.full((1, 1, 1, 1), 3, np.int64)}
    got = {x: np.empty(x.get_dim(), np.float32) for x in (o, *grads)}
    run(graph, {**values, **got})
    want = reference.execute(graph.spec, values)
    for x in (o, *grads):
        np.testing.assert_allclose(got[x], want[x.get_name()], rtol=1e-5, atol=1e-6)


# -- tensors ------------------------------------------------------------------------------------------
def test_tensor_like_makes_a_one_element_host_tensor_pass_by_value() -> None:
    graph = float_graph()
    scalar = graph.tensor_like(np.full((1, 1), 0.5, np.float32))
    array = graph.tensor_like(rand(4, 8))
    copy = graph.tensor_like(array, "copy")
    assert scalar.get_is_pass_by_value() and not array.get_is_pass_by_value()
    assert (copy.get_dim(), copy.get_stride(), copy.get_name()) == ([4, 8], [8, 1], "copy")


def test_uids_are_assigned_at_build_and_can_be_queried() -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[4], uid=7)
    y = graph.relu(x).set_output(True)
    assert y.get_uid() is None
    graph.build_operation_graph()
    assert (x.get_uid(), y.get_uid()) == (7, 1)
    assert graph.query_tensor_attributes_of_uid(1) is y
    with pytest.raises(GraphError, match="no tensor with uid 3"):
        graph.query_tensor_attributes_of_uid(3)


# -- the frontend's leniencies --------------------------------------------------------------------------
def test_duplicate_tensor_and_node_names_are_accepted() -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[4])
    x2 = graph.tensor(name="x", dim=[4])
    y = graph.relu(name="act", input=graph.add(x, x2))
    z = graph.relu(name="act", input=y).set_output(True)
    assert (x2.get_name(), y.get_name(), z.get_name()) == ("x#2", "act::OUT_0", "act::OUT_0#2")
    got = np.empty(4, np.float32)
    run(graph, {x: rand(4), x2: rand(4, seed=1), z: got})
    np.testing.assert_allclose(got, np.maximum(rand(4) + rand(4, seed=1), 0), rtol=1e-6)


def test_unread_inputs_and_none_keys_are_ignored() -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[4], uid=3)
    unread = graph.tensor(name="unread", dim=[9], uid=4)
    y = graph.neg(x).set_output(True)
    got = np.empty(4, np.float32)
    run(graph, {x: rand(4), unread: rand(9), None: rand(2), y: got})
    np.testing.assert_array_equal(got, -rand(4))
    graph.execute({3: rand(4), 4: rand(9), "unread": rand(9), y: got})  # by uid and by name too


def test_a_buffer_of_other_dims_but_the_same_memory_is_accepted() -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[2, 3, 1, 1], stride=[3, 1, 3, 3])
    y = graph.identity(x).set_output(True)
    got = np.empty(6, np.float32)  # [6] for [2, 3, 1, 1] channels-last: the same memory
    run(graph, {x: np.arange(6, dtype=np.float32), y: got})
    np.testing.assert_array_equal(got, np.arange(6))
    with pytest.raises(FeedError, match=r"tensor 'x'.*do not lay out the memory"):
        graph.execute({x: np.arange(12, dtype=np.float32)[::2], y: got})


def test_a_broadcast_view_is_an_input() -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[4, 8])
    row = graph.tensor(name="row", dim=[4, 8], stride=[0, 1])
    y = graph.add(x, row).set_output(True)
    assert y.get_stride() == [8, 1]  # not the broadcast input's strides: the output is written
    bias = rand(8, seed=3)
    got = np.empty((4, 8), np.float32)
    run(graph, {x: rand(4, 8), row: np.broadcast_to(bias, (4, 8)), y: got})
    np.testing.assert_allclose(got, rand(4, 8) + bias, rtol=1e-6)


def test_a_pointwise_output_copies_its_input_s_strides() -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[4, 8], stride=[16, 1])  # every row of a [4, 16] buffer, half used
    y = graph.relu(x).set_output(True)
    assert y.get_stride() == [16, 1]
    storage, out = rand(4, 16), np.zeros((4, 16), np.float32)
    run(graph, {x: storage[:, :8], y: out[:, :8]})
    np.testing.assert_array_equal(out[:, :8], np.maximum(storage[:, :8], 0))
    assert not out[:, 8:].any()


def test_a_boolean_compute_type_is_accepted() -> None:
    graph = float_graph()
    x, limit = graph.tensor(name="x", dim=[8]), graph.tensor(name="limit", dim=[8])
    above = graph.cmp_gt(input=x, comparison=limit, compute_data_type=cudnn.data_type.BOOLEAN)
    above.set_data_type(cudnn.data_type.BOOLEAN)
    both = graph.logical_and(a=above, b=above, compute_data_type=cudnn.data_type.BOOLEAN)
    both.set_output(True).set_data_type(cudnn.data_type.BOOLEAN)
    got = np.empty(8, np.bool_)
    run(graph, {x: rand(8), limit: np.zeros(8, np.float32), both: got})
    np.testing.assert_array_equal(got, rand(8) > 0)


def test_gen_index_builds_the_frontend_s_causal_mask() -> None:
    """As the frontend's test_flexible_sdpa.py writes it: row and column indexes set to INT32,
    cmp_ge with a BOOLEAN compute type, binary_select of the scores or -inf."""
    graph = float_graph()
    scores = graph.tensor(name="scores", dim=[1, 2, 5, 5])
    row = graph.gen_index(input=scores, axis=2, compute_data_type=cudnn.data_type.INT32)
    row.set_data_type(cudnn.data_type.INT32)
    col = graph.gen_index(input=scores, axis=3)
    col.set_data_type(cudnn.data_type.INT32)
    mask = graph.cmp_ge(input=row, comparison=col, compute_data_type=cudnn.data_type.BOOLEAN)
    mask.set_data_type(cudnn.data_type.BOOLEAN)
    out = graph.binary_select(input0=scores, input1=-np.inf, mask=mask).set_output(True)
    got = np.empty((1, 2, 5, 5), np.float32)
    run(graph, {scores: rand(1, 2, 5, 5), out: got})
    np.testing.assert_array_equal(got, np.where(np.tril(np.ones((5, 5), bool)), rand(1, 2, 5, 5), -np.inf))


# -- execute: keys and buffers ------------------------------------------------------------------------------
def test_raw_host_pointers_with_uid_keys() -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[3, 4], stride=[1, 3])
    eps = graph.tensor(name="eps", dim=[1], is_pass_by_value=True)
    y = graph.add(x, eps).set_output(True)
    graph.build([cudnn.heur_mode.A])
    xs = np.asfortranarray(rand(3, 4))
    got = np.asfortranarray(np.empty((3, 4), np.float32))
    graph.execute({x.get_uid(): xs.ctypes.data, eps.get_uid(): np.float32(2.0), y.get_uid(): got.ctypes.data}, None)
    np.testing.assert_allclose(got, xs + 2, rtol=1e-6)


class _DeviceLike:
    """An object that says it is GPU memory, as CuPy arrays do."""

    __cuda_array_interface__: ClassVar[dict[str, Any]] = {
        "shape": (4,),
        "typestr": "<f4",
        "data": (0, False),
        "version": 3,
    }


def test_buffers_must_all_be_on_the_host_or_all_on_the_gpu() -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[4])
    y = graph.relu(x).set_output(True)
    graph.build([cudnn.heur_mode.A])
    with pytest.raises(FeedError, match=r"tensor '0::OUT_0'.*host memory while 'x' is on the GPU"):
        graph.execute({x: _DeviceLike(), y: np.empty(4, np.float32)})
    with pytest.raises(UnsupportedError, match="built without a GPU"):
        graph.execute({x: _DeviceLike(), y: _DeviceLike()})


def test_serialize_and_deserialize_give_the_graph_back_built() -> None:
    graph = float_graph(name="saved")
    x = graph.tensor(name="x", dim=[4])
    y = graph.sqrt(x).set_output(True)
    graph.build([cudnn.heur_mode.A])
    data = graph.serialize()
    assert isinstance(data, bytes)
    loaded = cudnn.pygraph()
    loaded.deserialize(cudnn.create_handle(), data)
    assert loaded.key() == graph.key()
    got = np.empty(4, np.float32)
    loaded.execute({x.get_uid(): np.full(4, 9.0, np.float32), y.get_uid(): got}, None)
    np.testing.assert_array_equal(got, 3.0)


def test_key_ignores_names() -> None:
    graphs = []
    for name in ("one", "two"):
        graph = float_graph(name=name)
        graph.relu(graph.tensor(name=f"{name}_x", dim=[4])).set_output(True)
        graphs.append(graph.key())
    assert graphs[0] == graphs[1]


@pytest.mark.timeout(300)
def test_sm_version_compiles_the_gpu_plan_without_a_gpu() -> None:
    graph = float_graph(sm_version=90)
    x = graph.tensor(name="x", dim=[64])
    y = graph.relu(x).set_output(True)
    graph.build([cudnn.heur_mode.A])
    assert graph.get_workspace_size() == 0
    got = np.empty(64, np.float32)
    graph.execute({x: rand(64), y: got})  # host buffers still run the reference plan
    np.testing.assert_array_equal(got, np.maximum(rand(64), 0))
    values, got[:] = -rand(64), 0
    graph.execute({x: values.ctypes.data, y: got.ctypes.data})  # and so do host pointers
    np.testing.assert_array_equal(got, np.maximum(values, 0))


def test_a_cuda_graph_needs_the_gpu_plan_and_device_buffers() -> None:
    cpu = float_graph()
    x = cpu.tensor(name="x", dim=[64])
    y = cpu.relu(x).set_output(True)
    cpu.build([cudnn.heur_mode.A])
    with pytest.raises(UnsupportedError, match="built without a GPU"):
        cpu.populate_cuda_graph(None, {x: 1 << 40, y: 2 << 40}, None, 0)

    target = float_graph(sm_version=90)
    x = target.tensor(name="x", dim=[64])
    y = target.relu(x).set_output(True)
    target.build([cudnn.heur_mode.A])
    with pytest.raises(UnsupportedError, match="a CUDA graph runs on device buffers; this variant pack holds host"):
        target.update_cuda_graph(None, {x: rand(64), y: np.empty(64, np.float32)}, None, 0)


# -- what graphdnn cannot do, said in the frontend's terms --------------------------------------------------
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda g, x: g.moe_grouped_matmul(x, x, x, x, x, cudnn.moe_grouped_matmul_mode.SCATTER, top_k=2),
            "mode SCATTER: graphdnn multiplies grouped rows",
        ),
        (lambda g, x: g.moe_grouped_matmul(x, x, x, token_index=x), "mode NONE reads neither token_index"),
        (lambda g, x: g.moe_grouped_matmul(x, x, x, mode=cudnn.moe_grouped_matmul_mode.GATHER), "GATHER needs"),
        (lambda g, x: g.moe_grouped_matmul_bwd(x, x, x), "no weight gradient of the grouped matmul"),
        (lambda g, x: g.sdpa(x, x, x, dropout=(x, x)), r"sdpa dropout=.*not a caller's \(mask, scale\)"),
        (lambda g, x: g.sdpa_backward(x, x, x, x, x, x, dropout=(0.1, x, x), rng_dump=x), "rng_dump: .* rng\\(seed"),
        (lambda g, x: g.sdpa_backward(x, x, x, x, x, x, dBias=x), "sdpa_backward dBias: .* no bias gradient"),
        (lambda g, x: g.sdpa_backward(x, x, x, x, x, x, diagonal_band_right_bound=2), "right_bound=2"),
        (lambda g, x: g.batchnorm(x, x, x, None, None, 1e-5, None, peer_stats=[x]), "peer_stats"),
        (lambda g, x: g.matmul(x, x, padding=1.0), "ragged matmul padding"),
        (lambda g, x: g.tensor(dim=[4], ragged_offset=x, ragged_offset_multiplier=2), "ragged_offset_multiplier"),
        (lambda g, x: g.concatenate([x, x], 0, in_place_index=0), "in_place_index"),
        (lambda g, x: g.build_plan_at_index(1), "one plan per graph"),
    ],
)
def test_unsupported_frontend_calls_say_why(call: Any, message: str) -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[1, 1, 4, 4])
    with pytest.raises(GraphError, match=message):
        call(graph, x)


def test_unsupported_module_calls_say_why() -> None:
    with pytest.raises(UnsupportedError, match=r"cudnn\.backend_version is not supported: graphdnn is not cuDNN"):
        cudnn.backend_version()
    with pytest.raises(AttributeError, match="no attribute 'frobnicate'"):
        cudnn.frobnicate  # noqa: B018


def test_unsupported_graph_options_are_refused() -> None:
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="sm_count"):
        cudnn.pygraph(sm_count=16)
    with pytest.raises(UnsupportedError, match="is_dynamic_shape_enabled"):
        cudnn.pygraph(is_dynamic_shape_enabled=True)


def test_steps_out_of_order_and_bad_arguments_are_clear() -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[4, 4], stride=[1, 4])
    y = graph.relu(x).set_output(True)
    with pytest.raises(GraphError, match="is not built: call build"):
        graph.execute({x: rand(4, 4), y: rand(4, 4)})
    with pytest.raises(GraphError, match=r"cudnn\.heur_mode"):
        graph.create_execution_plans(["A"])
    with pytest.raises(GraphError, match=r"cudnn\.build_plan_policy"):
        graph.build_plans("ALL")
    with pytest.raises(UnsupportedError, match="VIEW_ONLY reshape of 'x'"):
        graph.reshape(x)
    flat = graph.reshape(x, reshape_mode=cudnn.reshape_mode.LOGICAL).set_dim([16])
    assert isinstance(flat, TensorSpec) and flat.get_name() == "1::Y"
    with pytest.raises(AttributeError, match="no attribute 'frobnicate'"):
        graph.frobnicate  # noqa: B018
    with pytest.raises(StructureError, match="missing input 'bias'"):
        graph.layernorm(cudnn.norm_forward_phase.TRAINING, x, x, None, 1e-5)


def test_a_host_pointer_is_read_with_the_tensor_s_layout() -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[2, 2])
    y = graph.abs(x).set_output(True)
    graph.build([cudnn.heur_mode.A])
    values = (ctypes.c_float * 4)(-1, 2, -3, 4)
    got = np.empty((2, 2), np.float32)
    graph.execute({"x": ctypes.addressof(values), y: got})
    np.testing.assert_array_equal(got, [[1, 2], [3, 4]])


# -- the high-level cudnn.Graph --------------------------------------------------------------------------------
def test_graph_names_nodes_and_refuses_misuse() -> None:
    x = rand(4, 8)
    with pytest.raises(GraphError, match=r"inside `with cudnn\.Graph"):
        cudnn.Graph().relu(x)
    with pytest.raises(GraphError, match="inputs must be a list"):
        cudnn.Graph(inputs="x")
    with cudnn.Graph(io_data_type=FLOAT) as graph:
        y = graph.relu(x)
        z = graph.add(y, x)
        assert (y.get_name(), z.get_name()) == ("relu.0::OUT_0", "add.0::OUT_0")
        with pytest.raises(StructureError, match=r"'relu\.0' is already used"):
            graph.relu(x, name="relu.0")
        with pytest.raises(GraphError, match="builds itself"):
            graph.build_plans()
        with pytest.raises(GraphError, match="after its with block"):
            graph(x)
        z.set_output(True)
    with pytest.raises(GraphError, match="after set_io_tuples"):
        graph(x)
    with pytest.raises(GraphError, match=r"input 0 \('nope'\) is no input"):
        graph.set_io_tuples(["nope"], [z])
    with pytest.raises(GraphError, match=r"'add\.0::OUT_0'.*neither an input nor an output"):
        graph.set_io_tuples([x], [])
    graph.set_io_tuples([x], [z])
    out = graph(rand(4, 8, seed=5))
    np.testing.assert_allclose(out, np.maximum(rand(4, 8, seed=5), 0) + rand(4, 8, seed=5), rtol=1e-6)
    with pytest.raises(FeedError, match=r"'relu\.0::0'"):
        graph({})


def test_graph_without_a_workspace_needs_one_per_call() -> None:
    x = rand(4)
    with cudnn.Graph(io_data_type=FLOAT, workspace_alloc=False, inputs=[x], outputs=["neg.0::OUT_0"]) as graph:
        graph.neg(x).set_output(True)
    with pytest.raises(GraphError, match="workspace_alloc=False"):
        graph(x)
    np.testing.assert_array_equal(graph(x, workspace=np.empty(0, np.uint8)), -x)


def test_a_tensor_of_another_graph_is_no_key() -> None:
    graph, other = float_graph(name="mine"), float_graph(name="theirs")
    x = graph.tensor(name="x", dim=[4])
    y = graph.relu(x).set_output(True)
    stranger = other.tensor(name="x", dim=[4])
    graph.build([cudnn.heur_mode.A])
    with pytest.raises(FeedError, match="tensor 'x': is a tensor of graph 'theirs', not of graph 'mine'"):
        graph.execute({stranger: rand(4), y: np.empty(4, np.float32)})


def test_null_pointers_and_keys_given_twice_are_refused() -> None:
    graph = float_graph()
    x = graph.tensor(name="x", dim=[4])
    y = graph.relu(x).set_output(True)
    graph.build([cudnn.heur_mode.A])
    with pytest.raises(FeedError, match="tensor 'x': is the pointer 0"):
        graph.execute({x: 0, y: np.empty(4, np.float32)})
    with pytest.raises(FeedError, match="tensor 'x': is given twice"):
        graph.execute({x: rand(4), "x": rand(4), y: np.empty(4, np.float32)})
