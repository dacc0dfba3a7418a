"""CUDA expressions for elementwise ops: one entry per op kind, as in graphdnn's op table.

Each renderer takes the argument expressions (already in the compute type, in the op's
input-role order), the node's attributes and the compute type ("float" or "double"),
and returns an expression of the compute type that matches the op's reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from graphdnn.dtypes import DataType, round_to
from graphdnn.ops.pointwise import ACTIVATION_KINDS, BACKWARD_OF, BINARY_KINDS, UNARY_KINDS
from graphdnn.ops.random import PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS, PHILOX_W0, PHILOX_W1

Render = Callable[[list[str], Any, str], str]


def literal(value: float, compute: str) -> str:
    """A C literal of the compute type (inf and NaN included). A float literal that float
    cannot hold is written as what it rounds to (1e308 as inf, 1e-300 as 0), as a float
    computation would see it, not as a constant NVRTC rejects."""
    number = float(value)
    if compute == "float":
        single = float(round_to(DataType.FLOAT, number))
        if single == 0 or single in (float("inf"), float("-inf")):
            number = single
    if number != number:
        return (
            f"{compute}(__int_as_float(0x7fffffff))"
            if compute == "float"
            else "__longlong_as_double(0x7ff8000000000000LL)"
        )
    if number in (float("inf"), float("-inf")):
        sign = "-" if number < 0 else ""
        return (
            f"{sign}__int_as_float(0x7f800000)"
            if compute == "float"
            else f"{sign}__longlong_as_double(0x7ff0000000000000LL)"
        )
    text = repr(number)
    if "e" not in text and "." not in text:
        text += ".0"
    return f"{text}f" if compute == "float" else text


def _math(name: str) -> Render:
    """A C math function: the f-suffixed one for float (expf), the plain one for double."""
    return lambda a, attrs, c: f"{name}{'f' if c == 'float' else ''}({a[0]})"


def _relu(a: list[str], attrs: Any, c: str) -> str:
    x, lower, slope = a[0], literal(attrs.lower_clip, c), literal(attrs.negative_slope, c)
    upper = (
        x if attrs.upper_clip is None else f"{'fminf' if c == 'float' else 'fmin'}({x}, {literal(attrs.upper_clip, c)})"
    )
    return f"({x} > {lower} ? {upper} : {lower} + {slope} * ({x} - {lower}))"


def _relu_backward(a: list[str], attrs: Any, c: str) -> str:
    dy, x = a
    lower, slope, one, zero = (literal(v, c) for v in (attrs.lower_clip, attrs.negative_slope, 1, 0))
    inside = one if attrs.upper_clip is None else f"({x} < {literal(attrs.upper_clip, c)} ? {one} : {zero})"
    return f"({dy} * ({x} > {lower} ? {inside} : {slope}))"


def _slope(derivative: Callable[[str, Any, str], str]) -> Render:
    """An activation backward op: loss (a[0]) times the derivative at the forward input (a[1])."""
    return lambda a, attrs, c: f"({a[0]} * {derivative(a[1], attrs, c)})"


# gd::philox4x32_10 (graphdnn.cuh) hard-codes the reference's constants, the Random123 ones.
assert (PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1, PHILOX_ROUNDS) == (
    0xD2511F53,
    0xCD9E8D57,
    0x9E3779B9,
    0xBB67AE85,
    10,
)


def bernoulli_threshold(probability: float) -> int:
    """gd::bernoulli's threshold: u = k / 2^24 < p with k an integer exactly when k < ceil(p 2^24),
    so the test is on integers, as exact as the reference's."""
    return math.ceil(probability * 2**24)


def _rng(a: list[str], attrs: Any, c: str) -> str:
    """a: seed, offset (64-bit integers), the element's row-major index."""
    threshold = bernoulli_threshold(attrs.bernoulli_probability)
    return f"(gd::bernoulli({a[0]}, {a[1]}, {a[2]}, {threshold}u) ? {literal(1, c)} : {literal(0, c)})"


def _compare(op: str) -> Render:
    return lambda a, attrs, c: f"({a[0]} {op} {a[1]} ? {literal(1, c)} : {literal(0, c)})"


def _logical(op: str) -> Render:
    """Non-zero (NaN included) is true; 1 or 0 in the compute type."""
    return lambda a, attrs, c: (
        f"(({a[0]} != {literal(0, c)} {op} {a[1]} != {literal(0, c)}) ? {literal(1, c)} : {literal(0, c)})"
    )


def _minmax(name: str) -> Render:
    # NumPy's maximum/minimum propagate NaN; fmaxf does not, so keep NaN explicitly.
    return lambda a, attrs, c: (
        f"(({a[0]} != {a[0]} || {a[1]} != {a[1]}) ? {a[0]} + {a[1]} : {name}{'f' if c == 'float' else ''}({a[0]}, {a[1]}))"
    )


