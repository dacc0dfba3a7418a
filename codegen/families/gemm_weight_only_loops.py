"""How the weight-only tensor-core kernel (gemm_weight_only_mma.py) walks its work: the K loop
of its column tile (two register sets in ping-pong, or a cp.async ring in shared memory) and
the tile's end (its warps' partial tiles summed, then with K slices the sums of the cluster's
blocks).

The kernel defines, before these pieces: ``fetch(base, set or stage, scales...)`` (the loads
of a set of chunks), ``multiply(base, weights, scales...)``, ``acc``, ``partial``, ``first``
(the tile's first column), ``rank`` (the block's K slice) and the constants ROWS, N, TILES,
HALVES, WARPS, SPLIT, CHUNKS, STEP.
"""

from __future__ import annotations


def ring_bytes(launch: dict[str, int]) -> int:
    """Dynamic shared memory of the cp.async ring: STAGES sets of each thread's 16-byte loads."""
    return launch["stages"] * launch["unroll"] * launch["column_tiles"] * 2 * 32 * launch["warps"] * 16


def ring_setup(stages: int, warps: int) -> list[str]:
    """The ring's shared memory and a slot's index: each thread's own 16-byte slots."""
    return [
        f"constexpr int STAGES = {stages}, THREADS = {32 * warps};",
        "extern __shared__ __align__(128) unsigned char smem[];",
        "uint4* const ring = reinterpret_cast<uint4*>(smem);  // [STAGES][UNROLL][TILES][2][THREADS]",
        "auto SLOT = [](int stage, int u, int j, int h) {",
        "  return (((stage * UNROLL + u) * TILES + j) * 2 + h) * THREADS + threadIdx.x;",
        "};",
    ]


def ping_pong(pair: str, nz: bool, early: bool) -> list[str]:
    """One set of chunks in flight in registers while the other multiplies (conditions the
    same in every warp)."""
    za, zb = (", za", ", zb") if nz else ("", "")
    xa, xb = (", xa", ", xb") if early else ("", "")
    return [
        "uint4 wa[UNROLL][TILES][2], wb[UNROLL][TILES][2];",
        f"{pair} sa[UNROLL][TILES][2], sb[UNROLL][TILES][2];",
        *([f"{pair} za[UNROLL][TILES][2], zb[UNROLL][TILES][2];"] if nz else []),
        *(["uint4 xa[UNROLL][HALVES][PIECES], xb[UNROLL][HALVES][PIECES];"] if early else []),
        f"fetch(0, wa, sa{za}{xa});",
        "for (int c0 = 0; c0 < CHUNKS; c0 += 2 * STEP) {",
        f"  if (c0 + STEP < CHUNKS) fetch(c0 + STEP, wb, sb{zb}{xb});",
        f"  multiply(c0, wa, sa{za}{xa});",
        f"  if (c0 + 2 * STEP < CHUNKS) fetch(c0 + 2 * STEP, wa, sa{za}{xa});",
        f"  if (c0 + STEP < CHUNKS) multiply(c0 + STEP, wb, sb{zb}{xb});",
        "}",
    ]


def ring_loop(pair: str, stages: int, nz: bool) -> list[str]:
    """STAGES - 1 sets of chunks in flight through shared memory: each thread copies and reads
    back only its own slots (cp.async.wait_group orders them, no barrier); the sets' scales (and
    zero-point terms) ride in a register ring beside, the stage loop unrolled so that its
    indices are constants."""
    zr = ", zr[{}]" if nz else ""
    return [
        f"{pair} sr[STAGES][UNROLL][TILES][2];  // the scales of the sets in flight",
        *([f"{pair} zr[STAGES][UNROLL][TILES][2];"] if nz else []),
        "#pragma unroll",
        f"for (int s = 0; s < STAGES - 1; ++s) fetch(s * STEP, s, sr[s]{zr.format('s')});",
        "for (int c0 = 0; c0 < CHUNKS; c0 += STAGES * STEP) {",
        "  #pragma unroll",
        "  for (int s = 0; s < STAGES; ++s) {",
        "    const int base = c0 + s * STEP;",
        "    if (base < CHUNKS) {  // the same in every warp",
        # the memory clobber keeps the slot's read below the wait (no barrier does it here)
        f'      asm volatile("cp.async.wait_group {stages - 2};\\n" ::: "memory");',
        "      uint4 wv[UNROLL][TILES][2];",
        "      #pragma unroll",
        "      for (int u = 0; u < UNROLL; ++u)",
        "        #pragma unroll",
        "        for (int j = 0; j < TILES; ++j) wv[u][j][0] = ring[SLOT(s, u, j, 0)], wv[u][j][1] = ring[SLOT(s, u, j, 1)];",
        "      const int next = (s + STAGES - 1) % STAGES;  // the slot read one step ago",
        f"      fetch(base + (STAGES - 1) * STEP, next, sr[next]{zr.format('next')});",
        f"      multiply(base, wv, sr[s]{zr.format('s')});",
        "    }",
        "  }",
        "}",
    ]


