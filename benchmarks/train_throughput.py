"""SFT throughput and memory: trajtune's learner vs a plain PyTorch loop on the same model and data.

The plain loop is the floor (no masking bookkeeping, no checkpoint machinery): the gap is
trajtune's overhead. Also as model GFLOP/s (forward + backward of every row's tokens, the LM head
only at trained ones: ``_roofline.sequence_flops``) and that as a fraction of this machine's matmul
peak at the thread count (``benchmarks/roofline.py``; the peak is measured at SmolLM2-135M's
shapes, so the tiny model's far smaller matmuls read low against it). Prints a table and writes
JSON. A benchmark, not a test: never asserted.

    python benchmarks/train_throughput.py --steps 30 --threads 1 --out bench_train.json
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import torch

from _roofline import (add_roofline_arg, limits_or_none, pct, rate,
                       recorded_peaks, sequence_flops, trained_tokens)


def _data(n: int):
    from trajtune.chat.render import ChatRenderer, message_to_template_dict, tools_to_template
    from trajtune.envs import make_env
    from trajtune.models.tiny import build_tokenizer, create_tiny_model

    env = make_env("home")
    trajs = [env.expert(t) for t in env.tasks("train", n, seed=0)]
    probe = build_tokenizer(["probe"], 300)
    texts = [probe.apply_chat_template([message_to_template_dict(m) for m in t.messages],
                                       tools=tools_to_template(t.tools), tokenize=False) for t in trajs[:300]]
    d = Path(tempfile.mkdtemp()) / "tiny"
    create_tiny_model(d, texts, vocab_size=1024, preset="micro")
    from trajtune.models.loading import load_tokenizer

    tok = load_tokenizer(str(d))
    return d, tok, [ChatRenderer(tok).render(t) for t in trajs]


def run_trajtune(model_dir, tok, tts, steps, bs):
    from trajtune.algorithms.sft import SFTObjective
    from trajtune.experience import DatasetSource
    from trajtune.learner import Learner, LearnerConfig
    from trajtune.models.loading import load_model

    model = load_model(str(model_dir))
    out = Path(tempfile.mkdtemp())
    lr = Learner(model, tok, SFTObjective(), DatasetSource(tts, bs), LearnerConfig(steps=steps, lr=1e-3,
                 micro_batch_size=bs), out)
    t0 = time.perf_counter()
    lr.fit()
    return time.perf_counter() - t0


def run_plain(model_dir, tok, tts, steps, bs):
    from transformers import AutoModelForCausalLM

    from trajtune.algorithms.batch import collate

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    for s in range(steps):
        b = collate([tts[(s * bs + i) % len(tts)] for i in range(bs)], tok.pad_token_id)
        labels = b.input_ids.clone()
        labels[b.source != 1] = -100
        loss = model(input_ids=b.input_ids, attention_mask=b.attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--records", type=int, default=512)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    add_roofline_arg(ap)
    ap.add_argument("--out", default="bench_train.json")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()
    limits = limits_or_none(a.roofline)
    model_dir, tok, tts = _data(a.records)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    used = [tts[(s * a.batch_size + i) % len(tts)] for s in range(a.steps) for i in range(a.batch_size)]
    tokens = sum(len(t) for t in used)
    # the LM head only where a token is trained (trajtune computes no other logits; the plain loop does)
    flops = sum(sequence_flops(config, len(t), training=True, head=trained_tokens(t)) for t in used)
    rows = []
    for name, fn in [("plain torch loop", run_plain), ("trajtune learner", run_trajtune)]:
        secs = fn(model_dir, tok, tts, a.steps, a.batch_size)
        rows.append({"runner": name, "seconds": round(secs, 2), "tokens_per_s": round(tokens / secs, 1),
                     **rate(flops, secs, limits, threads),
                     "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)})
    print(f"{'runner':20s} {'seconds':>8s} {'tokens/s':>10s} {'GFLOP/s':>8s} {'÷ peak':>7s} {'peak RSS MiB':>13s}")
    for r in rows:
        print(f"{r['runner']:20s} {r['seconds']:8.2f} {r['tokens_per_s']:10.1f} {r['gflops']:8.2f} "
              f"{pct(r['matmul_fraction']):>7s} {r['peak_rss_mib']:13.1f}")
    print(f"({threads} thread(s); peak RSS is the process maximum so far, so the second row includes the first)")
    Path(a.out).write_text(json.dumps({"steps": a.steps, "batch_size": a.batch_size, "threads": threads,
                                       "roofline": recorded_peaks(limits), "rows": rows},
                                      indent=1))


if __name__ == "__main__":
    main()
