"""The cuDNN-style builder (tensors, setters, defaults, uids) and every validation error."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import graphdnn as gd
from graphdnn.dtypes import DataType


def graph(**types: object) -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(name="g", **{"io_data_type": "float", **types})


# -- declaring tensors ------------------------------------------------------------------------
def test_tensor_defaults_to_a_packed_row_major_input() -> None:
    g = graph()
    x = g.tensor([2, 3, 4])
    assert (x.name, x.dim, x.stride) == ("tensor0", (2, 3, 4), (12, 4, 1))
    assert not x.is_virtual and not x.is_output and not x.is_pass_by_value
    assert x.producer is None and x.uid is None and x.value is None
    assert x.data_type is DataType.FLOAT
    assert g.tensor_named("tensor0") is x
    assert g.tensor([5]).name == "tensor1"


def test_getters_return_lists_like_pygraph() -> None:
    g = graph()
    x = g.tensor([2, 3], stride=[1, 2], data_type="bf16", name="x", uid=7)
    assert x.get_name() == "x"
    assert x.get_dim() == [2, 3] and x.get_stride() == [1, 2]
    assert x.get_data_type() is DataType.BFLOAT16
    assert x.get_is_virtual() is False
    assert x.get_uid() == 7


def test_fluent_setters_chain_and_change_the_tensor() -> None:
    g = graph()
    x = g.tensor([1])
    same = x.set_name("x").set_dim([2, 3]).set_stride([1, 2]).set_data_type(np.float16).set_uid(4)
    assert same is x
    assert (x.name, x.dim, x.stride, x.data_type, x.uid) == ("x", (2, 3), (1, 2), DataType.HALF, 4)
    assert g.tensor_named("x") is x
    with pytest.raises(gd.GraphError, match="graph 'g' has no tensor named 'tensor0'"):
        g.tensor_named("tensor0")


def test_set_name_and_set_uid_reject_bad_values() -> None:
    g = graph()
    g.tensor([1], name="x")
    y = g.tensor([1], name="y")
    with pytest.raises(gd.StructureError, match="tensor name 'x' is already used in graph 'g'"):
        y.set_name("x")
    with pytest.raises(gd.GraphError, match="tensor 'y': uid must be a non-negative integer, got -1"):
        y.set_uid(-1)
    with pytest.raises(gd.GraphError, match="uid must be a non-negative integer, got True"):
        y.set_uid(True)


def test_dims_and_strides_must_be_integers() -> None:
    g = graph()
    with pytest.raises(gd.GraphError, match=r"tensor 'x': dim must hold integers, got 2\.5"):
        g.tensor([2.5], name="x")
    with pytest.raises(gd.GraphError, match="tensor 'x': dim must be a list of integers, got 3"):
        g.tensor(3, name="x")
    with pytest.raises(gd.GraphError, match="stride must hold integers, got '1'"):
        g.tensor([2], stride=["1"], name="x")
    assert g.tensor(np.array([2, 3]), name="x").dim == (2, 3)  # NumPy integers are fine


def test_graph_name_must_be_a_non_empty_string() -> None:
    with pytest.raises(gd.GraphError, match="graph name must be a non-empty string, got ''"):
        gd.OperationGraphSpec(name="")


# -- tensor_like -------------------------------------------------------------------------------
def test_tensor_like_reads_dims_element_strides_and_type_of_numpy_arrays() -> None:
    g = graph()
    base = np.zeros((2, 3, 4), np.float32)
    packed = g.tensor_like(base, name="packed")
    assert (packed.dim, packed.stride, packed.data_type) == ((2, 3, 4), (12, 4, 1), DataType.FLOAT)
    transposed = g.tensor_like(base.transpose(0, 2, 1))
    assert (transposed.dim, transposed.stride) == ((2, 4, 3), (12, 1, 4))
    sliced = g.tensor_like(base.transpose(0, 2, 1)[:, ::2])
    assert (sliced.dim, sliced.stride) == ((2, 2, 3), (12, 2, 4))
    bf16 = g.tensor_like(np.zeros((5, 3), ml_dtypes.bfloat16)[:, 1:])
    assert (bf16.dim, bf16.stride, bf16.data_type) == ((5, 2), (3, 1), DataType.BFLOAT16)
    for t in (packed, transposed, sliced, bf16):
        g.relu(t).set_output(True)
    g.validate()  # every one is an acceptable layout


def test_tensor_like_rejects_reversed_arrays_at_validation() -> None:
    g = graph()
    x = g.tensor_like(np.zeros((4, 3), np.float32)[::-1], name="x")
    assert x.stride == (-3, 1)
    g.relu(x).set_output(True)
    with pytest.raises(gd.StrideError, match=r"tensor 'x': stride\[0\] = -3 is negative"):
        g.validate()


def test_tensor_like_reads_torch_style_element_strides_and_copies_a_spec() -> None:
    class FakeTorchTensor:
        shape = (2, 3)
        dtype = "torch.float16"

        def stride(self) -> tuple[int, int]:
            return (1, 2)

    g = graph()
    x = g.tensor_like(FakeTorchTensor(), name="x")
    assert (x.dim, x.stride, x.data_type) == ((2, 3), (1, 2), DataType.HALF)
    copy = g.tensor_like(x, name="copy")
    assert (copy.name, copy.dim, copy.stride, copy.data_type) == ("copy", (2, 3), (1, 2), DataType.HALF)


# -- scalars -------------------------------------------------------------------------------------
def test_scalar_is_a_one_element_constant() -> None:
    g = graph()
    s = g.scalar(0.5, name="half")
    assert (s.dim, s.stride, s.value, s.is_pass_by_value, s.data_type) == ((1,), (1,), 0.5, True, DataType.FLOAT)
    with pytest.raises(gd.GraphError, match="tensor 'k': a scalar constant must be a number, got 'a'"):
        g.scalar("a", name="k")
    with pytest.raises(gd.GraphError, match="a scalar constant must be a number, got True"):
        g.scalar(True)


def test_python_numbers_become_constant_scalars_without_uids() -> None:
    g = graph(io_data_type="half")
    x = g.tensor([2, 3], name="x")
    y = g.mul(x, 3, name="triple").set_output(True)
    constant = g.tensor_named("triple::b")
    assert constant.value == 3 and constant.is_pass_by_value and constant.data_type is DataType.FLOAT
    ir = g.validate()
    assert ir.tensor("triple::b").is_constant and ir.tensor("triple::b").uid is None
    assert [t.name for t in ir.inputs] == ["x"]
    assert [t.name for t in ir.outputs] == [y.name]


def test_pass_by_value_tensor_must_hold_one_element() -> None:
    g = graph()
    x = g.tensor([2, 3], name="x")
    s = g.tensor([3], is_pass_by_value=True, name="s")
    g.mul(x, g.tensor([1], is_pass_by_value=True)).set_output(True)
    g.add(x, s).set_output(True)
    with pytest.raises(gd.ShapeError, match="pass-by-value tensor 's' has 3 elements; it must hold one"):
        g.validate()


# -- op outputs: inferred at once, typed by the graph ---------------------------------------------
def test_inferred_dims_and_strides_are_visible_right_after_the_call() -> None:
    g = graph()
    x = g.tensor([2, 3, 5, 7], stride=gd.nhwc_strides([2, 3, 5, 7]), name="x")
    w = g.tensor([4, 3, 3, 3], name="w")
    y = g.conv_fprop(x, w, padding=[1, 0], stride=[2, 1])
    assert (y.dim, y.stride) == ((2, 4, 3, 5), gd.nhwc_strides([2, 4, 3, 5]))
    z = g.relu(y)
    assert (z.dim, z.stride) == (y.dim, y.stride)
    assert z.is_virtual and z.producer == "relu_0" and not z.is_output
    assert z.set_output(True).is_output


def test_data_types_default_from_the_graph_and_explicit_types_win() -> None:
    g = gd.OperationGraphSpec(io_data_type="bf16", intermediate_data_type="float", compute_data_type="float")
    x = g.tensor([4], name="x")
    h = g.tensor([4], data_type="half", name="h")
    v = g.add(x, h)
    assert x.data_type is DataType.BFLOAT16 and h.data_type is DataType.HALF
    assert v.data_type is DataType.FLOAT  # virtual: the intermediate type
    out = g.relu(v).set_output(True)
    assert out.data_type is DataType.BFLOAT16  # output: the io type
    assert out.set_data_type("double").data_type is DataType.DOUBLE
    v.set_data_type(np.float16)
    ir = g.validate()
    assert [ir.tensor(t.name).data_type for t in (x, h, v, out)] == [
        DataType.BFLOAT16,
        DataType.HALF,
        DataType.HALF,
        DataType.DOUBLE,
    ]


def test_graph_type_defaults_follow_pygraph() -> None:
    g = gd.OperationGraphSpec()
    assert g.io_data_type is DataType.NOT_SET
    assert g.intermediate_data_type is DataType.FLOAT and g.compute_data_type is DataType.FLOAT


def test_uids_go_to_non_virtual_tensors_skipping_those_users_chose() -> None:
    g = graph()
    x = g.tensor([2, 3], name="x")
    w = g.tensor([2, 3], name="w", uid=1)
    s = g.tensor([1], is_pass_by_value=True, name="s")
    v = g.add(x, w)
    y = g.mul(v, s).set_output(True)
    z = g.add(y, 1.0).set_output(True).set_uid(3)
    ir = g.validate()
    uids = {t.name: t.uid for t in ir.tensors}
    assert uids == {"x": 2, "w": 1, "s": 4, v.name: None, y.name: 5, "add_1::b": None, z.name: 3}
    assert x.uid == 2 and y.uid == 5  # written back to the builder's tensors


def test_duplicate_uids_are_rejected() -> None:
    g = graph()
    g.add(g.tensor([2], name="x", uid=1), g.tensor([2], name="w", uid=1)).set_output(True)
    with pytest.raises(gd.StructureError, match="uid 1 is used by tensors 'x' and 'w'"):
        g.validate()


def test_node_names_default_per_kind_and_must_be_unique() -> None:
    g = graph()
    x = g.tensor([2], name="x")
    g.relu(x)
    g.relu(x, name="mine")
    g.relu(x)
    g.neg(x)
    assert [n.name for n in g.nodes] == ["relu_0", "mine", "relu_2", "neg_0"]
    with pytest.raises(gd.StructureError, match="node name 'mine' is already used in graph 'g'"):
        g.relu(x, name="mine")
    with pytest.raises(gd.StructureError, match="tensor name 'x' is already used in graph 'g'"):
        g.tensor([2], name="x")


def test_a_failed_op_call_leaves_the_graph_as_it_was() -> None:
    g = graph()
    x = g.tensor([2, 3], name="x")
    b = g.tensor([4], name="b")
    with pytest.raises(gd.ShapeError):
        g.add(x, b)
    with pytest.raises(gd.StructureError):
        g.binary_select(x, 1.0, None)
    assert g.nodes == () and [t.name for t in g.tensors] == ["x", "b"]
    g.add(x, g.tensor([3], name="ok")).set_output(True)
    g.relu(b).set_output(True)
    g.validate()


# -- wiring errors -----------------------------------------------------------------------------------
def test_unknown_op() -> None:
    g = graph()
    with pytest.raises(gd.UnknownOpError, match="node 'n': unknown op 'conv_fwd'"):
        g._add_node("conv_fwd", {}, name="n")


def test_missing_input() -> None:
    g = graph()
    with pytest.raises(gd.StructureError, match="node 'add_0': missing input 'b' for add"):
        g._add_node("add", {"a": g.tensor([2])})


def test_extra_input_role() -> None:
    g = graph()
    x = g.tensor([2])
    with pytest.raises(gd.StructureError, match=r"node 'add_0': add has no input 'c' \(inputs: a, b\)"):
        g._add_node("add", {"a": x, "b": x, "c": x})


def test_input_that_is_not_a_tensor() -> None:
    g = graph()
    with pytest.raises(gd.StructureError, match="node 'relu_0': input 'input' must be a TensorSpec, got str"):
        g.relu("x")


def test_input_from_another_graph() -> None:
    g, other = graph(), gd.OperationGraphSpec(name="other")
    x, y = g.tensor([2], name="x"), other.tensor([2], name="y")
    with pytest.raises(
        gd.StructureError, match="node 'add_0': input 'b' is tensor 'y' of graph 'other', not of this graph"
    ):
        g.add(x, y)


def test_no_output_marked() -> None:
    g = graph()
    g.relu(g.tensor([2]))
    with pytest.raises(gd.StructureError, match=r"graph 'g' has no output: call set_output\(True\)"):
        g.validate()


def test_declared_input_nobody_reads() -> None:
    g = graph()
    g.relu(g.tensor([2], name="x")).set_output(True)
    g.tensor([2], name="unused")
    with pytest.raises(gd.StructureError, match="tensor 'unused' is declared but no node reads it"):
        g.validate()


def test_dead_node() -> None:
    g = graph()
    x = g.tensor([2], name="x")
    g.relu(x).set_output(True)
    g.exp(g.neg(x))  # computed, never used
    with pytest.raises(gd.StructureError, match="node 'neg_0': none of its outputs is a graph output"):
        g.validate()


def test_virtual_tensor_nobody_writes() -> None:
    g = graph()
    v = g.tensor([2], is_virtual=True, name="v")
    g.relu(v).set_output(True)
    with pytest.raises(gd.StructureError, match=r"virtual tensor 'v' is written by no node \(node 'relu_0' reads it\)"):
        g.validate()
    g2 = graph()
    g2.relu(g2.tensor([2])).set_output(True)
    g2.tensor([2], is_virtual=True, name="v")
    with pytest.raises(
        gd.StructureError, match=r"virtual tensor 'v' is written by no node \(no node reads it either\)"
    ):
        g2.validate()


# The op methods cannot wire these; a graph-file reader can. We build them the way the reader
# does: tensors first, then nodes through _add_node(outputs=..., infer=False).
def test_tensor_written_twice() -> None:
    g = graph()
    x = g.tensor([2, 3], name="x")
    t = g.tensor([2, 3], name="t")
    g._add_node("relu", {"input": x}, outputs={"y": t}, infer=False)
    g._add_node("neg", {"input": x}, outputs={"y": t}, infer=False)
    with pytest.raises(gd.StructureError, match="tensor 't' is written by both node 'relu_0' and node 'neg_0'"):
        g.validate()


def test_cycle() -> None:
    g = graph()
    x = g.tensor([2, 3], name="x")
    a, b = g.tensor([2, 3], is_virtual=True, name="a"), g.tensor([2, 3], name="b")
    g._add_node("add", {"a": x, "b": b}, outputs={"y": a}, infer=False)
    g._add_node("neg", {"input": a}, outputs={"y": b}, infer=False)
    with pytest.raises(
        gd.StructureError, match=r"node 'add_0': the graph has a cycle through node\(s\) 'add_0', 'neg_0'"
    ):
        g.validate()


def test_node_missing_an_output_or_with_an_unknown_one() -> None:
    g = graph()
    x = g.tensor([2, 3], name="x")
    g._add_node("relu", {"input": x}, outputs={}, infer=False)
    g.neg(x).set_output(True)
    with pytest.raises(gd.StructureError, match=r"node 'relu_0': missing output 'y' for relu \(outputs: y\)"):
        g.validate()
    g = graph()
    x = g.tensor([2, 3], name="x")
    y, z = g.tensor([2, 3], name="y"), g.tensor([2, 3], name="z")
    g._add_node("relu", {"input": x}, outputs={"y": y, "z": z}, infer=False)
    with pytest.raises(gd.StructureError, match=r"node 'relu_0': unexpected output 'z' for relu \(outputs: y\)"):
        g.validate()


def test_shape_errors_of_unchecked_nodes_surface_at_validation() -> None:
    g = graph()
    y = g._add_node("add", {"a": g.tensor([2, 3], name="x"), "b": g.tensor([4], name="b")}, infer=False)[0]
    assert y.dim is None
    y.set_output(True)
    with pytest.raises(gd.ShapeError, match=r"node 'add_0', tensor 'b': cannot broadcast a \[2, 3\], b \[4\]"):
        g.validate()


# -- dims, strides, types ---------------------------------------------------------------------------
def test_set_dim_on_an_op_output_must_agree_with_inference() -> None:
    g = graph()
    y = g.relu(g.tensor([2, 3], name="x")).set_output(True).set_dim([2, 4])
    assert y.stride is None  # the inferred strides were for the old dims
    with pytest.raises(
        gd.ShapeError, match=r"node 'relu_0': output y 'relu_0::y' has dims set to \[2, 4\], but relu gives \[2, 3\]"
    ):
        g.validate()


def test_input_dims_are_checked() -> None:
    g = graph()
    g.relu(g.tensor([2, 0], name="x")).set_output(True)
    with pytest.raises(gd.ShapeError, match=r"tensor 'x': dim\[1\] = 0 is outside 1\.\.2147483647"):
        g.validate()


def test_overlapping_strides_are_accepted_on_an_input_and_refused_on_an_output() -> None:
    g = graph()
    g.relu(g.tensor([2, 3], stride=[2, 1], name="x")).set_output(True)
    assert g.validate().tensor("x").stride == (2, 1)  # read-only: a view whose rows overlap
    g = graph()
    g.relu(g.tensor([2, 3], name="x")).set_output(True).set_stride([2, 1])
    with pytest.raises(gd.StrideError, match=r"tensor 'relu_0::y': strides \[2, 1\] overlap .* only a graph input"):
        g.validate()
    g = graph()
    g.relu(g.tensor([2, 3], name="x")).set_output(True).set_stride([1, 1])
    with pytest.raises(gd.StrideError, match=r"tensor 'relu_0::y': strides \[1, 1\] overlap"):
        g.validate()


def test_an_explicit_output_stride_is_kept() -> None:
    g = graph()
    y = g.relu(g.tensor([2, 3], name="x")).set_output(True).set_stride([1, 2])
    assert g.validate().tensor(y.name).stride == (1, 2)


def test_no_data_type_for_an_input_an_output_or_a_virtual_tensor() -> None:
    g = gd.OperationGraphSpec(name="g")
    g.relu(g.tensor([2], name="x")).set_output(True)
    with pytest.raises(
        gd.DataTypeError,
        match=r"graph input 'x' has no data type: set one \(data_type= or set_data_type\) "
        "or give the graph an io_data_type",
    ):
        g.validate()
    g = gd.OperationGraphSpec(name="g")
    g.relu(g.tensor([2], data_type="float", name="x")).set_output(True)
    with pytest.raises(gd.DataTypeError, match=r"output 'relu_0::y' has no data type.*io_data_type"):
        g.validate()
    g = gd.OperationGraphSpec(name="g", io_data_type="float", intermediate_data_type=None)
    g.neg(g.relu(g.tensor([2], name="x"))).set_output(True)
    with pytest.raises(gd.DataTypeError, match=r"virtual tensor 'relu_0::y' has no data type.*intermediate_data_type"):
        g.validate()


def test_integer_tensor_into_conv() -> None:
    g = graph()
    x = g.tensor([1, 2, 5, 5], data_type="int32", name="x")
    w = g.tensor([3, 2, 3, 3], name="w")
    with pytest.raises(
        gd.DataTypeError, match="node 'conv_fprop_0': image 'x' is int32; conv_fprop needs a floating type"
    ):
        g.conv_fprop(x, w)
    g._add_node(
        "conv_fprop",
        {"image": x, "weight": w},
        {"pre_padding": [0, 0], "post_padding": [0, 0], "stride": [1, 1], "dilation": [1, 1]},
        infer=False,
    )[0].set_output(True)
    with pytest.raises(gd.DataTypeError, match="image 'x' is int32; conv_fprop needs a floating type"):
        g.validate()


def test_compute_type_must_be_floating() -> None:
    g = graph(compute_data_type="int32")
    g.relu(g.tensor([2])).set_output(True)
    with pytest.raises(gd.DataTypeError, match="graph 'g': compute_data_type must be a floating type, not int32"):
        g.validate()
    g = graph(intermediate_data_type="int8")
    g.relu(g.tensor([2])).set_output(True)
    with pytest.raises(gd.DataTypeError, match="graph 'g': intermediate_data_type must be a floating type, not int8"):
        g.validate()
    g = graph()
    g.relu(g.tensor([2]), compute_data_type="int8").set_output(True)
    with pytest.raises(gd.DataTypeError, match=r"node 'relu_0': compute_data_type must be a floating type \(or int32"):
        g.validate()
    # the frontend's int8 matmul computes in int32; other operands may not
    g = graph(io_data_type="int8")
    g.matmul(g.tensor([4, 16]), g.tensor([16, 2]), compute_data_type="int32").set_output(True)
    assert g.validate().nodes[0].compute_data_type is DataType.INT32
    g = graph(io_data_type="half")
    g.matmul(g.tensor([4, 16]), g.tensor([16, 2]), compute_data_type="int32").set_output(True)
    with pytest.raises(gd.DataTypeError, match="node 'matmul_0': compute_data_type must be a floating type"):
        g.validate()


def test_node_compute_type_overrides_the_graph() -> None:
    g = graph(compute_data_type="float")
    x = g.tensor([2], name="x")
    g.relu(x, compute_data_type="double").set_output(True)
    g.neg(x).set_output(True)
    ir = g.validate()
    assert [n.compute_data_type for n in ir.nodes] == [DataType.DOUBLE, DataType.FLOAT]


# -- the IR is a snapshot ---------------------------------------------------------------------------
def test_validated_ir_does_not_follow_later_builder_edits() -> None:
    g = graph()
    x = g.tensor([2, 3], name="x")
    y = g.relu(x).set_output(True)
    ir = g.validate()
    y.set_dim([6])
    x.set_dim([3, 3]).set_data_type("half")
    y.set_name("renamed")
    assert ir.tensor("relu_0::y").dim == (2, 3) and ir.tensor("relu_0::y").stride == (3, 1)
    assert ir.tensor("x").dim == (2, 3) and ir.tensor("x").data_type is DataType.FLOAT
    with pytest.raises(gd.ShapeError, match=r"output y 'renamed' has dims set to \[6\], but relu gives \[3, 3\]"):
        g.validate()


def test_ir_nodes_are_topologically_ordered_and_linked() -> None:
    g = graph()
    x = g.tensor([2, 3], name="x")
    a, b = g.tensor([2, 3], is_virtual=True, name="a"), g.tensor([2, 3], is_virtual=True, name="b")
    c = g.tensor([2, 3], name="c")
    # as a file reader may list them: a consumer before its producer
    g._add_node("relu", {"input": b}, outputs={"y": a}, infer=False)
    g._add_node("neg", {"input": x}, outputs={"y": b}, infer=False)
    g._add_node("add", {"a": a, "b": x}, outputs={"y": c}, infer=False)
    ir = g.validate()
    assert [n.name for n in ir.nodes] == ["neg_0", "relu_0", "add_0"]
    assert [n.id for n in ir.nodes] == [0, 1, 2]
    assert ir.producer(ir.tensor("c")).name == "add_0"
    assert ir.producer(ir.tensor("x")) is None
    assert [n.name for n in ir.consumers(ir.tensor("x"))] == ["neg_0", "add_0"]
    assert [t.name for t in ir.inputs] == ["x"] and [t.name for t in ir.outputs] == ["c"]
