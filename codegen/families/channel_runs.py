"""What the depthwise and small-group convolution kernels share: NHWC tensors read in 16-byte
runs of channels whose groups line up (K = C, G channels a group dividing the run), a filter
staged per block in shared memory, a resident grid (gemm_grouped_conv.py: forward;
direct_conv_runs.py: the gradients)."""

from __future__ import annotations

from graphdnn.arch import sm_count
from graphdnn.dtypes import DataType
from graphdnn.errors import UnsupportedError
from graphdnn.ir import Tensor

VECTOR_BYTES = 16
TYPES = frozenset({DataType.HALF, DataType.BFLOAT16, DataType.FLOAT})
STAGED_BYTES = 48 * 1024  # a filter up to this size is staged in shared memory (static: any arch)
RESIDENT_BLOCKS = 8  # blocks of 256 threads per SM at full occupancy
STAGE_BATCH = 8  # filter elements a thread loads before storing them to shared memory
MAX_TILES = 4  # the tensor-core kernels' 16-pixel tiles a warp loads before their products


def run_width(data_type: DataType) -> int:
    """Channels in a 16-byte run."""
    return VECTOR_BYTES // data_type.itemsize


def lines_up(image: Tensor, filter: Tensor) -> bool:
    """A static image of fp16, bf16 or fp32 with its channels contiguous, C = K channels in
    groups of G dividing the run (C > G), C and the image's other strides multiples of it."""
    if image.symbols or filter.symbols or image.data_type not in TYPES:
        return False
    vec = run_width(image.data_type)
    channels, group = image.static_dim[1], filter.static_dim[1]
    if not (filter.static_dim[0] == channels and channels > group and vec % group == 0 and channels % vec == 0):
        return False
    return image.static_stride[1] == 1 and all(s % vec == 0 for axis, s in enumerate(image.static_stride) if axis != 1)


def stages(filter: Tensor) -> bool:
    return filter.static_numel * filter.data_type.itemsize <= STAGED_BYTES


def resident_grid(runs: int, threads: int, arch: int, per_sm: int = RESIDENT_BLOCKS) -> int:
    """Blocks for ``runs`` items of one thread each, at most a resident grid of ``per_sm``
    blocks per SM: each block stages the filter once, then walks several runs."""
    return min(max(1, -(-runs // threads)), sm_count(arch) * per_sm)


def staged_filter(element: str, numel: int, indices: str, source: str, comment: str = "") -> list[str]:
    """Statements copying the filter into ``__shared__ filter[numel]``: ``indices`` declares
    the coordinates of element ``i`` in the staged order, ``source`` reads the filter there.
    A thread loads STAGE_BATCH elements before it stores any: a copy of one element at a time
    waits for each load (a 36 KiB filter, 72 loads a thread, cost a block about as long as
    its share of the convolution)."""
    return [
        f"__shared__ __align__(16) {element} filter[{numel}];{comment}",
        f"for (int first = threadIdx.x; first < {numel}; first += {STAGE_BATCH} * blockDim.x) {{",
        f"  {element} held[{STAGE_BATCH}];",
        "  #pragma unroll",
        f"  for (int b = 0; b < {STAGE_BATCH}; ++b) {{",
        "    const int i = first + b * blockDim.x;",
        f"    if (i >= {numel}) break;",
        f"    const int {indices};",
        f"    held[b] = {source};",
        "  }",
        "  #pragma unroll",
        f"  for (int b = 0; b < {STAGE_BATCH}; ++b) {{",
        "    const int i = first + b * blockDim.x;",
        f"    if (i >= {numel}) break;",
        "    filter[i] = held[b];",
        "  }",
        "}",
        "__syncthreads();",
    ]


# The autotuning candidates of a layer the tensor-core kernels take: the kernel over runs (its
# defaults), then the tensor-core one at 2 and 1 tiles a warp.
MMA_CANDIDATES: tuple[dict[str, object], ...] = ({"mma": 0}, {"mma": 1}, {"mma": 1, "tiles": 1})


def mma_choices(
    tuning: dict[str, object], what: str, node: str, takes: bool, by_default: bool, defaults: tuple[int, int, int]
) -> tuple[int, int, int] | None:
    """(``tiles``, ``blocks_per_sm``, ``stages``) of a tensor-core kernel (grouped_conv_mma,
    wgrad_mma) where the tuning says ``mma``: 1, or untuned where ``by_default``; None for the
    kernel over runs. ``takes``: whether the tensor-core kernel takes the convolution (fp16/bf16,
    2-d, its tile in shared memory); ``what`` names the tuning in errors, ``node`` the node."""
    wanted = tuning.get("mma", int(not tuning and by_default and takes))
    if wanted not in (0, 1) or (wanted and not takes):
        raise UnsupportedError(
            f"{what} tuning {tuning}: 'mma' is 0 or 1, 1 only for 2-d fp16 and bf16 whose tile fits in shared memory",
            node=node,
        )
    if not wanted:
        return None
    names = ("tiles", "blocks_per_sm", "stages")
    values = [tuning.get(name, default) for name, default in zip(names, defaults)]
    checked = [v for v, high in zip(values, (MAX_TILES, RESIDENT_BLOCKS, 2)) if isinstance(v, int) and 1 <= v <= high]
    if set(tuning) - {"mma", *names} or len(checked) < len(names):
        raise UnsupportedError(
            f"{what} tuning {tuning}: with 'mma' the choices are 'tiles' (1..{MAX_TILES}), "
            f"'blocks_per_sm' (1..{RESIDENT_BLOCKS}) and 'stages' (1..2)",
            node=node,
        )
    return checked[0], checked[1], checked[2]
