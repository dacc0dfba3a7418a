"""``TensorSpec``: a tensor of a graph under construction, with cuDNN-style setters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .dtypes import DataType, as_data_type
from .errors import GraphError
from .symbolic import Extent, Sym

Scalar = float | int | bool


class Owner(Protocol):
    """What a tensor needs of its graph (an OperationGraphSpec): its name, the default
    types, and renaming. A protocol, so that this module sits below the builder."""

    @property
    def name(self) -> str: ...

    @property
    def io_data_type(self) -> DataType: ...

    @property
    def intermediate_data_type(self) -> DataType: ...

    def _rename_tensor(self, spec: TensorSpec, name: str) -> None: ...


class TensorSpec:
    """One tensor of an :class:`~graphdnn.OperationGraphSpec`.

    Made by ``graph.tensor(...)`` for graph inputs, or returned by an op method for
    op outputs, whose dims and strides are inferred. Op outputs are *virtual* (they live
    only inside the fused kernels) until ``set_output(True)`` makes them graph outputs.
    An unset data type follows the graph: virtual tensors take its intermediate type,
    the others its io type. Equality is identity, as for cuDNN frontend tensors.
    """

    __slots__ = (
        "_data_type",
        "_dim",
        "_dim_is_set",
        "_graph",
        "_is_pass_by_value",
        "_is_virtual",
        "_name",
        "_producer",
        "_stride",
        "_stride_is_set",
        "_uid",
        "_value",
    )

    def __init__(
        self,
        graph: Owner,
        name: str,
        *,
        dim: Sequence[Extent] | None,
        stride: Sequence[Extent] | None,
        data_type: Any,
        is_virtual: bool,
        is_pass_by_value: bool = False,
        value: Scalar | None = None,
        uid: int | None = None,
    ) -> None:
        self._graph = graph
        self._name = name
        self._dim = _as_ints(dim, "dim", name)
        self._stride = _as_ints(stride, "stride", name)
        self._data_type = as_data_type(data_type)
        self._is_virtual = bool(is_virtual)
        self._is_pass_by_value = bool(is_pass_by_value)
        self._value = value
        self._uid = uid
        self._dim_is_set = dim is not None
        self._stride_is_set = stride is not None
        self._producer: str | None = None  # name of the node that writes it, if any

    # -- read access ---------------------------------------------------------------
    @property
    def graph(self) -> Owner:
        return self._graph

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> tuple[Extent, ...] | None:
        """Logical dims; None until known (e.g. a reduction output the user must size).
        A dim may be symbolic (:class:`~graphdnn.Sym`, from ``graph.dim``)."""
        return self._dim

    @property
    def stride(self) -> tuple[Extent, ...] | None:
        return self._stride

    @property
    def data_type(self) -> DataType:
        """The set type, else the graph's default for a tensor of this kind."""
        if self._data_type.is_set:
            return self._data_type
        if self._is_virtual:
            return self._graph.intermediate_data_type
        return self._graph.io_data_type

    @property
    def is_virtual(self) -> bool:
        return self._is_virtual

    @property
    def is_output(self) -> bool:
        """True for a non-virtual tensor that a node writes: a graph output."""
        return self._producer is not None and not self._is_virtual

    @property
    def is_pass_by_value(self) -> bool:
        return self._is_pass_by_value

    @property
    def value(self) -> Scalar | None:
        """The value of a constant scalar; None for a scalar supplied at execution."""
        return self._value

    @property
    def uid(self) -> int | None:
        return self._uid

    @property
    def producer(self) -> str | None:
        """Name of the node that writes this tensor; None for graph inputs."""
        return self._producer

    # cuDNN frontend getters, for code written against pygraph tensors.
    def get_name(self) -> str:
        return self._name

    def get_dim(self) -> list[Extent] | None:
        return None if self._dim is None else list(self._dim)

    def get_stride(self) -> list[Extent] | None:
        return None if self._stride is None else list(self._stride)

    def get_data_type(self) -> DataType:
        return self.data_type

    def get_is_virtual(self) -> bool:
        return self._is_virtual

    def get_uid(self) -> int | None:
        return self._uid

    def get_is_pass_by_value(self) -> bool:
        return self._is_pass_by_value

    # -- fluent setters (cuDNN frontend style) ------------------------------------------
    def set_output(self, is_output: bool = True) -> TensorSpec:
        """Make this op output a graph output (non-virtual), or virtual again."""
        self._is_virtual = not is_output
        return self

    def set_is_virtual(self, is_virtual: bool) -> TensorSpec:
        self._is_virtual = bool(is_virtual)
        return self

    def set_is_pass_by_value(self, is_pass_by_value: bool) -> TensorSpec:
        """Make this input a one-element scalar whose value the variant pack gives (or not)."""
        self._is_pass_by_value = bool(is_pass_by_value)
        return self

    def set_data_type(self, data_type: Any) -> TensorSpec:
        self._data_type = as_data_type(data_type)
        return self

    def set_dim(self, dim: Sequence[Extent]) -> TensorSpec:
        """Pin the dims. Op outputs are checked against inference at validation."""
        self._dim = _as_ints(dim, "dim", self._name)
        self._dim_is_set = True
        if self._stride is not None and not self._stride_is_set:
            self._stride = None  # inferred again for the new dims
        return self

    def set_stride(self, stride: Sequence[Extent]) -> TensorSpec:
        self._stride = _as_ints(stride, "stride", self._name)
        self._stride_is_set = True
        return self

    def set_name(self, name: str) -> TensorSpec:
        self._graph._rename_tensor(self, name)
        return self

    def set_uid(self, uid: int) -> TensorSpec:
        if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
            raise GraphError(f"uid must be a non-negative integer, got {uid!r}", tensor=self._name)
        self._uid = uid
        return self

    def __repr__(self) -> str:
        dims = "?" if self._dim is None else "x".join(map(str, self._dim))
        if self._dim is not None and any(isinstance(d, Sym) for d in self._dim):
            dims = f"[{', '.join(map(str, self._dim))}]"
        kind = "virtual" if self._is_virtual else ("output" if self.is_output else "input")
        return f"TensorSpec({self._name!r}, {dims}, {self.data_type.value}, {kind})"


def _as_ints(values: Sequence[Extent] | None, what: str, tensor: str) -> tuple[Extent, ...] | None:
    """Integers and symbolic extents, as a tuple; NumPy integers become ints."""
    if values is None:
        return None
    try:
        items = tuple(values)
    except TypeError:
        raise GraphError(f"{what} must be a list of integers, got {values!r}", tensor=tensor) from None
    if all(type(item) is int or type(item) is Sym for item in items):
        return items
    for item in items:
        # NumPy integers are fine (they have __index__); floats, strings, bools are not.
        if isinstance(item, bool) or not hasattr(item, "__index__"):
            raise GraphError(
                f"{what} must hold integers, got {item!r}; a symbolic dim comes from graph.dim(name, min, max)",
                tensor=tensor,
            )
    return tuple(item if isinstance(item, Sym) else int(item) for item in items)
