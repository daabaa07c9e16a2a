"""Does a model read what it observed? The state a ``home`` copy/toggle call writes, probed.

On ``home``'s ``copy`` and ``toggle`` tasks the second call must write the state the first call
read (copy) or its opposite (toggle): the observed state XOR the task kind. A model that ignores the
reading is right half the time, which caps held-out success near two thirds (``set`` tasks always,
the others by a coin). This script measures, for each checkpoint, the probability it gives each state
at the decision, with everything before it the expert's (teacher forced), for the same task under
both readings: each task is played twice, with the device it reads set ``on`` and ``off`` (and the
target set so that a change is needed).

Per task kind it reports P(on | read on) and P(on | read off) (both renormalised over on/off) and
P(right): a model that copies has P(on | read on) near 1 and P(on | read off) near 0; one that
writes a constant has both equal. With ``--rationale`` (the ``home`` option whose expert first says
"The attic fan is on, so the office fan must be on.") it probes three places: the sentence's
restated reading (``read``), its conclusion (``decide``, after a correct restatement) and the call
(``call``, after the whole correct sentence).

    python benchmarks/home_state_probe.py runs/real-home-s0/sft/final runs/real-home-s0/rl/final
    python benchmarks/home_state_probe.py --rationale runs/real-home-why-s0/sft/final

Prints a table and writes ``benchmarks/results/home_state_probe[_rationale].json`` (``--json`` to
name another file). A measurement, not a test: it asserts nothing. One forward pass per task and
reading: 2 × ``--tasks`` per kind and checkpoint, about a second each for SmolLM2-135M on 2 threads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

STATES = ("on", "off")


def variant(task: Any, reading: str) -> Any:
    """``task`` with the device it reads holding ``reading`` and the goal that follows; a copy's
    target starts opposite its new goal, so the call is still a change."""
    import copy

    from trajtune.envs.home import _other, read_room

    t = copy.deepcopy(task)
    d = t.data
    d["initial"][read_room(d)][d["device"]] = reading
    d["goal"] = reading if d["kind"] == "copy" else _other(reading)
    if d["kind"] == "copy":
        d["initial"][d["room"]][d["device"]] = _other(d["goal"])
    return t


def _decoded(tok: Any, ids: list[int]) -> tuple[str, list[int]]:
    """The text of ``ids`` and the character offset where each token's text starts (byte-level BPE
    on ASCII text, so tokens decode one by one)."""
    pieces = [tok.decode([i]) for i in ids]
    offsets, pos = [], 0
    for piece in pieces:
        offsets.append(pos)
        pos += len(piece)
    return "".join(pieces), offsets


def _token_at(offsets: list[int], char: int) -> int:
    """The token that holds character ``char`` (the word's first letter or the space before it)."""
    return max(i for i, o in enumerate(offsets) if o <= char)


def probe_points(text: str, task: Any, rationale: bool) -> dict[str, int]:
    """Character index of the state word at each probed place of the rendered expert episode."""
    from trajtune.envs.home import read_room

    d = task.data
    points = {"call": text.rindex('"state": "') + len('"state": "')}
    if rationale:
        said = f"The {read_room(d)} {d['device']} is "
        points["read"] = text.rindex(said) + len(said)
        points["decide"] = text.rindex("must be ") + len("must be ")
    return points


def probe(model_dir: str, tasks: list[Any], rationale: bool) -> dict[str, dict[str, dict[str, float]]]:
    """Per place and kind: P(on | read on), P(on | read off), P(right), averaged over ``tasks``."""
    import torch

    from trajtune.chat.render import ChatRenderer
    from trajtune.envs.home import HomeEnv
    from trajtune.models.loading import load_model, load_tokenizer

    tok = load_tokenizer(model_dir)
    renderer = ChatRenderer(tok)
    model = load_model(model_dir, dtype="float32")
    model.eval()
    env = HomeEnv(rationale=rationale)
    sums: dict[tuple[str, str, str], list[float]] = {}
    for task in tasks:
        for reading in STATES:
            t = variant(task, reading)
            traj = env.expert(t)
            assert traj.outcome is not None and traj.outcome.success, t.id
            ids = renderer.render(traj).ids
            text, offsets = _decoded(tok, ids)
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0]
            for place, char in probe_points(text, t, rationale).items():
                k = _token_at(offsets, char)
                word = tok.decode([ids[k]])
                lead = word[: len(word) - len(word.lstrip())]
                cand = [tok.encode(lead + s, add_special_tokens=False) for s in STATES]
                if any(len(c) != 1 for c in cand) or ids[k] not in (cand[0][0], cand[1][0]):
                    raise SystemExit(f"{model_dir}: the state at {place} is not one token ({word!r})")
                lp = logits[k - 1].log_softmax(-1)
                p_on, p_off = (float(lp[c[0]].exp()) for c in cand)
                p = p_on / (p_on + p_off)
                want_on = (t.data["goal"] == "on") if place != "read" else reading == "on"
                sums.setdefault((place, t.data["kind"], reading), []).append(p)
                sums.setdefault((place, t.data["kind"], "right"), []).append(p if want_on else 1 - p)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (place, kind, what), v in sorted(sums.items()):
        key = {"on": "p_on_if_read_on", "off": "p_on_if_read_off", "right": "p_right"}[what]
        out.setdefault(place, {}).setdefault(kind, {})[key] = round(sum(v) / len(v), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="checkpoint or adapter directories")
    ap.add_argument("--rationale", action="store_true", help="episodes of home's rationale expert")
    ap.add_argument("--tasks", type=int, default=20, help="test tasks per kind (default 20)")
    ap.add_argument("--json", type=Path, help="where to write the figures")
    a = ap.parse_args()
    from trajtune.envs.home import HomeEnv

    pool = HomeEnv().tasks("test", 40 * a.tasks, seed=12345)
    tasks = [t for kind in ("copy", "toggle") for t in [t for t in pool if t.data["kind"] == kind][: a.tasks]]
    results = {m: probe(m, tasks, a.rationale) for m in a.models}
    print("| checkpoint | place | kind | P(on \\| read on) | P(on \\| read off) | P(right) |")
    print("|---|---|---|---|---|---|")
    for m, res in results.items():
        for place, kinds in res.items():
            for kind, v in kinds.items():
                print(f"| {m} | {place} | {kind} | {v['p_on_if_read_on']:.2f} | {v['p_on_if_read_off']:.2f} "
                      f"| {v['p_right']:.2f} |")
    out = a.json or Path(__file__).parent / "results" / f"home_state_probe{'_rationale' if a.rationale else ''}.json"
    out.write_text(json.dumps({"tasks_per_kind": a.tasks, "rationale": a.rationale, "results": results}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
