"""Several trained roles in one episode: the roles wrapper, sampling each role with its own adapter
(and KV cache), a training row and group baseline per role, gradient isolation between role adapters,
and an RL run that trains every adapter, saves them all and resumes exactly."""

from __future__ import annotations

import json

import pytest
import torch

from model_fixtures import randomize_lora_b

from trajtune.algorithms.advantages import assign_advantages
from trajtune.algorithms.batch import collate, token_logprobs
from trajtune.algorithms.policy_gradient import PolicyGradientObjective
from trajtune.algorithms.dualtune_decode import read_spec
from trajtune.algorithms.roles import add_role_adapters, load_role_adapters, read_roles, split_by_role
from trajtune.envs import make_env
from trajtune.errors import ConfigError, DataError, EnvError
from trajtune.models.adapters import DEFAULT, activate, role_adapters
from trajtune.models.loading import LoraConfig, load_model
from trajtune.schema import Message, ToolCall
from trajtune.tokens import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory

ROLES = [{"name": "scout", "tools": ["get_state"], "prompt": "Look the devices up for the operator."},
         {"name": "operator", "prompt": "Change the devices."}]


def _env():
    return make_env("roles", env="home", roles=ROLES)


def _call(name, **args):
    return Message(role="assistant", tool_calls=[ToolCall(id=f"c{name}", name=name, arguments=args)])


def test_roles_take_turns_with_notes_and_tool_permissions():
    env = _env()
    assert env.roles == ("scout", "operator")
    task = next(t for t in env.tasks("train", 40, seed=0) if t.data["kind"] == "copy")
    res = env.reset(task)
    assert env.acting_role() == "scout" and res.messages[-1].text().startswith("[scout's turn]")
    assert "tools: get_state)" in res.messages[-1].text()
    before = env.inner.render()
    out = env.step(_call("set_device", room=task.data["room"], device=task.data["device"], state="on"))
    # not executed: the scout may not write; the turn passes to the operator
    assert out.observations[0].text() == "Error: the scout may not call set_device; its tools: get_state"
    assert env.inner.render() == before and env.acting_role() == "operator" and not out.done
    assert out.observations[-1].text().startswith("[operator's turn]")
    assert env.step(_call("get_state", room="kitchen", device="lamp")).observations[0].role == "tool"
    assert env.acting_role() == "scout"
    # the inner expert replayed through the roles: look-ups by the scout, the change by the operator
    traj = _env().expert(task)
    assert traj.outcome.success
    assert [m.tool_calls[0].name if m.tool_calls else "text" for m in traj.messages if m.role == "assistant"] == \
        ["get_state", "set_device", "text"]
    with pytest.raises(EnvError, match="roles option roles"):
        make_env("roles", env="home", roles=ROLES[:1])
    with pytest.raises(EnvError, match="unique"):
        make_env("roles", env="home", roles=[ROLES[0], ROLES[0]])


def _play(env, task, actions):
    """Steps ``actions``; returns each role's reward summed over the steps, and the joint reward."""
    env.reset(task)
    total, joint = {}, 0.0
    for a in actions:
        out = env.step(a)
        joint += out.reward
        for r, v in out.info["role_rewards"].items():
            total[r] = total.get(r, 0.0) + v
        if out.done:
            break
    return total, joint


