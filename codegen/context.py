"""What every family emitter receives, and helpers for the parts all kernels share."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fusion_rules import FusedNode
from graphdnn.dtypes import DataType
from graphdnn.ir import Graph, Tensor
from graphdnn.program import TensorMap
from graphdnn.symbolic import Extent

from .cuda_types import compute_type, cuda_type, headers_for, load
from .epilogue import scalar_value
from .indexing import EXTENT_PREFIX, extent_name, offset
from .kernel import Param, ParamKind, compose, kernel_name, param_name


@dataclass(frozen=True)
class EmitContext:
    graph: Graph
    signature: str
    arch: int
    tuning: dict[str, object] = field(default_factory=dict)  # family-specific choices (autotuned)


@dataclass
class KernelParams:
    """The parameter list of a kernel, as C declarations and as runtime bindings."""

    declarations: list[str] = field(default_factory=list)
    bindings: list[Param] = field(default_factory=list)

    def tensor(self, tensor: Tensor, *, writable: bool = False) -> str:
        """Declare a pointer to ``tensor`` (or a double for a runtime scalar); return its name."""
        name = param_name(tensor)
        if tensor.is_pass_by_value:
            self.declarations.append(f"const double {name}")
            self.bindings.append(Param(ParamKind.SCALAR, tensor=tensor.id))
            return name
        qualifier = "" if writable else "const "
        self.declarations.append(f"{qualifier}{cuda_type(tensor.data_type)}* __restrict__ {name}")
        self.bindings.append(Param(ParamKind.TENSOR, tensor=tensor.id))
        return name

    def tensor_map(self, tensor: Tensor, tensor_map: TensorMap, sizes: tuple[Extent, ...] = ()) -> str:
        """Declare a TMA tensor map of ``tensor`` (a ``gd::TensorMapArg``, 64-byte aligned: declare
        tensor maps first, so that no padding precedes them); return its name. ``sizes``: a
        dynamic graph's map's dims then byte strides as extents (``tensor_map`` holds their
        values at the symbols' maxima), resolved at each call."""
        earlier = sum(1 for p in self.bindings if p.kind is ParamKind.TENSOR_MAP and p.tensor == tensor.id)
        name = f"tm{tensor.id}" + (f"_{earlier}" if earlier else "")  # a tensor may have several maps
        self.declarations.append(f"const __grid_constant__ gd::TensorMapArg {name}")
        self.bindings.append(Param(ParamKind.TENSOR_MAP, tensor=tensor.id, tensor_map=tensor_map, map_sizes=sizes))
        return name

    def scratch_map(self, name: str, tensor_map: TensorMap) -> str:
        """Declare a TMA tensor map of scratch buffer ``name`` (encoded at bind time from its
        workspace address; declare tensor maps first, as :meth:`tensor_map` says); return its name."""
        self.declarations.append(f"const __grid_constant__ gd::TensorMapArg tm_{name}")
        self.bindings.append(Param(ParamKind.TENSOR_MAP, scratch=name, tensor_map=tensor_map))
        return f"tm_{name}"

    def scratch(self, name: str, c_type: str) -> str:
        """Declare scratch buffer ``name`` once per kernel (two parts of a kernel may read it: the
        first declaration's type stands); return its name."""
        if any(p.kind is ParamKind.SCRATCH and p.scratch == name for p in self.bindings):
            return name
        self.declarations.append(f"{c_type}* __restrict__ {name}")
        self.bindings.append(Param(ParamKind.SCRATCH, scratch=name))
        return name

    def extents(self, graph: Graph, body: str) -> None:
        """Declare an EXTENT parameter for each symbol ``body`` reads (in order of first use)."""
        by_name = {extent_name(s): s for s in graph.symbols}
        for name in dict.fromkeys(_EXTENT.findall(body)):
            self.declarations.append(f"const long long {name}")
            self.bindings.append(Param(ParamKind.EXTENT, symbol=by_name[name]))

    def aligned_flag(self) -> str:
        self.declarations.append("const long long aligned")
        self.bindings.append(Param(ParamKind.ALIGNED))
        return "aligned"


def kernel_source(
    ctx: EmitContext,
    fused: FusedNode,
    pattern: str,
    params: KernelParams,
    threads: int,
    body: str,
    min_blocks: int = 0,
    device_functions: str = "",
    cluster: int = 1,
) -> tuple[str, str]:
    """(name, full source) of a kernel whose body is ``body`` (the code inside the function);
    ``min_blocks``: blocks per SM that must fit at once (``__launch_bounds__``' second argument,
    which caps the registers a thread may use), for grids sized to stay resident;
    ``device_functions``: the helpers the body calls, placed before the kernel; ``cluster``:
    blocks per thread-block cluster along x (sm_90; ``__cluster_dims__``, so that a plain launch
    groups them), 1 for none.

    Generated identifiers (t12, v7, ...) are renumbered by first appearance, so a fused node
    that appears in two graphs gives the same source, name and cubin whatever its tensor ids.
    In a dynamic graph each symbol the body reads becomes an EXTENT parameter (dyn_<name>,
    renumbered dyn0, dyn1, ... like the others).
    """
    params.extents(ctx.graph, body)
    bounds = f"{threads}, {min_blocks}" if min_blocks else f"{threads}"
    dims = f"__cluster_dims__({cluster}, 1, 1) " if cluster > 1 else ""
    function, renamed = canonical_identifiers(
        f'extern "C" __global__ void {dims}__launch_bounds__({bounds}) KERNEL({", ".join(params.declarations)}) {{\n{body}}}\n'
    )
    name = kernel_name(pattern, function)  # the headers follow from the function's text
    function = function.replace(" KERNEL(", f" {name}(", 1)
    members = ", ".join(f"{n.name} ({n.op})" for n in fused.nodes)
    legend = []
    for declaration, binding in zip(params.declarations, params.bindings):
        parameter = renamed.get(declaration.split()[-1], declaration.split()[-1])
        if binding.tensor is not None:
            legend.append(f"{parameter} = '{ctx.graph.tensors[binding.tensor].name}'")
        elif binding.symbol is not None:
            legend.append(f"{parameter} = symbol '{binding.symbol.name}'")
    header = (
        f"graphdnn {fused.family.value} kernel {name}: {pattern}\n"
        f"graph '{ctx.graph.name}' signature {ctx.signature}\n"
        f"fused node {fused.name} (rule {fused.rule}): {members}\n"
        f"parameters: {', '.join(legend)}"
    )
    code = f"{device_functions}\n{function}" if device_functions else function
    return name, compose(header=header, headers=headers_for(function), body=code)


_GENERATED = re.compile(r"\b(t|tm|s|v|r|a|o|in|pre|out|base|col|exact)(\d+)\b")
_EXTENT = re.compile(rf"\b{EXTENT_PREFIX}\w+")


def canonical_identifiers(text: str) -> tuple[str, dict[str, str]]:
    """``text`` with generated identifiers renumbered per prefix by first appearance (EXTENT
    parameters, named after their symbols, too), and the renaming."""
    renamed: dict[str, str] = {}
    counts: dict[str, int] = {}

    def rename(found: re.Match[str]) -> str:
        old, prefix = found.group(0), found.group(1)
        if old not in renamed:
            renamed[old] = f"{prefix}{counts.get(prefix, 0)}"
            counts[prefix] = counts.get(prefix, 0) + 1
        return renamed[old]

    def rename_extent(found: re.Match[str]) -> str:
        old = found.group(0)
        if old not in renamed:
            renamed[old] = f"dyn{counts.get(EXTENT_PREFIX, 0)}"
            counts[EXTENT_PREFIX] = counts.get(EXTENT_PREFIX, 0) + 1
        return renamed[old]

    return _GENERATED.sub(rename, _EXTENT.sub(rename_extent, text)), renamed


def pattern_name(fused: FusedNode) -> str:
    """A readable name of what the kernel computes, from its ops: conv_bn_relu, layernorm_gelu."""
    short = {"conv_fprop": "conv", "batchnorm_inference": "bn", "gelu_approx_tanh": "gelu", "batchnorm": "bn"}
    ops = [short.get(n.op, n.op) for n in fused.nodes]
    return "_".join(dict.fromkeys(ops))[:48]


def compute_of(tensors: Sequence[Tensor], extra: Iterable[DataType] = ()) -> str:
    return compute_type([*(t.data_type for t in tensors), *extra])


def indent(statements: Iterable[str], depth: int) -> str:
    pad = "  " * depth
    return "".join(f"{pad}{line}\n" for line in statements)


def operand_loader(names: Mapping[int, str], dims: Sequence[int], prefix: str, compute: str) -> Callable[[Tensor], str]:
    """How an epilogue reads an operand at the element whose coordinates over ``dims`` are
    ``{prefix}{axis}``: a runtime scalar from its parameter, a tensor through its (broadcast) strides."""

    def load_operand(tensor: Tensor) -> str:
        if tensor.is_pass_by_value:
            return scalar_value(tensor, names[tensor.id], compute)
        return load(tensor.data_type, f"{names[tensor.id]}[{offset(tensor, dims, prefix)}]", compute)

    return load_operand
