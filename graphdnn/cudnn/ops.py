"""The frontend's op methods, with its argument names, positional order and return arity.

Each method calls the graphdnn builder method of the same op (which checks everything)
and then names the outputs as the frontend does, ``<node>::<PORT>`` (``conv::Y``,
``bn::MEAN``, ``relu::OUT_0``); a node without a name is named by its position, as in
the frontend. Frontend ops that graphdnn lacks raise UnsupportedError saying so.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import UnsupportedError
from ..layout import overlap_reason, packed_strides
from ..ops.conv import ConvMode
from ..tensor import TensorSpec
from .attention_ops import AttentionOps
from .enums import reshape_mode as reshape_modes
from .moe_ops import MoeOps
from .ops_base import MaybeTensor, compute_type
from .quantize_ops import QuantizeOps


def _dims(values: Sequence[int] | None) -> Sequence[int] | None:
    """The frontend's empty-list default means 'not given'."""
    return None if values is None or len(values) == 0 else values


class FrontendOps(AttentionOps, MoeOps, QuantizeOps):
    """Op methods of :class:`~graphdnn.cudnn.pygraph`, mixed in; ``_spec`` is the builder."""

    # -- convolution and matmul ----------------------------------------------------------
    def conv_fprop(
        self,
        image: TensorSpec,
        weight: TensorSpec,
        padding: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        convolution_mode: Any = ConvMode.CROSS_CORRELATION,
        compute_data_type: Any = None,
        name: str = "",
        *,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
    ) -> TensorSpec:
        """Y = image (*) weight; ``pre_padding`` / ``post_padding`` (keywords) instead of ``padding``."""
        node = self._node(name)
        y = self._spec.conv_fprop(
            image, weight, _dims(padding), _dims(stride), _dims(dilation), _dims(pre_padding), _dims(post_padding),
            convolution_mode, compute_type(compute_data_type), node,
        )  # fmt: skip
        return self._one(node, y)

    def conv_dgrad(
        self,
        loss: TensorSpec,
        filter: TensorSpec,
        padding: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        convolution_mode: Any = ConvMode.CROSS_CORRELATION,
        compute_data_type: Any = None,
        name: str = "",
        *,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
    ) -> TensorSpec:
        """DX from DY; set DX's dims with ``set_dim`` where the stride leaves them ambiguous."""
        node = self._node(name)
        dx = self._spec.conv_dgrad(
            loss, filter, _dims(padding), _dims(stride), _dims(dilation), _dims(pre_padding), _dims(post_padding),
            convolution_mode, compute_data_type=compute_type(compute_data_type), name=node,
        )  # fmt: skip
        return self._one(node, dx, "DX")

    def conv_wgrad(
        self,
        image: TensorSpec,
        loss: TensorSpec,
        padding: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        convolution_mode: Any = ConvMode.CROSS_CORRELATION,
        compute_data_type: Any = None,
        name: str = "",
        *,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
    ) -> TensorSpec:
        """DW from X and DY; give DW its dims with ``set_dim``, as in the frontend."""
        node = self._node(name)
        dw = self._spec.conv_wgrad(
            image, loss, _dims(padding), _dims(stride), _dims(dilation), _dims(pre_padding), _dims(post_padding),
            convolution_mode, compute_data_type=compute_type(compute_data_type), name=node,
        )  # fmt: skip
        return self._one(node, dw, "DW")

    def matmul(
        self, A: TensorSpec, B: TensorSpec, compute_data_type: Any = None, padding: float = 0.0, name: str = ""
    ) -> TensorSpec:
        """C = A @ B. The frontend's ``padding`` (a value for out-of-bounds reads of ragged
        inputs) has no graphdnn counterpart: only 0.0 is accepted."""
        if padding != 0.0:
            raise UnsupportedError(f"matmul padding={padding!r}: graphdnn has no ragged matmul padding", node=name)
        node = self._node(name)
        return self._one(node, self._spec.matmul(A, B, compute_type(compute_data_type), node), "C")

    # -- normalizations ----------------------------------------------------------------------
    def batchnorm(
        self,
        input: TensorSpec,
        scale: TensorSpec,
        bias: TensorSpec,
        in_running_mean: MaybeTensor,
        in_running_var: MaybeTensor,
        epsilon: TensorSpec | float,
        momentum: MaybeTensor | float,
        peer_stats: Sequence[TensorSpec] = (),
        compute_data_type: Any = None,
        name: str = "",
    ) -> list[MaybeTensor]:
        """-> [Y, MEAN, INV_VARIANCE, NEXT_RUNNING_MEAN, NEXT_RUNNING_VAR] (the last two None
        without running statistics)."""
        _no_peer_stats(peer_stats, name)
        node = self._node(name)
        outputs = self._spec.batchnorm(
            input, scale, bias, in_running_mean, in_running_var, epsilon, momentum,
            compute_type(compute_data_type), node,
        )  # fmt: skip
        return self._label(node, outputs, ("Y", "MEAN", "INV_VARIANCE", "NEXT_RUNNING_MEAN", "NEXT_RUNNING_VAR"))

    def batchnorm_inference(
        self,
        input: TensorSpec,
        mean: TensorSpec,
        inv_variance: TensorSpec,
        scale: TensorSpec,
        bias: TensorSpec,
        compute_data_type: Any = None,
        name: str = "",
    ) -> TensorSpec:
        node = self._node(name)
        y = self._spec.batchnorm_inference(
            input, mean, inv_variance, scale, bias, compute_type(compute_data_type), node
        )
        return self._one(node, y)

    def layernorm(
        self,
        norm_forward_phase: Any,
        input: TensorSpec,
        scale: TensorSpec,
        bias: TensorSpec,
        epsilon: TensorSpec | float,
        compute_data_type: Any = None,
        name: str = "",
    ) -> list[MaybeTensor]:
        """-> [Y, MEAN, INV_VARIANCE]; the statistics are None in the inference phase."""
        node = self._node(name)
        outputs = self._spec.layernorm(
            norm_forward_phase, input, scale, bias, epsilon, compute_type(compute_data_type), node
        )
        return self._label(node, outputs, ("Y", "MEAN", "INV_VARIANCE"))

    def instancenorm(
        self,
        norm_forward_phase: Any,
        input: TensorSpec,
        scale: TensorSpec,
        bias: TensorSpec,
        epsilon: TensorSpec | float,
        compute_data_type: Any = None,
        name: str = "",
    ) -> list[MaybeTensor]:
        """-> [Y, MEAN, INV_VARIANCE]; the statistics are None in the inference phase."""
        node = self._node(name)
        outputs = self._spec.instancenorm(
            norm_forward_phase, input, scale, bias, epsilon, compute_type(compute_data_type), node
        )
        return self._label(node, outputs, ("Y", "MEAN", "INV_VARIANCE"))

    def adalayernorm(
        self,
        norm_forward_phase: Any,
        input: TensorSpec,
        scale: TensorSpec,
        bias: MaybeTensor = None,
        epsilon: TensorSpec | float | None = None,
        compute_data_type: Any = None,
        name: str = "",
    ) -> list[MaybeTensor]:
        """-> [Y, MEAN, INV_VARIANCE]: scale and bias per sample ([B, 1, D]); the statistics are None in inference."""
        node = self._node(name)
        outputs = self._spec.adalayernorm(
            norm_forward_phase, input, scale, bias, epsilon, compute_type(compute_data_type), node
        )
        return self._label(node, outputs, ("Y", "MEAN", "INV_VARIANCE"))

    def rmsnorm(
        self,
        norm_forward_phase: Any,
        input: TensorSpec,
        scale: TensorSpec,
        bias: MaybeTensor = None,
        epsilon: TensorSpec | float | None = None,
        compute_data_type: Any = None,
        name: str = "",
    ) -> list[MaybeTensor]:
        """-> [Y, INV_VARIANCE]; INV_VARIANCE is None in the inference phase."""
        node = self._node(name)
        outputs = self._spec.rmsnorm(
            norm_forward_phase, input, scale, bias, epsilon, compute_type(compute_data_type), node
        )
        return self._label(node, outputs, ("Y", "INV_VARIANCE"))

    def batchnorm_backward(
        self,
        grad: TensorSpec,
        input: TensorSpec,
        scale: TensorSpec,
        mean: TensorSpec,
        inv_variance: TensorSpec,
        peer_stats: Sequence[TensorSpec] = (),
        compute_data_type: Any = None,
        name: str = "",
    ) -> list[MaybeTensor]:
        """-> [DX, DSCALE, DBIAS]."""
        _no_peer_stats(peer_stats, name)
        node = self._node(name)
        outputs = self._spec.batchnorm_backward(
            grad, input, scale, mean, inv_variance, compute_type(compute_data_type), node
        )
        return self._label(node, outputs, ("DX", "DSCALE", "DBIAS"))

    def rmsnorm_backward(
        self,
        grad: TensorSpec,
        input: TensorSpec,
        scale: TensorSpec,
        inv_variance: TensorSpec,
        has_dbias: bool,
        compute_data_type: Any = None,
        name: str = "",
    ) -> list[MaybeTensor]:
        """-> [DX, DSCALE, DBIAS]; DBIAS is None unless ``has_dbias``."""
        node = self._node(name)
        outputs = self._spec.rmsnorm_backward(
            grad, input, scale, inv_variance, has_dbias, compute_type(compute_data_type), node
        )
        return self._label(node, outputs, ("DX", "DSCALE", "DBIAS"))

    # -- reductions ----------------------------------------------------------------------------
    def genstats(self, input: TensorSpec, compute_data_type: Any = None, name: str = "") -> list[MaybeTensor]:
        """-> [SUM, SQ_SUM], one value per channel."""
        node = self._node(name)
        outputs: list[MaybeTensor] = list(self._spec.genstats(input, compute_type(compute_data_type), node))
        return self._label(node, outputs, ("SUM", "SQ_SUM"))

    def reduction(self, input: TensorSpec, mode: Any, compute_data_type: Any = None, name: str = "") -> TensorSpec:
        """Y, whose dims the caller sets (``set_dim``): the axes where they are 1 are reduced."""
        node = self._node(name)
        y = self._spec.reduction(input, mode, compute_data_type=compute_type(compute_data_type), name=node)
        return self._one(node, y)

    def slice(
        self, input: TensorSpec, slices: Sequence[Any] = (), compute_data_type: Any = None, name: str = ""
    ) -> TensorSpec:
        """input[slices], one Python slice per leading dim."""
        node = self._node(name)
        return self._one(node, self._spec.slice(input, slices, compute_type(compute_data_type), node))

    def reshape(self, input: TensorSpec, name: str = "", reshape_mode: Any = None) -> TensorSpec:
        """Y, whose dims the caller sets (``set_dim``). graphdnn reshapes in row-major order
        (LOGICAL), which is the frontend's VIEW_ONLY (the default) for a packed row-major input."""
        view_only = reshape_mode is None or reshape_mode is reshape_modes.VIEW_ONLY
        if view_only and input.dim is not None and input.stride != packed_strides(input.dim):
            raise UnsupportedError(
                f"a VIEW_ONLY reshape of '{input.name}' with strides {input.stride}: graphdnn reshapes in row-major "
                "order, which is a view only of a packed row-major input; use reshape_mode=LOGICAL",
                node=name,
            )
        node = self._node(name)
        return self._one(node, self._spec.reshape(input, name=node))

    def transpose(
        self, input: TensorSpec, permutation: Sequence[int], compute_data_type: Any = None, name: str = ""
    ) -> TensorSpec:
        """Output axis i reads input axis ``permutation[i]``."""
        node = self._node(name)
        return self._one(node, self._spec.transpose(input, permutation, compute_type(compute_data_type), node))

    def concatenate(
        self, inputs: Sequence[TensorSpec], axis: int, in_place_index: int | None = None, name: str = ""
    ) -> TensorSpec:
        if in_place_index is not None:
            raise UnsupportedError("concatenate in_place_index: graphdnn always writes a new output", node=name)
        node = self._node(name)
        return self._one(node, self._spec.concatenate(inputs, axis, name=node))

    # -- pointwise -------------------------------------------------------------------------------
    def _pointwise(
        self, kind: str, inputs: Sequence[Any], compute_data_type: Any, name: str, **attrs: Any
    ) -> TensorSpec:
        """One pointwise node. Its output copies the strides of the first input of the same
        dims, as the frontend's does (graphdnn would pack them in that input's order)."""
        node = self._node(name)
        method: Callable[..., TensorSpec] = getattr(self._spec, kind)
        y = self._one(
            node, method(*inputs, compute_data_type=compute_type(compute_data_type), name=node, **attrs), "OUT_0"
        )
        like = next((t for t in inputs if isinstance(t, TensorSpec) and t.dim is not None and t.dim == y.dim), None)
        if like is not None and like.stride is not None and overlap_reason(like.dim, like.stride) is None:  # type: ignore[arg-type]
            y.set_stride(like.stride)
        return y

    def relu(
        self,
        input: TensorSpec,
        negative_slope: float | None = None,
        lower_clip: float | None = None,
        upper_clip: float | None = None,
        compute_data_type: Any = None,
        name: str = "",
    ) -> TensorSpec:
        clips = {"negative_slope": negative_slope, "lower_clip": lower_clip, "upper_clip": upper_clip}
        return self._pointwise("relu", [input], compute_data_type, name, **clips)

    def leaky_relu(
        self, input: TensorSpec, negative_slope: float, compute_data_type: Any = None, name: str = ""
    ) -> TensorSpec:
        return self._pointwise("leaky_relu", [input], compute_data_type, name, negative_slope=negative_slope)

    def swish(
        self, input: TensorSpec, swish_beta: float | None = None, compute_data_type: Any = None, name: str = ""
    ) -> TensorSpec:
        """x * sigmoid(swish_beta * x); no ``swish_beta`` means 1 (SiLU), as in the frontend."""
        beta = 1.0 if swish_beta is None else swish_beta
        return self._pointwise("swish", [input], compute_data_type, name, swish_beta=beta)

    def relu_backward(
        self,
        loss: TensorSpec,
        input: TensorSpec,
        negative_slope: float | None = None,
        lower_clip: float | None = None,
        upper_clip: float | None = None,
        compute_data_type: Any = None,
        name: str = "",
    ) -> TensorSpec:
        clips = {"negative_slope": negative_slope, "lower_clip": lower_clip, "upper_clip": upper_clip}
        return self._pointwise("relu_backward", [loss, input], compute_data_type, name, **clips)

    def leaky_relu_backward(
        self, loss: TensorSpec, input: TensorSpec, negative_slope: float, compute_data_type: Any = None, name: str = ""
    ) -> TensorSpec:
        return self._pointwise(
            "leaky_relu_backward", [loss, input], compute_data_type, name, negative_slope=negative_slope
        )

    def swish_backward(
        self,
        loss: TensorSpec,
        input: TensorSpec,
        compute_data_type: Any = None,
        swish_beta: float | None = None,
        name: str = "",
    ) -> TensorSpec:
        """The frontend's order: ``compute_data_type`` comes before ``swish_beta`` here."""
        beta = 1.0 if swish_beta is None else swish_beta
        return self._pointwise("swish_backward", [loss, input], compute_data_type, name, swish_beta=beta)

    def bias(self, input: TensorSpec, bias: TensorSpec, compute_data_type: Any = None, name: str = "") -> TensorSpec:
        return self._pointwise("bias", [input, bias], compute_data_type, name)

    def scale(self, input: TensorSpec, scale: TensorSpec, compute_data_type: Any = None, name: str = "") -> TensorSpec:
        return self._pointwise("scale", [input, scale], compute_data_type, name)

    def gen_index(self, input: TensorSpec, axis: int, compute_data_type: Any = None, name: str = "") -> TensorSpec:
        """Each element's index along ``axis`` (int32 unless set otherwise; the frontend's samples set it)."""
        return self._pointwise("gen_index", [input], compute_data_type, name, axis=axis)

    def binary_select(
        self, input0: TensorSpec, input1: TensorSpec, mask: TensorSpec, compute_data_type: Any = None, name: str = ""
    ) -> TensorSpec:
        """input0 where mask is non-zero, else input1."""
        return self._pointwise("binary_select", [input0, input1, mask], compute_data_type, name)


