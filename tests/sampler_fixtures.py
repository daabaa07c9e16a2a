"""What the tests of the backends that sample for the learner (the OpenAI-compatible server,
vLLM) share: first prompts as token ids, and the gap between a rollout's stored log-probs and the
learner's recompute of them."""

from __future__ import annotations

import torch

from trajtune.algorithms.batch import collate, token_logprobs
from trajtune.chat.render import ChatRenderer
from trajtune.envs import make_env
from trajtune.tokens import SOURCE_POLICY


def home_prompts(tok, n=2):
    """The first prompts of ``n`` `home` test tasks, rendered with ``tok``'s chat template."""
    env, r = make_env("home"), ChatRenderer(tok)
    out = []
    for task in env.tasks("test", n, seed=0):
        res = env.reset(task)
        out.append(r.encode(r.prompt_text(res.messages, res.tools)))
    return out


def policy_logprob_gap(model, tts, temperature):
    """max |stored − recomputed| log-prob over the policy tokens of ``tts``."""
    b = collate(tts, 0)
    with torch.no_grad():
        lp, _ = token_logprobs(model, b, temperature=temperature)
    m = b.source[:, 1:] == SOURCE_POLICY
    return float(((lp - b.old_logprobs[:, 1:]).abs() * m).max())
