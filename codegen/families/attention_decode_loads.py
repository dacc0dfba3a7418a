"""How the decode kernel's K and V rows reach its threads: the key loaders and the software
pipeline that keeps their loads in flight while the block computes.

Two pipelines, chosen by ``stages``:
- 0, register slots: each lane holds ``KT`` keys' vectors in registers and refills a slot with
  the next batch's key as soon as it is consumed, so one batch (``THREADS · KT · 32 B`` at D 128
  bf16) loads under the arithmetic of the previous one;
- ``S`` (3 or 4), a ring of S batches in shared memory fed by ``cp.async``: S batches load at once
  with no registers held for them, so one block alone keeps ``S · THREADS · KT · 32 B`` in flight
  (Little's law wants ~25-40 KB per SM: a few blocks of small batches cannot keep that
  otherwise). Each thread copies exactly the vectors it later reads, so ``cp.async.wait_group``
  is the only synchronisation (no barrier); a vector that cannot take a 16-byte copy (a pointer
  not 16-byte aligned, a column past D) is loaded element by element and stored, and a key
  past the slice is stored as zeros, both synchronously. The query rows sit before the ring in
  the same dynamic shared memory, and the block's merge reuses the ring after the loop.

Paged, a key's page is read from the table a batch before its row is loaded, so the table read
the row address depends on is never waited for.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphdnn.ir import Tensor

from ..indexing import divides
from .attention_problem import Attention, key_row_address, page_of

STAGES_CHOICES = (0, 3, 4)  # 0: register slots; else batches in the shared-memory ring


@dataclass(frozen=True)
class KeyPipeline:
    """The emitted pieces of one pipeline; ``vector``: K and V rows take 16-byte vectors."""

    a: Attention
    names: dict[str, str]
    stages: int
    vector: bool
    aligned: str  # C expression: every pointer is 16-byte aligned

    def declarations(self) -> list[str]:
        """The page lookups, the loaders and (staged) the ring and the slots' addresses in it."""
        lookups = [
            f"auto page_{role.lower()} = [&](int j) -> long long {{ return j < s_end ? "
            f"{page_of(self.a, self.names, role, 'j')} : 0; }};"
            for role in ("K", "V")
            if self.a.paged
        ]
        ring = []
        if self.stages:
            ring = [
                "// all dynamic (the runtime opts in past 48 KiB of it): the query rows, then the ring",
                "extern __shared__ __align__(128) unsigned char smem[];",
                "float (&q_s)[RB][DKP] = *reinterpret_cast<float(*)[RB][DKP]>(smem);",
                "unsigned char* const ring = smem + sizeof(q_s);",
                "// [stage][slot][vector][thread]: a warp's 16-byte accesses are consecutive",
                "gd::Vec<TK, VK>* const k_ring = reinterpret_cast<gd::Vec<TK, VK>*>(ring);",
                "gd::Vec<TV, VV>* const v_ring = reinterpret_cast<gd::Vec<TV, VV>*>(ring + STAGES * KT * CK * THREADS * 16);",
                "auto k_at = [&](int stage, int t) { return k_ring + (stage * KT + t) * CK * THREADS + tid; };",
                "auto v_at = [&](int stage, int t) { return v_ring + (stage * KT + t) * CV * THREADS + tid; };",
            ]
        return [*lookups, *ring, *self._loader("K", "TK", "D", "VK", "CK"), *self._loader("V", "TV", "DV", "VV", "CV")]

    def _loader(self, role: str, t: str, width: str, vec: str, count: str) -> list[str]:
        """``load_k(j, slot)`` (paged: ``load_k(j, page, slot)``): this lane's vectors of key j's
        row into ``slot`` (registers, or the ring with a stride of THREADS vectors); zero for a
        key past the slice, which reads nothing (its table entry may be anything, and zero V
        keeps 0 · V finite)."""
        page = "long long page, " if self.a.paged else ""
        stride, row = ("KS", "row_k") if role == "K" else ("VS", "row_v")
        at = "c * THREADS" if self.stages else "c"
        lines = [
            f"auto load_{role.lower()} = [&](int j, {page}gd::Vec<{t}, {vec}>* slot) {{",
            "  if (j >= s_end) {",
            "#pragma unroll",
            f"    for (int c = 0; c < {count}; ++c) slot[{at}] = gd::Vec<{t}, {vec}>{{}};",
            "    return;",
            "  }",
            f"  const {t}* const {row} = {key_row_address(self.a, self.names, role, 'j')};",
            "#pragma unroll",
            f"  for (int c = 0; c < {count}; ++c) {{",
            f"    const int col0 = (c * L + sub) * {vec};",
        ]
        if self.vector:
            copy = (
                f"copy16(smem_addr(&slot[{at}]), {row} + col0, true);"
                if self.stages
                else f"slot[c] = gd::load_vec<{t}, {vec}>({row} + col0);"
            )
            lines += [f"    if ({self.aligned} && col0 < {width}) {{", f"      {copy}", "      continue;", "    }"]
        element = f"col0 + e < {width} ? {row}[(col0 + e) * {stride}[3]] : {t}{{}}"
        if not self.stages:
            elements = ["#pragma unroll", f"    for (int e = 0; e < {vec}; ++e)", f"      slot[c].v[e] = {element};"]
        else:  # built in registers, stored once: 16-byte shared stores
            elements = [
                f"    gd::Vec<{t}, {vec}> value;",
                "#pragma unroll",
                f"    for (int e = 0; e < {vec}; ++e) value.v[e] = {element};",
                f"    slot[{at}] = value;",
            ]
        return [*lines, *elements, "  }", "};"]

    def fill(self) -> list[str]:
        """Before the loop: the first batch (registers) or the first S - 1 batches (ring), and
        paged, the pages of the batch loaded next."""
        return self._ring_fill() if self.stages else self._register_fill()

    def _register_fill(self) -> list[str]:
        lines = [
            "// Software pipeline in registers: slot t of a lane holds key base + t * KEY_GROUPS + grp of",
            "// the batch being computed; once its K (or V) vectors are consumed, the slot is refilled with",
            "// the next batch's key, whose loads stay in flight through the rest of this batch.",
            "gd::Vec<TK, VK> k_slot[KT][CK];",
            "gd::Vec<TV, VV> v_slot[KT][CV];",
        ]
        if not self.a.paged:
            return [
                *lines,
                "#pragma unroll",
                "for (int t = 0; t < KT; ++t) {",
                "  load_k(s_begin + t * KEY_GROUPS + grp, k_slot[t]);",
                "  load_v(s_begin + t * KEY_GROUPS + grp, v_slot[t]);",
                "}",
            ]
        return [
            *lines,
            "long long pk[KT], pv[KT];  // the pages of the slots' next keys",
            "#pragma unroll",
            "for (int t = 0; t < KT; ++t) {",
            "  const int j = s_begin + t * KEY_GROUPS + grp;",
            "  load_k(j, page_k(j), k_slot[t]);",
            "  load_v(j, page_v(j), v_slot[t]);",
            "  pk[t] = page_k(j + STEP);",
            "  pv[t] = page_v(j + STEP);",
            "}",
        ]

    def _ring_fill(self) -> list[str]:
        paged = self.a.paged
        lines = [
            "// Software pipeline in a shared-memory ring: slot t of a lane in stage (n % STAGES) holds",
            "// key base + t * KEY_GROUPS + grp of batch n; STAGES - 1 later batches load meanwhile.",
            *(["long long pk[KT], pv[KT];  // the pages of the keys loaded next"] if paged else []),
            "#pragma unroll",
            "for (int n = 0; n < STAGES - 1; ++n) {",
            "#pragma unroll",
            "  for (int t = 0; t < KT; ++t) {",
            "    const int j = s_begin + n * STEP + t * KEY_GROUPS + grp;",
            f"    load_k(j, {'page_k(j), ' if paged else ''}k_at(n, t));",
            f"    load_v(j, {'page_v(j), ' if paged else ''}v_at(n, t));",
            "  }",
            '  asm volatile("cp.async.commit_group;\\n" ::);',
            "}",
        ]
        if paged:
            lines += [
                "#pragma unroll",
                "for (int t = 0; t < KT; ++t) {",
                "  pk[t] = page_k(s_begin + (STAGES - 1) * STEP + t * KEY_GROUPS + grp);",
                "  pv[t] = page_v(s_begin + (STAGES - 1) * STEP + t * KEY_GROUPS + grp);",
                "}",
            ]
        return [*lines, "int stage = 0;  // the ring stage of the batch computed"]

    def issue(self) -> list[str]:
        """At the top of each iteration (ring): batch n + S - 1 into the stage batch n - 1 left,
        then the wait for batch n (at most S - 1 younger batches still loading)."""
        if not self.stages:
            return []
        lines = [
            "{",
            "  const int fill = stage == 0 ? STAGES - 1 : stage - 1;",
            "#pragma unroll",
            "  for (int t = 0; t < KT; ++t) {",
            "    const int j = base + (STAGES - 1) * STEP + t * KEY_GROUPS + grp;",
        ]
        if self.a.paged:
            lines += [
                "    load_k(j, pk[t], k_at(fill, t));",
                "    load_v(j, pv[t], v_at(fill, t));",
                "    pk[t] = page_k(j + STEP);",
                "    pv[t] = page_v(j + STEP);",
            ]
        else:
            lines += ["    load_k(j, k_at(fill, t));", "    load_v(j, v_at(fill, t));"]
        return [
            *lines,
            "  }",
            '  asm volatile("cp.async.commit_group;\\n" ::);',
            f'  asm volatile("cp.async.wait_group {self.stages - 1};\\n" ::);',
            "}",
        ]

    def unpack(self, role: str) -> list[str]:
        """Slot t's K (or V: ``role``) elements of the batch computed as floats, ``kf`` (``vf``)."""
        r = role.lower()
        vec, count, t = ("VK", "CK", "TK") if role == "K" else ("VV", "CV", "TV")
        if not self.stages:
            return [
                "#pragma unroll",
                f"for (int c = 0; c < {count}; ++c)",
                "#pragma unroll",
                f"  for (int e = 0; e < {vec}; ++e) {r}f[c * {vec} + e] = gd::element<float>({r}_slot[t][c], e);",
            ]
        return [
            "#pragma unroll",
            f"for (int c = 0; c < {count}; ++c) {{",
            f"  const gd::Vec<{t}, {vec}> vec = {r}_at(stage, t)[c * THREADS];  // one 16-byte shared load",
            "#pragma unroll",
            f"  for (int e = 0; e < {vec}; ++e) {r}f[c * {vec} + e] = gd::element<float>(vec, e);",
            "}",
        ]

    def refill(self, role: str) -> list[str]:
        """Registers: slot t's load of the next batch's key once its K (or V) is consumed;
        paged, through the page looked up a batch earlier, and the page of the key after it
        looked up now. Nothing for the ring (refilled by :meth:`issue`)."""
        if self.stages:
            return []
        r = role.lower()
        j = "base + STEP + t * KEY_GROUPS + grp"
        if not self.a.paged:
            return [f"load_{r}({j}, {r}_slot[t]);"]
        return [f"load_{r}({j}, p{r}[t], {r}_slot[t]);", f"p{r}[t] = page_{r}(base + 2 * STEP + t * KEY_GROUPS + grp);"]

    def advance(self) -> list[str]:
        """At the bottom of each iteration (ring): the next stage."""
        return ["stage = stage + 1 == STAGES ? 0 : stage + 1;"] if self.stages else []


def ring_bytes(stages: int, threads: int, keys_per_lane: int, ck: int, cv: int) -> int:
    """Dynamic shared memory of the ring: S batches of every thread's K and V vectors."""
    return stages * keys_per_lane * (ck + cv) * threads * 16


def vectorizable(tensor: Tensor, vector: int) -> bool:
    """Rows of ``tensor`` ([b or page, h, s, d]) load as 16-byte vectors (given aligned pointers)."""
    if tensor.stride[3] != 1 or tensor.dim[3] % vector:
        return False
    return all(divides(stride, vector) for d, stride in zip(tensor.dim[:3], tensor.stride[:3]) if d != 1)
