"""``rng``: Bernoulli masks from Philox4x32-10, reproducible from a seed and an offset.

Element ``i`` (its row-major index over the output's dims) draws one Philox4x32-10 block
(Salmon et al., SC'11; the Random123 constants) with key ``(seed_lo, seed_hi)`` and counter
``(i_lo, i_hi, offset_lo, offset_hi)``, 32-bit halves of 64-bit integers; ``u = (word0 >> 8) / 2^24``
is uniform on [0, 1) in steps of 2^-24, exact in every float type, and the element is 1 where
``u < bernoulli_probability``, else 0. The reference computes the same integers in NumPy uint32
arithmetic, so GPU masks are bit-identical to it. Being a function of the element's index, rng
is a pointwise op: it joins elementwise kernels and epilogues, and dropout with drop rate r,
``x * rng(..., bernoulli_probability=1 - r) / (1 - r)``, draws its mask in the kernel that uses it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..symbolic import Extent
from .attributes import Attributes
from .base import Category, Inferred, Op, Role, fail, fail_attribute, need_declared, register

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import Scalar, TensorSpec

# Philox4x32 multipliers and Weyl key increments (Random123).
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10


class RngDistribution(enum.Enum):
    BERNOULLI = "bernoulli"


@dataclasses.dataclass(frozen=True)
class RngAttributes(Attributes):
    bernoulli_probability: float
    distribution: RngDistribution = RngDistribution.BERNOULLI


def philox4x32_10(counter: Sequence[np.ndarray], key: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """The four 32-bit output words of Philox4x32-10 for each counter (four uint32 arrays)."""
    c0, c1, c2, c3 = (np.asarray(word, dtype=np.uint32) for word in counter)
    k0, k1 = key
    for round_ in range(PHILOX_ROUNDS):
        if round_:
            k0, k1 = (k0 + PHILOX_W0) & 0xFFFFFFFF, (k1 + PHILOX_W1) & 0xFFFFFFFF
        p0 = c0.astype(np.uint64) * np.uint64(PHILOX_M0)
        p1 = c2.astype(np.uint64) * np.uint64(PHILOX_M1)
        hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), p0.astype(np.uint32)
        hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), p1.astype(np.uint32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint32(k0), lo1, hi0 ^ c3 ^ np.uint32(k1), lo0
    return c0, c1, c2, c3


def as_uint64(value: float) -> int:
    """A seed or offset as the kernels read it: truncated to an integer, two's complement in 64 bits."""
    return int(value) % 2**64


def uniform(dims: tuple[int, ...], seed: int, offset: int) -> np.ndarray:
    """u in [0, 1) for every element of ``dims``, from its row-major index."""
    index = np.arange(int(np.prod(dims)), dtype=np.uint64)
    counter = (
        index.astype(np.uint32),
        (index >> np.uint64(32)).astype(np.uint32),
        np.full(index.shape, offset & 0xFFFFFFFF, dtype=np.uint32),
        np.full(index.shape, offset >> 32, dtype=np.uint32),
    )
    word = philox4x32_10(counter, (seed & 0xFFFFFFFF, seed >> 32))[0]
    return ((word >> np.uint32(8)).astype(np.float64) * 2.0**-24).reshape(dims)


@register
class Rng(Op):
    """A mask of declared dims: 1 with probability ``bernoulli_probability``, else 0."""

    kind = "rng"
    category = Category.POINTWISE  # a function of the element's index: it fuses like one
    inputs = (Role("seed", scalar=True), Role("offset", scalar=True))
    outputs = (Role("y"),)
    attributes = RngAttributes
    declared_outputs = frozenset({"y"})

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        p = node.attributes.bernoulli_probability  # type: ignore[attr-defined]
        if not 0.0 <= p <= 1.0:
            fail_attribute(node, f"bernoulli_probability {p} is not a probability (0 to 1)")
        y = declared.get("y")
        if y is None:
            need_declared(node, "the dims of an rng output cannot be inferred: pass shape= or call set_dim on y")
        if not y:
            fail(node, "y needs at least one dim")
        return {"y": Inferred(tuple(y))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        dims = node.output("y").static_dim  # type: ignore[union-attr]
        u = uniform(dims, as_uint64(x["seed"]), as_uint64(x["offset"]))
        return {"y": (u < node.attributes.bernoulli_probability).astype(np.float64)}  # type: ignore[attr-defined]

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        return 0, 2**31 - 1


class RandomMethods:
    _add_node: Callable[..., list[Any]]
    scalar: Callable[..., Any]

    def rng(
        self,
        seed: TensorSpec | Scalar,
        offset: TensorSpec | Scalar,
        bernoulli_probability: float,
        shape: Sequence[int] | None = None,
        distribution: Any = "bernoulli",
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """A Bernoulli mask of dims ``shape`` (or set_dim): 1 with probability ``bernoulli_probability``.

        ``seed`` and ``offset`` are integers in [0, 2^53): Python ints become int64 constants; one-element
        tensors (pass-by-value runtime scalars, or int64 device tensors) change per run without a rebuild.
        """
        # Python numbers become int64 constants: a float constant would round seeds past 2^24
        seed, offset = (
            self.scalar(v, data_type="int64") if isinstance(v, (int, float)) and not isinstance(v, bool) else v
            for v in (seed, offset)
        )
        return self._add_node(
            "rng",
            {"seed": seed, "offset": offset},
            {"bernoulli_probability": bernoulli_probability, "distribution": distribution},
            name=name,
            compute_data_type=compute_data_type,
            declared=None if shape is None else {"y": tuple(shape)},
        )[0]