def test_a_role_can_be_paid_for_matching_the_experts_turns():
    roles = [{**ROLES[0], "expert_weight": 0.5}, ROLES[1]]
    env = make_env("roles", env="home", roles=roles)
    task = next(t for t in env.tasks("train", 40, seed=0) if t.data["kind"] == "copy")
    expert = [m for m in _env().expert(task).messages if m.role == "assistant"]  # look-up, change, answer
    look, change, answer = expert
    other = next(d for d in ("lamp", "fan", "heater", "tv") if d != look.tool_calls[0].arguments["device"])
    wrong_look = _call("get_state", **{**look.tool_calls[0].arguments, "device": other})
    wrong_change = _call("set_device", **{**change.tool_calls[0].arguments,
                                          "state": "on" if change.tool_calls[0].arguments["state"] == "off" else "off"})
    # the expert's own turns: joint 1, and the scout matched both of its turns
    assert _play(env, task, [look, change, answer]) == ({"scout": 1.0, "operator": 1.0}, 1.0)
    # the operator's mistake: joint 0; the scout is still paid its half for its two right turns
    assert _play(env, task, [look, wrong_change, answer]) == ({"scout": 0.5, "operator": 0.0}, 0.0)
    # the scout's wrong look-up, the operator right anyway: 0.5 x 1 + 0.5 x 1/2
    assert _play(env, task, [wrong_look, change, answer]) == ({"scout": 0.75, "operator": 1.0}, 1.0)
    # an environment whose expert cannot be replayed is refused
    with pytest.raises(EnvError, match="expert_weight needs a deterministic environment"):
        _nondeterministic_roles(roles)
    with pytest.raises(EnvError, match="expert_weight"):
        make_env("roles", env="home", roles=[{**ROLES[0], "expert_weight": 1.5}, ROLES[1]])


def _nondeterministic_roles(roles):
    from trajtune.envs.adapters.roles import RolesEnv, RolesOptions

    inner = make_env("home")
    inner.deterministic = False
    return RolesEnv(inner, RolesOptions.model_validate({"roles": roles}))


@pytest.fixture()
def two_role_model(tiny_dir):
    model = load_model(str(tiny_dir), lora=LoraConfig(r=4, alpha=8))
    randomize_lora_b(model, seed=1, scale=0.3)
    names = add_role_adapters(model, ["scout", "operator"], None)
    return model, names


def test_role_adapters_start_as_copies_and_are_all_trainable(two_role_model):
    model, names = two_role_model
    assert names == {"scout": DEFAULT, "operator": "role_operator"} and role_adapters(model) == names
    params = dict(model.named_parameters())
    for n, p in params.items():
        if ".default." in n:
            twin = params[n.replace(".default.", ".role_operator.")]
            assert torch.equal(p, twin) and p.requires_grad and twin.requires_grad


def _teacher_forced(model, tt, adapter):
    activate(model, adapter)
    try:
        with torch.no_grad():
            return token_logprobs(model, collate([tt], 0))[0][0]
    finally:
        activate(model, DEFAULT)


