"""Host cost of ``plan.execute`` against a bound call, for a one-kernel plan (issue 8).

    PYTHONPATH=. python benchmarks/execute_cost.py                # on a GPU, torch tensors
    PYTHONPATH=. python benchmarks/execute_cost.py --cupy         # on a GPU, CuPy arrays (float32)
    PYTHONPATH=. python benchmarks/execute_cost.py --fake-driver  # anywhere: the Python side only

Rows (µs per call, the GPU waited for at the end): a bound call; ``execute`` on the same
pack (its binding reused); ``execute`` on new tensor objects over the same memory each
call (reused too: bindings are keyed by memory and layout, not identity); bind and call
each time (every check and all packing: what ``execute`` cost before); ``execute`` in
place (the output over the input). benchmarks/run.py records the cuDNN frontend's execute beside them.
With ``--cupy`` the buffers are CuPy arrays (the graph in float32: CuPy has no bf16), and
two more rows bind each call the objects cuda.core's StridedMemoryView reads one way
only: through ``__cuda_array_interface__`` alone, and through DLPack alone.
With ``--fake-driver`` the driver is a stand-in (tests/fake_gpu.py) and buffers are
DeviceArrays: nothing reaches a GPU, and the times are graphdnn's Python alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402

DIMS = [8, 1024]


def graph(io_data_type: str = "bf16") -> gd.OperationGraphSpec:
    """y = relu(x + b): one elementwise kernel, three buffers."""
    g = gd.OperationGraphSpec(name="execute_cost", io_data_type=io_data_type)
    x = g.tensor(name="x", dim=DIMS)
    b = g.tensor(name="b", dim=[1, DIMS[1]])
    g.relu(g.add(x, b)).set_name("y").set_output(True)
    return g


def per_call_us(fn: Callable[[], object], synchronize: Callable[[], object], calls: int, rounds: int = 5) -> float:
    """The best of ``rounds`` loops of ``calls`` calls, per call (other processes only add time)."""
    for _ in range(50):
        fn()
    synchronize()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake-driver", action="store_true", help="no GPU: a stand-in driver, DeviceArray buffers")
    parser.add_argument("--cupy", action="store_true", help="CuPy arrays, a float32 graph")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    if args.fake_driver:
        import pytest

        from tests import fake_gpu

        with pytest.MonkeyPatch.context() as patch:
            fake_gpu.install(patch)
            plan = gd.compile(graph(), arch="sm_90", cache=None)
            return report(plan, *device_array_buffers(plan), lambda: None, args.calls)
    if args.cupy:
        import cupy

        plan = gd.compile(graph("float"))
        pack, renewed = cupy_buffers(plan)
        sync = cupy.cuda.runtime.deviceSynchronize
        one_way = {
            "bind + call each time, __cuda_array_interface__-only objects": {
                name: InterfaceOnly(value) for name, value in pack.items()
            },
            "bind + call each time, DLPack-only objects": {name: DLPackOnly(value) for name, value in pack.items()},
        }
        extra = {row: per_call_us(lambda p=p: plan.bind(p)(), sync, args.calls // 5) for row, p in one_way.items()}
        return report(plan, pack, renewed, sync, args.calls, extra)
    import torch

    plan = gd.compile(graph())
    return report(plan, *torch_buffers(plan), torch.cuda.synchronize, args.calls)


class InterfaceOnly:
    """An array seen through ``__cuda_array_interface__`` alone."""

    def __init__(self, array: Any) -> None:
        self.__cuda_array_interface__ = array.__cuda_array_interface__
        self._array = array


class DLPackOnly:
    """An array seen through DLPack alone."""

    def __init__(self, array: Any) -> None:
        self._array = array

    def __dlpack__(self, **options: Any) -> Any:
        return self._array.__dlpack__(**options)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()


def cupy_buffers(plan: gd.Plan) -> tuple[dict[str, Any], Callable[[], dict[str, Any]]]:
    import cupy

    pack = {t.name: cupy.random.standard_normal(t.dim, dtype=cupy.float32) for t in (*plan.inputs, *plan.outputs)}
    return pack, lambda: {name: value.view() for name, value in pack.items()}


def torch_buffers(plan: gd.Plan) -> tuple[dict[str, Any], Callable[[], dict[str, Any]]]:
    from graphdnn.runtime.frameworks import empty_torch

    pack = {t.name: empty_torch(t).normal_() for t in (*plan.inputs, *plan.outputs)}
    return pack, lambda: {name: value.view_as(value) for name, value in pack.items()}


def device_array_buffers(plan: gd.Plan) -> tuple[dict[str, Any], Callable[[], dict[str, Any]]]:
    pack = {t.name: gd.DeviceArray(t.dim, t.stride, t.data_type) for t in (*plan.inputs, *plan.outputs)}
    return pack, lambda: dict(pack)  # DeviceArrays have no views: the same objects in a new dict


def report(
    plan: gd.Plan,
    pack: dict[str, Any],
    renewed: Callable[[], dict[str, Any]],
    sync: Callable[[], object],
    calls: int,
    extra: dict[str, float] | None = None,
) -> int:
    bound = plan.bind(pack)
    rows = {
        "bound call": per_call_us(bound, sync, calls),
        "execute, same pack": per_call_us(lambda: plan.execute(pack), sync, calls),
        "execute, new tensor objects over the same memory": per_call_us(lambda: plan.execute(renewed()), sync, calls),
        "bind + call each time (every check and all packing, as execute did before)": per_call_us(
            lambda: plan.bind(pack)(), sync, calls // 5
        ),
        "execute in place (y over x), same pack": per_call_us(
            lambda: plan.execute({**pack, "y": pack["x"]}), sync, calls
        ),
        **(extra or {}),
    }
    print(f"{len(plan.kernels)}-kernel plan {plan!r}, {calls} calls")
    for name, value in rows.items():
        print(f"  {name}: {value:.2f} µs per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
