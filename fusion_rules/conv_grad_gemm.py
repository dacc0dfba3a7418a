"""Which convolution gradients run as tensor-core GEMMs (codegen/families/gemm*.py), and how their
operands sit in memory; the others stay on the direct kernels (codegen/families/direct_conv.py).

The GEMM kernels copy their operands in 16-byte chunks of 8 consecutive 16-bit elements, so each
operand needs one axis of stride 1 whose extent is a multiple of 8, and every other stride a
multiple of 8 (the rules of convolution forward, gemm_problem.tensor_core_layout):

- dgrad (dx = implicit GEMM over dy and the filter): the loss's channels (K) contiguous; the
  filter with its input channels (C) contiguous (a KRSC filter: B is read n-contiguous, "kn") or
  its output channels contiguous (B k-contiguous, "nk");
- wgrad (dw = dy^T x over N*P*Q): the loss's channels contiguous (NHWC). The image is gathered
  in 16-byte chunks where its channels allow it (contiguous, a multiple of 8: ``image_chunked``),
  else element by element (any layout, any C: the 3-channel stem), which is slower per element
  but keeps the GEMM on the tensor cores (the direct kernel is ~70x slower than cuDNN there).

Both need groups = 1, fp16 or bf16 operands of one type (fp32 accumulation), and sm_80 or newer.
"""

from __future__ import annotations

from graphdnn.ir import Node, Tensor
from graphdnn.symbolic import show_ranges, symbols_of

from .pattern import MatchContext

CONV_GRADS = frozenset({"conv_dgrad", "conv_wgrad"})
_TENSOR_CORE_TYPES = frozenset({"half", "bfloat16"})
MIN_ARCH = 80  # cp.async and bf16 mma.sync


def operands(node: Node) -> tuple[Tensor, Tensor, Tensor]:
    """(A, B, output) of the gradient as a GEMM: (loss, filter, dx) or (loss, image, dw)."""
    roles = ("loss", "filter", "dx") if node.op == "conv_dgrad" else ("loss", "image", "dw")
    a, b = node.input(roles[0]), node.input(roles[1])
    out = node.output(roles[2])
    assert a is not None and b is not None and out is not None
    return a, b, out


def refusal(node: Node) -> str | None:
    """Why ``node`` (conv_dgrad / conv_wgrad) cannot take the tensor-core GEMM, or None."""
    a, b, out = operands(node)
    symbols = symbols_of(v for t in (a, b, out) for v in (*t.dim, *t.stride))
    if symbols:  # the direct family then refuses it, naming the node (codegen.emit.extents_refusal)
        return f"the gradient GEMMs take static shapes, and this one has symbolic dims ({show_ranges(symbols)})"
    if a.data_type.value not in _TENSOR_CORE_TYPES or b.data_type != a.data_type:
        return f"tensor cores take fp16 or bf16 operands of one type, not {a.data_type.value} and {b.data_type.value}"
    channels = out.static_dim[1] if node.op == "conv_dgrad" else b.static_dim[1]
    filter_channels = b.static_dim[1] if node.op == "conv_dgrad" else out.static_dim[1]
    if channels != filter_channels:
        return f"a grouped convolution ({channels // filter_channels} groups) stays on the direct kernel"
    # a wgrad's image is gathered whatever its layout (element by element where it must be)
    if node.op == "conv_wgrad" or _chunked(b, "filter", 1) is None or _chunked(b, "filter", 0) is None:
        return _chunked(a, "loss", 1)
    return f"{_chunked(b, 'filter', 1)}, or axis 0 (its output channels) likewise"


def b_layout(node: Node) -> str:
    """How the GEMM's B operand is laid out in shared memory: "kn" (n contiguous) or "nk" (k
    contiguous); a wgrad's image read in chunks and a KRSC filter are "kn", a wgrad's image
    gathered element by element (8 pixels of one column a chunk) and a filter with contiguous
    output channels "nk"."""
    _, b, _ = operands(node)
    if node.op == "conv_wgrad":
        return "kn" if image_chunked(node) else "nk"
    return "kn" if _chunked(b, "filter", 1) is None else "nk"


def image_chunked(node: Node) -> bool:
    """A wgrad's image reads in 16-byte chunks of 8 channels; else it is gathered element by
    element (codegen/families/gemm_wgrad_gather.py)."""
    _, image, _ = operands(node)
    return _chunked(image, "image", 1) is None


def tensor_core_conv_grad(ctx: MatchContext, node: Node) -> str | None:
    """Guard: the gradient takes the tensor-core GEMM on the target."""
    if ctx.arch < MIN_ARCH:
        return f"the tensor-core GEMM needs sm_{MIN_ARCH} or newer, the target is sm_{ctx.arch}"
    return refusal(node)


def _chunked(t: Tensor, role: str, axis: int) -> str | None:
    """``t`` reads in 16-byte chunks along ``axis``: stride 1, extent and other strides multiples of 8."""
    dims, strides = t.static_dim, t.static_stride
    if strides[axis] != 1 or dims[axis] % 8:
        return (
            f"{role} '{t.name}' needs axis {axis} contiguous with a multiple of 8 elements "
            f"(dims {list(dims)}, strides {list(strides)})"
        )
    if any(s % 8 for i, (d, s) in enumerate(zip(dims, strides)) if i != axis and d > 1):
        return f"{role} '{t.name}' needs strides that are multiples of 8 besides axis {axis} (strides {list(strides)})"
    return None
