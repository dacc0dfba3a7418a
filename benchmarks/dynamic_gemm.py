"""A dynamic matmul's plan (one plan for rows 1..max) against the static plan of each shape, and
the host cost of its per-call tensor maps.

    PYTHONPATH=. python benchmarks/dynamic_gemm.py            # on an sm_90 GPU

For each (hidden, rows): the dynamic plan and the static plan of that shape (both heuristic
choices), bound to the same bf16 buffers, checked against torch's product, timed as medians of
CUDA events (triton's do_bench, L2 flushed); cuBLAS (torch) as the peer. Then the host side of
the tensor maps: one cuTensorMapEncodeTiled through the bindings, a bind at a new shape (maps
encoded) and at a shape seen before (maps from the cache), and a bound call's enqueue cost,
dynamic against static. Prints one JSON line per measurement.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks.measure import host_us_per_call, median_us  # noqa: E402
from graphdnn.runtime import tensor_map  # noqa: E402

SHAPES = {1024: (16384, (1, 7, 64, 129, 1531, 4096, 16384)), 4096: (8192, (1, 64, 1531, 8192))}


def graph(hidden: int, rows: int, max_rows: int = 0) -> gd.OperationGraphSpec:
    """[rows, hidden] @ [hidden, hidden] in bf16; with ``max_rows`` the rows are a symbol."""
    g = gd.OperationGraphSpec(f"proj_{hidden}_{'dyn' if max_rows else rows}", io_data_type="bf16")
    m = g.dim("rows", 1, max_rows) if max_rows else rows
    g.matmul(g.tensor(name="a", dim=[m, hidden]), g.tensor(name="b", dim=[hidden, hidden])).set_name("y").set_output(
        True
    )
    return g


def _bench(hidden: int, top: int, rows_list: tuple[int, ...]) -> None:
    import torch

    start = time.perf_counter()
    dynamic = gd.compile(graph(hidden, 1, top))
    build_s = time.perf_counter() - start
    print(json.dumps({"hidden": hidden, "max_rows": top, "dynamic_build_s": round(build_s, 2)}), flush=True)
    b = torch.randn(hidden, hidden, device="cuda", dtype=torch.bfloat16) / hidden**0.5
    for rows in rows_list:
        a = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(rows, hidden, device="cuda", dtype=torch.bfloat16)
        expected = (a.float() @ b.float()).to(torch.bfloat16).float()
        row: dict[str, Any] = {"hidden": hidden, "rows": rows}
        try:  # one broken shape must not hide the others' numbers
            static = gd.compile(graph(hidden, rows))
            for key, plan in (("static", static), ("dynamic", dynamic)):
                bound = plan.bind({"a": a, "b": b, "y": y})
                y.fill_(float("nan"))
                bound()
                torch.cuda.synchronize()
                error = float((y.float() - expected).norm() / expected.norm())
                assert error < 1e-2, f"{key} plan at rows {rows}: relative error {error:.3g}"
                row[f"{key}_us"] = round(median_us(bound), 2)
                row[f"{key}_kernels"] = [launch.name.rsplit("_", 1)[0] for launch in bound.launches]
            row["dynamic_over_static"] = round(row["dynamic_us"] / row["static_us"], 3)
            row["cublas_us"] = round(median_us(lambda a=a, y=y: torch.matmul(a, b, out=y)), 2)
        except Exception as error:
            row["failure"] = f"{type(error).__name__}: {str(error)[:300]}"
        print(json.dumps(row), flush=True)


def _host_cost() -> None:
    """Microseconds per encoding, per bind (new shape / seen shape) and per bound call."""
    import torch

    hidden, top = 1024, 16384
    dynamic, static = gd.compile(graph(hidden, 1, top)), gd.compile(graph(hidden, 1531))
    a = torch.randn(top, hidden, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(hidden, hidden, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(top, hidden, device="cuda", dtype=torch.bfloat16)
    pack = {"a": a[:1531], "b": b, "y": y[:1531]}
    bound = dynamic.bind(pack)
    a_map = next(arg.tensor_map for arg in bound.launches[0].args if arg.tensor_map is not None)  # A's, resolved
    address = a.data_ptr()
    calls = 200
    start = time.perf_counter()
    for _ in range(calls):
        tensor_map.encoded.__wrapped__(a_map, address)
    encode_us = (time.perf_counter() - start) / calls * 1e6
    start = time.perf_counter()
    for rows in range(1, calls + 1):  # a new shape each time: its A map is encoded
        dynamic.bind({"a": a[:rows], "b": b, "y": y[:rows]})
    bind_new_us = (time.perf_counter() - start) / calls * 1e6
    start = time.perf_counter()
    for rows in range(1, calls + 1):  # the same shapes again: every map from the cache
        dynamic.bind({"a": a[:rows], "b": b, "y": y[:rows]})
    bind_seen_us = (time.perf_counter() - start) / calls * 1e6
    start = time.perf_counter()
    for _ in range(calls):
        static.bind(pack)
    bind_static_us = (time.perf_counter() - start) / calls * 1e6
    static_bound = static.bind(pack)
    row = {
        "encode_us": round(encode_us, 2),
        "bind_new_shape_us": round(bind_new_us, 1),
        "bind_seen_shape_us": round(bind_seen_us, 1),
        "bind_static_us": round(bind_static_us, 1),
        "bound_call_dynamic_us": round(host_us_per_call(bound), 2),
        "bound_call_static_us": round(host_us_per_call(static_bound), 2),
        "execute_dynamic_us": round(host_us_per_call(lambda: dynamic.execute(pack), 500), 2),
        "execute_static_us": round(host_us_per_call(lambda: static.execute(pack), 500), 2),
    }
    print(json.dumps(row), flush=True)


def main() -> int:
    import torch

    print(json.dumps({"device": torch.cuda.get_device_name()}), flush=True)
    (first, (top, rows_list)), *rest = SHAPES.items()
    _bench(first, top, rows_list)
    _host_cost()
    for hidden, (top, rows_list) in rest:
        _bench(hidden, top, rows_list)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
