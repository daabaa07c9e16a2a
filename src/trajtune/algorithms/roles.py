"""Several trained roles in one episode: one LoRA adapter per role, each trained on its own tokens,
with per-role group baselines (MAGRPO-style).

Why: in a team episode (``envs/adapters/roles.py``) a planner's tokens and an executor's come from
different policies. With ``rl.role_adapters`` the model carries one adapter per role on one base
(no second copy of the weights): the first role's is peft's ``default`` adapter, every other role's
starts as a copy of it (the same policy in every seat, e.g. an SFT adapter) unless the model
directory already holds that role's adapter (``roles.json``: a finished multi-role run). The rollout
samples each turn with the acting role's adapter and records the role of every turn
(``meta["turn_roles"]``).

``split_by_role`` then makes one training row per (episode, role): the same tokens, weighted only
on that role's turns, in the group ``<group>/<role>`` with the role's reward (``info["role_rewards"]``
when the environment reports them, else the joint reward), and ``meta["adapter"]`` naming its
adapter. The group estimators therefore compute a baseline per role; with a joint reward it is the
episode group's own. The objective runs each adapter's rows with that adapter active
(``batch.by_adapter``), so one role's rows leave every other adapter's gradient exactly zero.

SFT on team episodes (``role_adapters: true`` in an SFT config) uses the same pieces on recorded
data: ``mark_data_roles`` reads each assistant turn's role from the records (the turn's own
``extra["agent_role"]``, as rollouts write it, or else the latest role note before it, as the
roles wrapper's expert replays have) into ``meta["turn_roles"]``, and ``split_by_role`` makes the
per-role rows, so each adapter learns its own role's turns from the expert.

The final directory is peft's multi-adapter layout (``default`` at the top, the others in
sub-directories) plus ``roles.json`` ({role: adapter}); ``load_role_adapters`` (the RL algorithm's
load hook) brings them all back for evaluation.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from trajtune.envs.adapters.roles import ROLE_KEY
from trajtune.errors import DataError
from trajtune.models.adapters import DEFAULT, ROLES_ATTR, peft_model, read_sidecar
from trajtune.schema import Trajectory, atomic_write_text
from trajtune.tokens import SOURCE_POLICY, TokenTrajectory

ROLES_FILE = "roles.json"


def adapter_names(roles: list[str]) -> dict[str, str]:
    """{role: adapter}: the first role plays with peft's default adapter, the others with their own."""
    return {r: (DEFAULT if i == 0 else f"role_{r}") for i, r in enumerate(roles)}


def read_roles(path: str | Path) -> dict[str, str] | None:
    """The ``roles.json`` of a saved multi-role model directory, or None for any other."""
    roles = read_sidecar(path, ROLES_FILE, "role names to LoRA adapters")
    if roles is not None and not (isinstance(roles, dict)
                                  and all(isinstance(k, str) and isinstance(v, str) for k, v in roles.items())):
        raise DataError(f"{Path(path) / ROLES_FILE}: expected an object mapping role names to adapter names")
    return roles


