"""Mixture-of-experts data movement and expert GEMMs: ``gather`` (rows by index),
``moe_permutation`` (where each token's choices go when rows are grouped by expert),
``moe_unpermute`` (the weighted combine back into token order) and ``moe_grouped_matmul``
(the frontend's name: one matmul per expert over its contiguous rows).

Index tensors are integers whose values are known only at run time. The reference backend
refuses an out-of-range index with a ``FeedError`` naming the node and the tensor; the GPU
kernels cannot raise, so there an out-of-range index is ignored in a documented way (a
zero row, a skipped term, a dropped choice), never a read or write outside a buffer.
Everything is deterministic: the combine sums each token's terms in order, no atomics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DataType
from ..symbolic import Extent
from .attributes import Attributes
from .base import (
    INDEX_TYPES,
    Category,
    Inferred,
    Op,
    Role,
    check_axis,
    fail,
    fail_attribute,
    index_tensor,
    indices_in_range,
    register,
)

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import TensorSpec


@dataclasses.dataclass(frozen=True)
class GatherAttributes(Attributes):
    axis: int = 0


@dataclasses.dataclass(frozen=True)
class MoePermutationAttributes(Attributes):
    num_experts: int


@register
class Gather(Op):
    """y = input rows (along ``axis``) picked by a 1-D index: y[..., i, ...] = input[..., index[i], ...]."""

    kind = "gather"
    category = Category.DATA_MOVEMENT
    inputs = (Role("input"), Role("index"))
    outputs = (Role("y"),)
    attributes = GatherAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x, index = node.input("input"), index_tensor(node, "index")
        assert x is not None
        axis = check_axis(node, node.attributes.axis, len(x.dim))  # type: ignore[attr-defined]
        if len(index.dim) != 1:
            fail(node, f"index has dims {list(index.dim)}; gather takes a 1-D index", role="index")
        return {"y": Inferred(tuple(index.dim[0] if a == axis else e for a, e in enumerate(x.dim)))}

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        x = node.input("input")
        assert x is not None
        return (0, x.dim[node.attributes.axis] - 1) if role == "index" else None  # type: ignore[attr-defined]

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        value = x["input"]
        axis = node.attributes.axis  # type: ignore[attr-defined]
        index = indices_in_range(node, "index", x["index"], value.shape[axis], "rows")
        return {"y": np.take(value, index, axis=axis)}


@register
class MoePermutation(Op):
    """Group each token's k expert choices by expert: the permuted order is by expert, then
    token, then choice. Outputs, for S = T * k permuted rows:

    - ``token_index`` [S]: the token whose row each permuted row holds (what ``gather`` reads);
    - ``slot`` [T, k]: the permuted row of each choice (what ``moe_unpermute`` reads);
    - ``first_token_offset`` [E]: the first permuted row of each expert (``moe_grouped_matmul``).
    """

    kind = "moe_permutation"
    category = Category.DATA_MOVEMENT
    inputs = (Role("expert_indices"),)
    outputs = (Role("token_index"), Role("slot"), Role("first_token_offset"))
    attributes = MoePermutationAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        chosen = index_tensor(node, "expert_indices")
        experts = node.attributes.num_experts  # type: ignore[attr-defined]
        if experts < 1:
            fail_attribute(node, f"num_experts must be >= 1, got {experts}")
        if len(chosen.dim) != 2:
            fail(node, f"expert_indices has dims {list(chosen.dim)}; expected [tokens, k]", role="expert_indices")
        tokens, k = chosen.dim
        index = (DataType.INT32, INDEX_TYPES)
        return {
            "token_index": Inferred((tokens * k,), None, *index),
            "slot": Inferred((tokens, k), None, *index),
            "first_token_offset": Inferred((experts,), None, *index),
        }

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        return (0, node.attributes.num_experts - 1) if role == "expert_indices" else None  # type: ignore[attr-defined]

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        experts = node.attributes.num_experts  # type: ignore[attr-defined]
        chosen = indices_in_range(node, "expert_indices", x["expert_indices"], experts, "expert indices")
        tokens, k = chosen.shape
        order = np.argsort(chosen.ravel(), kind="stable")  # by expert, then token and choice (row-major)
        slot = np.empty(tokens * k, dtype=np.int64)
        slot[order] = np.arange(tokens * k)
        counts = np.bincount(chosen.ravel(), minlength=experts)
        return {
            "token_index": (order // k).astype(np.float64),
            "slot": slot.reshape(tokens, k).astype(np.float64),
            "first_token_offset": (np.cumsum(counts) - counts).astype(np.float64),
        }


@register
class MoeUnpermute(Op):
    """y[t] = sum over j of weights[t, j] * input[slot[t, j]]: each token's expert outputs,
    weighted by its router weights (1 when ``weights`` is not bound), summed in order of j."""

    kind = "moe_unpermute"
    category = Category.DATA_MOVEMENT
    inputs = (Role("input", floating=True), Role("slot"), Role("weights", optional=True, floating=True))
    outputs = (Role("y"),)

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x, slot, weights = node.input("input"), index_tensor(node, "slot"), node.input("weights")
        assert x is not None
        if len(x.dim) != 2:
            fail(node, f"input has dims {list(x.dim)}; expected [rows, hidden]", role="input")
        if len(slot.dim) != 2:
            fail(node, f"slot has dims {list(slot.dim)}; expected [tokens, k]", role="slot")
        if weights is not None and tuple(weights.dim) != tuple(slot.dim):
            fail(node, f"weights has dims {list(weights.dim)}, expected slot's {list(slot.dim)}", role="weights")
        return {"y": Inferred((slot.dim[0], x.dim[1]))}

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        x = node.input("input")
        assert x is not None
        return (0, x.dim[0] - 1) if role == "slot" else None

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        value = x["input"]
        slot = indices_in_range(node, "slot", x["slot"], value.shape[0], "slots (rows of input)")
        weights = x.get("weights")
        rows = value[slot]  # [T, k, H]
        if weights is not None:
            rows = rows * weights[..., None]
        return {"y": np.sum(rows, axis=1)}


@register
class MoeGroupedMatmul(Op):
    """Output[s] = Token[s] @ Weight[e] for the expert e whose rows hold s: row s belongs to
    the last expert e with first_token_offset[e] <= s (the experts' rows are contiguous and
    in order when the offsets rise); a row no expert holds is zero.

    Token [S, K] with offsets [E] and output [S, N], or the cuDNN frontend's form: token
    [1, S, K], offsets [E, 1, 1], output [1, S, N] (the same memory, no copy).
    """

    kind = "moe_grouped_matmul"
    category = Category.MATMUL
    inputs = (Role("token", floating=True), Role("weight", floating=True), Role("first_token_offset"))
    outputs = (Role("output"),)

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        token, weight = node.input("token"), node.input("weight")
        offsets = index_tensor(node, "first_token_offset")
        assert token is not None and weight is not None
        if len(token.dim) not in (2, 3) or token.dim[:-2] not in ((), (1,)):
            fail(node, f"token has dims {list(token.dim)}; expected [rows, K] or [1, rows, K]", role="token")
        if len(weight.dim) != 3 or weight.dim[1] != token.dim[-1]:
            fail(node, f"weight has dims {list(weight.dim)}; expected [experts, {token.dim[-1]}, N]", role="weight")
        if tuple(offsets.dim) not in ((weight.dim[0],), (weight.dim[0], 1, 1)):
            fail(
                node,
                f"first_token_offset has dims {list(offsets.dim)}, expected [{weight.dim[0]}] or "
                f"[{weight.dim[0]}, 1, 1] (one per expert)",
                role="first_token_offset",
            )
        return {"output": Inferred((*token.dim[:-1], weight.dim[2]))}

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        token = node.input("token")
        assert token is not None
        return (0, int(token.dim[-2])) if role == "first_token_offset" else None

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        token, weight, offsets = x["token"], x["weight"], x["first_token_offset"].reshape(-1)
        token = token.reshape(token.shape[-2:])
        rows = np.arange(token.shape[0])
        holds = offsets[None, :] <= rows[:, None]  # [S, E]
        last = weight.shape[0] - 1 - np.argmax(holds[:, ::-1], axis=1)
        expert = np.where(holds.any(axis=1), last, -1)
        out = np.zeros((token.shape[0], weight.shape[2]))
        for e in np.unique(expert[expert >= 0]):
            mine = expert == e
            out[mine] = token[mine] @ weight[e]
        return {"output": out.reshape(node.output("output").dim)}  # type: ignore[union-attr]


class MoeMethods:
    _add_node: Callable[..., list[Any]]

    def gather(
        self,
        input: TensorSpec,
        index: TensorSpec,
        axis: int = 0,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """input's slices along ``axis`` picked by the 1-D ``index``."""
        return self._add_node(
            "gather", {"input": input, "index": index}, {"axis": axis}, name=name, compute_data_type=compute_data_type
        )[0]

    def moe_permutation(
        self, expert_indices: TensorSpec, num_experts: int, compute_data_type: Any = None, name: str | None = None
    ) -> list[TensorSpec]:
        """[token_index, slot, first_token_offset] of the rows grouped by expert."""
        return self._add_node(
            "moe_permutation",
            {"expert_indices": expert_indices},
            {"num_experts": num_experts},
            name=name,
            compute_data_type=compute_data_type,
        )

    def moe_unpermute(
        self,
        input: TensorSpec,
        slot: TensorSpec,
        weights: TensorSpec | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """Each token's rows of ``input`` (at ``slot``) summed, weighted by ``weights``."""
        inputs = (
            {"input": input, "slot": slot} if weights is None else {"input": input, "slot": slot, "weights": weights}
        )
        return self._add_node("moe_unpermute", inputs, name=name, compute_data_type=compute_data_type)[0]

    def moe_grouped_matmul(
        self,
        token: TensorSpec,
        weight: TensorSpec,
        first_token_offset: TensorSpec,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """Each expert's rows of ``token`` times its ``weight`` matrix."""
        return self._add_node(
            "moe_grouped_matmul",
            {"token": token, "weight": weight, "first_token_offset": first_token_offset},
            name=name,
            compute_data_type=compute_data_type,
        )[0]