def _saved_statistics_backward(kind: str, doc: str) -> Callable[..., list[MaybeTensor]]:
    """A norm backward taking the forward's saved mean and inv_variance, -> [DX, DSCALE, DBIAS]."""

    def method(
        self: FrontendOps,
        grad: TensorSpec,
        input: TensorSpec,
        scale: TensorSpec,
        mean: TensorSpec,
        inv_variance: TensorSpec,
        compute_data_type: Any = None,
        name: str = "",
    ) -> list[MaybeTensor]:
        node = self._node(name)
        build = getattr(self._spec, kind)
        outputs = build(grad, input, scale, mean, inv_variance, compute_type(compute_data_type), node)
        return self._label(node, outputs, ("DX", "DSCALE", "DBIAS"))

    method.__name__ = method.__qualname__ = kind
    method.__doc__ = doc
    return method


def _no_peer_stats(peer_stats: Sequence[TensorSpec], node: str) -> None:
    if peer_stats:
        raise UnsupportedError(
            "batch norm peer_stats (statistics exchanged across GPUs) are not supported by graphdnn", node=node
        )


# Pointwise methods whose signatures differ only in the op and in their inputs' names.
def _pointwise_method(kind: str, roles: tuple[str, ...], doc: str) -> Callable[..., TensorSpec]:
    """``kind`` taking ``roles`` (by position or name), then compute_data_type and name."""
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    signature = inspect.Signature(
        [
            inspect.Parameter("self", positional),
            *(inspect.Parameter(role, positional, annotation="TensorSpec") for role in roles),
            inspect.Parameter("compute_data_type", positional, default=None, annotation="Any"),
            inspect.Parameter("name", positional, default="", annotation="str"),
        ],
        return_annotation="TensorSpec",
    )

    def method(*args: Any, **kwargs: Any) -> TensorSpec:
        given = signature.bind(*args, **kwargs)
        given.apply_defaults()
        values = given.arguments
        return values["self"]._pointwise(kind, [values[r] for r in roles], values["compute_data_type"], values["name"])

    method.__name__ = method.__qualname__ = kind
    method.__doc__ = f"Pointwise {kind}({', '.join(roles)}) -> OUT_0{doc}."
    method.__signature__ = signature  # type: ignore[attr-defined]
    return method


