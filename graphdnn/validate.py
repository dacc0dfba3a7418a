"""Validation: check a graph under construction and freeze it into the IR.

Walks the nodes in topological order, runs each op's shape inference, checks every
tensor's dims, strides and type against it, and the wiring of the whole graph
(cycles, tensors written twice, dangling and unused tensors, dead nodes, outputs).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Protocol

from .dtypes import DataType
from .errors import DataTypeError, GraphError, ShapeError, StructureError, SymbolicDimError
from .gc_pause import gc_paused
from .ir import Graph, Node, Tensor
from .layout import check_dims, check_extent, check_strides, numel, packed_strides
from .node_spec import NodeSpec
from .ops.base import Category, Inferred, Op
from .packing import packed_axis
from .symbolic import Extent, Sym, Symbol
from .tensor import Owner, TensorSpec


class GraphSpec(Owner, Protocol):
    """What validation reads of a graph under construction (an OperationGraphSpec, which
    calls this module: a protocol keeps the builder above validation, not beside it):
    what its tensors read of it, and its compute type, tensors and nodes."""

    @property
    def compute_data_type(self) -> DataType: ...

    @property
    def tensors(self) -> Sequence[TensorSpec]: ...

    @property
    def nodes(self) -> Sequence[NodeSpec]: ...


@gc_paused()
def validate(spec: GraphSpec) -> Graph:
    """Return the frozen IR of ``spec`` or raise a GraphError saying what is wrong."""
    for what in ("intermediate_data_type", "compute_data_type"):
        value: DataType = getattr(spec, what)
        if value.is_set and not value.is_floating:
            raise DataTypeError(f"graph '{spec.name}': {what} must be a floating type, not {value.value}")
    for node_spec in spec.nodes:
        _check_output_roles(node_spec)
    ids = {t: index for index, t in enumerate(spec.tensors)}
    writer = _writers(spec)
    order = _topological_order(spec, writer)
    read = {t for node in spec.nodes for t in node.input_tensors()}

    resolved: dict[TensorSpec, Tensor] = {}
    for t in spec.tensors:
        if t in writer:
            continue
        if t.is_virtual:
            readers = [n.name for n in spec.nodes if t in n.input_tensors()]
            where = f"node '{readers[0]}' reads it" if readers else "no node reads it either"
            raise StructureError(f"virtual tensor '{t.name}' is written by no node ({where})", tensor=t.name)
        if t not in read:
            raise StructureError(
                f"tensor '{t.name}' is declared but no node reads it; remove it or use it", tensor=t.name
            )
        resolved[t] = _resolve_input(t, ids[t])

    nodes: list[Node] = []
    for index, node_spec in enumerate(order):
        node = _resolve_node(spec, node_spec, index, resolved, ids)
        nodes.append(node)

    tensors = tuple(resolved[t] for t in spec.tensors)
    _check_outputs_and_liveness(spec, nodes, tensors)
    _check_symbols(tensors, writer.keys())
    numbered = _assign_uids(spec, tensors)
    fresh = {t.id: t for t, before in zip(numbered, tensors, strict=True) if t is not before}
    nodes = [_rebind(node, fresh) for node in nodes]
    return Graph(
        name=spec.name,
        io_data_type=spec.io_data_type,
        intermediate_data_type=spec.intermediate_data_type,
        compute_data_type=spec.compute_data_type,
        tensors=numbered,
        nodes=tuple(nodes),
    )


def infer_node(node_spec: NodeSpec) -> dict[str, Inferred]:
    """Run a node's inference on the current (unvalidated) input dims, for eager feedback."""
    inputs: dict[str, Tensor | tuple[Tensor, ...]] = {}
    for role, bound in node_spec.inputs.items():
        if isinstance(bound, tuple):
            inputs[role] = tuple(_provisional(t) for t in bound)
        else:
            inputs[role] = _provisional(bound)
    node = _partial_node(node_spec, -1, inputs, node_spec.compute_data_type)
    return _infer(node_spec.definition, node, node_spec)


