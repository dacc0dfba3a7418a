"""``cudnn.pygraph``: the frontend's graph object on graphdnn's builder, compiler and plans.

The build steps keep the frontend's names and order (validate, build_operation_graph,
create_execution_plans, check_support, build_plans, or build for all of them); graphdnn
has one plan per graph, compiled by its fusion and code generation. ``build_plans``
compiles it for the GPU when there is one (or for ``sm_version``), and always prepares
the NumPy reference plan: ``execute`` runs whichever the buffers' memory asks for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..compiler import compile as compile_graph
from ..dtypes import DataType, as_data_type
from ..errors import GraphError, UnsupportedError
from ..ir import Graph
from ..plan import PlanBase
from ..reference_plan import ReferencePlan
from ..runtime.buffers import is_torch
from ..runtime.driver import current_gpu_arch
from ..serialize import graph_to_json, read_graph
from ..signature import signature
from ..symbolic import Extent
from ..tensor import TensorSpec
from .enums import build_plan_policy, heur_mode, tiled_reordering
from .handle import Handle, get_stream
from .ops import FrontendOps
from .ragged import PendingOutput, check_ragged_uses, pack_outputs
from .reordering import tiled
from .spec import FrontendTensor, LenientSpec
from .variant_pack import adapt

if TYPE_CHECKING:
    from ..runtime.launch import BoundPlan

# Frontend calls graphdnn cannot serve, and why (AttributeError would not say).
NOT_SUPPORTED = {
    "sdpa_fp8": "graphdnn's attention has no fp8 scaling tensors",
    "sdpa_fp8_backward": "graphdnn's attention has no fp8 scaling tensors",
    "moe_grouped_matmul_bwd": "graphdnn has no weight gradient of the grouped matmul",
    "deselect_engines": "graphdnn builds one plan of its own kernels; there are no engines to choose",
    "deselect_numeric_notes": "graphdnn builds one plan of its own kernels; there are no engines to choose",
    "deselect_behavior_notes": "graphdnn builds one plan of its own kernels; there are no engines to choose",
    "select_numeric_notes": "graphdnn builds one plan of its own kernels; there are no engines to choose",
    "select_behavior_notes": "graphdnn builds one plan of its own kernels; there are no engines to choose",
    "deselect_workspace_greater_than": "graphdnn builds one plan of its own kernels; there are no engines to choose",
    "create_execution_plan": "graphdnn has no engine ids or knobs (gd.compile(tuning=...) picks launch choices)",
    "get_knobs_for_engine": "graphdnn has no engine ids or knobs (gd.compile(tuning=...) picks launch choices)",
    "get_engine_count": "graphdnn has no engine ids or knobs (gd.compile(tuning=...) picks launch choices)",
}


class pygraph(FrontendOps):
    """A graph built with the frontend's calls; ``graph.spec`` is the graphdnn builder beneath.

    Types that are NOT_SET take graphdnn's defaults: float for intermediates and compute.
    ``sm_version`` (e.g. 90) is the target the GPU plan is compiled for, with or without a
    GPU here; the frontend's SM carve-out, kernel cache and dynamic shapes are not supported.
    """

    def __init__(
        self,
        name: str = "test_graph",
        io_data_type: Any = DataType.NOT_SET,
        intermediate_data_type: Any = DataType.NOT_SET,
        compute_data_type: Any = DataType.NOT_SET,
        handle: Handle | None = None,
        sm_count: int | None = None,
        sm_version: int | None = None,
        kernel_cache: Any = None,
        device_property: Any = None,
        is_dynamic_shape_enabled: bool = False,
        is_override_shape_enabled: bool = False,
    ) -> None:
        for what, value in (
            ("sm_count", sm_count),
            ("kernel_cache", kernel_cache),
            ("device_property", device_property),
            ("is_dynamic_shape_enabled", is_dynamic_shape_enabled or None),
            ("is_override_shape_enabled", is_override_shape_enabled or None),
        ):
            if value is not None:
                raise UnsupportedError(
                    f"pygraph {what}={value!r}: graphdnn compiles static shapes for a whole GPU (or the target "
                    "sm_version names)"
                )
        self._spec = LenientSpec(
            name,
            io_data_type,
            _or_float(intermediate_data_type, "intermediate_data_type"),
            _or_float(compute_data_type, "compute_data_type"),
        )
        self._handle = handle
        self._arch = sm_version
        self._modes: list[heur_mode] = []
        self._plan: PlanBase | None = None  # the compiled plan, where there is a GPU or a target
        self._reference: ReferencePlan | None = None
        self._unread: set[TensorSpec] = set()  # inputs no node reads, as of the build
        self._ragged_outputs: list[PendingOutput] = []
        self._ragged_inputs: set[TensorSpec] = set()
        self._graph_bindings: dict[int, BoundPlan] = {}  # what each populated CUDA graph refers to

    @property
    def spec(self) -> LenientSpec:
        """The graphdnn builder holding this graph (an OperationGraphSpec)."""
        return self._spec

    @property
    def ir(self) -> Graph:
        """The validated graph the plans were built from (after a build step)."""
        return self._built().graph

    # -- tensors ----------------------------------------------------------------------------------
    def tensor(
        self,
        dim: Sequence[int],
        stride: Sequence[int] | None = None,
        data_type: Any = DataType.NOT_SET,
        is_virtual: bool = False,
        is_pass_by_value: bool = False,
        ragged_offset: TensorSpec | None = None,
        reordering_type: Any = None,
        name: str = "",
        uid: int = -1,
        ragged_offset_multiplier: int = 1,
    ) -> TensorSpec:
        """A graph input (or, with ``is_virtual``, a tensor a node will write). ``uid=-1``
        means assigned at build, the smallest free from 1. ``ragged_offset``: the element
        offsets of a packed attention tensor (cudnn/ragged.py)."""
        if ragged_offset_multiplier != 1:
            raise UnsupportedError(
                f"ragged_offset_multiplier={ragged_offset_multiplier}: graphdnn reads the ragged offsets as element "
                "offsets, unscaled",
                tensor=name or None,
            )
        layout = None
        if tiled_reordering(reordering_type, name or None):
            if is_virtual or is_pass_by_value:
                raise UnsupportedError(
                    "tensor reordering F8_128x4 is taken on block-scale inputs only (their buffers hold the tiles)",
                    tensor=name or None,
                )
            layout = tiled(dim, stride, data_type, name or None)
            dim, stride = layout.storage, None  # the input holds the tiles (cudnn/reordering.py)
        spec = self._spec.tensor(
            dim, stride, data_type, is_virtual, is_pass_by_value, name or None, None if uid == -1 else uid
        )
        assert isinstance(spec, FrontendTensor)
        if layout is not None:
            self._spec.declare_tiled(spec, layout)
        return spec.set_ragged_offset(ragged_offset)

    def tensor_like(self, input: Any, name: str = "") -> TensorSpec:
        """A tensor with the dims, strides and type of a graph tensor or a framework tensor.

        A host tensor of one element (a CPU torch tensor, a NumPy array) becomes a
        pass-by-value scalar, as in the frontend, whose value the variant pack gives.
        """
        spec = self._spec.tensor_like(input, name or None)
        if not isinstance(input, TensorSpec) and _on_host(input) and spec.dim is not None and _one(spec.dim):
            spec.set_is_pass_by_value(True)
        return spec

    def tensor_scalar(self, value: float, scalar_type: Any = None) -> TensorSpec:
        """A one-element constant, compiled into the plan (both frontend scalar types)."""
        return self._spec.scalar(value)

    def query_tensor_attributes_of_uid(self, uid: int) -> TensorSpec:
        for t in self._spec.tensors:
            if t.uid == uid:
                return t
        raise GraphError(f"graph '{self._spec.name}' has no tensor with uid {uid} (uids are assigned at build)")

    # -- build steps --------------------------------------------------------------------------------
    def validate(self) -> None:
        """Check the whole graph; raises a GraphError (a ValueError) naming the node and tensor."""
        self._validated()

    def build_operation_graph(self) -> None:
        """Validate and assign the uids left at -1 (``get_uid`` reads them)."""
        self._validated()

    def create_execution_plans(self, heur_modes: Sequence[Any] = (heur_mode.A,)) -> None:
        for mode in heur_modes:
            if not isinstance(mode, heur_mode):
                raise GraphError(f"create_execution_plans takes cudnn.heur_mode values, got {mode!r}")
        self._modes = list(heur_modes)
        self._validated()

    def get_execution_plan_count(self) -> int:
        return 1 if self._modes else 0

    def check_support(self) -> None:
        """Compile the plan; raises cudnnGraphNotSupportedError (UnsupportedError) saying why not."""
        self.build_plans()

    def build_plans(self, policy: Any = build_plan_policy.HEURISTICS_CHOICE) -> None:
        if not isinstance(policy, build_plan_policy):
            raise GraphError(f"build_plans takes a cudnn.build_plan_policy, got {policy!r}")
        ir = self._validated()
        gpu = self._arch is not None or current_gpu_arch() is not None
        self._plan = compile_graph(ir, arch=self._arch) if gpu else None
        self._reference = ReferencePlan(ir)
        self._unread = self._spec.unread_inputs()

    def build_plan_at_index(self, index: int) -> None:
        _plan_index(index)
        self.build_plans()

    def build(self, heur_modes: Sequence[Any] = (heur_mode.A,)) -> None:
        """Every step: validate, build the operation graph, create, check and build the plan."""
        self.create_execution_plans(heur_modes)
        self.build_plans()

    def get_workspace_size(self) -> int:
        """Bytes of workspace the compiled plan needs (0 for the reference plan alone)."""
        self._built()
        return self._plan.workspace_size if self._plan is not None else 0  # type: ignore[attr-defined]

    def get_workspace_size_plan_at_index(self, index: int) -> int:
        _plan_index(index)
        return self.get_workspace_size()

    # -- execution ------------------------------------------------------------------------------------
    def execute(self, variant_pack: Mapping[Any, Any], workspace: Any = None, handle: Handle | None = None) -> None:
        """Run the plan on the buffers of ``variant_pack`` (keys: tensors, uids or names;
        values: framework tensors or raw ``data_ptr()`` ints), writing the outputs in place."""
        reference = self._built()
        adapted = adapt(reference.graph, self._spec, variant_pack, self._unread, self._plan is not None)
        if adapted.on_host:
            reference.execute(adapted.pack)
            return
        self._gpu_plan().execute(adapted.pack, workspace, self._stream(handle))

    def populate_cuda_graph(
        self, handle: Handle | None, variant_pack: Mapping[Any, Any], workspace: Any, cuda_graph: Any
    ) -> None:
        """Put the plan's launches on the buffers of ``variant_pack`` into ``cuda_graph``, an
        empty ``cudaGraph_t`` (an int or a cuda-bindings handle), as one chain of nodes. The
        graph refers to memory this pygraph holds for it until the next update of that graph."""
        bound = self._graph_binding(handle, variant_pack, workspace)
        bound.record_into(int(cuda_graph))
        self._graph_bindings[int(cuda_graph)] = bound

    def update_cuda_graph(
        self, handle: Handle | None, variant_pack: Mapping[Any, Any], workspace: Any, cuda_graph: Any
    ) -> None:
        """Point a graph that ``populate_cuda_graph`` filled (or its clone, such as a child
        graph node's) at new buffers; apply it to an instantiated graph with
        ``cudaGraphExecChildGraphNodeSetParams`` or ``cudaGraphExecUpdate`` before the next launch."""
        bound = self._graph_binding(handle, variant_pack, workspace)
        bound.update_graph(int(cuda_graph))
        self._graph_bindings[int(cuda_graph)] = bound

    def _graph_binding(self, handle: Handle | None, variant_pack: Mapping[Any, Any], workspace: Any) -> BoundPlan:
        reference = self._built()
        plan = self._gpu_plan()
        adapted = adapt(reference.graph, self._spec, variant_pack, self._unread, True)
        if adapted.on_host:
            raise UnsupportedError(
                f"graph '{self._spec.name}': a CUDA graph runs on device buffers; this variant pack holds host "
                "memory (NumPy arrays or CPU tensors), which only execute() runs, on the NumPy reference plan"
            )
        return plan.bind(adapted.pack, workspace, self._stream(handle))

    def _gpu_plan(self) -> PlanBase:
        if self._plan is None:
            raise UnsupportedError(
                f"graph '{self._spec.name}' was built without a GPU (and without sm_version), so only host buffers "
                "(NumPy arrays, CPU tensors) can run it, on the NumPy reference plan"
            )
        return self._plan

    def _stream(self, handle: Handle | None) -> Any:
        handle = handle if handle is not None else self._handle
        return get_stream(handle) if handle is not None else None

    def execute_plan_at_index(
        self, variant_pack: Mapping[Any, Any], workspace: Any, index: int, handle: Handle | None = None
    ) -> None:
        _plan_index(index)
        self.execute(variant_pack, workspace, handle)

    def _validated(self) -> Graph:
        """The validated graph, after the outputs of ragged attention sides are packed as the
        frontend left them (their dims, strides and offsets are set after the op call), and the
        dequantizes held back are added (cudnn/deferred.py)."""
        self._spec.resolve_pending()
        pack_outputs(self._ragged_outputs)
        check_ragged_uses(self._spec.tensors, self._ragged_inputs | {o.tensor for o in self._ragged_outputs})
        return self._spec.validate()

    def _built(self) -> ReferencePlan:
        if self._reference is None:
            raise GraphError(
                f"graph '{self._spec.name}' is not built: call build([cudnn.heur_mode.A]) or build_plans()"
            )
        return self._reference

    # -- serialization ---------------------------------------------------------------------------------
    def serialize(self) -> bytes:
        """The graph as graphdnn's JSON (its plan comes back from the plan cache on deserialize)."""
        return graph_to_json(self._built().graph).encode()

    def deserialize(self, *args: Any) -> None:
        """``deserialize([handle,] data)``: this graph becomes the serialized one, built."""
        if len(args) not in (1, 2):
            raise GraphError(f"deserialize takes ([handle,] data), got {len(args)} arguments")
        if len(args) == 2:
            self._handle = args[0]
        data = args[-1]
        self._spec = read_graph(bytes(data) if isinstance(data, (bytearray, list)) else data, LenientSpec)[0]
        self._ragged_outputs, self._ragged_inputs = [], set()  # the graph read is packed already
        self.build_plans()

    def key(self) -> int:
        """A key for caching built graphs: graphdnn's signature (independent of names and uids)."""
        ir: Graph = self._validated()
        return int(signature(ir)[:16], 16)

    def __getattr__(self, name: str) -> Any:
        if name in NOT_SUPPORTED:
            raise UnsupportedError(f"pygraph.{name} is not supported: {NOT_SUPPORTED[name]}")
        raise AttributeError(f"'pygraph' object has no attribute '{name}'")

    def __repr__(self) -> str:
        return f"pygraph({self._spec.name!r}, {self._spec.node_count} nodes)"


def _or_float(value: Any, what: str) -> DataType:
    data_type = as_data_type(value, what=what)
    return data_type if data_type.is_set else DataType.FLOAT


def _on_host(value: Any) -> bool:
    return not bool(value.is_cuda) if is_torch(value) else not hasattr(value, "__cuda_array_interface__")


def _one(dim: Sequence[Extent]) -> bool:
    return all(d == 1 for d in dim)


def _plan_index(index: int) -> None:
    if index != 0:
        raise GraphError(f"plan index {index}: graphdnn builds one plan per graph (index 0)")