@pytest.mark.parametrize("reuse", [True, False])
def test_rollout_samples_each_role_with_its_own_adapter(two_role_model, tiny_tok, reuse):
    from trajtune.rollout import RolloutConfig, run_rollouts

    from trajtune.chat.render import ChatRenderer

    model, names = two_role_model
    randomize_lora_b(model, seed=7, scale=0.3)  # now every adapter differs (all B matrices redrawn)
    # turns that end at the end-of-turn token now and then (an untrained model rarely writes it): a bias
    # on its logit, in every forward (sampling and the teacher-forced check alike)
    eot = ChatRenderer(tiny_tok).stop_ids()[0]

    def boost(module, args, out):
        out = out.clone()
        out[..., eot] += 4.0
        return out

    model.get_output_embeddings().register_forward_hook(boost)

    def chat():  # every turn goes on (an untrained model writes no valid call), so both roles act
        return make_env("roles", env="envfixtures:Chatter", roles=[{"name": "scout", "expert_weight": 0.5},
                                                                    {"name": "operator"}])

    tasks = chat().tasks("train", 3, seed=1)
    cfg = RolloutConfig(max_turns=4, max_new_tokens=6, temperature=1.0, batch_size=3, reuse_kv_cache=reuse)
    eps = run_rollouts(model, tiny_tok, chat, tasks, cfg, seed=3)
    checked = 0
    for ep in eps:
        tt = ep.tokens
        roles = tt.meta["turn_roles"]
        assert roles == ["scout", "operator", "scout", "operator"][:len(roles)] and len(roles) == ep.turns
        written = [m.extra.get("agent_role") for m in ep.trajectory.messages if m.role == "assistant"]
        assert written == roles
        # the per-role rewards, summed over the steps: the scout's half for matching the expert's two plain
        # turns (Chatter's expert writes four), the operator's the joint reward. A turn cut by the length
        # limit never reached the environment (nothing answers it)
        msgs = ep.trajectory.messages
        stepped = [m for i, m in enumerate(msgs) if m.role == "assistant" and i + 1 < len(msgs)]
        matched = sum(not m.tool_calls for m in stepped[0::2][:2])
        assert tt.meta["role_rewards"]["operator"] == pytest.approx(tt.reward)
        assert tt.meta["role_rewards"]["scout"] == pytest.approx(0.5 * tt.reward + 0.5 * matched / 2)
        sampled = torch.tensor(tt.logprobs[1:])
        for role, adapter in names.items():
            other = next(a for r, a in names.items() if r != role)
            mine = [i - 1 for i, (s, k) in enumerate(zip(tt.source, tt.turn)) if s == SOURCE_POLICY and roles[k] == role]
            if not mine:
                continue
            own = _teacher_forced(model, tt, adapter)[mine]
            assert torch.allclose(own, sampled[mine], atol=1e-4), (role, own, sampled[mine])
            assert not torch.allclose(_teacher_forced(model, tt, other)[mine], sampled[mine], atol=1e-3)
            checked += 1
    assert checked >= 4 and any(ep.turns >= 3 for ep in eps)  # a role came back to its own cache
    assert model.active_adapter == DEFAULT


def _episode(roles, group, reward, role_rewards=None, tid="t"):
    # prompt, then per turn: 2 policy tokens and 1 observation token
    ids, src, turn = [1, 2], [SOURCE_PROMPT] * 2, [0, 0]
    for k in range(len(roles)):
        ids += [10 + k, 20 + k, 30]
        src += [SOURCE_POLICY, SOURCE_POLICY, SOURCE_ENV]
        turn += [k, k, k + 1]
    meta = {"turn_roles": roles, **({"role_rewards": role_rewards} if role_rewards else {})}
    return TokenTrajectory(ids=ids, source=src, turn=turn, weight=[1.0 if s == SOURCE_POLICY else 0.0 for s in src],
                           logprobs=[0.0] * len(ids), traj_id=tid, group=group, reward=reward, meta=meta)


def test_split_by_role_rows_groups_and_per_role_baselines():
    a = _episode(["p", "e", "p"], "g", 1.0, {"p": 1.0, "e": 0.0}, tid="a")
    b = _episode(["p", "e", "p"], "g", 0.0, {"p": 0.0, "e": 1.0}, tid="b")
    c = TokenTrajectory(ids=[1, 2, 3], source=[SOURCE_PROMPT, SOURCE_POLICY, SOURCE_POLICY], turn=[0, 0, 0],
                        weight=[0.0, 1.0, 1.0], group="solo", reward=1.0)
    rows, m = split_by_role([a, b, c], {"p": DEFAULT, "e": "role_e"})
    assert m["role_rows"] == 4.0 and rows[0] is a and rows[-1] is c  # an episode without roles stays as it is
    by = {(r.traj_id, r.meta.get("role")): r for r in rows[:-1]}
    pa, ea = by[("a", "p")], by[("a", "e")]
    # the weights partition the episode's policy tokens: turns 0 and 2 for p, turn 1 for e
    pol = [i for i, s in enumerate(a.source) if s == SOURCE_POLICY]
    assert [i for i in pol if pa.weight[i]] == [2, 3, 8, 9] and [i for i in pol if ea.weight[i]] == [5, 6]
    assert pa.group == "g/p" and ea.group == "g/e" and ea.meta["adapter"] == "role_e" and pa.meta["adapter"] == DEFAULT
    # per-role rewards, and a baseline per role: p's rewards (1, 0) and e's (0, 1) give opposite advantages
    assert (pa.reward, ea.reward) == (1.0, 0.0)
    scored, _ = assign_advantages(rows[:-1], "dr_grpo", False, "token", False)
    adv = {(r.traj_id, r.meta["role"], r.reward): max(r.advantages, key=abs) for r in scored}
    assert adv[("a", "p", 1.0)] == pytest.approx(0.5) and adv[("a", "e", 0.0)] == pytest.approx(-0.5)
    assert adv[("b", "p", 0.0)] == pytest.approx(-0.5) and adv[("b", "e", 1.0)] == pytest.approx(0.5)


