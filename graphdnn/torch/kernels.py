"""The real kernels of a graph's torch op: the NumPy reference on CPU tensors, a GPU plan on CUDA ones.

Results (and, on the GPU, the workspace and any input copy) come from torch's allocator on
the arguments' device, and the plan is launched on ``torch.cuda.current_stream()``: the op
allocates nothing outside torch and never waits for the GPU, so it is captured in a CUDA
graph like any torch op (the capture's private memory pool holds its buffers). Plans are
built on first use per device (for that device's architecture) and per set of symbol
values of a dynamic graph, which is compiled as the static graph of those values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..cache.lru import LRU
from ..errors import UnsupportedError
from ..plan import Plan
from ..program import TENSOR_MAP_ALIGNMENT, ArgKind
from ..reference import execute
from ..runtime.buffers import same_strides
from ..runtime.frameworks import numpy_view, torch_host
from ..specialize import specialize
from .arguments import check_arguments, device_of, empty_results, returned
from .op_schema import OpSchema

PLANS_PER_OP = 8  # GPU plans kept by one op (devices x symbol values), least recently used dropped first


class GraphKernels:
    """Runs one op's graph on its arguments' device; called with the op's arguments in schema order."""

    def __init__(self, schema: OpSchema, plan: Plan | None, compile_options: Mapping[str, Any]) -> None:
        self.schema = schema
        self._plan = plan  # a plan the caller compiled: serves every CUDA call
        self._compile_options = dict(compile_options)
        self._plans: LRU[tuple[Any, ...], tuple[Plan, frozenset[int]]] = LRU(PLANS_PER_OP)

    def __call__(self, *args: Any) -> Any:
        values = check_arguments(self.schema, args)
        device = device_of(self.schema, args)
        results = empty_results(self.schema, values, device)
        if device.type == "cpu":
            self._reference(args, results)
        elif device.type == "cuda":
            self._gpu(args, values, results, device)
        else:
            raise UnsupportedError(
                f"graph '{self.schema.graph.name}' runs on CUDA tensors (compiled plans) and CPU tensors "
                f"(the reference backend), not on {device}"
            )
        return returned(results)

    def _reference(self, args: Sequence[Any], results: Sequence[Any]) -> None:
        feeds = {
            t.name: value if t.is_pass_by_value else numpy_view(value, t.data_type)
            for t, value in zip(self.schema.inputs, args)
        }
        computed = execute(self.schema.graph, feeds)
        for t, result in zip(self.schema.outputs, results):
            result.copy_(torch_host(computed[t.name], t))

    def _gpu(self, args: Sequence[Any], values: dict[str, int], results: Sequence[Any], device: Any) -> None:
        import torch

        plan, tensor_maps = self._gpu_plan(device, values)
        pack: dict[str, Any] = {}
        for t, value in zip(self.schema.inputs, args):
            if not t.is_pass_by_value:
                value = _in_plan_layout(value, plan.graph.tensors[t.id], t.id in tensor_maps)
            pack[t.name] = value
        pack.update({t.name: result for t, result in zip(self.schema.outputs, results)})
        size = plan.workspace_size
        workspace = torch.empty(size, dtype=torch.uint8, device=device) if size else None
        plan.execute(pack, workspace, torch.cuda.current_stream(device).cuda_stream)

    def _gpu_plan(self, device: Any, values: dict[str, int]) -> tuple[Plan, frozenset[int]]:
        """The plan for ``device`` and these symbol values, with the inputs its kernels read
        through TMA tensor maps (which must start on a 16-byte boundary)."""
        key = (device.index, *sorted(values.items()))
        found = self._plans.get(key)
        if found is None:
            plan = self._plan if self._plan is not None else self._compile(device, values)
            found = (plan, _tensor_map_operands(plan))
            self._plans.put(key, found)
        return found

    def _compile(self, device: Any, values: dict[str, int]) -> Plan:
        import torch

        from ..compiler import compile

        major, minor = torch.cuda.get_device_capability(device)
        plan = compile(specialize(self.schema.graph, values), arch=major * 10 + minor, **self._compile_options)
        assert isinstance(plan, Plan)  # backend 'gpu': custom_op refuses a backend option
        return plan


def _in_plan_layout(value: Any, tensor: Any, read_by_tma: bool) -> Any:
    """``value``, or a copy of it in the plan's strides (kernels are compiled for them) and,
    for a tensor-map operand, at an address TMA takes (torch's blocks are 512-byte aligned)."""
    import torch

    strided = same_strides(tensor.static_dim, tuple(value.stride()), tensor.static_stride)
    if strided and not (read_by_tma and value.data_ptr() % TENSOR_MAP_ALIGNMENT):
        return value
    copy = torch.empty_strided(tensor.static_dim, tensor.static_stride, dtype=value.dtype, device=value.device)
    return copy.copy_(value)


def _tensor_map_operands(plan: Plan) -> frozenset[int]:
    return frozenset(
        a.tensor
        for launch in plan.program.launches
        for a in launch.args
        if a.kind is ArgKind.TENSOR_MAP and a.tensor is not None
    )