def tile_end(target: str, value: str, sliced: bool) -> list[str]:
    """The end of the column tile at ``first``: the warps' partial tiles summed in warp order,
    ``target`` (at ``row``, ``n``) written with ``value`` of ``sum``, or with K slices the
    block's sums handed to the cluster (cluster_sum)."""
    return [
        "#pragma unroll",
        "for (int j = 0; j < TILES; ++j) {",
        "  #pragma unroll",
        "  for (int t = 0; t < HALVES; ++t) {",
        "    partial[warp][j * HALVES + t][lane] = make_float4(acc[j][t][0], acc[j][t][1], acc[j][t][2], acc[j][t][3]);",
        "  }",
        "}",
        "__syncthreads();",
        # one output per step: tile j, tokens half t, lane and register of the m16n8 accumulator fragment
        "for (int e = threadIdx.x; e < TILES * HALVES * 128; e += WARPS * 32) {",
        *_output_at("  "),
        "  float sum = 0.0f;",
        "  for (int v = 0; v < WARPS; ++v) sum += reinterpret_cast<const float*>(&partial[v][jt][from])[reg];",
        *(
            ["  sums_of(rank)[e] = sum;", "}", *cluster_sum(target, value)]
            if sliced
            else [f"  {target} = {value};", "}"]
        ),
    ]


def _output_at(depth: str) -> list[str]:
    """Output ``e`` of the tile at ``first``: its fragment (jt, from, reg), row and column n; a
    ``continue`` past the output."""
    lines = [
        "const int jt = e >> 7, from = (e >> 2) & 31, reg = e & 3;",
        "const int row = 8 * (jt % HALVES) + 2 * (from & 3) + (reg & 1);",
        "const long long n = first + 16 * (jt / HALVES) + (from >> 2) + 8 * (reg >> 1);",
        "if (row >= ROWS || n >= N) continue;",
    ]
    return [depth + line for line in lines]


def cluster_setup() -> list[str]:
    """The cluster's helpers: its barrier, and where rank r keeps its sums over its warps: the
    block's own shared memory, read by the others through sm_90's distributed shared memory.
    The CPU emulation runs one block at a time, a cluster's ranks in order, their statics
    shared: there each rank has its own row of ``block_sums``, and the barrier is nothing."""
    return [
        "#ifdef __CUDA_ARCH__",
        "constexpr int SLOTS = 1;",
        "#else",
        "constexpr int SLOTS = SPLIT;",
        "#endif",
        "__shared__ float block_sums[SLOTS][TILES * HALVES * 128];",
        "auto cluster_sync = [] {",
        "#ifdef __CUDA_ARCH__",
        '  asm volatile("barrier.cluster.arrive.release.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");',
        "#endif",
        "};",
        "auto sums_of = [&](int r) -> float* {",
        "#ifdef __CUDA_ARCH__",
        "  if (r == rank) return block_sums[0];",
        "  float* at;",
        '  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(at) : "l"(block_sums[0]), "r"(r));',
        "  return at;",
        "#else",
        "  return block_sums[r];",
        "#endif",
        "};",
    ]


def cluster_sum(target: str, value: str) -> list[str]:
    """The K slices' sums added in rank order by the cluster's last block (deterministic), which
    writes ``target``; the second barrier keeps every block's sums until they are read."""
    return [
        "cluster_sync();",
        "if (rank == SPLIT - 1) {",
        "  for (int e = threadIdx.x; e < TILES * HALVES * 128; e += WARPS * 32) {",
        *_output_at("    "),
        "    float part[SPLIT];",
        "    #pragma unroll",
        "    for (int r = 0; r < SPLIT; ++r) part[r] = sums_of(r)[e];",
        "    float sum = 0.0f;",
        "    #pragma unroll",
        "    for (int r = 0; r < SPLIT; ++r) sum += part[r];",
        f"    {target} = {value};",
        "  }",
        "}",
        "cluster_sync();",
    ]
