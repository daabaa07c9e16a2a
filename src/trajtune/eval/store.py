"""The evaluation output directory: append-as-you-go episodes, resumable, final results atomic.

Layout of ``--out``:

- ``run.json``: the evaluation's settings (what was evaluated and how). A resume must match it,
  otherwise the finished episodes would be mixed with ones from a different setup.
- ``episodes.jsonl``: one IR trajectory per finished episode, appended and ``fsync``-ed as each
  batch finishes, keyed by ``metadata["eval"]["task_id"]`` and ``["sample"]``. A crash can at
  worst leave a partial last line; ``--resume`` drops it (with a warning) and carries on.
- ``results.json``: the metrics, written last with temp file + rename.

Episodes hold model output, which can be nested arbitrarily deep (a model that emits tool-call
arguments 500 levels deep). Before an episode is written, every free-form value in it (call
arguments, ``extra``, ``metadata``, JSON parts) nested deeper than ``MAX_VALUE_DEPTH`` (100)
levels is replaced by the string ``DEPTH_MARKER`` ("<trajtune: value nested deeper than 100
levels was cut here>") and ``metadata["depth_capped"]`` counts the cuts, so one pathological
answer cannot stop an evaluation; the text the model wrote is still in the message content or
``arguments_raw``.

An existing directory holding any of these files is refused unless ``resume`` (continue) or
``overwrite`` (delete these three files, nothing else) is given.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trajtune.errors import DataError, OutputError, UsageError
from trajtune.eval.metrics import eval_meta
from trajtune.schema import (
    MAX_VALUE_DEPTH,
    RecordError,
    Trajectory,
    atomic_write_text,
    cap_model_depth,
    parse_trajectory,
    trajectory_to_json,
)

RUN_FILE = "run.json"
EPISODES_FILE = "episodes.jsonl"
RESULTS_FILE = "results.json"
#: Settings that may differ between the interrupted run and its resume (they do not change results).
RESUME_FREE = {"workers", "batch_size", "quiet", "step_timeout_s", "device"}

Key = tuple[str, int]


def episode_key(traj: Trajectory) -> Key:
    m = eval_meta(traj)
    if "task_id" not in m or "sample" not in m:
        raise ValueError(f"episode {traj.id!r} has no metadata.eval.task_id/sample (not written by trajtune eval)")
    return str(m["task_id"]), int(m["sample"])


class EvalStore:
    """Owns ``out_dir`` for one evaluation (see module docstring)."""

    def __init__(self, out_dir: str | os.PathLike[str], settings: dict[str, Any], *, resume: bool = False,
                 overwrite: bool = False):
        if resume and overwrite:
            raise UsageError("--resume and --overwrite exclude each other")
        self.dir = Path(out_dir)
        self.run_path = self.dir / RUN_FILE
        self.episodes_path = self.dir / EPISODES_FILE
        self.results_path = self.dir / RESULTS_FILE
        self.done: dict[Key, Trajectory] = {}
        self.warnings: list[str] = []  # what a resume had to repair (the caller shows them)
        ours = [p for p in (self.run_path, self.episodes_path, self.results_path) if p.exists()]
        if ours and overwrite:
            for p in ours:
                p.unlink()
        elif ours and not resume:
            raise OutputError(f"{self.dir} already holds an evaluation ({', '.join(p.name for p in ours)}); "
                                  "pass --resume to continue it or --overwrite to start again")
        elif ours and resume:
            self._check_settings(settings)
            self._load()
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.run_path.exists():
            atomic_write_text(self.run_path, json.dumps(settings, indent=1, sort_keys=True, default=str))
        # A lone surrogate (possible in model text) cannot be UTF-8 encoded; "backslashreplace" writes
        # it as \udXXX, which inside a JSON string is exactly its JSON escape, so the line stays valid.
        self._f = self.episodes_path.open("a", encoding="utf-8", errors="backslashreplace")

    def _check_settings(self, settings: dict[str, Any]) -> None:
        if not self.run_path.exists():
            raise OutputError(f"{self.run_path} is missing, so {self.dir} cannot be resumed; use --overwrite")
        try:
            before = json.loads(self.run_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"{self.run_path}: invalid JSON ({e.msg}); use --overwrite to start again") from None
        now = json.loads(json.dumps(settings, default=str))
        diff = sorted(k for k in set(before) | set(now) if k not in RESUME_FREE and before.get(k) != now.get(k))
        if diff:
            detail = "; ".join(f"{k}: was {before.get(k)!r}, now {now.get(k)!r}" for k in diff)
            raise OutputError(f"cannot resume {self.dir}: settings differ ({detail}); "
                             "rerun with the same settings, or use --overwrite / a new --out")

    def _load(self) -> None:
        """Read finished episodes; drop a torn last line left by a crash (and only that)."""
        if not self.episodes_path.exists():
            return
        data = self.episodes_path.read_bytes()
        chunks = data.split(b"\n")
        offset = good_end = 0
        for i, raw in enumerate(chunks):
            line_end = offset + len(raw)  # where this line's newline is (or the end of the file)
            if raw.strip():
                try:
                    obj = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    if all(not r.strip() for r in chunks[i + 1:]):
                        break  # torn tail: the write that was interrupted
                    raise RecordError(self.episodes_path, i + 1, "invalid JSON in the middle of the file",
                                      rule="json", hint="the file was edited or corrupted; use --overwrite") from None
                traj = parse_trajectory(obj, self.episodes_path, i + 1)
                self.done[episode_key(traj)] = traj
            good_end = min(line_end + 1, len(data))
            offset = line_end + 1
        if good_end < len(data):
            with self.episodes_path.open("r+b") as f:
                f.truncate(good_end)
            self.warnings.append(f"{self.episodes_path}: dropped a torn last line ({len(data) - good_end} bytes) left "
                                 "by the interrupted run; that episode runs again")
        if good_end and data[good_end - 1:good_end] != b"\n":
            with self.episodes_path.open("ab") as f:
                f.write(b"\n")

    def append(self, trajs: Iterable[Trajectory]) -> None:
        """Write finished episodes and force them to disk before anything else happens.

        Over-deep values are cut first (see the module docstring); what is kept in ``done`` is
        what was written, so a resumed run sees the same episodes."""
        for t in trajs:
            t, cut = cap_model_depth(t, MAX_VALUE_DEPTH)
            if cut:
                t = t.model_copy(update={"metadata": {**t.metadata, "depth_capped": cut}})
            self._f.write(trajectory_to_json(t) + "\n")
            self.done[episode_key(t)] = t
        self._f.flush()
        os.fsync(self._f.fileno())

    def write_results(self, results: dict[str, Any]) -> Path:
        atomic_write_text(self.results_path, json.dumps(results, indent=1, ensure_ascii=False, default=str))
        return self.results_path

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> "EvalStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
