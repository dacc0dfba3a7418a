"""Rotary position embeddings folded into attention (the ``rotary_attention`` fusion rule): the
flash and Hopper kernels rotate their Q tile in shared memory once it has landed
(:func:`q_rotation`, once per Q tile, before the first S = Q Kᵀ); K, which every Q tile of a
head reads, is rotated once by a pre-pass kernel into the fused node's scratch, which the
attention kernel reads in place of K (Q too, for the decode and SIMT kernels).

The pre-pass reads each rotated operand once and writes it once (packed [B, H, S, D], the
operand's type), in one launch for both: RoPE written from primitives runs as a slice, a slice
and a concatenate (three data-movement kernels) and an elementwise kernel per operand, which read
and write it about seven times. Each thread takes one pair (d, d + D/2) of a row: the angle
``s * expf(i * (-2 ln(theta) / D))`` in float, as the unfused graph computes it, precise
``sincosf`` (angles reach the sequence length, where ``__sincosf`` loses digits), the rotation in
float, rounded to the operand's type (graphdnn/ops/rotary.py defines it); the prologue's
rotation is the same arithmetic. The Hopper kernel reads the scratch by TMA maps of it
(KernelParams.scratch_map), the others by pointer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.layout import packed_strides
from graphdnn.ops.attention import ROTARY_TABLES, RotarySdpaAttributes

from ..context import EmitContext, KernelParams, indent, kernel_source
from ..cuda_types import cuda_type, load
from ..indexing import offset_at
from ..kernel import FusedProgram, Kernel, Scratch
from ..pointwise import literal
from .attention_problem import Attention, coordinates

THREADS = 256


@dataclasses.dataclass(frozen=True)
class RotaryPrepass:
    """The pre-pass kernel, its scratch, and the problem as the attention kernel reads it."""

    kernel: Kernel | None  # None: the attention kernel rotates Q, and K needs none
    scratch: tuple[Scratch, ...]
    attention: Attention

    def around(self, program: FusedProgram) -> FusedProgram:
        """``program`` (the attention's kernels) after the pre-pass."""
        first = () if self.kernel is None else (self.kernel,)
        return FusedProgram(program.fused, (*first, *program.kernels), (*self.scratch, *program.scratch))


def rotary_prepass(
    fused: FusedNode, ctx: EmitContext, a: Attention, q_in_kernel: bool, k_in_kernel: bool
) -> RotaryPrepass | None:
    """The pre-pass of an sdpa anchor with RoPE folded in; None for a plain sdpa. A kernel that
    rotates Q in its prologue (``q_in_kernel``: :func:`q_rotation`) takes Q's RoPE by theta, as
    ``rotary_q_theta`` of the problem returned; one that rotates K as its keys land
    (``k_in_kernel``: :func:`decode_k_rotation`) K's, as ``rotary_k_theta``; the pre-pass has no
    kernel when nothing is left."""
    attrs = a.node.attributes
    if not isinstance(attrs, RotarySdpaAttributes):
        return None
    params = KernelParams()
    declared: dict[int, str] = {}

    def pointer(tensor: Tensor) -> str:
        if tensor.id not in declared:
            declared[tensor.id] = params.tensor(tensor)
        return declared[tensor.id]

    rotated: dict[str, str] = {}
    blocks: list[str] = []
    scratch: list[Scratch] = []
    begin = 0

    def by_theta(role: str, on: bool, in_kernel: bool) -> float | None:
        tables = a.node.input(ROTARY_TABLES[role][0]) is not None
        return attrs.rotary_theta if on and in_kernel and not tables else None

    q_theta, k_theta = by_theta("Q", attrs.rotary_q, q_in_kernel), by_theta("K", attrs.rotary_k, k_in_kernel)
    for role, on in (("Q", attrs.rotary_q and q_theta is None), ("K", attrs.rotary_k and k_theta is None)):
        tensor = a.q if role == "Q" else a.k
        if not on:
            continue
        target = params.scratch(f"rotary_{role.lower()}", cuda_type(tensor.data_type))
        cos, sin = (a.node.input(name) for name in ROTARY_TABLES[role])
        if cos is not None and sin is not None:
            factors = _tabled(cos, pointer(cos), sin, pointer(sin), attrs.rotary_negated)
        else:
            factors = _angles(attrs.rotary_theta, a.d)
        pairs = tensor.static_numel // 2
        blocks += _rotate(tensor, pointer(tensor), target, begin, pairs, factors)
        begin += pairs
        scratch.append(Scratch(target, tensor.static_numel * tensor.data_type.itemsize))
        rotated[role] = target
    a = dataclasses.replace(a, rotary_q_theta=q_theta, rotary_k_theta=k_theta)
    if not rotated:
        return RotaryPrepass(None, (), a)
    body = [
        f"const long long p = (long long)blockIdx.x * {THREADS} + threadIdx.x;  // one pair (d, d + D/2) of a row",
        *blocks,
    ]
    name, source = kernel_source(ctx, fused, "rope_prepass", params, THREADS, indent(body, 1))
    grid = (-(-begin // THREADS), 1, 1)
    kernel = Kernel(name, source, grid, (THREADS, 1, 1), 0, tuple(params.bindings))
    packed = {role.lower(): _packed(a.q if role == "Q" else a.k) for role in rotated}
    return RotaryPrepass(kernel, tuple(scratch), dataclasses.replace(a, **packed, rotated=rotated))  # type: ignore[arg-type]


def q_rotation(a: Attention, rows: int, position: str, threads: int, thread: str) -> list[str]:
    """A kernel's prologue rotating its Q tile in shared memory (``q_at(r, c)``, a ``T&`` to row
    r, column c of the tile, which the kernel defines), once per tile, before the first S = Q Kᵀ:
    ``threads`` threads (this one ``thread``) take the pairs (c, c + D/2) of ``rows`` rows, row r
    at sequence position ``position`` (a C expression of r). The pre-pass's arithmetic. Nothing
    unless the problem's ``rotary_q_theta`` asks for it; the kernel synchronises after."""
    if a.rotary_q_theta is None:
        return []
    half = a.d // 2
    return [
        f"// RoPE on Q (theta {a.rotary_q_theta:g}), in place: pairs (c, c + {half}) of {rows} rows",
        f"for (int pair = {thread}; pair < {rows * half}; pair += {threads}) {{",
        f"  const int r = pair / {half}, i = pair % {half};",
        *(f"  {line}" for line in _sincos(position, a.rotary_q_theta, a.d)),
        "  T& first = q_at(r, i);",
        f"  T& second = q_at(r, i + {half});",
        *(f"  {line}" for line in _turn("first", "second", "T")),
        "}",
    ]


def hopper_q_rotation(a: Attention, barrier: int) -> list[str]:
    """The Hopper kernel's (attention_wgmma.py) RoPE on a consumer's 64 rows of the Q tile, in the
    128-byte-swizzle layout, where asked (:func:`q_rotation`): the generic-proxy stores fenced
    before wgmma reads the tile, the consumer's warps joined at named barrier ``barrier`` +
    consumer."""
    position = coordinates(a, "Q", "h", "row0 + consumer * 64 + r", "0")[2]
    rotation = q_rotation(a, 64, position, 128, "(tid & 127)")
    if not rotation:
        return []
    return [
        "auto q_at = [&](int r, int c) -> T& {  // row consumer * 64 + r, column c of the swizzled Q tile",
        "  const int row = consumer * 64 + r;",
        "  const unsigned at = q_tile + (c >> 6) * (BM * 128) + row * 128 + ((((c >> 3) & 7) ^ (row & 7)) << 4) + (c & 7) * 2;",
        "  return *reinterpret_cast<T*>(smem_raw + (at - smem_addr(smem_raw)));",
        "};",
        *rotation,
        'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");',
        f'asm volatile("bar.sync %0, 128;\\n" ::"r"({barrier} + consumer) : "memory");  // this consumer\'s Q is rotated',
    ]


def rotated_load(a: Attention, name: str, position: str, value: str) -> list[str]:
    """``name(rr, d)``: Q's element ``value`` (a C expression of rr and d) rotated by RoPE, row rr
    at sequence position ``position``, for a kernel that reads Q element by element (the
    tensor-core decode kernel); the pre-pass's arithmetic. Nothing unless the problem's
    ``rotary_q_theta`` asks for it."""
    if a.rotary_q_theta is None:
        return []
    half = a.d // 2
    return [
        f"auto {name} = [&](int rr, int d) -> float {{  // RoPE on Q (theta {a.rotary_q_theta:g}) as it is read",
        f"  const int i = d % {half};",
        f"  const float x = {value};",
        f"  const float partner = [&](int d) -> float {{ return {value}; }}(d < {half} ? d + {half} : d - {half});",
        *(f"  {line}" for line in _sincos(position, a.rotary_q_theta, a.d)),
        f"  return d < {half} ? x * cs - partner * sn : x * cs + partner * sn;",
        "};",
    ]


def decode_k_rotation(a: Attention) -> list[str]:
    """The tensor-core decode kernel's (attention_decode_mma.py) RoPE on the keys of a warp's
    batch once they have landed in its ring (stage ``stage``, keys ``key0`` on), in place, before
    the first ldmatrix reads them: each block reads its keys once, so nothing is rotated twice
    and K never makes a pass of its own. Lane l takes the pairs (i, i + D/2) with i = l + 32 u of
    every key (its inverse frequencies once per batch); the pre-pass's arithmetic. Nothing
    unless the problem's ``rotary_k_theta`` asks for it."""
    if a.rotary_k_theta is None:
        return []
    half = a.d // 2
    return [
        f"// RoPE on K (theta {a.rotary_k_theta:g}), in place: this lane's pairs (i, i + {half}) of each key",
        "#pragma unroll",
        f"for (int u = 0; u < {-(-half // 32)}; ++u) {{",
        "  const int i = lane + 32 * u;",
        f"  if (i >= {half}) break;",
        f"  const float inverse = expf((float)i * {_exponent(a.rotary_k_theta, a.d)});",
        "  for (int key = 0; key < KEYS; ++key) {",
        "    TK* const row = k_ring + (stage * KEYS + key) * KROW;",
        "    float sn, cs;",
        "    sincosf((float)(key0 + key) * inverse, &sn, &cs);",
        *(f"    {line}" for line in _turn("row[i]", "row[i + D / 2]", "TK")),
        "  }",
        "}",
        "__syncwarp();  // the rotated keys, for every lane's ldmatrix",
    ]


def _turn(first: str, second: str, t: str) -> list[str]:
    """The pair (``first``, ``second``), elements of type ``t``, turned in place by the angle whose
    sine and cosine are ``sn``, ``cs``: RoPE's rotation of columns (i, i + D/2)."""
    return [
        f"const float x1 = gd::to<float>({first}), x2 = gd::to<float>({second});",
        f"{first} = gd::from<{t}>(x1 * cs - x2 * sn);",
        f"{second} = gd::from<{t}>(x2 * cs + x1 * sn);",
    ]


def _sincos(position: str, theta: float, d: int) -> list[str]:
    """``sn``, ``cs``: the sine and cosine of RoPE's angle for frequency ``i`` at ``position``, in
    float as the unfused graph computes it (precise sincosf: the angles reach the positions)."""
    return ["float sn, cs;", f"sincosf((float)({position}) * expf((float)i * {_exponent(theta, d)}), &sn, &cs);"]


def _exponent(theta: float, d: int) -> str:
    """-2 ln(theta) / D as a float literal: frequency i turns theta^(-2i/D) radians per position."""
    return literal(-2.0 * math.log(theta) / d, "float")


def _packed(tensor: Tensor) -> Tensor:
    """The operand as the pre-pass writes it: row-major [B, H, S, D]."""
    return dataclasses.replace(tensor, stride=packed_strides(tensor.static_dim))


def _angles(theta: float, d: int) -> Callable[[str], list[str]]:
    """RoPE's factors from theta: ``cos1, sin1`` for column i, ``cos2, sin2`` for i + D/2
    (``sin1 = -sin``: the first half takes ``-x2 sin``), at position s."""

    def factors(second: str) -> list[str]:
        return [*_sincos("s", theta, d), "const float cos1 = cs, sin1 = -sn, cos2 = cs, sin2 = sn;"]

    return factors


def _tabled(cos: Tensor, cos_name: str, sin: Tensor, sin_name: str, negated: bool) -> Callable[[str], list[str]]:
    """RoPE's factors read from the cos and sin tables (broadcast against [S, D]) at position s,
    columns i and ``second``; the sin of the first half negated where the graph swaps to [-x2, x1]."""

    def at(table: Tensor, name: str, column: str) -> str:
        coordinates = ["0", "0", "(long long)s", column][4 - len(table.dim) :]  # leading dims are 1
        return load(table.data_type, f"{name}[{offset_at(table, coordinates)}]")

    def factors(second: str) -> list[str]:
        sign = "-" if negated else ""
        return [
            f"const float cos1 = {at(cos, cos_name, 'i')}, sin1 = {sign}{at(sin, sin_name, 'i')};",
            f"const float cos2 = {at(cos, cos_name, second)}, sin2 = {at(sin, sin_name, second)};",
        ]

    return factors


def _rotate(
    tensor: Tensor, source: str, target: str, begin: int, pairs: int, factors: Callable[[str], list[str]]
) -> list[str]:
    """Pairs ``begin`` to ``begin + pairs`` of the launch: one pair of ``tensor`` each."""
    _, heads, positions, d = tensor.static_dim
    half = d // 2
    t = cuda_type(tensor.data_type)
    column = ["(long long)bb", "(long long)hh", "(long long)s", "i"]
    x1 = load(tensor.data_type, f"{source}[{offset_at(tensor, column)}]")
    x2 = load(tensor.data_type, f"{source}[{offset_at(tensor, [*column[:3], f'i + {half}'])}]")
    out = f"{target}[(((long long)bb * {heads} + hh) * {positions} + s) * {d} + i"
    return [
        f"if (p >= {begin} && p < {begin + pairs}) {{",
        *indent(
            [
                f"const long long pair = p - {begin}, row = pair / {half};",
                f"const int i = (int)(pair % {half}), s = (int)(row % {positions});",
                f"const int hh = (int)((row / {positions}) % {heads}), bb = (int)(row / {positions} / {heads});",
                *factors(f"i + {half}"),
                f"const float x1 = {x1}, x2 = {x2};",
                f"{out}] = gd::from<{t}>(x1 * cos1 + x2 * sin1);",
                f"{out} + {half}] = gd::from<{t}>(x2 * cos2 + x1 * sin2);",
            ],
            1,
        ).splitlines(),
        "}",
    ]
