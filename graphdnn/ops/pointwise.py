"""Pointwise ops: one table row per op, NumPy-style broadcasting of size-1 dims.

Every pointwise op is declared once in :data:`POINTWISE`: its roles, attributes and
float64 reference. Codegen renders the same ops from its own table keyed by op kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..layout import stride_order
from ..symbolic import Extent
from .attributes import Attributes, NoAttributes
from .base import Category, Inferred, Op, Role, broadcast_dims, register

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import Scalar, TensorSpec


@dataclasses.dataclass(frozen=True)
class ReluAttributes(Attributes):
    """y = min(x, upper_clip) above lower_clip, lower_clip + negative_slope*(x - lower_clip) below."""

    negative_slope: float = 0.0
    lower_clip: float = 0.0
    upper_clip: float | None = None


@dataclasses.dataclass(frozen=True)
class LeakyReluAttributes(Attributes):
    negative_slope: float = 0.01


@dataclasses.dataclass(frozen=True)
class EluAttributes(Attributes):
    alpha: float = 1.0


@dataclasses.dataclass(frozen=True)
class SwishAttributes(Attributes):
    swish_beta: float = 1.0


@dataclasses.dataclass(frozen=True)
class SoftplusAttributes(Attributes):
    softplus_beta: float = 1.0


def _relu(x: np.ndarray, a: ReluAttributes) -> np.ndarray:
    upper = np.inf if a.upper_clip is None else a.upper_clip
    return np.where(x > a.lower_clip, np.minimum(x, upper), a.lower_clip + a.negative_slope * (x - a.lower_clip))


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    from scipy.special import expit  # imported on first use: scipy costs ~0.3 s at import

    return expit(x)


_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))


def _gelu_approx_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated in place in one buffer:
    on activations of 8M elements, x**3 and seven temporaries cost ~10x the arithmetic."""
    y = x * x
    y *= 0.044715
    y += 1.0
    y *= x
    y *= _SQRT_2_OVER_PI
    np.tanh(y, out=y)
    y += 1.0
    y *= x
    y *= 0.5
    return y


# kind -> (attributes, is an activation, reference(x, attributes))
_UNARY: dict[str, tuple[type[Attributes], bool, Callable[..., np.ndarray]]] = {
    "identity": (NoAttributes, False, lambda x, a: x),
    "neg": (NoAttributes, False, lambda x, a: -x),
    "abs": (NoAttributes, False, lambda x, a: np.abs(x)),
    "exp": (NoAttributes, False, lambda x, a: np.exp(x)),
    "log": (NoAttributes, False, lambda x, a: np.log(x)),
    "sqrt": (NoAttributes, False, lambda x, a: np.sqrt(x)),
    "rsqrt": (NoAttributes, False, lambda x, a: 1.0 / np.sqrt(x)),
    "reciprocal": (NoAttributes, False, lambda x, a: 1.0 / x),
    "sin": (NoAttributes, False, lambda x, a: np.sin(x)),
    "cos": (NoAttributes, False, lambda x, a: np.cos(x)),
    "tan": (NoAttributes, False, lambda x, a: np.tan(x)),
    "erf": (NoAttributes, False, lambda x, a: _erf(x)),
    "floor": (NoAttributes, False, lambda x, a: np.floor(x)),
    "ceil": (NoAttributes, False, lambda x, a: np.ceil(x)),
    "logical_not": (NoAttributes, False, lambda x, a: (x == 0).astype(np.float64)),
    "relu": (ReluAttributes, True, _relu),
    "leaky_relu": (LeakyReluAttributes, True, lambda x, a: np.where(x > 0, x, a.negative_slope * x)),
    "elu": (EluAttributes, True, lambda x, a: np.where(x > 0, x, a.alpha * np.expm1(np.minimum(x, 0)))),
    "gelu": (NoAttributes, True, lambda x, a: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))),
    "gelu_approx_tanh": (NoAttributes, True, lambda x, a: _gelu_approx_tanh(x)),
    "swish": (SwishAttributes, True, lambda x, a: x * _sigmoid(a.swish_beta * x)),
    "sigmoid": (NoAttributes, True, lambda x, a: _sigmoid(x)),
    "tanh": (NoAttributes, True, lambda x, a: np.tanh(x)),
    "softplus": (SoftplusAttributes, True, lambda x, a: np.logaddexp(0.0, a.softplus_beta * x) / a.softplus_beta),
}


