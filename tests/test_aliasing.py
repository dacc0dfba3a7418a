"""Outputs that share memory with inputs, on the CPU: exact overlap of strided views, the
launch schedule (order and copies) that reads inputs before they are written over, bind
and execute through a stand-in driver, the reference plan, and read-only inputs whose
strides overlap."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from graphdnn.compare import relative_error, tolerance
from graphdnn.layout import overlap_reason
from graphdnn.program import Arg, ArgKind, Launch
from graphdnn.random_inputs import random_inputs
from graphdnn.reference_plan import host_array
from graphdnn.runtime import overlap as overlap_module
from graphdnn.runtime.bind_cache import BindCache
from graphdnn.runtime.overlap import View, overlap, overlapping_pairs, same_view
from graphdnn.runtime.schedule import Schedule, schedule
from tests import fake_gpu

P = 0x7F0000100000  # a device address


def view(offset: int, dims: tuple[int, ...], strides: tuple[int, ...], itemsize: int = 4) -> View:
    return View(P + offset, dims, strides, itemsize)


# -- overlap ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        (view(0, (8, 33), (33, 1)), view(0, (8, 33), (33, 1)), True),  # the same view
        (view(0, (8, 33), (33, 1)), view(8 * 33 * 4, (8, 33), (33, 1)), False),  # adjacent
        (view(0, (8, 33), (33, 1)), view(8 * 33 * 4 - 4, (8, 33), (33, 1)), True),  # one element in common
        (view(0, (8, 33), (33, 1)), view(40, (8, 33), (33, 1)), True),  # partial overlap, shifted
        (view(0, (4, 8), (16, 2)), view(4, (4, 8), (16, 2)), False),  # even / odd elements, interleaved
        (view(0, (4, 16), (32, 1)), view(16 * 4, (4, 16), (32, 1)), False),  # even / odd rows
        (view(0, (4, 16), (32, 1)), view(32 * 4, (4, 16), (32, 1)), True),  # rows 0,2,4,6 and 2,4,6,8
        (view(0, (2, 4), (100, 1)), view(50 * 4, (1, 4), (1, 1)), False),  # inside the gap between rows
        (view(0, (2, 4), (100, 1)), view(98 * 4, (1, 4), (1, 1)), True),  # reaches into the second row
        (view(0, (4,), (1,), 2), view(2, (2,), (1,), 4), True),  # half elements vs float elements, bytewise
        (view(0, (4,), (2,), 2), view(2, (1,), (1,), 2), False),  # a half between two strided halves
        (view(0, (8, 33), (0, 1)), view(0, (8, 33), (33, 1)), True),  # broadcast rows vs a full tensor
        (view(0, (16, 128, 64), (8192, 1, 64), 2), view(16 * 8192 * 2, (4,), (1,)), False),  # overlapping strides
    ],
)
def test_overlap_is_exact_for_strided_views(a: View, b: View, shared: bool) -> None:
    assert overlap(a, b) is shared
    assert overlap(b, a) is shared


def test_byte_extent_and_same_view() -> None:
    gapped = view(0, (2, 3), (10, 2), 2)
    assert gapped.end == P + (10 + 4 + 1) * 2
    assert same_view(view(0, (1, 33), (999, 1)), view(0, (1, 33), (33, 1)))  # a size-1 dim's stride is unused
    assert not same_view(view(0, (8, 33), (33, 1)), view(0, (8, 33), (1, 8)))  # same memory, transposed
    assert not same_view(view(0, (8, 33), (33, 1)), view(0, (8, 33), (33, 1), 2))


def test_a_problem_too_hard_for_the_bound_counts_as_overlapping(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = view(0, (5, 2, 4), (52, 51, 45)), view(20, (5, 2, 4), (52, 51, 45))
    assert not overlap(a, b)
    monkeypatch.setattr(overlap_module, "MAX_WORK", 1)
    assert overlap(a, b)  # undecided within the bound: conservative, never a missed overlap


def test_overlapping_pairs_name_written_buffers_first() -> None:
    views = {
        1: view(0, (64,), (1,)),  # input
        2: view(1 << 20, (64,), (1,)),  # input, far away
        3: view(128, (64,), (1,)),  # output over the end of input 1
        4: view(3 << 20, (8,), (1,)),  # output alone
    }
    assert overlapping_pairs(views, {3, 4}) == [(3, 1)]
    assert overlapping_pairs({1: views[1], 5: view(0, (64,), (1,))}, set()) == []  # inputs may share memory


# -- schedule --------------------------------------------------------------------------------


def launch(fused_index: int, *tensors: int, elementwise: bool = True, name: str = "") -> Launch:
    args = (*tuple(Arg(ArgKind.TENSOR, t) for t in tensors), Arg(ArgKind.ALIGNED))
    return Launch(
        name or f"k{fused_index}", "key", "hash", fused_index, (1, 1, 1), (32, 1, 1), 0, 16, args, elementwise
    )


NAMES = {i: f"t{i}" for i in range(20)}
X = view(0, (8, 32), (32, 1))
X2 = view(1 << 20, (8, 32), (32, 1))


def test_no_overlap_keeps_the_plan_order() -> None:
    views = {1: X, 2: X2, 3: view(2 << 20, (8, 32), (32, 1))}
    assert schedule([launch(0, 1, 2, 3), launch(1, 3, 1)], views, {3}, NAMES) == Schedule((0, 1), ())


def test_an_elementwise_kernel_in_place_on_the_same_view_needs_nothing() -> None:
    assert schedule([launch(0, 1, 2)], {1: X, 2: X}, {2}, NAMES) == Schedule((0,), ())


@pytest.mark.parametrize(
    ("output", "elementwise"),
    [(X, False), (view(4, (8, 32), (32, 1)), True), (view(0, (8, 32), (1, 8)), True)],
    ids=["not elementwise", "shifted by one element", "transposed"],
)
def test_an_input_written_over_by_its_own_kernel_otherwise_is_copied(output: View, elementwise: bool) -> None:
    assert schedule([launch(0, 1, 2, elementwise=elementwise)], {1: X, 2: output}, {2}, NAMES) == Schedule((0,), (1,))


def test_a_broadcast_input_written_over_is_copied() -> None:
    bias = view(0, (1, 32), (32, 1))
    assert schedule([launch(0, 1, 3, 2)], {1: X2, 3: bias, 2: X}, {2}, NAMES) == Schedule((0,), (3,))


def test_readers_of_an_input_run_before_the_kernel_writing_over_it() -> None:
    # k0 reads t1, writes t3 into t2's memory; k1 reads t2: k1 moves first, nothing is copied
    views = {1: X, 2: X2, 3: X2, 4: view(2 << 20, (8, 32), (32, 1))}
    launches = [launch(0, 1, 3), launch(1, 2, 4)]
    assert schedule(launches, views, {3, 4}, NAMES) == Schedule((1, 0), ())


def test_rope_in_place_copies_one_input() -> None:
    # y1 = f(x1, x2) over x1 and y2 = g(x1, x2) over x2, in two kernels: each reads the other's
    # aliased input, so no order works; x2 is copied and the second kernel goes first
    views = {1: X, 2: X2, 3: X, 4: X2, 5: view(3 << 20, (1, 32), (32, 1))}
    launches = [launch(0, 1, 5, 2, 3), launch(1, 2, 5, 1, 4)]
    assert schedule(launches, views, {3, 4}, NAMES) == Schedule((1, 0), (2,))


def test_data_dependencies_are_kept_and_a_copy_breaks_the_cycle() -> None:
    # k0 reads t1, writes t3 over t2; k1 reads t3 (an output used downstream) and t2: k1 must
    # follow k0 for t3 and precede it for t2, so t2 is copied
    views = {1: view(2 << 20, (8, 32), (32, 1)), 2: X, 3: X, 4: X2}
    launches = [launch(0, 1, 3), launch(1, 3, 2, 4)]
    assert schedule(launches, views, {3, 4}, NAMES) == Schedule((0, 1), (2,))


def test_kernels_of_one_fused_node_stay_together_in_order() -> None:
    # fused node 0 (two kernels: partial sums in t9, then t3 over t2); fused node 1 reads t2
    views = {1: view(2 << 20, (8, 32), (32, 1)), 2: X, 3: X, 4: X2}
    launches = [launch(0, 1, 9, elementwise=False), launch(0, 9, 3, elementwise=False), launch(1, 2, 4)]
    assert schedule(launches, views, {3, 4}, NAMES) == Schedule((2, 0, 1), ())


def test_two_outputs_sharing_memory_are_refused() -> None:
    views = {1: view(2 << 20, (8, 32), (32, 1)), 3: X, 4: view(64, (8, 32), (32, 1))}
    with pytest.raises(gd.FeedError, match="tensor 't3': shares memory with output 't4': two outputs cannot"):
        schedule([launch(0, 1, 3, 4)], views, {3, 4}, NAMES)
    interleaved = {1: X2, 3: view(0, (8, 16), (32, 2)), 4: view(4, (8, 16), (32, 2))}
    assert schedule([launch(0, 1, 3, 4)], interleaved, {3, 4}, NAMES) == Schedule((0,), ())


# -- bind and execute through a stand-in driver -------------------------------------------


def rope(dtype: str = "float") -> gd.OperationGraphSpec:
    """The cuDNN frontend's in-place RoPE sample: Y1 = X1 cos - X2 sin, Y2 = X2 cos + X1 sin."""
    g = gd.OperationGraphSpec(name="rope", io_data_type=dtype, compute_data_type="float")
    x1, x2 = g.tensor(name="x1", dim=[2, 4, 16, 64]), g.tensor(name="x2", dim=[2, 4, 16, 64])
    cos, sin = g.tensor(name="cos", dim=[1, 1, 16, 64]), g.tensor(name="sin", dim=[1, 1, 16, 64])
    g.sub(g.mul(x1, cos), g.mul(x2, sin)).set_name("y1").set_output(True)
    g.add(g.mul(x2, cos), g.mul(x1, sin)).set_name("y2").set_output(True)
    return g


