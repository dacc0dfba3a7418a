"""Small elementwise graphs for the plan, cache and runtime tests (one NVRTC compile each)."""

from __future__ import annotations

import graphdnn as gd


def add_relu(
    name: str = "add_relu",
    *,
    names: tuple[str, str, str] = ("x", "b", "y"),
    cols: int = 33,
    dtype: str = "half",
    bias_first: bool = False,
) -> gd.OperationGraphSpec:
    """y = relu(x + b), x [8, cols], b [1, cols] broadcast. ``names`` and ``bias_first`` (the
    declaration order) change nothing the plan cache may see."""
    g = gd.OperationGraphSpec(name=name, io_data_type=dtype)
    x_name, b_name, y_name = names
    if bias_first:
        b = g.tensor(name=b_name, dim=[1, cols])
        x = g.tensor(name=x_name, dim=[8, cols])
    else:
        x = g.tensor(name=x_name, dim=[8, cols])
        b = g.tensor(name=b_name, dim=[1, cols])
    g.relu(g.add(x, b, name=f"{name}.add"), name=f"{name}.relu").set_name(y_name).set_output(True)
    return g


def add_relu_and_sigmoid(name: str = "two_groups") -> gd.OperationGraphSpec:
    """add_relu's graph (same tensors, same ids) plus an independent sigmoid on another input:
    its add+relu kernel is identical to add_relu's, so the cache compiles it once."""
    g = add_relu(name)
    z = g.tensor(name="z", dim=[4, 5], data_type="float")
    g.mul(g.sigmoid(z), 2.0).set_name("s").set_output(True)
    return g


def scaled(name: str = "scaled") -> gd.OperationGraphSpec:
    """y = x * alpha + 1, alpha a runtime (pass-by-value) scalar; NHWC x, so strides matter."""
    g = gd.OperationGraphSpec(name=name, io_data_type="float")
    dims = [2, 3, 4, 5]
    x = g.tensor(name="x", dim=dims, stride=gd.nhwc_strides(dims))
    alpha = g.tensor(name="alpha", dim=[1], is_pass_by_value=True)
    g.add(g.mul(x, alpha), 1.0).set_name("y").set_output(True)
    return g


def sum_then_add(name: str = "sum_then_add") -> gd.OperationGraphSpec:
    """y = x + sum(x, axis 1): the row sums are a virtual tensor that crosses fused nodes, so
    it lives in the workspace; two kernels (a reduction, then an elementwise add)."""
    g = gd.OperationGraphSpec(name=name, io_data_type="float")
    x = g.tensor(name="x", dim=[4, 6])
    sums = g.reduction(x, mode="add", axes=[1], name="sum")
    sums.set_dim([4, 1])
    g.add(x, sums, name="add").set_name("y").set_output(True)
    return g


def matmul_relu(name: str = "matmul_relu") -> gd.OperationGraphSpec:
    """y = relu(a @ b) in bf16: the GEMM family offers several tile shapes (autotuning candidates)."""
    g = gd.OperationGraphSpec(name=name, io_data_type="bf16")
    a = g.tensor(name="a", dim=[64, 32])
    b = g.tensor(name="b", dim=[32, 16])
    g.relu(g.matmul(a, b)).set_name("y").set_output(True)
    return g
