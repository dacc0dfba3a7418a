"""The builder under a ``pygraph``: an OperationGraphSpec with the frontend's leniencies.

Two things the frontend allows and graphdnn's builder refuses, kept here so that the
builder itself stays strict: the same name for two tensors or two nodes (the second
becomes ``name#2``, the next free suffix), and inputs that no node reads (left out of
validation, as the frontend leaves them out of its operation graph). Its tensors also
carry the frontend's ragged offsets (cudnn/ragged.py translates them for attention).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ..errors import UnsupportedError
from ..graph import OperationGraphSpec
from ..ir import Graph
from ..tensor import TensorSpec
from .deferred import Pending, absorbed
from .enums import tensor_reordering, tiled_reordering
from .reordering import Tiled, untiled


class FrontendTensor(TensorSpec):
    """A TensorSpec with the frontend's ``set_ragged_offset``: the ``[B + 1, 1, 1, 1]`` element
    offsets where each sequence of a packed ``[B, H, S, d]`` tensor starts."""

    __slots__ = ("_ragged_offset", "_tiled")

    def __init__(self, *args: object, **fields: object) -> None:
        super().__init__(*args, **fields)  # type: ignore[arg-type]
        self._ragged_offset: TensorSpec | None = None
        self._tiled = False  # declared with F8_128x4: its dims are the tiles' (cudnn/reordering.py)

    def set_ragged_offset(self, ragged_offset: TensorSpec | None) -> FrontendTensor:
        self._ragged_offset = ragged_offset
        return self

    def get_ragged_offset(self) -> TensorSpec | None:
        return self._ragged_offset

    def set_reordering_type(self, reordering_type: Any) -> FrontendTensor:
        """NONE, or the reordering the tensor was declared with: F8_128x4 changes the dims of the
        buffer, so it is given to ``pygraph.tensor``, for inputs only."""
        if tiled_reordering(reordering_type, self.name) != self._tiled:
            raise UnsupportedError(
                f"set_reordering_type({reordering_type!r}): graphdnn takes F8_128x4 as pygraph.tensor's "
                "reordering_type, on a block-scale input (its buffer holds the tiles); not on a tensor a node "
                "writes, nor set afterwards",
                tensor=self.name,
            )
        return self

    def get_reordering_type(self) -> tensor_reordering:
        return tensor_reordering.F8_128x4 if self._tiled else tensor_reordering.NONE

    @property
    def stride_is_set(self) -> bool:
        """Whether the strides were given (else they are inferred, or unknown)."""
        return self._stride_is_set


class LenientSpec(OperationGraphSpec):
    _tensor_class: ClassVar[type[TensorSpec]] = FrontendTensor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[TensorSpec, Pending] = {}  # dequantizes not yet added (cudnn/deferred.py)
        self._held = 0  # frontend calls not (yet) nodes: pending or absorbed dequantizes
        self._absorbed: set[TensorSpec] = set()  # pending outputs a block-scaled matmul stands in for
        self._tiled: dict[TensorSpec, Tiled] = {}  # F8_128x4 inputs: the tiles, and their declared layout
        self._untiled: dict[tuple[TensorSpec, tuple[int, ...]], TensorSpec] = {}  # their plain views, as read

    def declare_tiled(self, tiles: FrontendTensor, layout: Tiled) -> None:
        """``tiles`` (an input of dims ``layout.storage``) holds F8_128x4 block scales."""
        tiles._tiled = True
        self._tiled[tiles] = layout

    def untiled(self, t: TensorSpec, dims: tuple[int, ...] | None = None) -> TensorSpec:
        """``t``, or where it holds F8_128x4 tiles, the plain view of them an op reads: of the
        declared dims, or of ``dims`` (a dequantize reads the blocks of its input only)."""
        layout = self._tiled.get(t)
        if layout is None:
            return t
        key = (t, layout.dims if dims is None else dims)
        if key not in self._untiled:
            del self._tiled[t]  # the movement nodes read the tiles themselves
            try:
                self._untiled[key] = untiled(self, t, layout, key[1])
            finally:
                self._tiled[t] = layout
        return self._untiled[key]

    @property
    def node_count(self) -> int:
        """How many op calls the graph has had (nodes, and dequantizes held back)."""
        return len(self._nodes) + self._held

    def defer_dequantize(self, pending: Pending) -> TensorSpec:
        """The output of a dequantize added when first read (or absorbed into a matmul)."""
        x = pending.x
        y = self._new_tensor(f"{pending.node}::Y", dim=x.dim, stride=x.stride, data_type=None, is_virtual=True)
        self._pending[y] = pending
        self._held += 1
        return y

    def resolve_pending(self) -> None:
        """Before validation: add the dequantizes still held, but those only a matmul absorbed."""
        for y, pending in list(self._pending.items()):
            if y in self._absorbed and not y.is_output:
                del self._pending[y], self._tensor_names[y.name]
                self._tensors.remove(y)
            else:
                self._materialize(y, pending)

    def validate(self) -> Graph:
        self.resolve_pending()
        return super().validate()

    def _add_node(self, kind: str, inputs: Mapping[str, Any], *args: Any, **kwargs: Any) -> list[TensorSpec | None]:
        stand_ins: tuple[TensorSpec, ...] = ()
        if self._pending and kind == "matmul":
            a, b = (self._pending.get(t) if isinstance(t := inputs.get(role), TensorSpec) else None for role in "AB")
            scaled = absorbed(a, b)
            if scaled is not None:
                stand_ins, inputs = (inputs["A"], inputs["B"]), scaled
        for value in inputs.values():
            if isinstance(value, TensorSpec) and value in self._pending:
                self._materialize(value, self._pending[value])
        if self._tiled:
            inputs = {role: self.untiled(v) if isinstance(v, TensorSpec) else v for role, v in inputs.items()}
        outputs = super()._add_node(kind, inputs, *args, **kwargs)
        self._absorbed.update(stand_ins)
        return outputs

    def _materialize(self, y: TensorSpec, pending: Pending) -> None:
        arguments = pending.node_arguments()
        super()._add_node(
            "block_scale_dequantize",
            arguments["inputs"],
            arguments["attributes"],
            name=arguments["name"],
            compute_data_type=arguments["compute_data_type"],
            outputs={"Y": y},
        )
        del self._pending[y]
        self._held -= 1

    @property
    def tensors(self) -> tuple[TensorSpec, ...]:
        """Every tensor but the declared inputs that no node reads."""
        unread = self.unread_inputs()
        return tuple(t for t in self._tensors if t not in unread)

    def unread_inputs(self) -> set[TensorSpec]:
        """Non-virtual tensors that no node writes or reads: the frontend ignores them."""
        touched = {t for node in self._nodes for t in (*node.input_tensors(), *node.outputs.values())}
        return {t for t in self._tensors if t not in touched and not t.is_virtual}

    def _fresh_tensor_name(self, name: str | None) -> str:
        return super()._fresh_tensor_name(_free(name, self._tensor_names))

    def _fresh_node_name(self, name: str | None, kind: str) -> str:
        return super()._fresh_node_name(_free(name, self._node_names), kind)


def _free(name: str | None, taken: set[str] | dict[str, TensorSpec]) -> str | None:
    """``name``, or ``name#k`` for the smallest k >= 2 that is free."""
    if not name or name not in taken:
        return name
    suffix = 2
    while f"{name}#{suffix}" in taken:
        suffix += 1
    return f"{name}#{suffix}"