UNARY = (
    "identity", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan", "erf", "floor",
    "ceil", "logical_not", "tanh", "sigmoid", "elu", "gelu", "gelu_approx_tanh", "softplus",
)  # fmt: skip
BINARY_AB = ("add", "sub", "mul", "div", "add_square", "logical_and", "logical_or")
BINARY_INPUT01 = ("max", "min", "pow", "mod")
COMPARISONS = ("cmp_eq", "cmp_neq", "cmp_gt", "cmp_ge", "cmp_lt", "cmp_le")
# The frontend's elu_backward and softplus_backward take no alpha / beta: the defaults, 1.
BACKWARD = (
    "tanh_backward", "sigmoid_backward", "elu_backward", "gelu_backward", "gelu_approx_tanh_backward",
    "softplus_backward",
)  # fmt: skip

for _kinds, _roles, _doc in (
    (UNARY, ("input",), ""),
    (BINARY_AB, ("a", "b"), ""),
    (BINARY_INPUT01, ("input0", "input1"), ""),
    (COMPARISONS, ("input", "comparison"), ": 1 where true, 0 where false"),
    (BACKWARD, ("loss", "input"), ": loss times the derivative at the forward input"),
):
    for _kind in _kinds:
        setattr(FrontendOps, _kind, _pointwise_method(_kind, _roles, _doc))
for _kind, _doc in (
    ("layernorm_backward", "-> [DX, DSCALE, DBIAS]."),
    ("adalayernorm_backward", "-> [DX, DSCALE, DBIAS]; DSCALE and DBIAS per sample, as scale."),
    ("instancenorm_backward", "-> [DX, DSCALE, DBIAS]."),
):
    setattr(FrontendOps, _kind, _saved_statistics_backward(_kind, _doc))