@pytest.mark.parametrize("objective", ["rl", "sft"])
def test_one_roles_rows_leave_the_other_adapters_gradient_exactly_zero(two_role_model, objective):
    from trajtune.algorithms.sft import SFTObjective

    model, names = two_role_model
    model.train()
    randomize_lora_b(model, seed=11, scale=0.3)
    ep = _episode(["scout", "operator", "scout"], "g", 1.0)
    ep.advantages = [1.0] * len(ep)
    rows, _ = split_by_role([ep], names)
    obj = PolicyGradientObjective() if objective == "rl" else SFTObjective()

    def grads(tts):
        model.zero_grad(set_to_none=True)
        loss, _ = obj.loss_sum(model, collate(tts, 0))
        loss.backward()
        return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                for n, p in model.named_parameters() if "lora_" in n}

    scout_only = grads([r for r in rows if r.meta["role"] == "scout"])
    assert all(g.abs().sum() == 0 for n, g in scout_only.items() if ".role_operator." in n)
    assert any(g.abs().sum() > 0 for n, g in scout_only.items() if ".default." in n)
    operator_only = grads([r for r in rows if r.meta["role"] == "operator"])
    assert all(g.abs().sum() == 0 for n, g in operator_only.items() if ".default." in n)
    both = grads(rows)  # one batch of both roles: each adapter's gradient is its own rows' alone
    for n, g in both.items():
        part = scout_only[n] if ".default." in n else operator_only[n]
        assert torch.allclose(g, part, atol=1e-7), n
    assert model.active_adapter == DEFAULT


def _both_adapters_trained(final):
    """The saved roles map, and both adapters trained (they started equal: B = 0), and differently
    (each on its own tokens)."""
    from safetensors.torch import load_file

    assert json.loads((final / "roles.json").read_text()) == {"scout": DEFAULT, "operator": "role_operator"}
    scout = load_file(final / "adapter_model.safetensors")
    operator = load_file(final / "role_operator" / "adapter_model.safetensors")
    assert any(v.abs().sum() > 0 for k, v in scout.items() if "lora_B" in k)
    assert any(v.abs().sum() > 0 for k, v in operator.items() if "lora_B" in k)
    assert any(not torch.equal(scout[k], operator[k]) for k in scout)


def _same_adapters(a_dir, b_dir):
    from safetensors.torch import load_file

    for sub in ("", "role_operator"):
        a = load_file(a_dir / sub / "adapter_model.safetensors")
        b = load_file(b_dir / sub / "adapter_model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), sub


def _rl_args(model, out, extra=()):
    # Chatter goes on after every turn and rewards the text's length mod 3: both roles act, rewards vary
    env = json.dumps({"name": "roles", "kwargs": {"env": "envfixtures:Chatter",
                                                  "roles": [{"name": "scout"}, {"name": "operator"}]}})
    return [f"model={model}", f"output_dir={out}", f"env={env}", "model.lora={r: 4, alpha: 8}",
            "rollout.max_turns=4", "rollout.max_new_tokens=8", "rl.tasks_per_step=2", "rl.group_size=3",
            "train.steps=2", "train.save_every=1", "train.lr=1e-2", "rl.role_adapters=true", "report=false", *extra]


def test_rl_trains_every_role_adapter_saves_them_and_resumes_exactly(tiny_dir, tmp_path, turns_end):
    from trajtune.algorithms.registry import load_trained
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.train import run

    out = tmp_path / "rl"
    run(load_config(None, RLRunConfig, _rl_args(tiny_dir, out)), quiet=True)
    final = out / "final"
    _both_adapters_trained(final)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r.get("role_rows", 0) >= 4 for r in rows if "loss" in r)
    loaded = load_trained(str(final))
    assert role_adapters(loaded) == {"scout": DEFAULT, "operator": "role_operator"}
    # killed after step 1, resumed: every adapter equals the uninterrupted run's
    cut = tmp_path / "cut"
    run(load_config(None, RLRunConfig, _rl_args(tiny_dir, cut)), quiet=True, stop_after=1)
    run(load_config(None, RLRunConfig, _rl_args(tiny_dir, cut)), quiet=True, resume=True)
    _same_adapters(final, cut / "final")


