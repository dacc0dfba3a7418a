"""The GPU runtime's pure parts, on the CPU: lowering to plan data, argument packing, buffer
checks, streams, and a plan's description of itself."""

from __future__ import annotations

import numpy as np
import pytest

import graphdnn as gd
from codegen import FusedProgram, Kernel, Param, ParamKind, Scratch
from fusion_rules import fuse
from graphdnn.dtypes import DataType
from graphdnn.lower import assemble
from graphdnn.program import Arg, ArgKind, Launch, LaunchProgram, WorkspaceBuffer
from graphdnn.runtime import buffers
from graphdnn.runtime.driver import stream_handle
from graphdnn.runtime.launch import pack_arguments, slot_addresses
from tests import plan_graphs


def test_intermediates_and_scratch_get_aligned_workspace_slots() -> None:
    partition = fuse(plan_graphs.sum_then_add().validate())
    ir = partition.graph
    (sums,) = partition.materialized
    x, y = ir.tensor("x"), ir.tensor("y")

    def program(name: str, tensors: list[int], scratch: tuple[Scratch, ...]) -> FusedProgram:
        params = tuple(Param(ParamKind.TENSOR, tensor=t) for t in tensors)
        params += (*tuple(Param(ParamKind.SCRATCH, scratch=s.name) for s in scratch), Param(ParamKind.ALIGNED))
        kernel = Kernel(name, f"// {name}\n// ---- end of header ----\nbody {name}", (1, 1, 1), (32, 1, 1), 0, params)
        return FusedProgram(name, (kernel,), scratch)

    programs = (
        program("reduce", [x.id, sums.id], (Scratch("partials", 100), Scratch("flags", 3))),
        program("add", [x.id, sums.id, y.id], (Scratch("partials", 8),)),
    )
    lowered = assemble(partition, programs, lambda content: f"key-{content[:8]}", {1: {"block": 64}})
    workspace = lowered.program.workspace
    assert workspace == (
        WorkspaceBuffer(0, 16, tensor=sums.id),
        WorkspaceBuffer(256, 100, scratch="partials", fused_index=0),
        WorkspaceBuffer(512, 3, scratch="flags", fused_index=0),
        WorkspaceBuffer(768, 8, scratch="partials", fused_index=1),
    )
    assert lowered.program.workspace_size == 1024
    first, second = lowered.program.launches
    assert [a.offset for a in first.args if a.kind is ArgKind.SCRATCH] == [256, 512]
    assert [a.offset for a in second.args if a.kind is ArgKind.SCRATCH] == [768]
    assert [a.tensor for a in second.args if a.kind is ArgKind.TENSOR] == [x.id, sums.id, y.id]
    assert lowered.program.tuning == ({}, {"block": 64})
    assert set(lowered.sources) == {first.kernel_key, second.kernel_key}


def test_a_kernel_reading_an_unwritten_virtual_tensor_is_a_codegen_bug() -> None:
    partition = fuse(plan_graphs.add_relu().validate())
    virtual = next(t for t in partition.graph.tensors if t.is_virtual)
    kernel = Kernel("k", "body", (1, 1, 1), (1, 1, 1), 0, (Param(ParamKind.TENSOR, tensor=virtual.id),))
    with pytest.raises(AssertionError, match="reads virtual tensor"):
        assemble(partition, (FusedProgram("f", (kernel,)),), lambda c: c, {})


def test_program_relabel_and_json_round_trip() -> None:
    launch = Launch(
        "k", "kk", "ch", 0, (2, 1, 1), (64, 1, 1), 0, 16,
        (Arg(ArgKind.TENSOR, 0), Arg(ArgKind.SCALAR, 1), Arg(ArgKind.SCRATCH, offset=256), Arg(ArgKind.ALIGNED)),
    )  # fmt: skip
    program = LaunchProgram(
        (launch,), (WorkspaceBuffer(0, 16, tensor=2), WorkspaceBuffer(256, 4, None, "s", 0)), 512, ({},)
    )
    moved = program.relabel({0: 5, 1: 6, 2: 7})
    assert [a.tensor for a in moved.launches[0].args] == [5, 6, None, None]
    assert moved.intermediate_offsets() == {7: 0}
    assert LaunchProgram.from_json(moved.to_json()) == moved
    assert moved.relabel({5: 0, 6: 1, 7: 2}) == program