@pytest.fixture(scope="module")
def compiled_rope() -> gd.Plan:
    plan = gd.compile(rope(), arch="sm_90", cache=None)
    assert isinstance(plan, gd.Plan) and len(plan.kernels) == 2  # as issue 8 found it: two kernels
    return plan


@pytest.fixture
def rope_plan(compiled_rope: gd.Plan) -> gd.Plan:
    """The compiled RoPE plan with no bindings remembered (each test has its own fake driver)."""
    compiled_rope._bound = BindCache()
    return compiled_rope


def fake_pack(fake: fake_gpu.FakeDriver, plan: gd.Plan, **aliases: str) -> dict[str, Any]:
    """A FakeArray per input and output; ``aliases`` puts an output at an input's address."""
    arrays: dict[str, Any] = {}
    pointers: dict[str, int] = {}
    for t in (*plan.inputs, *plan.outputs):
        itemsize = t.data_type.itemsize
        pointers[t.name] = pointers[aliases[t.name]] if t.name in aliases else fake.allocate(1 << 16)
        arrays[t.name] = fake_gpu.FakeArray(pointers[t.name], t.dim, t.stride, f"<f{itemsize}")
    return arrays


def test_bind_copies_and_reorders_for_in_place_rope(monkeypatch: pytest.MonkeyPatch, rope_plan: gd.Plan) -> None:
    fake = fake_gpu.install(monkeypatch)
    pack = fake_pack(fake, rope_plan, y1="x1", y2="x2")
    bound = rope_plan.bind(pack)
    first, second = rope_plan.program.launches
    assert [launch.name for launch in bound.launches] == [second.name, first.name]
    (copy,) = bound.copies
    x2 = pack["x2"].__cuda_array_interface__["data"][0]
    assert copy.source == x2 and copy.destination.nbytes == 2 * 4 * 16 * 64 * 4
    x2_id = rope_plan.graph.tensor("x2").id
    for launch, slots in zip(bound.launches, bound._slots):
        (slot,) = [i for i, a in enumerate(launch.args) if a.tensor == x2_id]
        assert int(slots[slot]) == copy.destination.pointer  # every kernel reads x2 from the copy
    bound()
    assert fake.calls == [("copy", copy.destination.pointer, x2, copy.destination.nbytes)] + [
        ("launch", launch.name) for launch in bound.launches
    ]


