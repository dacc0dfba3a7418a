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


# -- dynamic graphs: the rows are symbols (None), or the static graph of given values ----------------
def dynamic_rows(name: str = "dynamic_rows", symbol: str = "rows", max_rows: int = 64) -> gd.OperationGraphSpec:
    """add_relu over ``symbol`` in 1..max_rows rows of 33: one elementwise kernel with a runtime
    extent. ``symbol``'s name changes nothing the plan cache may see; its range does."""
    g = gd.OperationGraphSpec(name=name, io_data_type="half")
    x = g.tensor(name="x", dim=[g.dim(symbol, 1, max_rows), 33])
    g.relu(g.add(x, g.tensor(name="b", dim=[1, 33]))).set_name("y").set_output(True)
    return g


def ln_gelu(
    rows: int | None = None, *, width: int = 768, max_rows: int = 4096, dtype: str = "half"
) -> gd.OperationGraphSpec:
    """y = gelu(layernorm(x)) over [rows, width] (the benchmark's LN+GELU): one row-norm kernel."""
    g = gd.OperationGraphSpec(name="ln_gelu", io_data_type=dtype, compute_data_type="float")
    x = g.tensor(name="x", dim=[g.dim("rows", 1, max_rows) if rows is None else rows, width])
    gamma, beta = g.tensor(name="gamma", dim=[1, width]), g.tensor(name="beta", dim=[1, width])
    y = g.layernorm("inference", x, gamma, beta, 1e-5, name="ln")[0]
    g.gelu(y, name="act").set_name("y").set_output(True)
    return g


def add_rmsnorm(
    batch: int | None = None,
    seq: int | None = None,
    *,
    width: int = 1024,
    max_batch: int = 8,
    max_seq: int = 512,
    dtype: str = "half",
) -> gd.OperationGraphSpec:
    """h = x + r (written), y = rmsnorm(h) over [batch, seq, width] (the benchmark's add+RMSNorm):
    one row-norm kernel with the residual add as its prologue; rows are batch * seq."""
    g = gd.OperationGraphSpec(name="add_rmsnorm", io_data_type=dtype, compute_data_type="float")
    b = g.dim("batch", 1, max_batch) if batch is None else batch
    s = g.dim("seq", 1, max_seq) if seq is None else seq
    x, r = g.tensor(name="x", dim=[b, s, width]), g.tensor(name="r", dim=[b, s, width])
    h = g.add(x, r, name="residual").set_name("h").set_output(True)
    y, _ = g.rmsnorm("inference", h, g.tensor(name="scale", dim=[1, 1, width]), epsilon=1e-5, name="norm")
    assert y is not None
    y.set_name("y").set_output(True)
    return g


def pointwise_chain(
    batch: int | None = None, seq: int | None = None, *, width: int = 40, max_batch: int = 9, max_seq: int = 17
) -> gd.OperationGraphSpec:
    """y = tanh(x * rowscale + bias) - x over [batch, seq, width] with x laid out seq-major
    (symbolic strides: [width, width*batch, 1]), a per-row scale [batch, seq, 1] and a bias."""
    g = gd.OperationGraphSpec(name="pointwise_chain", io_data_type="float")
    b = g.dim("batch", 1, max_batch) if batch is None else batch
    s = g.dim("seq", 1, max_seq) if seq is None else seq
    x = g.tensor(name="x", dim=[b, s, width], stride=gd.packed_strides([b, s, width], [1, 0, 2]))
    scale = g.tensor(name="rowscale", dim=[b, s, 1])
    bias = g.tensor(name="bias", dim=[1, 1, width])
    h = g.tanh(g.add(g.mul(x, scale), bias))
    g.sub(h, x).set_name("y").set_output(True)
    return g