def test_pack_arguments_fills_pointers_doubles_scratch_and_the_aligned_flag() -> None:
    args = (Arg(ArgKind.TENSOR, 0), Arg(ArgKind.SCALAR, 1), Arg(ArgKind.SCRATCH, offset=256), Arg(ArgKind.ALIGNED))
    launch = Launch("k", "kk", "ch", 0, (1, 1, 1), (1, 1, 1), 0, 16, args)
    slots = pack_arguments(launch, {0: 0x7F0000001000}, {1: -2.5}, workspace=0x7F0000100000)
    assert slots.dtype == np.uint64 and len(slots) == 4
    assert int(slots[0]) == 0x7F0000001000
    assert slots.view(np.float64)[1] == -2.5
    assert int(slots[2]) == 0x7F0000100000 + 256
    assert int(slots[3]) == 1
    misaligned = pack_arguments(launch, {0: 0x7F0000001002}, {1: 0.0}, workspace=0x7F0000100000)
    assert int(misaligned[3]) == 0  # one pointer off a 16-byte boundary: the vector path is off
    addresses = slot_addresses(launch, slots)
    assert [int(a) - slots.ctypes.data for a in addresses] == [0, 8, 16, 24]


def test_buffers_are_checked_field_by_field() -> None:
    t = plan_graphs.add_relu().validate().tensor("x")  # half [8, 33] strides [33, 1]

    def buffer(**changes: object) -> buffers.Buffer:
        fields: dict[str, object] = {
            "pointer": 0x10000, "shape": (8, 33), "strides": (33, 1), "data_type": DataType.HALF,
            "type_name": "half", "device": 0, "where": "cuda:0", "owner": None,
        }  # fmt: skip
        fields.update(changes)
        return buffers.Buffer(**fields)  # type: ignore[arg-type]

    buffers.check(t, buffer(), 0)
    buffers.check(t, buffer(shape=(8, 33), strides=(33, 1)), 0)
    cases = [
        (buffer(device=None, where="host memory (a NumPy array)"), "tensor 'x': is in host memory"),
        (buffer(device=1), "tensor 'x': is on cuda:1, the plan runs on cuda:0"),
        (buffer(data_type=DataType.BFLOAT16, type_name="bfloat16"), "has data type bfloat16, the graph declares half"),
        (buffer(data_type=None, type_name="complex64"), "has data type complex64"),
        (buffer(shape=(33, 8)), r"has dims \[33, 8\], the graph declares \[8, 33\]"),
        (buffer(strides=(1, 8)), r"has strides \[1, 8\], the graph declares \[33, 1\]"),
        (buffer(pointer=0x10001), "starts at address 0x10001, not aligned to its element size \\(2 bytes\\)"),
    ]
    for bad, message in cases:
        with pytest.raises(gd.FeedError, match=message):
            buffers.check(t, bad, 0)


def test_the_stride_of_a_size_one_dim_is_never_compared() -> None:
    assert buffers.same_strides((1, 33), (999, 1), (33, 1))
    assert not buffers.same_strides((2, 33), (999, 1), (33, 1))


class _Stream:
    def __init__(self, handle: int) -> None:
        self.handle_value = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle_value)


class _TorchLikeStream:
    cuda_stream = 0x1234


def test_streams_from_ints_protocol_objects_and_torch() -> None:
    assert stream_handle(None) == 0
    assert stream_handle(0xABC) == 0xABC
    assert stream_handle(_Stream(0x55)) == 0x55
    assert stream_handle(_TorchLikeStream()) == 0x1234
    with pytest.raises(gd.FeedError, match="cannot use str as a stream"):
        stream_handle("default")


def test_a_gpu_plan_describes_its_kernels_and_workspace() -> None:
    plan = gd.compile(plan_graphs.sum_then_add(), arch="sm_80", cache=None)
    assert isinstance(plan, gd.Plan)
    assert (plan.arch, plan.arch_name, plan.backend) == (80, "sm_80", "gpu")
    assert len(plan.kernels) == 2 and plan.workspace_size >= 256
    (slot,) = [s for s in plan.workspace if s.tensor is not None]
    assert slot.tensor.name == "sum::y" and slot.offset == 0  # type: ignore[union-attr]
    reads_sums = [p for k in plan.kernels for p in k.params if p.tensor is not None and p.tensor.name == "sum::y"]
    assert reads_sums and all(p.workspace_offset == 0 for p in reads_sums)
    text = plan.describe()
    assert "sum::y at workspace+0" in text and plan.kernels[0].name in text
    assert all(k.cubin and 'extern "C"' in k.source for k in plan.kernels)
    assert [t.name for t in plan.inputs] == ["x"] and [t.name for t in plan.outputs] == ["y"]


def test_a_torch_pack_has_one_key_from_its_first_call_on() -> None:
    """The first call meets the tensor class before it takes the inline path: the key must not
    change between them, or the first binding is never reused."""
    torch = pytest.importorskip("torch")
    from graphdnn.runtime.bind_cache import pack_key

    pack = {"x": torch.zeros(4, 3), "y": torch.zeros(4, 3)}
    first = pack_key(pack, None, None)
    assert first is not None and pack_key(pack, None, None) == first
