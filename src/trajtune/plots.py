"""PNG plots of a run's metrics.jsonl (loss, reward, success), written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path


def plot_metrics(metrics_path: str | Path, out_png: str | Path, keys: list[str], title: str) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = Path(metrics_path)
    if not p.exists():
        return None
    rows = [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]
    present = [k for k in keys if any(k in r for r in rows)]
    if not present:
        return None
    fig, axes = plt.subplots(len(present), 1, figsize=(7, 2.4 * len(present)), squeeze=False)
    for ax, k in zip(axes[:, 0], present):
        xs = [r["step"] for r in rows if k in r]
        ys = [r[k] for r in rows if k in r]
        ax.plot(xs, ys, marker="." if len(xs) < 50 else None)
        ax.set_ylabel(k)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_png)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, out)
    return out