def test_bind_leaves_plans_without_aliasing_alone(monkeypatch: pytest.MonkeyPatch, rope_plan: gd.Plan) -> None:
    fake = fake_gpu.install(monkeypatch)
    bound = rope_plan.bind(fake_pack(fake, rope_plan))
    assert bound.launches == rope_plan.program.launches and bound.copies == ()


def test_bind_refuses_outputs_sharing_memory(monkeypatch: pytest.MonkeyPatch, rope_plan: gd.Plan) -> None:
    fake = fake_gpu.install(monkeypatch)
    with pytest.raises(gd.FeedError, match="tensor 'y1': shares memory with output 'y2'"):
        rope_plan.bind(fake_pack(fake, rope_plan, y2="y1"))
    assert fake.calls == []


def test_a_workspace_sharing_memory_with_a_buffer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import plan_graphs

    fake = fake_gpu.install(monkeypatch)
    plan = gd.compile(plan_graphs.sum_then_add(), arch="sm_90", cache=None)
    pack = fake_pack(fake, plan)
    x = pack["x"].__cuda_array_interface__["data"][0]
    with pytest.raises(gd.FeedError, match=r"workspace \[0x.*\) shares memory with tensor 'x'"):
        plan.bind(pack, workspace=x)


def test_in_place_pointwise_is_one_kernel_with_no_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import plan_graphs

    fake = fake_gpu.install(monkeypatch)
    plan = gd.compile(plan_graphs.add_relu(dtype="float"), arch="sm_90", cache=None)
    (launch,) = plan.program.launches
    assert launch.elementwise
    bound = plan.bind(fake_pack(fake, plan, y="x"))
    assert bound.copies == () and len(bound.launches) == 1
    pack = fake_pack(fake, plan, y="b")
    bias_over = plan.bind(pack)  # y over the broadcast bias: b is copied first, the kernel reads the copy
    (copy,) = bias_over.copies
    assert copy.source == pack["b"].__cuda_array_interface__["data"][0]
    b_slot = [i for i, a in enumerate(launch.args) if a.tensor == plan.graph.tensor("b").id]
    assert [int(bias_over._slots[0][i]) for i in b_slot] == [copy.destination.pointer]