def add_role_adapters(model: Any, roles: list[str], source: str | Path | None) -> dict[str, str]:
    """Give ``model`` (a PeftModel) one trainable adapter per role (see the module doc); returns
    {role: adapter} and marks the model with it, so rollouts switch adapters per role."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    pm = peft_model(model)
    if not hasattr(pm, "peft_config"):
        raise ValueError("rl.role_adapters needs a LoRA model: set model.lora, or start from an adapter directory")
    names = adapter_names(roles)
    saved = read_roles(source) if source is not None and Path(source).is_dir() else None
    default_state = get_peft_model_state_dict(pm, adapter_name=DEFAULT)
    for role, adapter in names.items():
        if adapter == DEFAULT:
            continue
        if adapter not in pm.peft_config:
            pm.add_adapter(adapter, copy.deepcopy(pm.peft_config[DEFAULT]))
        sub = Path(source) / saved[role] if saved and role in saved and saved[role] != DEFAULT else None
        if sub is not None and (sub / "adapter_model.safetensors").is_file():
            state = load_file(sub / "adapter_model.safetensors")
        else:  # every seat starts as the same policy: the default adapter's weights
            state = default_state
        set_peft_model_state_dict(pm, state, adapter_name=adapter)
    pm.set_adapter(DEFAULT)
    for n, p in pm.named_parameters():
        if "lora_" in n:
            p.requires_grad_(True)
    pm.__dict__[ROLES_ATTR] = dict(names)
    return names


def write_roles(final: Path, names: dict[str, str]) -> None:
    atomic_write_text(final / ROLES_FILE, json.dumps(names, indent=1, sort_keys=True))


def load_role_adapters(model: Any, path: str) -> Any:
    """The load hook: a saved multi-role directory's other adapters, loaded next to the default one,
    and the roles mark (so rollouts and evaluation play each role with its adapter)."""
    names = read_roles(path)
    if names is None:
        return model
    pm = peft_model(model)
    for adapter in sorted(set(names.values()) - {DEFAULT}):
        sub = Path(path) / adapter
        if not (sub / "adapter_config.json").is_file():
            raise DataError(f"{Path(path) / ROLES_FILE} names adapter {adapter!r}, but {sub} holds no adapter")
        if adapter not in pm.peft_config:
            pm.load_adapter(str(sub), adapter_name=adapter, is_trainable=False)
    pm.set_adapter(DEFAULT)
    pm.__dict__[ROLES_ATTR] = dict(names)
    return model


def split_by_role(tts: list[TokenTrajectory], adapters: dict[str, str]) -> tuple[list[TokenTrajectory], dict[str, float]]:
    """One row per (episode, role) that wrote a policy token (module doc); an episode without roles
    is kept as it is. The first role's row is the episode's own object (its record follows it)."""
    out: list[TokenTrajectory] = []
    rows = 0
    for t in tts:
        roles = t.meta.get("turn_roles")
        if not roles:
            out.append(t)
            continue
        of_token = [roles[k] if s == SOURCE_POLICY and k < len(roles) else None for k, s in zip(t.turn, t.source)]
        role_rewards = t.meta.get("role_rewards") or {}
        group, weights = t.group or t.traj_id, list(t.weight)  # the first role's row is t itself, changed below
        for i, role in enumerate(dict.fromkeys(roles)):
            weight = [w if r == role else 0.0 for w, r in zip(weights, of_token)]
            if not any(weight):
                continue
            meta = {**t.meta, "role": role, **({"adapter": adapters[role]} if role in adapters else {})}
            reward = float(role_rewards.get(role, t.reward if t.reward is not None else 0.0))
            if i == 0:
                row = t
                row.weight, row.meta = weight, meta
            else:
                row = TokenTrajectory(ids=t.ids, source=t.source, turn=t.turn, weight=weight, logprobs=t.logprobs,
                                      advantages=None, traj_id=t.traj_id, reward=reward, success=t.success,
                                      termination=t.termination, meta=meta)
            row.group, row.reward = f"{group}/{role}", reward
            out.append(row)
            rows += 1
    return out, {"role_rows": float(rows)}


def assistant_roles(traj: Trajectory) -> list[str | None]:
    """The role of each assistant turn, in order: the turn's own mark, else the role named by the
    latest marked note before it; None where neither exists."""
    out: list[str | None] = []
    current: str | None = None
    for m in traj.messages:
        mark = (m.extra or {}).get(ROLE_KEY)
        if m.role == "assistant":
            out.append(mark if isinstance(mark, str) else current)
        elif isinstance(mark, str):
            current = mark
    return out


def mark_data_roles(trajs: list[Trajectory], tts: list[TokenTrajectory]) -> list[str]:
    """Record each rendered sample's turn roles (``meta["turn_roles"]``, indexed by assistant turn,
    as rollouts record them) from its trajectory; returns the roles in the order they first act.
    A record with an assistant turn of no known role is refused, naming it: its turns would train
    no adapter, or the wrong one."""
    by_id: dict[str, list[str | None]] = {}
    order: dict[str, None] = {}
    for t in trajs:
        roles = assistant_roles(t)
        if t.id in by_id and by_id[t.id] != roles:
            raise DataError(f"records share the id {t.id!r} but their turns have different roles; give each "
                            "record its own id")
        missing = [k for k, r in enumerate(roles) if r is None]
        if missing:
            raise DataError(f"record {t.id!r}: assistant turn {missing[0]} has no role (role_adapters needs "
                            f"each turn's role: message.extra[{ROLE_KEY!r}] on the turn, or on a note before it, "
                            "as the roles environment writes)")
        by_id[t.id] = roles
        order.update(dict.fromkeys(r for r in roles if r is not None))
    for tt in tts:
        if tt.traj_id not in by_id:
            raise DataError(f"a training sample of record {tt.traj_id!r} matches no record (role_adapters cannot "
                            "follow the rows of folded records)")
        tt.meta["turn_roles"] = list(by_id[tt.traj_id])
    if len(order) < 2:
        raise DataError(f"role_adapters: the data's turns have {len(order)} role(s) ({', '.join(order) or 'none'}); "
                        "one adapter per role needs team episodes with at least two roles")
    return list(order)
