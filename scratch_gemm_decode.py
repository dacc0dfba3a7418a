"""scratch: the engine's split-K choices on the decode shapes, each timed."""
import sys
sys.path.insert(0, "benchmarks")
import torch
import graphdnn as gd
from gemm_engine import graph, split_label
from codegen.families.gemm import candidates
from benchmarks.measure import median_us
for m, n, k, t in [(128, 4096, 4096, False), (128, 4096, 4096, True), (256, 8192, 4096, True), (64, 8192, 8192, True)]:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    b = w.t() if t else w.t().contiguous()
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    want = a.float() @ b.float()
    fused = gd.fuse(graph(m, n, k, t)).nodes[0]
    def timed(**o):
        bound = gd.compile(graph(m, n, k, t), **o).bind({"a": a, "b": b, "c": c})
        c.fill_(float("nan")); bound()
        err = ((c.float() - want).norm() / want.norm()).item(); assert err < 1e-2, (o, err)
        return 2 * m * n * k / median_us(bound) / 1e6
    row = {"default": timed()}
    for ch in candidates(fused, 90):
        if ch.get("path") == "ws" or "split_k" in ch:
            row[f"{ch.get('path', 'mma')} {ch.get('block_m', 128)}x{ch['block_n']} s{ch['stages']}{split_label(ch)}"] = timed(tuning={fused.name: ch})
    cub = 2 * m * n * k / median_us(lambda: torch.matmul(a, b, out=c)) / 1e6
    best = max(row, key=row.get)
    print(f"{m}x{n}x{k} {'[N,K]' if t else '[K,N]'}: cuBLAS {cub:.0f}, default {row['default']:.0f} ({row['default']/cub:.2f}), best {best} {row[best]:.0f} ({row[best]/cub:.2f})", flush=True)
    for name, v in sorted(row.items(), key=lambda kv: -kv[1])[:8]:
        print(f"    {name}: {v:.0f}")