# -- execute reuses a binding for the same memory ----------------------------------------------


def device_pack(plan: gd.Plan) -> dict[str, gd.DeviceArray]:
    return {t.name: gd.DeviceArray(t.dim, t.stride, t.data_type) for t in (*plan.inputs, *plan.outputs)}


def test_execute_binds_a_pack_once(monkeypatch: pytest.MonkeyPatch, rope_plan: gd.Plan) -> None:
    fake = fake_gpu.install(monkeypatch)
    binds = []
    original = gd.Plan.bind
    monkeypatch.setattr(gd.Plan, "bind", lambda *args, **kwargs: binds.append(1) or original(*args, **kwargs))
    pack = device_pack(rope_plan)
    for _ in range(3):
        outputs = rope_plan.execute(pack)
        assert outputs == {"y1": pack["y1"], "y2": pack["y2"]}
    assert len(binds) == 1 and len(fake.calls) == 6
    moved = {**pack, "x1": gd.DeviceArray((2, 4, 16, 64), None, gd.DataType.FLOAT)}  # other memory: bound anew
    rope_plan.execute(moved)
    rope_plan.execute(pack, stream=7)  # another stream: bound anew
    assert len(binds) == 3
    in_place = {**pack, "y1": pack["x1"], "y2": pack["x2"]}  # aliasing: its copies are kept with the binding
    rope_plan.execute(in_place)
    rope_plan.execute(in_place)
    assert len(binds) == 4 and [c[0] for c in fake.calls[-6:]] == ["copy", "launch", "launch"] * 2