# -- graph structure -----------------------------------------------------------------------
def _writers(spec: GraphSpec) -> dict[TensorSpec, NodeSpec]:
    writer: dict[TensorSpec, NodeSpec] = {}
    for node in spec.nodes:
        for t in node.outputs.values():
            if t in writer:
                raise StructureError(
                    f"tensor '{t.name}' is written by both node '{writer[t].name}' and node '{node.name}'",
                    tensor=t.name,
                )
            writer[t] = node
    return writer


def _topological_order(spec: GraphSpec, writer: dict[TensorSpec, NodeSpec]) -> list[NodeSpec]:
    """Kahn's algorithm, taking ready nodes in insertion order so the order is stable."""
    nodes = spec.nodes
    position = {node.name: i for i, node in enumerate(nodes)}
    waiting_on = [0] * len(nodes)
    dependents: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        producers = {position[writer[t].name] for t in node.input_tensors() if t in writer}
        waiting_on[i] = len(producers)
        for producer in producers:
            dependents[producer].append(i)
    ready = [i for i, count in enumerate(waiting_on) if count == 0]  # ascending: already a heap
    order: list[NodeSpec] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for dependent in dependents[i]:
            waiting_on[dependent] -= 1
            if waiting_on[dependent] == 0:
                heapq.heappush(ready, dependent)
    if len(order) != len(nodes):
        stuck = [node for i, node in enumerate(nodes) if waiting_on[i] > 0]
        raise StructureError(
            "the graph has a cycle through node(s) " + ", ".join(f"'{n.name}'" for n in stuck[:4]),
            node=stuck[0].name,
        )
    return order


def _check_outputs_and_liveness(spec: GraphSpec, nodes: list[Node], tensors: tuple[Tensor, ...]) -> None:
    outputs = [t for node in nodes for t in node.output_tensors() if not t.is_virtual]
    if not outputs:
        raise StructureError(f"graph '{spec.name}' has no output: call set_output(True) on the tensors you need")
    live_tensors = {t.id for t in outputs}
    live_nodes: set[int] = set()
    for node in reversed(nodes):
        if any(t.id in live_tensors for t in node.output_tensors()):
            live_nodes.add(node.id)
            live_tensors.update(t.id for t in node.input_tensors())
    for node in nodes:
        if node.id not in live_nodes:
            raise StructureError(
                "none of its outputs is a graph output or read by a node that matters; "
                "remove the node or mark an output with set_output(True)",
                node=node.name,
            )


def _check_symbols(tensors: tuple[Tensor, ...], written: Iterable[TensorSpec]) -> None:
    """One range per symbol name, and each symbol a whole dim of some graph input, where
    execution reads its value (a symbol seen only inside products could not be solved for)."""
    seen: dict[str, tuple[Symbol, str]] = {}
    for t in tensors:
        for s in t.symbols:
            first = seen.setdefault(s.name, (s, t.name))
            if first[0] != s:
                raise ShapeError(
                    f"symbol '{s.name}' has range {s.min}..{s.max} here but {first[0].min}..{first[0].max} in tensor "
                    f"'{first[1]}'; a symbol has one range in a graph",
                    tensor=t.name,
                )
    if not seen:
        return
    outputs = {t.name for t in written}
    readable = {
        d.factors[0].name
        for t in tensors
        if t.name not in outputs and not t.is_virtual
        for d in t.dim
        if isinstance(d, Sym) and d.coefficient == 1 and len(d.factors) == 1
    }
    for name, (s, where) in seen.items():
        if name not in readable:
            raise ShapeError(
                f"symbol {s} is in tensor '{where}' but is not a whole dim of any graph input; execution reads a "
                "symbol's value from an input's dims",
                tensor=where,
            )


