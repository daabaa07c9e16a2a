"""What an AdamW step costs in memory on CPU, by implementation, and whether they agree bit for bit.

Memory: parameters of SmolLM2-135M's shapes (the 49,152 × 576 embedding, 30 layers) with zero
gradients, one process per implementation (torch's default, `foreach=False`, `foreach=True`,
`fused=True`); peak RSS before the first step and after two (the moments are allocated in the
first). Agreement: 5 steps on small random tensors and gradients, each implementation against
`foreach=True`. A benchmark, not a test; writes nothing.

    python benchmarks/adamw_memory.py
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from typing import Any

import torch

KINDS: dict[str, dict[str, Any]] = {"default": {}, "foreach=False": {"foreach": False},
                                    "foreach=True": {"foreach": True}, "fused=True": {"fused": True}}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def smollm2_shapes() -> list[tuple[int, ...]]:
    layer = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536), (576,), (576,)]
    return [(49152, 576)] + layer * 30 + [(576,)]


def memory_worker(kind: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in smollm2_shapes()]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), **KINDS[kind])
    before = _peak_mb()
    opt.step()
    opt.step()
    return {"kind": kind, "parameters_m": sum(p.numel() for p in params) / 1e6, "before_mb": before,
            "step_adds_mb": _peak_mb() - before}


def agreement() -> dict[str, float]:
    torch.manual_seed(0)
    init = [torch.randn(s) for s in [(300, 70), (70,), (5, 5, 5)]]
    grads = [[torch.randn_like(p) for p in init] for _ in range(5)]
    out = {}
    for kind, kw in KINDS.items():
        params = [torch.nn.Parameter(p.clone()) for p in init]
        opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, **kw)
        for g in grads:
            for p, gg in zip(params, g):
                p.grad = gg.clone()
            opt.step()
        out[kind] = [p.detach() for p in params]
    ref = out["foreach=True"]
    return {k: max(float((a - b).abs().max()) for a, b in zip(ref, v)) for k, v in out.items()}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(memory_worker(sys.argv[2])))
        return
    for kind in KINDS:
        p = subprocess.run([sys.executable, __file__, "--worker", kind], capture_output=True, text=True, check=True)
        r = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"{kind:>14s}: {r['parameters_m']:.1f} M parameters, weights + gradients {r['before_mb']:.0f} MB, "
              f"two AdamW steps add {r['step_adds_mb']:.0f} MB")
    for kind, diff in agreement().items():
        print(f"{kind:>14s}: largest difference from foreach=True after 5 steps {diff:.3g}")


if __name__ == "__main__":
    main()