def test_execute_reuses_bindings_of_cuda_array_interface_buffers(
    monkeypatch: pytest.MonkeyPatch, rope_plan: gd.Plan
) -> None:
    fake = fake_gpu.install(monkeypatch)
    pack = fake_pack(fake, rope_plan)
    rope_plan.execute(pack)
    again = fake_pack(fake, rope_plan)  # new objects, new memory: a second binding
    rope_plan.execute(again)
    same_memory = {name: fake_gpu.FakeArray(*a.args) for name, a in pack.items()}
    assert rope_plan.execute(same_memory) == {"y1": same_memory["y1"], "y2": same_memory["y2"]}
    assert len(rope_plan._bound) == 2


def test_execute_checks_every_new_layout(monkeypatch: pytest.MonkeyPatch, rope_plan: gd.Plan) -> None:
    fake_gpu.install(monkeypatch)
    pack = device_pack(rope_plan)
    rope_plan.execute(pack)
    with pytest.raises(gd.FeedError, match="tensor 'y1': shares memory with output 'y2'"):
        rope_plan.execute({**pack, "y2": pack["y1"]})
    half = gd.DeviceArray((2, 4, 16, 64), None, gd.DataType.HALF)
    with pytest.raises(gd.FeedError, match="tensor 'x1': has data type half"):
        rope_plan.execute({**pack, "x1": half})


def test_execute_allocates_left_out_outputs_on_every_call(monkeypatch: pytest.MonkeyPatch, rope_plan: gd.Plan) -> None:
    fake_gpu.install(monkeypatch)
    inputs = {name: a for name, a in device_pack(rope_plan).items() if name not in ("y1", "y2")}
    first, second = rope_plan.execute(inputs), rope_plan.execute(inputs)
    assert first["y1"] is not second["y1"] and len(rope_plan._bound) == 0


# -- the reference plan ----------------------------------------------------------------------


def test_reference_rope_in_place() -> None:
    graph = rope()
    ir = graph.validate()
    rng = np.random.default_rng(0)
    feeds = {t.name: rng.standard_normal(t.dim).astype(np.float32) for t in ir.inputs}
    want = gd.reference.execute(ir, feeds)
    arrays = {name: host_array(ir.tensor(name), values) for name, values in feeds.items()}
    outputs = gd.compile(graph, backend="reference").execute({**arrays, "y1": arrays["x1"], "y2": arrays["x2"]})
    assert outputs["y1"] is arrays["x1"]
    np.testing.assert_allclose(arrays["x1"], want["y1"], rtol=1e-6)
    np.testing.assert_allclose(arrays["x2"], want["y2"], rtol=1e-6)


def test_reference_refuses_outputs_sharing_memory() -> None:
    ir = rope().validate()
    arrays = {t.name: host_array(t) for t in ir.inputs}
    y = host_array(ir.tensor("y1"))
    with pytest.raises(gd.FeedError, match="tensor 'y1': shares memory with output 'y2'"):
        gd.compile(ir, backend="reference").execute({**arrays, "y1": y, "y2": y})


# -- read-only inputs with overlapping strides -----------------------------------------------


