"""The plan-cache key: everything that decides what a compiled plan contains.

A key is the SHA-256 of its fields (:class:`KeyFields`), each printable with
``graphdnn cache key FILE``. Names, uids and declaration order are not fields: the graph
enters through its signature. Computing a key imports neither fusion_rules nor codegen's
emit stage: the codegen version is a hash of source files, read as bytes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from ..arch import arch_name
from ..ir import Graph
from ..signature import signature

FORMAT_VERSION = 1  # the layout of cache entries; bumping it retires every stored entry

# graphdnn modules whose contents shape the generated code or the stored program
# (inference decides dims and strides; lower and program decide the plan data).
_GRAPHDNN_SOURCES = ("ir.py", "dtypes.py", "layout.py", "validate.py", "lower.py", "program.py", "ops")
_PACKAGES = ("codegen", "fusion_rules")
_SOURCE_SUFFIXES = (".py", ".cuh", ".h")


@dataclass(frozen=True)
class KeyFields:
    """The inputs of a plan's compilation."""

    format: int  # FORMAT_VERSION
    signature: str  # the graph's canonical signature (graphdnn.signature)
    arch: str  # compilation target, e.g. sm_90
    codegen: str  # sha256 of the codegen, fusion_rules and code-shaping graphdnn sources
    nvrtc: str  # NVRTC version, e.g. 13.0
    headers: str  # the CUDA headers NVRTC compiles against, e.g. nvidia-cuda-runtime 13.0.96 (headers_version())
    options: str  # NVRTC compile options (codegen.nvrtc.options_key())
    disabled_rules: str  # fusion rules turned off for this build, sorted, comma-separated

    @property
    def key(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def kernel_key(self, content_hash: str) -> str:
        """The key of one compiled kernel: its source plus what compiles it (not the graph)."""
        text = json.dumps(
            [self.format, content_hash, self.arch, self.nvrtc, self.headers, self.options], separators=(",", ":")
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def tuned_key(self, gpu: str) -> str:
        """The key of the plan autotuned on GPU model ``gpu``: one per model, beside the untuned
        plan (``key``) that every GPU of the arch shares."""
        text = json.dumps([self.key, gpu], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def describe(self) -> str:
        fields = asdict(self)
        width = max(map(len, fields))
        lines = [f"{name.ljust(width)}  {value if value != '' else '(none)'}" for name, value in fields.items()]
        return "\n".join([*lines, f"{'key'.ljust(width)}  {self.key}"])


def key_fields(ir: Graph, arch: int, disable: Iterable[str] = (), graph_signature: str | None = None) -> KeyFields:
    """The key fields of compiling ``ir`` for sm_``arch`` (``graph_signature``: ``ir``'s, if already known)."""
    nvrtc, headers, options = toolchain()
    return KeyFields(
        format=FORMAT_VERSION,
        signature=graph_signature or signature(ir),
        arch=arch_name(arch),
        codegen=codegen_version(),
        nvrtc=nvrtc,
        headers=headers,
        options=options,
        disabled_rules=",".join(sorted(set(disable))),
    )


def toolchain() -> tuple[str, str, str]:
    """(NVRTC version, CUDA headers version, compile options). Reads codegen.nvrtc, which
    imports neither fusion_rules nor the emitters. The options are read each time
    (GRAPHDNN_LINEINFO)."""
    from codegen.nvrtc import options_key

    return nvrtc_version(), headers_version(), options_key()


@cache
def headers_version() -> str:
    """The version of the CUDA headers NVRTC compiles against (``codegen.nvrtc.include_paths()``).

    Where the nvidia-cuda-runtime wheel is installed, its headers are the ones found (the path
    finder looks at installed wheels before a CUDA toolkit), and the key holds the wheel's full
    version ('nvidia-cuda-runtime 13.0.96'): a patch release may change ``cuda_fp16.hpp`` and
    friends without changing the version macro. Reading it from the name of the wheel's
    dist-info directory costs half a millisecond, where importlib.metadata costs ten and
    finding the headers tens (a warm plan load pays this once per process). Otherwise (a CUDA
    toolkit's include directory) the ``CUDART_VERSION`` macro of its ``cuda_runtime_api.h``
    ('CUDART_VERSION 13000').
    """
    wheel = _nvidia_wheel_version("nvidia_cuda_runtime")
    if wheel is not None:
        return f"nvidia-cuda-runtime {wheel}"
    from codegen.nvrtc import CompileError, include_paths

    header = next((Path(d) / _HEADER for d in include_paths() if (Path(d) / _HEADER).is_file()), None)
    if header is None:
        raise CompileError(f"{_HEADER} not found in the CUDA include path {', '.join(include_paths())}")
    found = re.search(rb"^\s*#\s*define\s+CUDART_VERSION\s+(\d+)", header.read_bytes(), re.MULTILINE)
    if found is None:
        raise CompileError(f"{header} defines no CUDART_VERSION: cannot tell the CUDA headers' version")
    return f"CUDART_VERSION {found.group(1).decode()}"


_HEADER = "cuda_runtime_api.h"


@cache
def nvrtc_version() -> str:
    """NVRTC's version, 'major.minor'.

    Where the nvidia-cuda-nvrtc wheel is installed (the copy cuda.pathfinder, and so the
    compiler, loads first), read from the name of its builtins library: NVRTC X.Y loads
    ``libnvrtc-builtins.so.X.Y`` beside it. A plan loaded from the cache then neither
    imports cuda.bindings (about 0.1 s) nor loads NVRTC. Otherwise NVRTC is asked.
    """
    for builtins in _wheel_nvrtc_builtins():
        found = re.fullmatch(r"libnvrtc-builtins\.so\.(\d+)\.(\d+)", builtins.name)
        if found and any(builtins.parent.glob("libnvrtc.so.*")):
            return f"{found.group(1)}.{found.group(2)}"
    from codegen.nvrtc import nvrtc_version as asked

    return asked()


def _wheel_nvrtc_builtins() -> list[Path]:
    return sorted(path for root in _nvidia_roots() for path in root.glob("*/lib/libnvrtc-builtins.so.*"))


def _nvidia_wheel_version(project: str) -> str | None:
    """The version of NVIDIA's wheel ``project`` (normalised name) installed beside the
    ``nvidia`` namespace package, from its dist-info directory's name; None where there is none."""
    for root in _nvidia_roots():
        for info in sorted(root.parent.glob(f"{project}-*.dist-info")):
            return info.name[len(project) + 1 : -len(".dist-info")]
    return None


def _nvidia_roots() -> list[Path]:
    """The directories of the ``nvidia`` namespace package of NVIDIA's wheels."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(root) for root in spec.submodule_search_locations]


@cache
def codegen_version() -> str:
    """sha256 over the relative path and bytes of every source file that shapes generated code."""
    digest = hashlib.sha256()
    for label, path in _source_files():
        digest.update(label.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _source_files() -> list[tuple[str, Path]]:
    files: list[tuple[str, Path]] = []
    for package in _PACKAGES:
        spec = importlib.util.find_spec(package)  # locates without importing the package
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"package {package} not found: graphdnn's code generator is incomplete")
        files += _tree(package, Path(next(iter(spec.submodule_search_locations))))
    root = Path(__file__).resolve().parent.parent
    for name in _GRAPHDNN_SOURCES:
        path = root / name
        files += _tree(f"graphdnn/{name}", path) if path.is_dir() else [(f"graphdnn/{name}", path)]
    return sorted(files)


def _tree(label: str, directory: Path) -> list[tuple[str, Path]]:
    return [
        (f"{label}/{path.relative_to(directory).as_posix()}", path)
        for path in directory.rglob("*")
        if path.suffix in _SOURCE_SUFFIXES and "__pycache__" not in path.parts and path.is_file()
    ]
