"""How the weight-only tensor-core kernel (gemm_weight_only_mma.py) walks its work: the K loop
of a column tile (two register sets in ping-pong, or a cp.async ring in shared memory), the
walk over column tiles (one per cluster of blocks, or several: a resident grid), and each
tile's end (its warps' partial tiles summed, then with K slices the cluster's blocks' sums).

The kernel defines, before these pieces: ``fetch(first, base, set or stage, scales...)`` (the
loads of a set of chunks of the tile at column ``first``), ``multiply(base, weights,
scales...)``, ``acc``, ``partial``, and the constants ROWS, N, TILES, HALVES, WARPS, SPLIT,
CHUNKS, STEP, COLUMN_TILES, with ``cluster`` and ``clusters`` (column tiles cluster, cluster
+ clusters, ... are this block's).
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
    """Per column tile of the block: one set of chunks in flight in registers while the other
    multiplies (conditions the same in every warp), then the tile's end."""
    za, zb = (", za", ", zb") if nz else ("", "")
    xa, xb = (", xa", ", xb") if early else ("", "")
    return [
        "uint4 wa[UNROLL][TILES][2], wb[UNROLL][TILES][2];",
        f"{pair} sa[UNROLL][TILES][2], sb[UNROLL][TILES][2];",
        *([f"{pair} za[UNROLL][TILES][2], zb[UNROLL][TILES][2];"] if nz else []),
        *(["uint4 xa[UNROLL][HALVES][PIECES], xb[UNROLL][HALVES][PIECES];"] if early else []),
        "for (int tile = cluster; tile < COLUMN_TILES; tile += clusters) {",
        "  const long long first = (long long)tile * (16 * TILES);",
        f"  fetch(first, 0, wa, sa{za}{xa});",
        "  for (int c0 = 0; c0 < CHUNKS; c0 += 2 * STEP) {",
        f"    if (c0 + STEP < CHUNKS) fetch(first, c0 + STEP, wb, sb{zb}{xb});",
        f"    multiply(c0, wa, sa{za}{xa});",
        f"    if (c0 + 2 * STEP < CHUNKS) fetch(first, c0 + 2 * STEP, wa, sa{za}{xa});",
        f"    if (c0 + STEP < CHUNKS) multiply(c0 + STEP, wb, sb{zb}{xb});",
        "  }",
        "  finish(first);",
        "}",
    ]


def ring_stream(pair: str, stages: int, nz: bool) -> list[str]:
    """The block's column tiles as one stream of sets of chunks (step i: tile i / SPT, chunks
    from (i % SPT) * STEP), STAGES - 1 sets in flight through shared memory across the tiles'
    ends, so that a resident block's next tile loads while it sums the last. Each thread copies
    and reads back only its own slots (cp.async.wait_group orders them, no barrier); the sets'
    scales (and zero-point terms) ride in a register ring beside, the stage loop unrolled so
    that its indices are constants."""
    zr = ", zr[{}]" if nz else ""
    return [
        "constexpr int SPT = (CHUNKS + STEP - 1) / STEP;  // steps per column tile",
        "const int steps = (COLUMN_TILES - cluster + clusters - 1) / clusters * SPT;  // the same in the whole cluster",
        "auto first_of = [&](int i) { return (long long)(cluster + i / SPT * clusters) * (16 * TILES); };",
        f"{pair} sr[STAGES][UNROLL][TILES][2];  // the scales of the sets in flight",
        *([f"{pair} zr[STAGES][UNROLL][TILES][2];"] if nz else []),
        "#pragma unroll",
        f"for (int s = 0; s < STAGES - 1; ++s) fetch(first_of(s), s % SPT * STEP, s, sr[s]{zr.format('s')});",
        "for (int i0 = 0; i0 < steps; i0 += STAGES) {",
        "  #pragma unroll",
        "  for (int s = 0; s < STAGES; ++s) {",
        "    const int i = i0 + s, ahead = i + STAGES - 1;",
        "    if (i < steps) {",
        # the memory clobber keeps the slot's read below the wait (no barrier does it here)
        f'      asm volatile("cp.async.wait_group {stages - 2};\\n" ::: "memory");',
        "      uint4 wv[UNROLL][TILES][2];",
        "      #pragma unroll",
        "      for (int u = 0; u < UNROLL; ++u)",
        "        #pragma unroll",
        "        for (int j = 0; j < TILES; ++j) wv[u][j][0] = ring[SLOT(s, u, j, 0)], wv[u][j][1] = ring[SLOT(s, u, j, 1)];",
        "      const int next = (s + STAGES - 1) % STAGES;  // the slot read one step ago",
        f"      fetch(first_of(ahead), ahead % SPT * STEP, next, sr[next]{zr.format('next')});",
        f"      multiply(i % SPT * STEP, wv, sr[s]{zr.format('s')});",
        "      if (i % SPT == SPT - 1) finish(first_of(i));",
        "    }",
        "  }",
        "}",
    ]


