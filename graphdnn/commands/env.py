"""``graphdnn env``: what a bug report needs about this machine, with or without a GPU.

graphdnn's version, Python, the versions of the packages graphdnn compiles and runs with,
NVRTC and its headers, the CUDA driver and each GPU, the plan cache (and remote cache,
not contacted) and the GRAPHDNN_* settings. Nothing here fails for a missing piece: each line says what is absent and why.
"""

from __future__ import annotations

import argparse
import os
import platform
from importlib import metadata
from typing import Any

from ..arch import arch_name
from ..cache.plan_cache import default_directory
from ..cache.remote import remote_from_env
from ..errors import GraphError
from ..names import printable
from ..runtime import driver
from ..version import __version__

PACKAGES = (
    "numpy",
    "cuda-core",
    "cuda-bindings",
    "cuda-pathfinder",
    "nvidia-cuda-nvrtc",
    "nvidia-cuda-runtime",
    "torch",
    "redis",
)


def add(commands: Any) -> None:
    parser = commands.add_parser("env", help="print versions, NVRTC, driver, GPUs and settings (for bug reports)")
    parser.set_defaults(run=_env)


def report() -> list[tuple[str, str]]:
    """(what, value) rows, in the order printed."""
    rows = [
        ("graphdnn", __version__),
        ("python", f"{platform.python_version()} ({platform.python_implementation()}, {platform.platform()})"),
    ]
    rows += [(name, _installed(name)) for name in PACKAGES]
    rows += _toolchain() + _gpus()
    rows.append(("plan cache", str(default_directory())))
    try:
        remote = remote_from_env()
        rows.append(("remote cache", remote.describe() if remote is not None else "none"))
    except GraphError as error:
        rows.append(("remote cache", f"misconfigured: {error}"))
    rows += sorted((name, value) for name, value in os.environ.items() if name.startswith("GRAPHDNN_"))
    return rows


def _env(args: argparse.Namespace) -> int:
    rows = report()
    width = max(len(what) for what, _ in rows)
    for what, value in rows:
        print(f"{what.ljust(width)}  {printable(value)}")
    return 0


def _installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _toolchain() -> list[tuple[str, str]]:
    from codegen.nvrtc import include_paths, options_key

    from ..cache.key import headers_version, nvrtc_version

    rows = []
    for what, ask in (
        ("NVRTC", nvrtc_version),
        ("CUDA headers", lambda: f"{', '.join(include_paths())} ({headers_version()})"),
    ):
        try:
            rows.append((what, ask()))
        except (GraphError, ImportError, OSError) as error:
            rows.append((what, f"unavailable: {error}"))
    rows.append(("NVRTC options", options_key()))
    return rows


def _gpus() -> list[tuple[str, str]]:
    """The driver's CUDA version and each device; 'none' with the reason where there is no driver."""
    try:
        api = driver.api()
        version = driver.call(api.cuDriverGetVersion)
        count = driver.call(api.cuDeviceGetCount)
        rows = [("CUDA driver", f"{version // 1000}.{version % 1000 // 10}")]
        for device in map(driver.device, range(count)):
            rows.append((f"GPU {device.ordinal}", f"{device.name} ({arch_name(device.arch)})"))
    except driver.CudaError as error:
        return [("CUDA driver", f"none ({error})")]
    return rows if count else [*rows, ("GPU", "none")]
