"""``from_torch``: a PyTorch module, exported with ``torch.export``, as an OperationGraphSpec.

The exported program's ATen nodes are translated one by one into builder calls; one
translator per ATen op, found in a table keyed by the op's name (``aten.<name>``), so
that the high-level ops ``torch.export.export`` keeps (``linear``, ``conv2d``,
``layer_norm``, ``scaled_dot_product_attention``) and their core-ATen decompositions
(``addmm``, ``convolution``, ``native_layer_norm``, ``_softmax``...) map alike. The
module's parameters and buffers become graph inputs named after their ``state_dict``
keys, the user inputs are named after ``forward``'s arguments, and the user outputs are
``output`` (or ``output0``, ``output1``... when there are several), in the types torch
gives them. torch is imported only when this runs: graphdnn works without it.

Every node that cannot be mapped is collected, and one :class:`UnsupportedError` names
them all with their ATen targets, so that a user sees the whole gap at once.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

from .errors import GraphError, UnsupportedError
from .graph import OperationGraphSpec
from .tensor import TensorSpec

Value = Any  # a TensorSpec, a tuple of them (multi-output ops), or a Python constant


class _Unmapped(Exception):
    """A translator cannot express this node in graphdnn; the message says why."""


def from_torch(module: Any, example_inputs: Sequence[Any], name: str | None = None) -> OperationGraphSpec:
    """Import ``module`` (a ``torch.nn.Module``, or an ``ExportedProgram`` already made
    by ``torch.export.export``, decomposed or not) traced at ``example_inputs``.

    Inputs and outputs take the example inputs' data type (the graph's io type);
    parameters and buffers keep their own. Intermediates and computation are fp32.
    Raises :class:`UnsupportedError` naming every node it cannot map.
    """
    try:
        import torch
    except ImportError as error:
        raise ImportError("gd.from_torch needs PyTorch (torch.export); install torch") from error

    args = tuple(example_inputs)
    exported = isinstance(module, torch.export.ExportedProgram)
    program = module if exported else torch.export.export(module, args)
    io_type = next((a.dtype for a in args if isinstance(a, torch.Tensor)), torch.float32)
    graph_name = name or ("graph" if exported else type(module).__name__)
    g = OperationGraphSpec(name=graph_name, io_data_type=io_type)
    return _Importer(g, program).run()


class _Importer:
    def __init__(self, g: OperationGraphSpec, program: Any) -> None:
        self.g = g
        self.program = program
        self.values: dict[str, Value] = {}
        self.missing: set[str] = set()  # fx nodes with no value (unmapped, or fed by one)
        self.unmapped: list[str] = []

    def run(self) -> OperationGraphSpec:
        from torch.export.graph_signature import InputKind

        input_names = {}
        for spec in self.program.graph_signature.input_specs:
            if spec.kind == InputKind.USER_INPUT:
                input_names[spec.arg.name] = spec.arg.name
            elif spec.target is not None:
                input_names[spec.arg.name] = spec.target  # the state_dict key
        outputs: Sequence[Any] = ()
        for node in self.program.graph.nodes:
            if node.op == "placeholder":
                if node.users:  # an unread buffer (num_batches_tracked) is no input
                    self.values[node.name] = self.g.tensor_like(node.meta["val"], name=input_names[node.name])
            elif node.op == "call_function":
                self._translate(node)
            elif node.op == "output":
                outputs = node.args[0]
        if self.unmapped:
            raise UnsupportedError(
                f"from_torch cannot map {len(self.unmapped)} node(s) of the exported program: "
                + "; ".join(self.unmapped)
            )
        self._mark_outputs(outputs)
        return self.g

    def _translate(self, node: Any) -> None:
        import torch

        if any(arg.name in self.missing for arg in node.all_input_nodes):
            self.missing.add(node.name)  # follows from an unmapped node, reported there
            return
        target = node.target
        key = "getitem" if target is operator.getitem else _aten_name(target)
        translator = _TRANSLATORS.get(key) if key is not None else None
        functional = _functional_form(key) if translator is None else None
        in_place = functional is not None
        try:
            if functional is not None:
                _check_in_place(node)
                translator = functional
            if translator is None:
                raise _Unmapped("no graphdnn translation")
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: self.values[n.name])
            value = translator(self.g, node, *args, **kwargs)
        except (_Unmapped, GraphError, TypeError) as error:
            # TypeError: an overload whose arguments the translator does not take
            reason = f"arguments not understood ({error})" if isinstance(error, TypeError) else str(error)
            self.unmapped.append(f"'{node.name}' ({target}): {reason}")
            self.missing.add(node.name)
            return
        self.values[node.name] = value
        if in_place:  # later reads of the tensor it wrote over see the result
            self.values[node.args[0].name] = value

    def _mark_outputs(self, outputs: Sequence[Any]) -> None:
        for index, out in enumerate(outputs):
            spec = self.values[out.name]
            if not isinstance(spec, TensorSpec) or spec.producer is None or spec.is_output:
                spec = self.g.identity(spec, name=f"output_copy{index}")  # an input or a repeat
            spec.set_name("output" if len(outputs) == 1 else f"output{index}")
            spec.set_output(True).set_data_type(out.meta["val"].dtype)


# ops whose result may share memory with their input: writing over it in place writes over that too
_VIEWS = frozenset(
    {
        "view",
        "reshape",
        "_unsafe_view",
        "permute",
        "transpose",
        "t",
        "flatten",
        "expand",
        "slice",
        "select",
        "squeeze",
        "unsqueeze",
        "alias",
        "as_strided",
        "detach",
        "contiguous",
        "dropout",
        "getitem",
    }
)


def _functional_form(key: str | None) -> Translator | None:
    """The translator of an in-place op's functional form (``relu_``: ``relu``'s), if it has one."""
    if key is None or not key.endswith("_") or key.startswith("_"):
        return None
    return _TRANSLATORS.get(key[:-1])


def _check_in_place(node: Any) -> None:
    """An in-place op (ResNet's ``relu_``, ``out += identity``) maps to its functional form, its
    result standing for the tensor it wrote over from then on, unless that tensor is a graph
    input (a mutation torch.export hands back to the caller) or may share memory with another
    (a view: writing it would change that one too)."""
    written = node.args[0]
    if written.op == "placeholder":
        raise _Unmapped(f"it writes over the input '{written.name}' in place, which graphdnn cannot hand back")
    source = "getitem" if written.target is operator.getitem else _aten_name(written.target)
    if source in _VIEWS:
        raise _Unmapped(f"it writes in place over '{written.name}', a {source} that may share memory with its input")


def _aten_name(target: Any) -> str | None:
    """``aten.<name>`` of an OpOverload (``aten.add.Tensor`` -> ``add``), else None."""
    namespace = getattr(target, "namespace", None)
    if namespace != "aten":
        return None
    return str(target.overloadpacket.__name__)


# -- translators: (graph, fx node, *args, **kwargs) -> value --------------------------------
Translator = Callable[..., Value]
_TRANSLATORS: dict[str, Translator] = {}


def _aten(*names: str) -> Callable[[Translator], Translator]:
    def register(fn: Translator) -> Translator:
        for name in names:
            _TRANSLATORS[name] = fn
        return fn

    return register


def _tensor(value: Any, what: str) -> TensorSpec:
    if not isinstance(value, TensorSpec):
        raise _Unmapped(f"{what} must be a tensor, got {value!r}")
    return value


def _dims(node: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in node.meta["val"].shape)


def _per_channel(g: OperationGraphSpec, vector: TensorSpec, rank: int) -> TensorSpec:
    """A ``[C]`` parameter as ``[1, C, 1, ...]``, the per-channel form of conv and batch norm."""
    (channels,) = _static_dims(vector)
    return g.reshape(vector, [1, channels, *[1] * (rank - 2)])


def _static_dims(spec: TensorSpec) -> tuple[int, ...]:
    """An imported tensor's dims: always numbers, since the program is traced at fixed shapes."""
    return tuple(int(d) for d in spec.dim or ())


def _per_dim(value: Any, rank: int) -> list[int]:
    """torch's int-or-list spatial arguments as one int per spatial dim."""
    values = [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    return values * rank if len(values) == 1 else values


@_aten("getitem")
def _getitem(g: OperationGraphSpec, node: Any, value: Any, index: int) -> Value:
    picked = value[index]
    if picked is None and node.users:  # an unread one (pooling's indices) is no gap
        raise _Unmapped(f"output {index} of '{node.args[0].name}' has no graphdnn equivalent")
    return picked


@_aten("convolution", "conv2d")
def _convolution(
    g: OperationGraphSpec,
    node: Any,
    x: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    *rest: Any,
) -> Value:
    # convolution: (transposed, output_padding, groups); conv2d: (groups,). conv_fprop reads
    # the group count off the weight's dims ([K, C/groups, ...]), so groups need no argument.
    if len(rest) == 3 and rest[0]:
        raise _Unmapped("transposed convolution is not conv_fprop")
    if isinstance(padding, str):
        raise _Unmapped(f"padding='{padding}' is not supported")
    weight = _tensor(weight, "weight")
    spatial = len(_static_dims(weight)) - 2
    y = g.conv_fprop(
        _tensor(x, "input"),
        weight,
        padding=_per_dim(padding, spatial),
        stride=_per_dim(stride, spatial),
        dilation=_per_dim(dilation, spatial),
    )
    return y if bias is None else g.add(y, _per_channel(g, _tensor(bias, "bias"), len(_static_dims(y))))


def _batchnorm(
    g: OperationGraphSpec, x: Any, weight: Any, bias: Any, mean: Any, var: Any, epsilon: float
) -> TensorSpec:
    x = _tensor(x, "input")
    if weight is None or bias is None or mean is None or var is None:
        raise _Unmapped("batch norm needs affine weight and bias and running statistics")
    rank = len(_static_dims(x))
    inv_variance = g.rsqrt(g.add(_per_channel(g, var, rank), float(epsilon)))
    mean, weight, bias = (_per_channel(g, v, rank) for v in (mean, weight, bias))
    return g.batchnorm_inference(x, mean, inv_variance, weight, bias)


@_aten("_native_batch_norm_legit_no_training")
def _batch_norm_no_training(
    g: OperationGraphSpec, node: Any, x: Any, weight: Any, bias: Any, mean: Any, var: Any, momentum: float, eps: float
) -> Value:
    return (_batchnorm(g, x, weight, bias, mean, var, eps), None, None)


@_aten("batch_norm")
def _batch_norm(
    g: OperationGraphSpec,
    node: Any,
    x: Any,
    weight: Any,
    bias: Any,
    mean: Any,
    var: Any,
    training: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool = True,
) -> Value:
    if training:
        raise _Unmapped("training-mode batch norm (put the module in eval mode)")
    return _batchnorm(g, x, weight, bias, mean, var, eps)


def _layernorm(g: OperationGraphSpec, x: Any, shape: Sequence[int], weight: Any, bias: Any, eps: float) -> TensorSpec:
    if weight is None or bias is None:
        raise _Unmapped("layer norm without an affine weight and bias is not supported")
    if tuple(weight.dim) != tuple(shape):
        raise _Unmapped(f"weight dims {weight.dim} differ from normalized_shape {list(shape)}")
    if 1 in shape:  # graphdnn reads the normalized axes off the scale's dims that are not 1
        raise _Unmapped(f"normalized_shape {list(shape)} has an extent of 1")
    y = g.layernorm("inference", _tensor(x, "input"), weight, bias, float(eps))[0]
    return cast(TensorSpec, y)  # inference: y only


@_aten("layer_norm")
def _layer_norm(
    g: OperationGraphSpec,
    node: Any,
    x: Any,
    shape: Sequence[int],
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
    cudnn_enable: bool = True,
) -> Value:
    return _layernorm(g, x, shape, weight, bias, eps)


@_aten("native_layer_norm")
def _native_layer_norm(
    g: OperationGraphSpec, node: Any, x: Any, shape: Sequence[int], weight: Any, bias: Any, eps: float
) -> Value:
    return (_layernorm(g, x, shape, weight, bias, eps), None, None)


def _matmul(g: OperationGraphSpec, a: Any, b: Any) -> TensorSpec:
    a, b = _tensor(a, "input"), _tensor(b, "other")
    if len(_static_dims(a)) < 2 or len(_static_dims(b)) < 2:
        raise _Unmapped("a matmul of a 1-D operand (a vector) is not supported")
    return g.matmul(a, b)


@_aten("mm", "bmm", "matmul")
def _mm(g: OperationGraphSpec, node: Any, a: Any, b: Any) -> Value:
    return _matmul(g, a, b)


@_aten("addmm")
def _addmm(g: OperationGraphSpec, node: Any, bias: Any, a: Any, b: Any, *, beta: float = 1, alpha: float = 1) -> Value:
    product = _matmul(g, a, b)
    if alpha != 1:
        product = g.mul(product, float(alpha))
    if beta != 1:
        bias = g.mul(bias, float(beta))
    return g.add(product, bias)


@_aten("linear")
def _linear(g: OperationGraphSpec, node: Any, x: Any, weight: Any, bias: Any = None) -> Value:
    y = _matmul(g, x, _transpose(g, _tensor(weight, "weight"), 0, 1))
    return y if bias is None else g.add(y, bias)


def _operand(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (TensorSpec, int, float)):
        raise _Unmapped(f"operand {value!r} is not a tensor or a number")
    return float(value) if not isinstance(value, TensorSpec) else value


def _binary(kind: str) -> Translator:
    def translate(
        g: OperationGraphSpec, node: Any, a: Any, b: Any, alpha: float = 1, *, rounding_mode: str | None = None
    ) -> Value:
        if rounding_mode is not None:
            raise _Unmapped(f"division with rounding_mode='{rounding_mode}' is not supported")
        a, b = _operand(a), _operand(b)
        if alpha != 1:
            b = g.mul(b, float(alpha)) if isinstance(b, TensorSpec) else b * alpha
        if not isinstance(a, TensorSpec):
            raise _Unmapped("the first operand must be a tensor")
        return getattr(g, kind)(a, b)

    return translate


for _kind in ("add", "sub", "mul", "div"):
    _aten(_kind)(_binary(_kind))


def _unary(method: str) -> Translator:
    def translate(g: OperationGraphSpec, node: Any, x: Any) -> Value:
        return getattr(g, method)(_tensor(x, "input"))

    return translate


for _name in ("relu", "silu", "sigmoid", "tanh", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "erf"):
    _aten(_name)(_unary(_name))


@_aten("hardtanh")
def _hardtanh(g: OperationGraphSpec, node: Any, x: Any, min_val: float = -1.0, max_val: float = 1.0) -> Value:
    return g.relu(_tensor(x, "input"), lower_clip=float(min_val), upper_clip=float(max_val))


@_aten("contiguous", "clone")
def _same_values(g: OperationGraphSpec, node: Any, x: Any, **memory_format: Any) -> Value:
    """A copy or a change of layout: the same logical tensor, which is all graphdnn sees."""
    return _tensor(x, "input")


@_aten("dropout")
def _dropout(g: OperationGraphSpec, node: Any, x: Any, p: float, train: bool) -> Value:
    if train and p:
        raise _Unmapped("training-mode dropout (put the module in eval mode)")
    return _tensor(x, "input")


@_aten("gelu")
def _gelu(g: OperationGraphSpec, node: Any, x: Any, *, approximate: str = "none") -> Value:
    return g.gelu_approx_tanh(x) if approximate == "tanh" else g.gelu(x)


@_aten("softmax", "_softmax")
def _softmax(g: OperationGraphSpec, node: Any, x: Any, dim: int, option: Any = None) -> Value:
    return g.softmax(_tensor(x, "input"), axis=int(dim))


@_aten("view", "reshape", "_unsafe_view", "flatten")
def _reshape(g: OperationGraphSpec, node: Any, x: Any, *layout: Any) -> Value:
    """``layout`` (a shape, or flatten's dims) is not read: the output's dims are the node's."""
    return g.reshape(_tensor(x, "input"), _dims(node))


@_aten("permute")
def _permute(g: OperationGraphSpec, node: Any, x: Any, dims: Sequence[int]) -> Value:
    rank = len(dims)
    return g.transpose(_tensor(x, "input"), [int(d) % rank for d in dims])


def _transpose(g: OperationGraphSpec, x: TensorSpec, dim0: int, dim1: int) -> TensorSpec:
    rank = len(_static_dims(x))
    permutation = list(range(rank))
    permutation[dim0 % rank], permutation[dim1 % rank] = dim1 % rank, dim0 % rank
    return g.transpose(x, permutation)


@_aten("transpose")
def _transpose_int(g: OperationGraphSpec, node: Any, x: Any, dim0: int, dim1: int) -> Value:
    return _transpose(g, _tensor(x, "input"), dim0, dim1)


@_aten("t")
def _t(g: OperationGraphSpec, node: Any, x: Any) -> Value:
    x = _tensor(x, "input")
    return x if len(_static_dims(x)) < 2 else _transpose(g, x, 0, 1)


def _window_args(kernel: Any, stride: Any, padding: Any) -> tuple[list[int], list[int], list[int]]:
    window = _per_dim(kernel, 2)
    return window, _per_dim(stride, 2) if stride else window, _per_dim(padding, 2)


@_aten("max_pool2d", "max_pool2d_with_indices")
def _max_pool2d(
    g: OperationGraphSpec,
    node: Any,
    x: Any,
    kernel: Any,
    stride: Any = (),
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> Value:
    if ceil_mode or _per_dim(dilation, 2) != [1, 1]:
        raise _Unmapped("max pooling with ceil_mode or dilation is not supported")
    window, stride, padding = _window_args(kernel, stride, padding)
    y = g.pooling(_tensor(x, "input"), "max", window, stride=stride, padding=padding)
    return (y, None) if _aten_name(node.target) == "max_pool2d_with_indices" else y


@_aten("avg_pool2d")
def _avg_pool2d(
    g: OperationGraphSpec,
    node: Any,
    x: Any,
    kernel: Any,
    stride: Any = (),
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> Value:
    if ceil_mode or divisor_override is not None:
        raise _Unmapped("average pooling with ceil_mode or divisor_override is not supported")
    window, stride, padding = _window_args(kernel, stride, padding)
    mode = "avg_include_padding" if count_include_pad else "avg_exclude_padding"
    return g.pooling(_tensor(x, "input"), mode, window, stride=stride, padding=padding)


@_aten("adaptive_avg_pool2d", "_adaptive_avg_pool2d", "adaptive_max_pool2d")
def _adaptive_pool2d(g: OperationGraphSpec, node: Any, x: Any, output_size: Any) -> Value:
    mode = "max" if _aten_name(node.target) == "adaptive_max_pool2d" else "avg"
    y = g.adaptive_pooling(_tensor(x, "input"), mode, _per_dim(output_size, 2))
    return (y, None) if mode == "max" else y  # adaptive_max_pool2d returns (values, indices)


@_aten("scaled_dot_product_attention")
def _sdpa(
    g: OperationGraphSpec,
    node: Any,
    q: Any,
    k: Any,
    v: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Value:
    q, k, v = _tensor(q, "query"), _tensor(k, "key"), _tensor(v, "value")
    if dropout_p:
        raise _Unmapped(
            f"attention dropout (dropout_p={dropout_p}): torch draws its mask from its own generator, which "
            "graphdnn's Philox mask does not reproduce; import in eval mode, or build sdpa(dropout=(p, seed, offset))"
        )
    if len(_static_dims(q)) != 4:
        raise _Unmapped("sdpa takes rank-4 [B, H, S, D] query, key and value")
    if attn_mask is not None:
        attn_mask = _tensor(attn_mask, "attn_mask")
        if not attn_mask.data_type.is_floating:
            raise _Unmapped("a boolean attn_mask is not supported (an additive float mask is)")
        mask_dims = _static_dims(attn_mask)
        if len(mask_dims) < 4:  # torch broadcasts a [Sq, Skv] mask; sdpa's bias is rank 4
            attn_mask = g.reshape(attn_mask, [*[1] * (4 - len(mask_dims)), *mask_dims])
    attn_scale = scale if scale is not None else 1.0 / math.sqrt(_static_dims(q)[-1])
    return g.sdpa(q, k, v, attn_scale=float(attn_scale), bias=attn_mask, use_causal_mask=bool(is_causal))[0]
