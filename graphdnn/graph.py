"""``OperationGraphSpec``: the user-facing graph builder, in the cuDNN frontend's style."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .dtypes import DataType, as_data_type
from .errors import GraphError, ShapeError, StructureError, UndeclaredDimsError
from .ir import Graph
from .layout import MAX_DIM, packed_strides
from .names import check_name
from .node_spec import NodeSpec
from .ops import OpMethods
from .ops.attributes import Attributes
from .ops.base import Inferred, Op, get_op
from .serialize import graph_to_json, read_graph
from .signature import signature as signature_of
from .symbolic import Extent, Sym, Symbol, symbol
from .tensor import Scalar, TensorSpec
from .validate import infer_node
from .validate import validate as validate_spec

if TYPE_CHECKING:  # the build seam (see build)
    from .plan import PlanBase

InputValue = TensorSpec | Scalar | Sequence[TensorSpec] | None


class OperationGraphSpec(OpMethods):
    """A computation described as tensors and op nodes, to validate, fuse and compile.

    Mirrors ``cudnn.pygraph``: declare inputs with :meth:`tensor`, call op methods
    (``conv_fprop``, ``layernorm``, ``relu``...) that return output tensors with inferred
    dims, strides and type, mark results with ``set_output(True)``. Types default from the
    graph: inputs and outputs take ``io_data_type``, virtual tensors
    ``intermediate_data_type``, nodes compute in ``compute_data_type``.
    """

    # The class of its tensors: a compatibility layer's builder may add setters of its own.
    _tensor_class: ClassVar[type[TensorSpec]] = TensorSpec

    def __init__(
        self,
        name: str = "graph",
        io_data_type: Any = None,
        intermediate_data_type: Any = DataType.FLOAT,
        compute_data_type: Any = DataType.FLOAT,
    ) -> None:
        self.name = name
        self.io_data_type = as_data_type(io_data_type, what="io_data_type")
        self.intermediate_data_type = as_data_type(intermediate_data_type, what="intermediate_data_type")
        self.compute_data_type = as_data_type(compute_data_type, what="compute_data_type")
        self._tensors: list[TensorSpec] = []
        self._tensor_names: dict[str, TensorSpec] = {}
        self._nodes: list[NodeSpec] = []
        self._node_names: set[str] = set()
        self._nodes_of_kind: dict[str, int] = {}  # numbers default node names without a scan
        self._symbols: dict[str, Symbol] = {}

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, name: str) -> None:
        self._name = check_name(name, "graph")

    # -- contents ------------------------------------------------------------------------
    @property
    def tensors(self) -> tuple[TensorSpec, ...]:
        return tuple(self._tensors)

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return tuple(self._nodes)

    def tensor_named(self, name: str) -> TensorSpec:
        try:
            return self._tensor_names[name]
        except KeyError:
            raise GraphError(f"graph '{self.name}' has no tensor named '{name}'") from None

    @property
    def symbols(self) -> tuple[Symbol, ...]:
        """The symbols declared with :meth:`dim`, in order of declaration."""
        return tuple(self._symbols.values())

    # -- declaring tensors ---------------------------------------------------------------
    def dim(self, name: str, min: int = 1, max: int = MAX_DIM) -> Sym:
        """A symbolic dim: an extent known only at execution, anywhere in ``min..max``.

        Use it in tensor dims (``g.tensor([batch, 768])``); the same name is the same
        value in every tensor, and shape inference carries it through the ops. Products
        (``batch * seq``) are symbolic dims too. Asking again for a declared name with the
        same range returns it; with another range is a ShapeError.
        """
        declared = self._symbols.get(name)
        if declared is None:
            declared = self._symbols[name] = symbol(name, min, max, limit=MAX_DIM)
        elif (declared.min, declared.max) != (min, max):
            raise ShapeError(
                f"symbol '{name}' is declared with range {declared.min}..{declared.max}; it cannot also be {min}..{max}"
            )
        return Sym.of(declared)

    def tensor(
        self,
        dim: Sequence[Extent],
        stride: Sequence[Extent] | None = None,
        data_type: Any = None,
        is_virtual: bool = False,
        is_pass_by_value: bool = False,
        name: str | None = None,
        uid: int | None = None,
    ) -> TensorSpec:
        """Declare a graph input. ``stride`` defaults to packed row-major (NCHW).

        A pass-by-value tensor is a one-element scalar whose value the caller supplies at
        execution, like cuDNN's; for a constant, pass a Python number to the op instead.
        """
        spec = self._new_tensor(
            name,
            dim=dim,
            stride=stride,
            data_type=data_type,
            is_virtual=is_virtual,
            is_pass_by_value=is_pass_by_value,
            uid=uid,
        )
        if spec.stride is None and spec.dim is not None:
            spec._stride = packed_strides(spec.dim)
        return spec

    def tensor_like(self, like: Any, name: str | None = None) -> TensorSpec:
        """Declare an input with the dims, strides and type of an array or another spec.

        Takes a TensorSpec, a NumPy array, or a torch/CuPy-style array (``shape`` plus
        ``stride()`` or ``strides`` in bytes, and ``dtype``).
        """
        if isinstance(like, TensorSpec):
            return self.tensor(
                dim=like.dim or (),
                stride=like.stride,
                data_type=like.data_type,
                is_pass_by_value=like.is_pass_by_value,
                name=name,
            )
        dim = tuple(int(d) for d in like.shape)
        data_type = as_data_type(like.dtype)
        if callable(getattr(like, "stride", None)):  # torch: element strides
            stride = tuple(int(s) for s in like.stride())
        else:  # NumPy / CuPy: byte strides
            stride = tuple(int(s) // data_type.itemsize for s in like.strides)
        return self.tensor(dim=dim, stride=stride, data_type=data_type, name=name)

    def scalar(self, value: Scalar, data_type: Any = DataType.FLOAT, name: str | None = None) -> TensorSpec:
        """A constant one-element tensor; its value is part of the graph and its signature."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GraphError(f"a scalar constant must be a number, got {value!r}", tensor=name)
        return self._new_tensor(
            name,
            dim=(1,),
            stride=(1,),
            data_type=data_type,
            is_virtual=False,
            is_pass_by_value=True,
            value=float(value),
        )

    def _new_tensor(self, name: str | None, **fields: Any) -> TensorSpec:
        name = self._fresh_tensor_name(name)
        spec = self._tensor_class(self, name, **fields)
        self._tensors.append(spec)
        self._tensor_names[name] = spec
        return spec

    def _fresh_tensor_name(self, name: str | None) -> str:
        if name is None or name == "":
            index = len(self._tensors)
            while f"tensor{index}" in self._tensor_names:
                index += 1
            return f"tensor{index}"
        check_name(name, "tensor")
        if name in self._tensor_names:
            raise StructureError(f"tensor name '{name}' is already used in graph '{self.name}'")
        return name

    def _rename_tensor(self, spec: TensorSpec, name: str) -> None:
        if name == spec.name:
            return
        name = self._fresh_tensor_name(name)
        del self._tensor_names[spec.name]
        spec._name = name
        self._tensor_names[name] = spec

    # -- adding nodes ---------------------------------------------------------------------
    def _add_node(
        self,
        kind: str,
        inputs: Mapping[str, InputValue],
        attributes: Mapping[str, Any] | Attributes | None = None,
        *,
        name: str | None = None,
        compute_data_type: Any = None,
        declared: Mapping[str, Sequence[int]] | None = None,
        outputs: Mapping[str, TensorSpec] | None = None,
        infer: bool = True,
    ) -> list[TensorSpec | None]:
        """Add a node; return its outputs in the op's output-role order (None if absent).

        ``declared`` gives dims for outputs the op cannot infer (a reduction's, say). Op
        methods call this; so does the JSON reader, with existing ``outputs`` and
        ``infer=False``, so that all checking happens in validation.
        """
        op = get_op(kind, node=name)
        node_name = self._fresh_node_name(name, kind)
        if isinstance(attributes, op.attributes):
            attrs = attributes
        elif isinstance(attributes, Attributes):
            raise StructureError(
                f"{op.kind} takes {op.attributes.__name__}, not {type(attributes).__name__}", node=node_name
            )
        else:
            attrs = op.attributes.build(attributes or {}, node=node_name)
        first_new_tensor = len(self._tensors)
        try:  # a call that fails leaves the graph as it was (no half-added node, no stray scalars)
            bound = self._bind_inputs(op, node_name, inputs)
            if outputs is None:
                present = op.present_outputs(attrs, frozenset(bound))
                outputs = {
                    role.name: self._new_tensor(
                        f"{node_name}::{role.name}", dim=None, stride=None, data_type=None, is_virtual=True
                    )
                    for role in op.outputs
                    if role.name in present
                }
            node = NodeSpec(
                name=node_name,
                op=kind,
                inputs=bound,
                outputs=dict(outputs),
                attributes=attrs,
                compute_data_type=as_data_type(compute_data_type, what="compute_data_type"),
            )
            if declared:
                for role, spec in outputs.items():
                    if role in declared:
                        spec.set_dim(declared[role])
            if infer:
                self._infer_eagerly(node)
        except GraphError:
            for spec in self._tensors[first_new_tensor:]:
                del self._tensor_names[spec.name]
            del self._tensors[first_new_tensor:]
            raise
        for spec in outputs.values():
            spec._producer = node_name
        self._nodes.append(node)
        self._node_names.add(node_name)
        self._nodes_of_kind[kind] = self._nodes_of_kind.get(kind, 0) + 1
        return [outputs.get(role.name) for role in op.outputs]

    def _fresh_node_name(self, name: str | None, kind: str) -> str:
        if name is None or name == "":
            index = self._nodes_of_kind.get(kind, 0)
            while f"{kind}_{index}" in self._node_names:
                index += 1
            return f"{kind}_{index}"
        check_name(name, "node")
        if name in self._node_names:
            raise StructureError(f"node name '{name}' is already used in graph '{self.name}'")
        return name

    def _bind_inputs(
        self, op: Op, node: str, inputs: Mapping[str, InputValue]
    ) -> dict[str, TensorSpec | tuple[TensorSpec, ...]]:
        if not inputs.keys() <= op.input_names:
            unknown = next(role_name for role_name in inputs if role_name not in op.input_names)
            raise StructureError(
                f"{op.kind} has no input '{unknown}' (inputs: {', '.join(sorted(op.input_names))})", node=node
            )
        bound: dict[str, TensorSpec | tuple[TensorSpec, ...]] = {}
        for role in op.inputs:
            value = inputs.get(role.name)
            if value is None:
                if not role.optional:
                    raise StructureError(f"missing input '{role.name}' for {op.kind}", node=node)
                continue
            if role.variadic:
                if isinstance(value, TensorSpec) or not isinstance(value, Sequence) or not value:
                    raise StructureError(f"input '{role.name}' takes a non-empty list of tensors", node=node)
                bound[role.name] = tuple(self._own(v, node, role.name) for v in value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                # A Python number becomes a constant scalar, baked into the kernel.
                bound[role.name] = self.scalar(value, name=f"{node}::{role.name}")
            else:
                bound[role.name] = self._own(value, node, role.name)
        return bound

    def _own(self, value: Any, node: str, role: str) -> TensorSpec:
        if not isinstance(value, TensorSpec):
            raise StructureError(f"input '{role}' must be a TensorSpec, got {type(value).__name__}", node=node)
        if value.graph is not self:
            raise StructureError(
                f"input '{role}' is tensor '{value.name}' of graph '{value.graph.name}', not of this graph",
                node=node,
            )
        return value

    def _infer_eagerly(self, node: NodeSpec) -> None:
        """Give the new outputs their dims now, so users can read them; validation repeats it."""
        if any(t.dim is None for t in node.input_tensors()):
            return  # an input's dims are declared later; validation will infer
        try:
            inferred: dict[str, Inferred] = infer_node(node)
        except UndeclaredDimsError:
            return  # the user declares these dims later (set_dim); validation will check
        for role, spec in node.outputs.items():
            if role not in inferred:
                continue
            if not spec._dim_is_set:
                spec._dim = inferred[role].dim
            if not spec._stride_is_set:
                spec._stride = packed_strides(inferred[role].dim, inferred[role].order)
            fixed = inferred[role].data_type
            if fixed is not None and not spec._data_type.is_set:
                spec._data_type = fixed

    # -- stages ---------------------------------------------------------------------------
    def validate(self) -> Graph:
        """Check the whole graph and return its frozen, fully inferred IR.

        Raises a :class:`~graphdnn.GraphError` subclass naming the node and tensor.
        """
        return validate_spec(self)

    def signature(self) -> str:
        """Hex SHA-256 of the graph's canonical form; see :mod:`graphdnn.signature`."""
        return signature_of(self.validate())

    def build(self, **options: Any) -> PlanBase:
        """Compile this graph into a plan: the keyword arguments of :func:`graphdnn.compile`.

        The builder's one reach up the pipeline (docs/architecture.md, "The build seam"):
        imported here, when called, so that the builder never loads the compile stage.
        """
        from .compiler import compile

        return compile(self, **options)

    def to_json(self, *, indent: int | None = 2) -> str:
        return graph_to_json(self.validate(), indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> OperationGraphSpec:
        """Read a graph file's text; raises FormatError naming the JSON path on bad input."""
        return read_graph(text, cls)[0]

    def __repr__(self) -> str:
        return f"OperationGraphSpec({self.name!r}, {len(self._nodes)} nodes, {len(self._tensors)} tensors)"
