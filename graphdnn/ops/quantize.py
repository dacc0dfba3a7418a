"""Block-scaled quantization, as the cuDNN frontend's ``block_scale_quantize`` and
``block_scale_dequantize``: fp8 values that share one scale per block of consecutive
elements along an axis.

Two recipes come from the scale's data type: fp32 scales (DeepSeek-style 1x128 blocks,
any block size) and power-of-two fp8_e8m0 scales (MXFP8: 32-element blocks, the OCP MX
scale format). The scale is chosen so that the block's largest magnitude lands on the
element type's largest finite value; the element conversion saturates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DataType, round_to
from ..errors import DataTypeError
from ..layout import stride_order
from ..symbolic import Extent
from .attributes import Attributes
from .base import Category, Inferred, Op, Role, check_axis, fail, fail_attribute, register

if TYPE_CHECKING:
    from ..ir import Node, Tensor
    from ..tensor import TensorSpec

ELEMENT_TYPES = frozenset({DataType.FP8_E4M3, DataType.FP8_E5M2})
SCALE_TYPES = frozenset({DataType.FLOAT, DataType.FP8_E8M0})
# Dequantize also reads 4-bit weights (graphdnn/packing.py) and int8 weights, and fp8 ones
# with 16-bit scales: the group or per-channel scales of weight-only GEMMs (fusion_rules/rules/weight_only.py).
DEQUANTIZE_TYPES = ELEMENT_TYPES | {DataType.INT4, DataType.FP4_E2M1, DataType.INT8}
DEQUANTIZE_SCALE_TYPES = SCALE_TYPES | {DataType.HALF, DataType.BFLOAT16}
# int4 weights may carry a zero point per group (asymmetric quantization, as AWQ / GPTQ store
# them): y = (x - zero_point) * scale.
ZERO_POINT_TYPES = frozenset({DataType.FLOAT, DataType.HALF, DataType.BFLOAT16})
WEIGHT_RANGES = {DataType.INT4: (-8, 7), DataType.INT8: (-128, 127)}  # random weights span their type
INPUT_TYPES = frozenset({DataType.FLOAT, DataType.HALF, DataType.BFLOAT16})
# The largest finite value of each element type: the block maximum is scaled onto it.
LARGEST = {DataType.FP8_E4M3: 448.0, DataType.FP8_E5M2: 57344.0}
E8M0_EXPONENTS = (-127, 127)  # the powers of two an fp8_e8m0 scale can hold


@dataclasses.dataclass(frozen=True)
class BlockScaleQuantizeAttributes(Attributes):
    block_size: int
    axis: int | None = None  # None: the last axis
    transpose: bool = False  # lay y and scale out with the block axis innermost


@dataclasses.dataclass(frozen=True)
class BlockScaleDequantizeAttributes(Attributes):
    block_size: int
    axis: int | None = None


def block_axis(node: Node, rank: int) -> int:
    """The axis blocks run along (negative counted from the end; None is the last)."""
    axis = node.attributes.axis  # type: ignore[attr-defined]
    return rank - 1 if axis is None else check_axis(node, axis, rank)


def scale_dims(dims: tuple[Extent, ...], axis: int, block_size: int) -> tuple[Extent, ...]:
    """One scale per block: the last block of an axis not divisible by the size is partial."""
    return tuple(-(-extent // block_size) if a == axis else extent for a, extent in enumerate(dims))


def _check_block_size(node: Node) -> int:
    block_size: int = node.attributes.block_size  # type: ignore[attr-defined]
    if block_size < 1:
        fail_attribute(node, f"block_size must be >= 1, got {block_size}")
    return block_size


def _check_input_type(node: Node, role: str, tensor: Tensor, allowed: frozenset[DataType], what: str) -> None:
    if tensor.data_type.is_set and tensor.data_type not in allowed:
        raise DataTypeError(
            f"{role} '{tensor.name}' is {tensor.data_type.value}; {node.op} takes {what} "
            f"({', '.join(sorted(t.value for t in allowed))})",
            node=node.name,
            tensor=tensor.name,
        )


def _blocks(values: np.ndarray, axis: int, block_size: int) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """``values`` with ``axis`` zero-padded to whole blocks and split in two ([..., blocks,
    size, ...]); and how to undo it (zeros never change a block's maximum magnitude)."""
    extent = values.shape[axis]
    block_size = min(block_size, extent)  # one block either way; never pad beyond the data
    blocks = -(-extent // block_size)
    padding = [(0, 0)] * values.ndim
    padding[axis] = (0, blocks * block_size - extent)
    padded = np.pad(values, padding)
    shape = (*values.shape[:axis], blocks, block_size, *values.shape[axis + 1 :])

    def undo(blocked: np.ndarray) -> np.ndarray:
        flat = blocked.reshape((*values.shape[:axis], blocks * block_size, *values.shape[axis + 1 :]))
        return np.take(flat, np.arange(extent), axis=axis)

    return padded.reshape(shape), undo


def e8m0_scale(amax: np.ndarray, largest: float) -> np.ndarray:
    """The smallest power of two s with amax / s <= largest, clamped to e8m0's range; NaN for
    a NaN or infinite amax. Exact: amax = m * 2^e (m in [0.5, 1)) is compared with the
    mantissa of ``largest`` rather than rounded through a division or a logarithm."""
    finite = np.isfinite(amax)
    safe = np.where(finite & (amax > 0), amax, 1.0)
    m, e = np.frexp(safe)
    lm, le = np.frexp(largest)
    exponent = e - le + (m > lm)
    exponent = np.where(amax > 0, exponent, E8M0_EXPONENTS[0])
    exponent = np.clip(exponent, *E8M0_EXPONENTS)
    return np.where(finite, np.ldexp(1.0, exponent), np.nan)


def quantize_blocks(x: np.ndarray, axis: int, block_size: int, element: DataType, scale: DataType) -> dict[str, Any]:
    """The reference of block_scale_quantize (see the module and docs/ops.md), in float64."""
    blocked, undo = _blocks(x, axis, block_size)
    amax = np.max(np.abs(blocked), axis=axis + 1, keepdims=True)  # NaN if the block holds one
    largest = LARGEST[element]
    if scale is DataType.FP8_E8M0:
        s = e8m0_scale(amax, largest)
    else:
        with np.errstate(invalid="ignore"):
            s = round_to(DataType.FLOAT, amax / largest)  # inf for an infinite amax
        s = np.where(s == 0, 1.0, s)  # all zeros, or an amax below fp32's range: no scaling
    with np.errstate(invalid="ignore", divide="ignore"):
        quotient = round_to(DataType.FLOAT, blocked / s)  # the kernel divides in fp32
    y = round_to(element, np.clip(quotient, -largest, largest))  # saturating; NaN stays NaN
    return {"y": undo(y), "scale": np.squeeze(s, axis=axis + 1)}


@register
class BlockScaleQuantize(Op):
    """y = saturate(x / scale) per block, scale from the block's largest magnitude."""

    kind = "block_scale_quantize"
    category = Category.QUANTIZATION
    inputs = (Role("X", floating=True),)
    outputs = (Role("Y"), Role("scale"))
    attributes = BlockScaleQuantizeAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x = node.input("X")
        assert x is not None
        _check_input_type(node, "X", x, INPUT_TYPES, "a float, half or bfloat16 input")
        block_size = _check_block_size(node)
        axis = block_axis(node, len(x.dim))
        order = stride_order(x.dim, x.stride)
        if node.attributes.transpose:  # type: ignore[attr-defined]
            order = (*(a for a in order if a != axis), axis)
        return {
            "Y": Inferred(x.dim, order, DataType.FP8_E4M3, ELEMENT_TYPES),
            "scale": Inferred(scale_dims(x.dim, axis, block_size), order, DataType.FLOAT, SCALE_TYPES),
        }

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        value = x["X"]
        y, scale = node.output("Y"), node.output("scale")
        assert y is not None and scale is not None
        axis = block_axis(node, value.ndim)
        block_size = node.attributes.block_size  # type: ignore[attr-defined]
        out = quantize_blocks(value, axis, block_size, y.data_type, scale.data_type)
        return {"Y": out["y"], "scale": out["scale"]}


@register
class BlockScaleDequantize(Op):
    """y = x * scale, each element with the scale of its block: fp8 values with float or
    fp8_e8m0 scales, or 4-bit (int4, fp4_e2m1) or int8 weights with float, half or bfloat16
    group scales; int4 weights with a ``zero_point`` per block give y = (x - zero_point) * scale."""

    kind = "block_scale_dequantize"
    category = Category.QUANTIZATION
    inputs = (Role("X"), Role("scale", positive=True), Role("zero_point", optional=True))
    outputs = (Role("Y"),)
    attributes = BlockScaleDequantizeAttributes
    packed_inputs = frozenset({"X"})

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x, scale, zero_point = node.input("X"), node.input("scale"), node.input("zero_point")
        assert x is not None and scale is not None
        _check_input_type(node, "X", x, DEQUANTIZE_TYPES, "fp8, 4-bit or int8 values")
        _check_input_type(node, "scale", scale, DEQUANTIZE_SCALE_TYPES, "block scales")
        block_size = _check_block_size(node)
        axis = block_axis(node, len(x.dim))
        expected = scale_dims(x.dim, axis, block_size)
        blocks = [("scale", scale)]
        if zero_point is not None:
            if x.data_type.is_set and x.data_type is not DataType.INT4:
                fail(
                    node,
                    f"zero_point '{zero_point.name}' is bound but X '{x.name}' is {x.data_type.value}: zero points "
                    "are for int4 weights (asymmetric quantization)",
                    role="zero_point",
                )
            _check_input_type(node, "zero_point", zero_point, ZERO_POINT_TYPES, "zero points")
            blocks.append(("zero_point", zero_point))
        for role, t in blocks:
            if tuple(t.dim) != expected:
                fail(
                    node,
                    f"{role} has dims {list(t.dim)}, expected {list(expected)}: one per block of {block_size} "
                    f"along axis {axis} of X {list(x.dim)}",
                    role=role,
                )
        return {"Y": Inferred(x.dim, stride_order(x.dim, x.stride))}

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        """int4 and int8 weights span their whole range, -8..7 and -128..127."""
        x = node.input("X")
        return WEIGHT_RANGES.get(x.data_type) if role == "X" and x is not None else None

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        value = x["X"]
        axis = block_axis(node, value.ndim)
        blocks = np.arange(value.shape[axis]) // node.attributes.block_size  # type: ignore[attr-defined]
        if "zero_point" in x:
            value = value - np.take(x["zero_point"], blocks, axis=axis)
        return {"Y": value * np.take(x["scale"], blocks, axis=axis)}


class QuantizeMethods:
    _add_node: Callable[..., list[Any]]

    def block_scale_quantize(
        self,
        input: TensorSpec,
        block_size: int,
        axis: int | None = None,
        transpose: bool = False,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec]:
        """[Y, scale]: fp8 Y (fp8_e4m3 unless set) and one scale per block (float unless set to
        fp8_e8m0, the MXFP8 recipe)."""
        return self._add_node(
            "block_scale_quantize",
            {"X": input},
            {"block_size": block_size, "axis": axis, "transpose": transpose},
            name=name,
            compute_data_type=compute_data_type,
        )

    def block_scale_dequantize(
        self,
        input: TensorSpec,
        scale: TensorSpec,
        block_size: int,
        axis: int | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
        zero_point: TensorSpec | None = None,
    ) -> TensorSpec:
        """input * scale, each element with its block's scale; (input - zero_point) * scale with
        a ``zero_point`` per block (int4 input only)."""
        return self._add_node(
            "block_scale_dequantize",
            {"X": input, "scale": scale, "zero_point": zero_point},
            {"block_size": block_size, "axis": axis},
            name=name,
            compute_data_type=compute_data_type,
        )[0]