def test_role_adapter_configs_that_cannot_work_are_refused(tiny_dir, tmp_path):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.train import run

    with pytest.raises(Exception, match="rl.role_adapters is not supported with rollout.mask_observations_at"):
        load_config(None, RLRunConfig, _rl_args(tiny_dir, tmp_path / "a", ["rollout.mask_observations_at=64"]))
    cfg = load_config(None, RLRunConfig, [a for a in _rl_args(tiny_dir, tmp_path / "b") if not a.startswith("env=")]
                      + ["env=home"])
    with pytest.raises(ConfigError, match="environment 'home' has no roles; wrap it"):
        run(cfg, quiet=True)
    no_lora = [a for a in _rl_args(tiny_dir, tmp_path / "c") if not a.startswith("model.lora")]
    with pytest.raises(ConfigError, match="needs a LoRA model"):
        run(load_config(None, RLRunConfig, no_lora), quiet=True)


def test_a_broken_sidecar_names_its_file_and_what_it_should_hold(tmp_path):
    assert read_roles(tmp_path) is None and read_spec(tmp_path) is None  # an ordinary model directory
    (tmp_path / "roles.json").write_text('{"scout": "default",')
    with pytest.raises(DataError, match=r"roles\.json: not valid JSON .*maps role names to LoRA adapters"):
        read_roles(tmp_path)
    (tmp_path / "roles.json").write_text('{"scout": 1}')
    with pytest.raises(DataError, match=r"roles\.json: expected an object mapping role names to adapter names"):
        read_roles(tmp_path)
    (tmp_path / "roles.json").write_text('{"scout": "default", "operator": "role_operator"}')
    assert read_roles(tmp_path) == {"scout": "default", "operator": "role_operator"}
    (tmp_path / "dualtune.json").write_text('{"arguments": []}')
    with pytest.raises(DataError, match=r"dualtune\.json: expected an object with an 'arguments' map"):
        read_spec(tmp_path)


# -- SFT on team episodes: an adapter per role, from recorded data -------------------------------------

def _role_data(tmp_path, n=6):
    env = _env()
    path = tmp_path / "roles.jsonl"
    path.write_text("".join(env.expert(t).model_dump_json() + "\n" for t in env.tasks("train", n, seed=0)))
    return path, env


def test_turn_roles_are_read_from_the_roles_notes_or_the_turns_own_marks():
    from trajtune.algorithms.roles import assistant_roles

    env = _env()
    traj = env.expert(env.tasks("train", 1, seed=0)[0])
    roles = assistant_roles(traj)
    assert roles[:2] == ["scout", "operator"] and set(roles) == {"scout", "operator"}
    # the notes alternate (module doc of the wrapper), so the expert's turns alternate too
    assert all(r == ("scout" if k % 2 == 0 else "operator") for k, r in enumerate(roles))
    marked = traj.model_copy(deep=True)
    first = next(m for m in marked.messages if m.role == "assistant")
    first.extra = {"agent_role": "operator"}  # a turn's own mark wins over the note before it
    assert assistant_roles(marked)[0] == "operator"