EXPRESSIONS: dict[str, Render] = {
    "identity": lambda a, attrs, c: a[0],
    "neg": lambda a, attrs, c: f"(-({a[0]}))",  # parenthesized: -(-1.25f), never --1.25f
    "abs": _math("fabs"),
    "exp": _math("exp"),
    "log": _math("log"),
    "sqrt": _math("sqrt"),
    "rsqrt": lambda a, attrs, c: f"({literal(1, c)} / {'sqrtf' if c == 'float' else 'sqrt'}({a[0]}))",
    "reciprocal": lambda a, attrs, c: f"({literal(1, c)} / {a[0]})",
    "sin": _math("sin"),
    "cos": _math("cos"),
    "tan": _math("tan"),
    "erf": _math("erf"),
    "floor": _math("floor"),
    "ceil": _math("ceil"),
    "logical_not": lambda a, attrs, c: f"({a[0]} == {literal(0, c)} ? {literal(1, c)} : {literal(0, c)})",
    "relu": _relu,
    "leaky_relu": lambda a, attrs, c: (
        f"({a[0]} > {literal(0, c)} ? {a[0]} : {literal(attrs.negative_slope, c)} * {a[0]})"
    ),
    "elu": lambda a, attrs, c: f"gd::elu<{c}>({a[0]}, {literal(attrs.alpha, c)})",
    "gelu": lambda a, attrs, c: f"gd::gelu_erf<{c}>({a[0]})",
    "gelu_approx_tanh": lambda a, attrs, c: f"gd::gelu_tanh<{c}>({a[0]})",
    "swish": lambda a, attrs, c: f"({a[0]} * gd::sigmoid<{c}>({literal(attrs.swish_beta, c)} * {a[0]}))",
    "sigmoid": lambda a, attrs, c: f"gd::sigmoid<{c}>({a[0]})",
    "tanh": _math("tanh"),
    "softplus": lambda a, attrs, c: f"gd::softplus<{c}>({a[0]}, {literal(attrs.softplus_beta, c)})",
    "relu_backward": _relu_backward,
    "leaky_relu_backward": _slope(
        lambda x, attrs, c: f"({x} > {literal(0, c)} ? {literal(1, c)} : {literal(attrs.negative_slope, c)})"
    ),
    "elu_backward": _slope(
        lambda x, attrs, c: f"({x} > {literal(0, c)} ? {literal(1, c)} : {literal(attrs.alpha, c)} * exp({x}))"
    ),
    "gelu_backward": _slope(lambda x, attrs, c: f"gd::gelu_erf_grad<{c}>({x})"),
    "gelu_approx_tanh_backward": _slope(lambda x, attrs, c: f"gd::gelu_tanh_grad<{c}>({x})"),
    "swish_backward": _slope(lambda x, attrs, c: f"gd::swish_grad<{c}>({x}, {literal(attrs.swish_beta, c)})"),
    "sigmoid_backward": _slope(lambda x, attrs, c: f"gd::sigmoid_grad<{c}>({x})"),
    "tanh_backward": _slope(lambda x, attrs, c: f"gd::tanh_grad<{c}>({x})"),
    "softplus_backward": _slope(lambda x, attrs, c: f"gd::sigmoid<{c}>({literal(attrs.softplus_beta, c)} * {x})"),
    "add": lambda a, attrs, c: f"({a[0]} + {a[1]})",
    "sub": lambda a, attrs, c: f"({a[0]} - {a[1]})",
    "mul": lambda a, attrs, c: f"({a[0]} * {a[1]})",
    "div": lambda a, attrs, c: f"({a[0]} / {a[1]})",
    "max": _minmax("fmax"),
    "min": _minmax("fmin"),
    "pow": lambda a, attrs, c: f"{'powf' if c == 'float' else 'pow'}({a[0]}, {a[1]})",
    "mod": lambda a, attrs, c: f"{'fmodf' if c == 'float' else 'fmod'}({a[0]}, {a[1]})",
    "add_square": lambda a, attrs, c: f"gd::add_square<{c}>({a[0]}, {a[1]})",
    "logical_and": _logical("&&"),
    "logical_or": _logical("||"),
    "scale": lambda a, attrs, c: f"({a[0]} * {a[1]})",
    "bias": lambda a, attrs, c: f"({a[0]} + {a[1]})",
    "cmp_eq": _compare("=="),
    "cmp_neq": _compare("!="),
    "cmp_gt": _compare(">"),
    "cmp_ge": _compare(">="),
    "cmp_lt": _compare("<"),
    "cmp_le": _compare("<="),
    "rng": _rng,
    "gen_index": lambda a, attrs, c: f"(({c}){a[0]})",  # a: the coordinate along the axis (an integer)
    "binary_select": lambda a, attrs, c: f"({a[2]} != {literal(0, c)} ? {a[0]} : {a[1]})",
    # Inference batch norm, folded: scale = gamma * inv_variance, shift = beta - mean * scale.
    "batchnorm_inference": lambda a, attrs, c: f"({a[0]} * ({a[3]} * {a[2]}) + ({a[4]} - {a[1]} * ({a[3]} * {a[2]})))",
}

assert set(EXPRESSIONS) >= UNARY_KINDS | BINARY_KINDS | ACTIVATION_KINDS | set(BACKWARD_OF) | {"binary_select"}


def render(op: str, args: list[str], attributes: Any, compute: str) -> str:
    return EXPRESSIONS[op](args, attributes, compute)