def _relu_slope(x: np.ndarray, a: ReluAttributes) -> np.ndarray:
    """relu's derivative: 1 strictly between the clips, 0 at and above upper_clip (as PyTorch's
    hardtanh backward), negative_slope at and below lower_clip."""
    upper = np.inf if a.upper_clip is None else a.upper_clip
    return np.where(x > a.lower_clip, np.where(x < upper, 1.0, 0.0), a.negative_slope)


def _gelu_approx_tanh_slope(x: np.ndarray) -> np.ndarray:
    t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)


def _swish_slope(x: np.ndarray, a: SwishAttributes) -> np.ndarray:
    s = _sigmoid(a.swish_beta * x)
    return s * (1.0 + a.swish_beta * x * (1.0 - s))


# Activation backward ops, as the cuDNN frontend's *_backward(loss, input): the forward op's
# derivative at its *input* x (the backend's xDesc; sigmoid and tanh too, not their output),
# times loss: dx = loss * f'(x). kind -> (attributes, the forward activation, f'(x, attributes)).
_BACKWARD: dict[str, tuple[type[Attributes], str, Callable[..., np.ndarray]]] = {
    "relu_backward": (ReluAttributes, "relu", _relu_slope),
    "leaky_relu_backward": (LeakyReluAttributes, "leaky_relu", lambda x, a: np.where(x > 0, 1.0, a.negative_slope)),
    "elu_backward": (EluAttributes, "elu", lambda x, a: np.where(x > 0, 1.0, a.alpha * np.exp(np.minimum(x, 0)))),
    "gelu_backward": (
        NoAttributes,
        "gelu",
        lambda x, a: 0.5 * (1.0 + _erf(x / np.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi),
    ),
    "gelu_approx_tanh_backward": (NoAttributes, "gelu_approx_tanh", lambda x, a: _gelu_approx_tanh_slope(x)),
    "swish_backward": (SwishAttributes, "swish", _swish_slope),
    "sigmoid_backward": (NoAttributes, "sigmoid", lambda x, a: _sigmoid(x) * _sigmoid(-x)),
    "tanh_backward": (NoAttributes, "tanh", lambda x, a: 1.0 - np.tanh(x) ** 2),
    "softplus_backward": (SoftplusAttributes, "softplus", lambda x, a: _sigmoid(a.softplus_beta * x)),
}

# kind -> (input roles, reference(x, y)); the second operand may be a Python number.
_BINARY: dict[str, tuple[tuple[str, str], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "add": (("a", "b"), np.add),
    "sub": (("a", "b"), np.subtract),
    "mul": (("a", "b"), np.multiply),
    "div": (("a", "b"), np.divide),
    "max": (("a", "b"), np.maximum),
    "min": (("a", "b"), np.minimum),
    "pow": (("a", "b"), np.power),
    "mod": (("a", "b"), np.fmod),  # C fmod: the sign of a; NaN where b is 0
    "add_square": (("a", "b"), lambda x, y: x + y * y),
    "logical_and": (("a", "b"), lambda x, y: ((x != 0) & (y != 0)).astype(np.float64)),
    "logical_or": (("a", "b"), lambda x, y: ((x != 0) | (y != 0)).astype(np.float64)),
    "scale": (("input", "scale"), np.multiply),
    "bias": (("input", "bias"), np.add),
    "cmp_eq": (("input", "comparison"), lambda x, y: (x == y).astype(np.float64)),
    "cmp_neq": (("input", "comparison"), lambda x, y: (x != y).astype(np.float64)),
    "cmp_gt": (("input", "comparison"), lambda x, y: (x > y).astype(np.float64)),
    "cmp_ge": (("input", "comparison"), lambda x, y: (x >= y).astype(np.float64)),
    "cmp_lt": (("input", "comparison"), lambda x, y: (x < y).astype(np.float64)),
    "cmp_le": (("input", "comparison"), lambda x, y: (x <= y).astype(np.float64)),
}


# Inputs outside whose positive range the op is undefined (NaN) in real arithmetic.
_POSITIVE_INPUTS = {("log", "input"), ("sqrt", "input"), ("rsqrt", "input"), ("pow", "a")}


Evaluate = Callable[[list[np.ndarray], Any], Any]


class PointwiseOp(Op):
    """Base of every pointwise op: broadcast the inputs, apply ``evaluate`` elementwise."""

    category = Category.POINTWISE
    outputs = (Role("y"),)
    evaluate: Evaluate

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        tensors = [(role, t) for role, t in node.inputs if not isinstance(t, tuple)]
        dim = broadcast_dims(node, tensors)
        # The output takes the layout of the first input that already has its dims.
        for _, t in tensors:
            if t.dim == dim:
                return {"y": Inferred(dim, stride_order(t.dim, t.stride))}
        return {"y": Inferred(dim)}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        values = [np.asarray(x[role.name], dtype=np.float64) for role in self.inputs]
        out_dim = node.output("y").static_dim  # type: ignore[union-attr]
        with np.errstate(all="ignore"):  # NaN and inf are results here, not errors
            y = np.asarray(type(self).evaluate(values, node.attributes), dtype=np.float64)
        return {"y": y if y.shape == out_dim else np.broadcast_to(y, out_dim)}


def _define(kind: str, roles: tuple[str, ...], attrs: type[Attributes], evaluate: Evaluate) -> None:
    namespace = {
        "kind": kind,
        "inputs": tuple(Role(r, positive=(kind, r) in _POSITIVE_INPUTS) for r in roles),
        "attributes": attrs,
        "evaluate": staticmethod(evaluate),
        "__doc__": f"Pointwise {kind}.",
    }
    register(type(f"Pointwise_{kind}", (PointwiseOp,), namespace))


def _unary(fn: Callable[..., Any]) -> Evaluate:
    return lambda values, attributes: fn(values[0], attributes)


def _plain(fn: Callable[..., Any]) -> Evaluate:
    return lambda values, attributes: fn(*values)


def _backward(slope: Callable[..., np.ndarray]) -> Evaluate:
    return lambda values, attributes: values[0] * slope(values[1], attributes)


for _kind, (_attrs, _, _fn) in _UNARY.items():
    _define(_kind, ("input",), _attrs, _unary(_fn))
for _kind, (_roles, _fn) in _BINARY.items():
    _define(_kind, _roles, NoAttributes, _plain(_fn))
for _kind, (_attrs, _forward, _slope) in _BACKWARD.items():
    _define(_kind, ("loss", "input"), _attrs, _backward(_slope))
_define(
    "binary_select",
    ("input0", "input1", "mask"),
    NoAttributes,
    _plain(lambda a, b, mask: np.where(mask != 0, a, b)),
)

UNARY_KINDS = frozenset(_UNARY)
BINARY_KINDS = frozenset(_BINARY)
ACTIVATION_KINDS = frozenset(kind for kind, (_, activation, _) in _UNARY.items() if activation)
# backward kind -> the forward activation it differentiates
BACKWARD_OF = {kind: forward for kind, (_, forward, _) in _BACKWARD.items()}


class PointwiseMethods:
    """cuDNN-frontend-style builder methods for pointwise ops (mixed into the graph)."""

    _add_node: Callable[..., list[Any]]

    def _pointwise(
        self, kind: str, inputs: dict[str, Any], name: str | None, compute_data_type: Any, **attrs: Any
    ) -> TensorSpec:
        return self._add_node(kind, inputs, attrs, name=name, compute_data_type=compute_data_type)[0]

    # binary arithmetic
    def add(
        self, a: TensorSpec, b: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("add", {"a": a, "b": b}, name, compute_data_type)

    def sub(
        self, a: TensorSpec, b: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("sub", {"a": a, "b": b}, name, compute_data_type)

    def mul(
        self, a: TensorSpec, b: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("mul", {"a": a, "b": b}, name, compute_data_type)

    def div(
        self, a: TensorSpec, b: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("div", {"a": a, "b": b}, name, compute_data_type)

    def max(
        self, a: TensorSpec, b: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("max", {"a": a, "b": b}, name, compute_data_type)

    def min(
        self, a: TensorSpec, b: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("min", {"a": a, "b": b}, name, compute_data_type)

    def pow(
        self, a: TensorSpec, b: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("pow", {"a": a, "b": b}, name, compute_data_type)

    def mod(
        self, a: TensorSpec, b: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """C ``fmod(a, b)``: the remainder has the sign of ``a``; NaN where ``b`` is 0."""
        return self._pointwise("mod", {"a": a, "b": b}, name, compute_data_type)

    def add_square(
        self, a: TensorSpec, b: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """``a + b * b`` (the frontend's ADD_SQUARE: a running sum of squares in one node)."""
        return self._pointwise("add_square", {"a": a, "b": b}, name, compute_data_type)

    def scale(
        self, input: TensorSpec, scale: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("scale", {"input": input, "scale": scale}, name, compute_data_type)

    def bias(
        self, input: TensorSpec, bias: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("bias", {"input": input, "bias": bias}, name, compute_data_type)

    # logical ops: non-zero (NaN included) is true; 1 where true, 0 where false, in the output's type
    def logical_and(
        self, a: TensorSpec, b: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("logical_and", {"a": a, "b": b}, name, compute_data_type)

    def logical_or(
        self, a: TensorSpec, b: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("logical_or", {"a": a, "b": b}, name, compute_data_type)

    def logical_not(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("logical_not", {"input": input}, name, compute_data_type)

    # comparisons: 1 where true, 0 where false, in the output's type
    def cmp_eq(
        self, input: TensorSpec, comparison: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("cmp_eq", {"input": input, "comparison": comparison}, name, compute_data_type)

    def cmp_neq(
        self, input: TensorSpec, comparison: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("cmp_neq", {"input": input, "comparison": comparison}, name, compute_data_type)

    def cmp_gt(
        self, input: TensorSpec, comparison: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("cmp_gt", {"input": input, "comparison": comparison}, name, compute_data_type)

    def cmp_ge(
        self, input: TensorSpec, comparison: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("cmp_ge", {"input": input, "comparison": comparison}, name, compute_data_type)

    def cmp_lt(
        self, input: TensorSpec, comparison: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("cmp_lt", {"input": input, "comparison": comparison}, name, compute_data_type)

    def cmp_le(
        self, input: TensorSpec, comparison: TensorSpec | Scalar, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("cmp_le", {"input": input, "comparison": comparison}, name, compute_data_type)

    def binary_select(
        self,
        input0: TensorSpec,
        input1: TensorSpec,
        mask: TensorSpec,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """``input0`` where ``mask`` is non-zero, else ``input1``."""
        return self._pointwise(
            "binary_select", {"input0": input0, "input1": input1, "mask": mask}, name, compute_data_type
        )

    # unary math
    def identity(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("identity", {"input": input}, name, compute_data_type)

    def neg(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("neg", {"input": input}, name, compute_data_type)

    def abs(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("abs", {"input": input}, name, compute_data_type)

    def exp(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("exp", {"input": input}, name, compute_data_type)

    def log(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("log", {"input": input}, name, compute_data_type)

    def sqrt(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("sqrt", {"input": input}, name, compute_data_type)

    def rsqrt(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("rsqrt", {"input": input}, name, compute_data_type)

    def reciprocal(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("reciprocal", {"input": input}, name, compute_data_type)

    def sin(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("sin", {"input": input}, name, compute_data_type)

    def cos(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("cos", {"input": input}, name, compute_data_type)

    def tan(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("tan", {"input": input}, name, compute_data_type)

    def erf(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("erf", {"input": input}, name, compute_data_type)

    def floor(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("floor", {"input": input}, name, compute_data_type)

    def ceil(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("ceil", {"input": input}, name, compute_data_type)

    # activations
    def relu(
        self,
        input: TensorSpec,
        negative_slope: float | None = None,
        lower_clip: float | None = None,
        upper_clip: float | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        attrs = {"negative_slope": negative_slope, "lower_clip": lower_clip, "upper_clip": upper_clip}
        set_attrs = {k: v for k, v in attrs.items() if v is not None}
        return self._pointwise("relu", {"input": input}, name, compute_data_type, **set_attrs)

    def leaky_relu(
        self, input: TensorSpec, negative_slope: float = 0.01, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("leaky_relu", {"input": input}, name, compute_data_type, negative_slope=negative_slope)

    def elu(
        self, input: TensorSpec, alpha: float = 1.0, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("elu", {"input": input}, name, compute_data_type, alpha=alpha)

    def gelu(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        """Exact GELU, x * Phi(x) with the erf."""
        return self._pointwise("gelu", {"input": input}, name, compute_data_type)

    def gelu_approx_tanh(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("gelu_approx_tanh", {"input": input}, name, compute_data_type)

    def swish(
        self, input: TensorSpec, swish_beta: float = 1.0, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """x * sigmoid(swish_beta * x); SiLU is swish_beta = 1."""
        return self._pointwise("swish", {"input": input}, name, compute_data_type, swish_beta=swish_beta)

    def silu(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self.swish(input, 1.0, compute_data_type, name)

    def sigmoid(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("sigmoid", {"input": input}, name, compute_data_type)

    def tanh(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> TensorSpec:
        return self._pointwise("tanh", {"input": input}, name, compute_data_type)

    def softplus(
        self, input: TensorSpec, softplus_beta: float = 1.0, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("softplus", {"input": input}, name, compute_data_type, softplus_beta=softplus_beta)

    # activation backward (cuDNN frontend names and roles): loss * f'(input), input = the forward op's input
    def relu_backward(
        self,
        loss: TensorSpec,
        input: TensorSpec,
        negative_slope: float | None = None,
        lower_clip: float | None = None,
        upper_clip: float | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """The gradient through ``relu`` with the same slope and clips; unset ones keep the defaults."""
        attrs = {"negative_slope": negative_slope, "lower_clip": lower_clip, "upper_clip": upper_clip}
        set_attrs = {k: v for k, v in attrs.items() if v is not None}
        return self._pointwise("relu_backward", {"loss": loss, "input": input}, name, compute_data_type, **set_attrs)

    def leaky_relu_backward(
        self,
        loss: TensorSpec,
        input: TensorSpec,
        negative_slope: float = 0.01,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        return self._pointwise(
            "leaky_relu_backward",
            {"loss": loss, "input": input},
            name,
            compute_data_type,
            negative_slope=negative_slope,
        )

    def elu_backward(
        self,
        loss: TensorSpec,
        input: TensorSpec,
        alpha: float = 1.0,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        return self._pointwise("elu_backward", {"loss": loss, "input": input}, name, compute_data_type, alpha=alpha)

    def gelu_backward(
        self, loss: TensorSpec, input: TensorSpec, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("gelu_backward", {"loss": loss, "input": input}, name, compute_data_type)

    def gelu_approx_tanh_backward(
        self, loss: TensorSpec, input: TensorSpec, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        return self._pointwise("gelu_approx_tanh_backward", {"loss": loss, "input": input}, name, compute_data_type)

    def swish_backward(
        self,
        loss: TensorSpec,
        input: TensorSpec,
        swish_beta: float = 1.0,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        return self._pointwise(
            "swish_backward", {"loss": loss, "input": input}, name, compute_data_type, swish_beta=swish_beta
        )

    def sigmoid_backward(
        self, loss: TensorSpec, input: TensorSpec, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """loss * sigmoid'(input), with ``input`` the forward op's input x (not its output)."""
        return self._pointwise("sigmoid_backward", {"loss": loss, "input": input}, name, compute_data_type)

    def tanh_backward(
        self, loss: TensorSpec, input: TensorSpec, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """loss * (1 - tanh(input)^2), with ``input`` the forward op's input x (not its output)."""
        return self._pointwise("tanh_backward", {"loss": loss, "input": input}, name, compute_data_type)

    def softplus_backward(
        self,
        loss: TensorSpec,
        input: TensorSpec,
        softplus_beta: float = 1.0,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        return self._pointwise(
            "softplus_backward", {"loss": loss, "input": input}, name, compute_data_type, softplus_beta=softplus_beta
        )