def _sft_args(model, data, out, extra=()):
    return [f"model={model}", f"output_dir={out}", f"data.path={data}", "model.lora={r: 4, alpha: 8}",
            "role_adapters=true", "train.steps=3", "train.batch_size=4", "train.micro_batch_size=4",
            "train.lr=1e-2", "train.save_every=1", "report=false", *extra]


def test_sft_trains_each_role_adapter_on_its_own_turns_saves_and_resumes_exactly(tiny_dir, tmp_path):
    from trajtune.algorithms.registry import load_trained
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.config import load_config
    from trajtune.train import run

    data, _ = _role_data(tmp_path)
    out = tmp_path / "sft"
    run(load_config(None, SFTRunConfig, _sft_args(tiny_dir, data, out)), quiet=True)
    final = out / "final"
    _both_adapters_trained(final)
    result = json.loads((out / "result.json").read_text())
    assert result["roles"] == ["scout", "operator"] and result["role_rows"] == 12  # 6 records × 2 roles
    assert role_adapters(load_trained(str(final))) == {"scout": DEFAULT, "operator": "role_operator"}
    cut = tmp_path / "cut"
    run(load_config(None, SFTRunConfig, _sft_args(tiny_dir, data, cut)), quiet=True, stop_after=1)
    run(load_config(None, SFTRunConfig, _sft_args(tiny_dir, data, cut)), quiet=True, resume=True)
    _same_adapters(final, cut / "final")


def test_sft_rows_weight_each_role_on_exactly_its_turns(two_role_model, tiny_tok, tmp_path):
    """The rows of a record: one per role, the same tokens, and between them exactly the trained
    tokens of the single-model row, each on the turns of its role."""
    from trajtune.algorithms.roles import assistant_roles, mark_data_roles
    from trajtune.chat.render import ChatRenderer

    model, names = two_role_model
    env = _env()
    traj = env.expert(env.tasks("train", 1, seed=0)[0])
    whole = ChatRenderer(tiny_tok).render(traj)
    tt = ChatRenderer(tiny_tok).render(traj)
    assert mark_data_roles([traj], [tt]) == ["scout", "operator"]
    rows, m = split_by_role([tt], names)
    assert m["role_rows"] == 2 and [r.meta["adapter"] for r in rows] == [DEFAULT, "role_operator"]
    roles = assistant_roles(traj)
    for row, role in zip(rows, ("scout", "operator")):
        assert row.ids == whole.ids
        for k, (w, w0, s) in enumerate(zip(row.weight, whole.weight, whole.source)):
            on_role = s == SOURCE_POLICY and roles[whole.turn[k]] == role
            assert w == (w0 if on_role else 0.0)
    assert [a + b for a, b in zip(rows[0].weight, rows[1].weight)] == whole.weight


def test_sft_role_adapter_data_and_configs_that_cannot_work_are_refused(tiny_dir, tmp_path):
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.config import load_config
    from trajtune.train import run

    data, _ = _role_data(tmp_path, n=2)
    no_lora = [a for a in _sft_args(tiny_dir, data, tmp_path / "a") if not a.startswith("model.lora")]
    with pytest.raises(ConfigError, match="needs a LoRA model"):
        run(load_config(None, SFTRunConfig, no_lora), quiet=True)
    home = tmp_path / "home.jsonl"  # one agent: no roles to give adapters to
    env = make_env("home")
    home.write_text("".join(env.expert(t).model_dump_json() + "\n" for t in env.tasks("train", 2, seed=0)))
    with pytest.raises(DataError, match="assistant turn 0 has no role"):
        run(load_config(None, SFTRunConfig, _sft_args(tiny_dir, home, tmp_path / "b")), quiet=True)
    with pytest.raises(Exception, match="role_adapters needs conversations"):
        load_config(None, SFTRunConfig, _sft_args(tiny_dir, data, tmp_path / "c", ["data.format=text", "data.train_on=all_tokens"]))
