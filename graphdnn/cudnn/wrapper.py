"""``cudnn.Graph``: the frontend's high-level wrapper, on :class:`~graphdnn.cudnn.pygraph`.

Ops take framework tensors (torch, NumPy: anything with ``__dlpack__``) directly, which
become graph tensors (``tensor_like``); the graph builds itself when the ``with`` block
ends; it is then called, with positional buffers in the order of ``inputs=`` /
``set_io_tuples`` (returning the outputs, allocated like the first input), or with a dict
by name (returning the dict with the missing outputs added). A node's inputs are named
``<node>::<argument>`` (``conv2d::image``, ``add.0::0``), its outputs by their tensor names
(``conv2d::Y``); nodes without a name are ``<op>.<count>``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import FeedError, GraphError, StructureError
from ..reference_plan import host_array
from ..runtime.buffers import is_torch
from ..runtime.frameworks import empty_torch
from ..tensor import TensorSpec
from .enums import heur_mode
from .frontend import pygraph

# pygraph calls that Graph makes itself, or that make no sense on it.
_BUILD_STEPS = frozenset(
    {
        "validate",
        "build_operation_graph",
        "create_execution_plans",
        "check_support",
        "build_plans",
        "build",
        "build_plan_at_index",
        "execute",
        "execute_plan_at_index",
        "get_execution_plan_count",
        "key",
    }
)
_PASS_THROUGH = frozenset({"get_workspace_size", "serialize", "query_tensor_attributes_of_uid"})
_TENSOR_MAKERS = frozenset({"tensor", "tensor_like", "tensor_scalar"})

Ref = str | TensorSpec | Any  # a name, a graph tensor, or a framework tensor used to build the graph


class Graph:
    """``with cudnn.Graph(io_data_type=...) as graph: y = graph.conv_fprop(image=x, ...)``.

    ``heuristics`` and ``handle`` are passed to the build and to ``execute``; the other
    keyword arguments go to :class:`pygraph`. With ``workspace_alloc=True`` calls use the
    plan's own workspace; with False each call must pass ``workspace=``.
    """

    def __init__(
        self,
        *,
        handle: Any = None,
        inputs: Sequence[Ref] | None = None,
        outputs: Sequence[Ref] | None = None,
        heuristics: Sequence[heur_mode] | None = None,
        workspace_alloc: bool = True,
        **kwargs: Any,
    ) -> None:
        for what, value in (("inputs", inputs), ("outputs", outputs), ("heuristics", heuristics)):
            if value is not None and not isinstance(value, (list, tuple)):
                raise GraphError(f"{what} must be a list or tuple, got {type(value).__name__}")
        self._kwargs = kwargs
        self._handle = handle
        self._heuristics = list(heuristics or [heur_mode.A, heur_mode.FALLBACK])
        self._workspace_alloc = workspace_alloc
        self._graph: pygraph | None = None
        self._built = False
        self._framework: dict[int, tuple[Any, TensorSpec]] = {}  # id -> (the tensor, kept alive; its graph tensor)
        self._inputs: dict[str, TensorSpec] = {}  # "<node>::<argument>" -> graph tensor
        self._outputs: dict[str, TensorSpec] = {}  # tensor name -> graph tensor
        self._made: list[TensorSpec] = []  # made directly with tensor / tensor_like
        self._node_count: dict[str, int] = {}
        self._node_names: set[str] = set()
        self._io: tuple[Sequence[Ref], Sequence[Ref]] = (inputs or [], outputs or [])
        self._order: tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]] | None = None

    # -- building ---------------------------------------------------------------------------------
    def __enter__(self) -> Graph:
        if self._graph is not None:
            raise GraphError("this Graph was already built; make a new one")
        self._graph = pygraph(handle=self._handle, **self._kwargs)
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if exc_type is not None:
            self._graph = None
            return
        assert self._graph is not None
        self._graph.build(self._heuristics)
        self._built = True
        if self._io[0] or self._io[1]:
            self.set_io_tuples(*self._io)

    def __getattr__(self, name: str) -> Any:
        graph = self.__dict__.get("_graph")
        if graph is None:
            raise GraphError(f"Graph.{name}: build the graph inside `with cudnn.Graph(...) as graph:`")
        if name in _BUILD_STEPS:
            raise GraphError(f"Graph.{name}: a Graph builds itself when its with block ends and is called to run")
        attribute = getattr(graph, name)
        if name in _PASS_THROUGH or not callable(attribute):
            return attribute
        if name in _TENSOR_MAKERS:
            return self._maker(attribute)
        return self._node(name, attribute)

    def _maker(self, make: Callable[..., TensorSpec]) -> Callable[..., TensorSpec]:
        def made(*args: Any, **kwargs: Any) -> TensorSpec:
            tensor = make(*args, **kwargs)
            self._made.append(tensor)
            return tensor

        return made

    def _node(self, op: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def node(*args: Any, **kwargs: Any) -> Any:
            count = self._node_count.get(op, 0)
            self._node_count[op] = count + 1
            name = kwargs.get("name") or f"{op}.{count}"
            if name in self._node_names:
                raise StructureError(f"node name '{name}' is already used in this Graph")
            self._node_names.add(name)
            kwargs["name"] = name
            args = tuple(self._argument(f"{name}::{i}", value) for i, value in enumerate(args))
            kwargs = {key: self._argument(f"{name}::{key}", value) for key, value in kwargs.items()}
            result = method(*args, **kwargs)
            for tensor in result if isinstance(result, list) else [result]:
                if isinstance(tensor, TensorSpec):
                    self._outputs[tensor.get_name()] = tensor
            return result

        return node

    def _argument(self, port: str, value: Any) -> Any:
        """A framework tensor becomes its graph tensor (one per framework tensor); graph
        tensors are recorded as the node's input ``port``."""
        if not isinstance(value, TensorSpec) and hasattr(value, "__dlpack__"):
            if id(value) not in self._framework:
                assert self._graph is not None
                self._framework[id(value)] = (value, self._graph.tensor_like(value))
            value = self._framework[id(value)][1]
        if isinstance(value, TensorSpec):
            self._inputs[port] = value
        return value

    # -- inputs and outputs -------------------------------------------------------------------------
    def set_io_tuples(self, inputs: Sequence[Ref], outputs: Sequence[Ref]) -> None:
        """The order of positional buffers in a call, and of the outputs it returns."""
        if not self._built:
            self._io = (inputs, outputs)  # applied when the with block ends
            return
        order_in = tuple(self._find(ref, self._inputs, "input", i) for i, ref in enumerate(inputs))
        order_out = tuple(self._find(ref, self._outputs, "output", i) for i, ref in enumerate(outputs))
        chosen = [*order_in, *order_out]
        for i, tensor in enumerate(chosen):
            if any(other is tensor for other in chosen[:i]):
                raise GraphError(f"tensor '{tensor.get_name()}' is named twice in set_io_tuples")
            if tensor.is_virtual:
                raise GraphError(f"tensor '{tensor.get_name()}' is virtual: it cannot be an input or an output")
        for port, tensor in itertools.chain(self._inputs.items(), self._outputs.items()):
            if not tensor.is_virtual and not any(tensor is t for t in chosen):
                raise GraphError(f"'{port}' ('{tensor.get_name()}') is neither an input nor an output in set_io_tuples")
        self._order = (order_in, order_out)

    def _find(self, ref: Ref, tensors: Mapping[str, TensorSpec], what: str, index: int) -> TensorSpec:
        if isinstance(ref, TensorSpec) and any(ref is t for t in (*self._made, *tensors.values())):
            return ref
        if isinstance(ref, str):
            if ref in tensors:
                return tensors[ref]
            found = [t for t in tensors.values() if t.get_name() == ref]
            if found:
                return found[0]
        if id(ref) in self._framework and self._framework[id(ref)][0] is ref:
            return self._framework[id(ref)][1]
        known = ", ".join(tensors) or "none"
        raise GraphError(f"{what} {index} ({ref!r}) is no {what} of this Graph (known: {known})")

    # -- running --------------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``graph(x, w)`` -> the outputs (one, or a tuple), or ``graph({name: buffer})`` -> the dict."""
        if not self._built or self._graph is None:
            raise GraphError("a Graph runs only after its with block has ended (which builds it)")
        if len(args) == 1 and isinstance(args[0], dict):
            return self._call_dict(args[0], **kwargs)
        if self._order is None:
            raise GraphError("call with positional buffers after set_io_tuples (or inputs= / outputs=)")
        order_in, order_out = self._order
        if len(args) != len(order_in):
            raise GraphError(f"{len(args)} buffers given for {len(order_in)} inputs")
        results = [self._allocate(t, args[0] if args else None) for t in order_out]
        pack = dict(zip((*order_in, *order_out), (*args, *results), strict=True))
        self._execute(pack, **kwargs)
        return results[0] if len(results) == 1 else tuple(results)

    def _call_dict(self, buffers: dict[Any, Any], **kwargs: Any) -> dict[Any, Any]:
        pack: dict[TensorSpec, Any] = {}
        missing: list[str] = []
        for port, tensor in itertools.chain(self._inputs.items(), self._outputs.items()):
            if tensor.is_virtual or tensor in pack:
                continue
            for key in (port, tensor, tensor.get_name(), tensor.get_uid()):
                if key in buffers:
                    pack[tensor] = buffers[key]
                    break
            else:
                if port in self._outputs:
                    continue
                missing.append(port)
        if missing:
            raise FeedError(f"inputs {', '.join(repr(m) for m in missing)} are not in the dict")
        like = next(iter(pack.values()), None)
        for name, tensor in self._outputs.items():
            if not tensor.is_virtual and tensor not in pack:
                pack[tensor] = buffers[name] = self._allocate(tensor, like)
        self._execute(pack, **kwargs)
        return buffers

    def _execute(self, pack: dict[TensorSpec, Any], workspace: Any = None, handle: Any = None) -> None:
        if workspace is None and not self._workspace_alloc:
            raise GraphError("this Graph was made with workspace_alloc=False: pass workspace= to each call")
        assert self._graph is not None
        self._graph.execute(pack, workspace, handle)

    def _allocate(self, tensor: TensorSpec, like: Any) -> Any:
        """An output buffer where the inputs are: torch on their device, else NumPy."""
        assert self._graph is not None
        resolved = self._graph.ir.tensor(tensor.get_name())
        if is_torch(like):
            return empty_torch(resolved, str(like.device))
        return host_array(resolved)
