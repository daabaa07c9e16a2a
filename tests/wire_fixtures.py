"""A tiny model that has learned to answer in a short word and end its turn: the untrained tiny model
rarely emits the end-of-turn token, so its episodes end by length and never succeed. Trained here
in a few SFT steps through ``trajtune.train.run``; the replies vary in length, so a sampling policy
gets even and odd replies (``wire_envs.Reply``)."""

from __future__ import annotations

from pathlib import Path

from wire_envs import REPLY_SYSTEM, REPLY_USER

WORDS = ["ok", "yes", "fine", "sure", "done", "good", "right", "no", "maybe", "nice"]


def talker_data() -> list:
    from trajtune.envs import make_env
    from trajtune.schema import Message, Trajectory

    out = []
    for i, w in enumerate(WORDS * 2):
        out.append(Trajectory(id=f"reply-{i}", messages=[
            Message(role="system", content=REPLY_SYSTEM), Message(role="user", content=REPLY_USER),
            Message(role="assistant", content=w)]))
    env = make_env("wire_envs:Ladder")
    for t in env.tasks("train", 3, seed=7):
        expert = env.expert(t)
        acts = [i for i, m in enumerate(expert.messages) if m.role == "assistant"]
        for k, a in enumerate(acts):  # every state of the expert, answered in text at once
            history = [m.model_copy(update={"train": False}) if m.role == "assistant" else m
                       for m in expert.messages[:a]]  # the expert's calls stay untrained: no tool use learned
            out.append(Trajectory(id=f"{t.id}-{k}", messages=[*history, Message(role="assistant", content=WORDS[k])],
                                  tools=expert.tools))
    return out


def train_talker(tiny_dir: Path, work: Path) -> Path:
    """SFT the tiny model on ``talker_data`` (its final answers only); returns the final model dir."""
    from trajtune.algorithms.registry import load_run_config
    from trajtune.schema import write_trajectories
    from trajtune.train import run

    data = work / "talker.jsonl"
    write_trajectories(data, talker_data())
    cfg = load_run_config(None, [f"model={tiny_dir}", f"output_dir={work / 'talker'}", "seed=0",
                                 f"data={{path: {data}, format: ir, train_on: hint}}",
                                 "train={steps: 12, lr: 2.0e-2, batch_size: 8, micro_batch_size: 8, "
                                 "schedule: constant}", "report=false"], algorithm="sft")
    run(cfg, quiet=True)
    return work / "talker" / "final"


def torchrun(*args: str, timeout: int = 600) -> "subprocess.CompletedProcess[str]":
    """``trajtune ARGS`` on 2 CPU processes (gloo), with tests/ importable (the wire_envs environments)."""
    import os
    import subprocess
    import sys

    here = str(Path(__file__).resolve().parent)
    env = {"TRAJTUNE_DIST_TIMEOUT_S": "120", **os.environ, "OMP_NUM_THREADS": "1",  # a hang fails in minutes
           "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "trajtune.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def launch_two(*args: str, env: dict[str, str]) -> "list[subprocess.Popen[str]]":
    """2 ranks started by hand (no torchrun agent, which would stop the survivor itself when a rank dies)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        e = {**os.environ, **env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
             "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-m", "trajtune.cli", *args], env=e, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return procs