def finish(target: str, value: str, sliced: bool) -> list[str]:
    """``finish(first)``: the end of the column tile at ``first``: the warps' partial tiles
    summed in warp order, ``target`` (at ``row``, ``n``) written with ``value`` of ``sum``, or
    with K slices the block's sums handed to the cluster (cluster_sum); the accumulators zeroed
    for the block's next tile, the barrier keeping ``partial`` until every thread has read it."""
    return [
        "auto finish = [&](long long first) {",
        "  #pragma unroll",
        "  for (int j = 0; j < TILES; ++j) {",
        "    #pragma unroll",
        "    for (int t = 0; t < HALVES; ++t) {",
        "      partial[warp][j * HALVES + t][lane] = make_float4(acc[j][t][0], acc[j][t][1], acc[j][t][2], acc[j][t][3]);",
        "      acc[j][t][0] = acc[j][t][1] = acc[j][t][2] = acc[j][t][3] = 0.0f;",
        "    }",
        "  }",
        "  __syncthreads();",
        # one output per step: tile j, tokens half t, lane and register of the m16n8 accumulator fragment
        "  for (int e = threadIdx.x; e < TILES * HALVES * 128; e += WARPS * 32) {",
        *_output_at("    "),
        "    float sum = 0.0f;",
        "    for (int v = 0; v < WARPS; ++v) sum += reinterpret_cast<const float*>(&partial[v][jt][from])[reg];",
        *(
            ["    sums_of(rank, first)[e] = sum;", "  }", *cluster_sum(target, value)]
            if sliced
            else [f"    {target} = {value};", "  }"]
        ),
        "  __syncthreads();",
        "};",
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
    """The cluster's helpers: its barrier, and where rank r keeps its sums over its warps of
    the column tile at ``first``: the block's own shared memory, read by the others through
    sm_90's distributed shared memory. The CPU emulation runs one block at a time (all of its
    column tiles), a cluster's ranks in order, their statics shared: there each rank and
    column tile has its own row of ``block_sums``, and the barrier is nothing."""
    return [
        "#ifdef __CUDA_ARCH__",
        "constexpr int SLOTS = 1;",
        "#else",
        "constexpr int SLOTS = SPLIT * COLUMN_TILES;",
        "#endif",
        "__shared__ float block_sums[SLOTS][TILES * HALVES * 128];",
        "auto cluster_sync = [] {",
        "#ifdef __CUDA_ARCH__",
        '  asm volatile("barrier.cluster.arrive.release.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");',
        "#endif",
        "};",
        "auto sums_of = [&](int r, long long first) -> float* {",
        "#ifdef __CUDA_ARCH__",
        "  if (r == rank) return block_sums[0];",
        "  float* at;",
        '  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(at) : "l"(block_sums[0]), "r"(r));',
        "  return at;",
        "#else",
        "  return block_sums[r * COLUMN_TILES + first / (16 * TILES)];",
        "#endif",
        "};",
    ]


def cluster_sum(target: str, value: str) -> list[str]:
    """The K slices' sums added in rank order by the cluster's last block (deterministic), which
    writes ``target``; the second barrier keeps every block's sums until they are read."""
    return [
        "  cluster_sync();",
        "  if (rank == SPLIT - 1) {",
        "    for (int e = threadIdx.x; e < TILES * HALVES * 128; e += WARPS * 32) {",
        *_output_at("      "),
        "      float part[SPLIT];",
        "      #pragma unroll",
        "      for (int r = 0; r < SPLIT; ++r) part[r] = sums_of(r, first)[e];",
        "      float sum = 0.0f;",
        "      #pragma unroll",
        "      for (int r = 0; r < SPLIT; ++r) sum += part[r];",
        f"      {target} = {value};",
        "    }",
        "  }",
        "  cluster_sync();",
    ]