def mixed_precision_matmul() -> gd.OperationGraphSpec:
    """The frontend's mixed-precision matmul sample reads B through overlapping strides."""
    g = gd.OperationGraphSpec(name="mixed_mm", io_data_type="bf16", compute_data_type="float")
    a = g.tensor(name="a", dim=[16, 32, 128])
    b = g.tensor(name="b", dim=[16, 128, 64], stride=[8192, 1, 64])
    g.matmul(a, b).set_name("c").set_output(True)
    return g


def broadcast_add() -> gd.OperationGraphSpec:
    """y = x + r, r a row read through stride 0 (every row the same memory)."""
    g = gd.OperationGraphSpec(name="broadcast_add", io_data_type="float")
    x = g.tensor(name="x", dim=[8, 33])
    r = g.tensor(name="r", dim=[8, 33], stride=[0, 1])
    g.add(x, r).set_name("y").set_output(True)
    return g


@pytest.mark.parametrize("make", [mixed_precision_matmul, broadcast_add], ids=lambda f: f.__name__)
def test_inputs_with_overlapping_strides_on_the_reference(make: Any) -> None:
    graph = make()
    ir = graph.validate()
    rng = np.random.default_rng(1)
    arrays = {t.name: host_array(t, rng.standard_normal(t.dim)) for t in ir.inputs}
    got = gd.compile(graph, backend="reference").execute(arrays)
    first, second = (arrays[t.name].astype(np.float64) for t in ir.inputs)
    want = np.matmul(first, second) if graph.name == "mixed_mm" else first + second
    (out,) = ir.outputs
    assert relative_error(got[out.name].astype(np.float64), want) <= tolerance(out.data_type)


@pytest.mark.parametrize("make", [mixed_precision_matmul, broadcast_add], ids=lambda f: f.__name__)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_index_overlapping_inputs_with_their_strides(make: Any, arch: str) -> None:
    plan = gd.compile(make(), arch=arch, cache=None)
    assert isinstance(plan, gd.Plan)
    (kernel,) = plan.kernels
    assert kernel.cubin
    body = kernel.source[kernel.source.index('extern "C"') :]
    if make is broadcast_add:  # r's row coordinate is dropped (stride 0), x's is not
        assert re.search(r"t\d\[c1\]", body) and re.search(r"t\d\[c0 \* 33 \+ c1\]", body)
    else:  # B's batch, n and k strides as declared: 8192, 64, 1
        assert re.search(r"\* 8192\b", body) and re.search(r"\* \(int\)64\b", body) and re.search(r"k \* 1\b", body)


def test_random_inputs_share_values_where_elements_share_memory() -> None:
    ir = mixed_precision_matmul().validate()
    b = ir.tensor("b")
    assert overlap_reason(b.dim, b.stride) == "dim 2 (extent 64) steps 64 but the dims inside it span 128"
    assert overlap_reason(ir.tensor("a").dim, ir.tensor("a").stride) is None
    feeds = random_inputs(ir, 3)
    values = feeds["b"].astype(np.float64)
    np.testing.assert_array_equal(values[:, 64:, :-1], values[:, :64, 1:])  # (k + 64, n) is (k, n + 1)
    laid_out = host_array(b, feeds["b"])  # what a buffer of b holds
    np.testing.assert_array_equal(laid_out.astype(np.float64), values)
    got = gd.compile(ir, backend="reference").execute({"a": host_array(ir.tensor("a"), feeds["a"]), "b": laid_out})
    want = gd.reference.execute(ir, feeds)
    assert relative_error(got["c"].astype(np.float64), want["c"].astype(np.float64)) == 0


def test_an_output_with_overlapping_strides_is_refused() -> None:
    g = gd.OperationGraphSpec(name="bad", io_data_type="float")
    x = g.tensor(name="x", dim=[8, 33])
    g.relu(x).set_name("y").set_output(True).set_stride([0, 1])
    with pytest.raises(gd.StrideError, match=r"tensor 'y': strides \[0, 1\] overlap .* a tensor the graph writes"):
        g.validate()