def _assign_uids(spec: GraphSpec, tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Check user uids are unique; give other non-virtual tensors the smallest free ones."""
    taken: dict[int, str] = {}
    for t in tensors:
        if t.uid is not None:
            if t.uid in taken:
                raise StructureError(f"uid {t.uid} is used by tensors '{taken[t.uid]}' and '{t.name}'", tensor=t.name)
            taken[t.uid] = t.name
    next_uid = 1
    out = []
    for t, t_spec in zip(tensors, spec.tensors, strict=True):
        if t.uid is None and not t.is_virtual and not t.is_constant:
            while next_uid in taken:
                next_uid += 1
            taken[next_uid] = t.name
            t_spec._uid = next_uid
            t = replace(t, uid=next_uid)
        out.append(t)
    return tuple(out)


# -- tensors ---------------------------------------------------------------------------------
def _resolve_input(t: TensorSpec, tensor_id: int) -> Tensor:
    if t.dim is None:
        raise ShapeError(f"graph input '{t.name}' has no dims", tensor=t.name)
    stride = t.stride if t.stride is not None else packed_strides(t.dim)
    _check_layout(t.name, t.dim, stride, read_only=True)
    data_type = _resolved_type(t, "graph input")
    if data_type.is_packed:
        packed_axis(t.name, data_type, t.dim, stride)
    if t.is_pass_by_value and len(t.dim) and numel(t.dim) != 1:
        raise ShapeError(
            f"pass-by-value tensor '{t.name}' has {numel(t.dim)} elements; it must hold one", tensor=t.name
        )
    return Tensor(
        id=tensor_id,
        name=t.name,
        dim=tuple(t.dim),
        stride=tuple(t.stride) if t.stride is not None else packed_strides(t.dim),
        data_type=data_type,
        is_virtual=False,
        is_pass_by_value=t.is_pass_by_value,
        value=t.value,
        uid=t.uid,
    )


def _resolved_type(t: TensorSpec, what: str) -> DataType:
    data_type = t.data_type
    if not data_type.is_set:
        default = "intermediate_data_type" if t.is_virtual else "io_data_type"
        raise DataTypeError(
            f"{what} '{t.name}' has no data type: set one (data_type= or set_data_type) or give the graph an {default}",
            tensor=t.name,
        )
    return data_type


def _check_layout(
    name: str, dim: Iterable[Extent], stride: Iterable[Extent] | None = None, *, read_only: bool = False
) -> None:
    """Check ``dim``, and ``stride`` unless it is None (packed strides, valid by construction)."""
    dim = tuple(dim)
    try:
        check_dims(dim)
        if stride is not None:
            stride = tuple(stride)
            check_strides(dim, stride, read_only=read_only)
            check_extent(dim, stride)
    except GraphError as error:
        raise error.located(tensor=name) from None


def _provisional(t: TensorSpec) -> Tensor:
    assert t.dim is not None
    return Tensor(
        id=-1,
        name=t.name,
        dim=t.dim,
        stride=t.stride if t.stride is not None else packed_strides(t.dim),
        data_type=t.data_type,
        is_virtual=t.is_virtual,
        is_pass_by_value=t.is_pass_by_value,
        value=t.value,
    )


# -- nodes -----------------------------------------------------------------------------------
def _int8_matmul_in_int32(kind: str, inputs: dict[str, Tensor | tuple[Tensor, ...]], compute: DataType) -> bool:
    """The frontend's int8 matmul names int32 as its compute type: its sums are exact integers
    (the reference's and the kernels' alike)."""
    return (
        kind == "matmul"
        and compute is DataType.INT32
        and all(isinstance(t, Tensor) and t.data_type is DataType.INT8 for t in inputs.values())
    )


def _resolve_node(
    spec: GraphSpec,
    node_spec: NodeSpec,
    index: int,
    resolved: dict[TensorSpec, Tensor],
    ids: dict[TensorSpec, int],
) -> Node:
    op = node_spec.definition
    inputs: dict[str, Tensor | tuple[Tensor, ...]] = {}
    for role, bound in node_spec.inputs.items():
        inputs[role] = tuple(resolved[t] for t in bound) if isinstance(bound, tuple) else resolved[bound]
    compute = node_spec.compute_data_type if node_spec.compute_data_type.is_set else spec.compute_data_type
    if not compute.is_floating and not _int8_matmul_in_int32(op.kind, inputs, compute):
        raise DataTypeError(
            f"compute_data_type must be a floating type (or int32 for a matmul of int8 operands), not {compute.value}",
            node=node_spec.name,
        )
    node = _partial_node(node_spec, index, inputs, compute)
    _check_packed_inputs(op, node)
    inferred = _infer(op, node, node_spec)
    outputs = []
    for output in op.outputs:
        if output.name not in node_spec.outputs:
            continue
        t = node_spec.outputs[output.name]
        if output.name not in inferred:
            raise StructureError(f"output '{output.name}' is not produced by this {op.kind}", node=node.name)
        tensor = _resolve_output(node.name, op, output.name, t, inferred[output.name], ids[t])
        resolved[t] = tensor
        outputs.append((output.name, tensor))
    return Node(
        id=index,
        name=node.name,
        op=node.op,
        inputs=node.inputs,
        outputs=tuple(outputs),
        attributes=node.attributes,
        compute_data_type=compute,
    )


def _check_packed_inputs(op: Op, node: Node) -> None:
    """4-bit tensors reach only the roles that unpack them (``Op.packed_inputs``)."""
    for role, bound in node.inputs:
        for t in bound if isinstance(bound, tuple) else (bound,):
            if t.data_type.is_packed and role not in op.packed_inputs:
                takes = f" (it takes them as {', '.join(sorted(op.packed_inputs))})" if op.packed_inputs else ""
                raise DataTypeError(
                    f"{role} '{t.name}' is {t.data_type.value}; {op.kind} does not read 4-bit tensors{takes}: "
                    "dequantize it first (block_scale_dequantize)",
                    node=node.name,
                    tensor=t.name,
                )


def _check_output_roles(node_spec: NodeSpec) -> None:
    op = node_spec.definition
    expected = op.present_outputs(node_spec.attributes, frozenset(node_spec.inputs))
    if expected == node_spec.outputs.keys():
        return
    missing = sorted(expected - set(node_spec.outputs))
    extra = sorted(set(node_spec.outputs) - expected)
    if missing or extra:
        problem = f"missing output '{missing[0]}'" if missing else f"unexpected output '{extra[0]}'"
        raise StructureError(f"{problem} for {op.kind} (outputs: {', '.join(sorted(expected))})", node=node_spec.name)


def _partial_node(
    node_spec: NodeSpec, index: int, inputs: dict[str, Tensor | tuple[Tensor, ...]], compute: DataType
) -> Node:
    op = node_spec.definition
    ordered = tuple((role.name, inputs[role.name]) for role in op.inputs if role.name in inputs)
    return Node(
        id=index,
        name=node_spec.name,
        op=node_spec.op,
        inputs=ordered,
        outputs=(),
        attributes=node_spec.attributes,
        compute_data_type=compute,
    )


def _infer(op: Op, node: Node, node_spec: NodeSpec) -> dict[str, Inferred]:
    bound_to = dict(node.inputs)
    for role in op.inputs:
        bound = bound_to.get(role.name)
        for t in () if bound is None else bound if isinstance(bound, tuple) else (bound,):
            if role.floating and t.data_type.is_set and not t.data_type.is_floating:
                raise DataTypeError(
                    f"{role.name} '{t.name}' is {t.data_type.value}; {op.kind} needs a floating type",
                    node=node.name,
                    tensor=t.name,
                )
            if t.is_pass_by_value and not role.scalar and op.category is not Category.POINTWISE:
                raise StructureError(
                    f"{role.name} '{t.name}' is a pass-by-value scalar; {op.kind} takes those only in its scalar "
                    "roles (elementwise ops take them anywhere)",
                    node=node.name,
                    tensor=t.name,
                )
            if role.scalar and t.numel != 1:
                raise ShapeError(
                    f"{role.name} '{t.name}' must be a one-element scalar, has dims {list(t.dim)}",
                    node=node.name,
                    tensor=t.name,
                )
    declared = {
        role: node_spec.outputs[role].dim if node_spec.outputs[role]._dim_is_set else None
        for role in op.declared_outputs
        if role in node_spec.outputs
    }
    try:
        return op.infer(node, declared)
    except SymbolicDimError as error:
        raise _symbolic_error(op, node, error) from None


def _symbolic_error(op: Op, node: Node, error: SymbolicDimError) -> ShapeError:
    """Name the role and dim holding the symbol that ``op``'s inference needed a value of."""
    culprits = set(error.extent.symbols) if isinstance(error.extent, Sym) else set()
    for role, bound in node.inputs:
        for t in bound if isinstance(bound, tuple) else (bound,):
            for axis, extent in enumerate(t.dim):
                if isinstance(extent, Sym) and (not culprits or culprits & set(extent.symbols)):
                    return ShapeError(
                        f"{op.kind} cannot take a symbolic dim as {role} '{t.name}' dim {axis} ({extent}): "
                        f"{error.reason}; that dim must be static",
                        node=node.name,
                        tensor=t.name,
                    )
    return ShapeError(f"{op.kind}: {error.reason}", node=node.name)


def _resolve_output(node: str, op: Op, role: str, t: TensorSpec, inferred: Inferred, tensor_id: int) -> Tensor:
    if t.is_pass_by_value:
        raise StructureError(f"output '{t.name}' cannot be pass-by-value", node=node, tensor=t.name)
    if t._dim_is_set and t.dim != inferred.dim and role not in op.declared_outputs:
        raise ShapeError(
            f"output {role} '{t.name}' has dims set to {list(t.dim or ())}, but {op.kind} gives {list(inferred.dim)}",
            node=node,
            tensor=t.name,
        )
    stride = packed_strides(inferred.dim, inferred.order)
    if t._stride_is_set and t.stride is not None and t.stride != stride:
        stride = t.stride
        _check_layout(t.name, inferred.dim, stride)
    else:  # packed strides of valid dims are distinct, non-negative and span numel(dims) elements
        _check_layout(t.name, inferred.dim)
    data_type = _output_type(node, op, role, t, inferred)
    if data_type.is_packed:
        raise DataTypeError(
            f"output {role} '{t.name}' is {data_type.value}: 4-bit tensors are graph inputs (packed weights); "
            f"no op writes them",
            node=node,
            tensor=t.name,
        )
    if not t._dim_is_set:
        t._dim = inferred.dim
    if not t._stride_is_set:
        t._stride = stride
    return Tensor(
        id=tensor_id,
        name=t.name,
        dim=inferred.dim,
        stride=tuple(stride),
        data_type=data_type,
        is_virtual=t.is_virtual,
        uid=t.uid,
    )


def _output_type(node: str, op: Op, role: str, t: TensorSpec, inferred: Inferred) -> DataType:
    """The output's own type, else the one the op fixes (or its default), else the graph's default."""
    fixed = inferred.data_type
    if fixed is None:
        return _resolved_type(t, "output" if not t.is_virtual else "virtual tensor")
    if t._data_type.is_set and t._data_type is not fixed:
        if t._data_type in inferred.allowed:
            return t._data_type
        choices = " or ".join(sorted(d.value for d in {fixed, *inferred.allowed}))
        raise DataTypeError(
            f"output {role} '{t.name}' is {t._data_type.value}; {op.kind} writes it as {choices}",
            node=node,
            tensor=t.name,
        )
    return fixed


def _rebind(node: Node, fresh: dict[int, Tensor]) -> Node:
    """Point a node at the tensors uid assignment replaced (``fresh``, by id), if it has any."""
    if not any(t.id in fresh for t in node.input_tensors()) and not any(t.id in fresh for t in node.output_tensors()):
        return node

    def final(t: Tensor) -> Tensor:
        return fresh.get(t.id, t)

    def rebound(bound: Tensor | tuple[Tensor, ...]) -> Tensor | tuple[Tensor, ...]:
        return tuple(map(final, bound)) if isinstance(bound, tuple) else final(bound)

    return Node(
        id=node.id,
        name=node.name,
        op=node.op,
        inputs=tuple((role, rebound(bound)) for role, bound in node.inputs),
        outputs=tuple((role, final(t)) for role, t in node.outputs),
        attributes=node.attributes,
        compute_data_type=node.compute_data_type,
    )
