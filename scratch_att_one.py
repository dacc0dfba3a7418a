"""scratch: one attention launch per wgmma choice, for ncu."""
import sys
import torch
sys.path.insert(0, "benchmarks")
from attention import graph
import graphdnn as gd
from codegen.emit import candidates
shape = (4, 16, 4096, 128, False)
g = graph(*shape)
fused = next(f for f in gd.fuse(g).nodes if f.anchor is not None and f.anchor.op == "sdpa")
q, k, v = (torch.randn(*shape[:2], shape[2], shape[3], device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = torch.empty_like(q)
for choice in [c for c in candidates(fused, 90) if c.get("path") == "wgmma"][3:]:
    bound = gd.compile(graph(*shape), tuning={fused.name: choice}).bind({"q": q, "k": k, "v": v, "o": o})
    bound(); torch.cuda.synchronize()
    print(choice)
