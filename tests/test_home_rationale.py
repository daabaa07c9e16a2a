"""``home``'s ``rationale`` option: the expert states what it read and what follows before each call
that depends on a reading; the text never changes what is scored."""

from __future__ import annotations

import pytest

from trajtune.chat.parsers import parse_tool_calls
from trajtune.envs.home import HomeEnv
from trajtune.schema import Message, ToolCall


def _tasks(env: HomeEnv, kind: str, n: int = 3):
    return [t for t in env.tasks("train", 60, seed=5) if t.data["kind"] == kind][:n]


def _assistant(traj) -> list[Message]:
    return [m for m in traj.messages if m.role == "assistant"]


@pytest.mark.parametrize("kind", ["copy", "toggle"])
def test_the_sentence_names_the_reading_and_the_state_the_call_writes(kind: str) -> None:
    env = HomeEnv(rationale=True)
    for t in _tasks(env, kind):
        d = t.data
        traj = env.expert(t)
        read, write, done = _assistant(traj)
        source = d["source_room"] if kind == "copy" else d["room"]
        seen = d["initial"][source][d["device"]]
        call = write.tool_calls[0]
        assert read.content is None and done.content == "Done." and traj.outcome.success
        assert call.arguments["state"] == d["goal"]
        # what it read, from the environment's table, not from the call
        assert write.content.startswith(f"The {source} {d['device']} is {seen}")
        assert write.content.endswith(f"must be {d['goal']}.")
        # a copy keeps the reading, a toggle flips it
        assert (d["goal"] == seen) == (kind == "copy")
        assert ("toggled" in write.content) == (kind == "toggle")


def test_set_tasks_and_the_default_carry_no_sentence() -> None:
    t = _tasks(HomeEnv(), "set", 1)[0]
    assert [m.content for m in _assistant(HomeEnv(rationale=True).expert(t))] == [None, "Done."]
    for kind in ("copy", "toggle"):
        t = _tasks(HomeEnv(), kind, 1)[0]
        assert all(m.content in (None, "Done.") for m in _assistant(HomeEnv().expert(t)))


def test_chores_get_one_sentence_per_chore_that_reads() -> None:
    env = HomeEnv(rationale=True, chores=4)
    t = env.tasks("train", 1, seed=2)[0]
    traj = env.expert(t)
    reading = [c for c in t.data["chores"] if c["kind"] != "set"]
    said = [m.content for m in _assistant(traj) if m.tool_calls and m.content]
    assert traj.outcome.success and len(said) == len(reading) and reading
    for c, text in zip(reading, said):
        assert text.endswith(f"the {c['room']} {c['device']} must be {c['goal']}.") or \
            (c["kind"] == "toggle" and text.endswith(f"toggled, it must be {c['goal']}."))


def test_scoring_ignores_the_text_a_wrong_sentence_with_the_right_call_succeeds() -> None:
    env = HomeEnv(rationale=True)
    t = _tasks(env, "copy", 1)[0]
    d = t.data
    env.reset(t)
    env.step(Message(role="assistant", tool_calls=[ToolCall(id="a", name="get_state",
                                                            arguments={"room": d["source_room"], "device": d["device"]})]))
    wrong = "The moon is made of cheese, so it must be off."
    env.step(Message(role="assistant", content=wrong, tool_calls=[ToolCall(
        id="b", name="set_device", arguments={"room": d["room"], "device": d["device"], "state": d["goal"]})]))
    assert env.step(Message(role="assistant", content="Done.")).reward == 1.0


def test_a_sampled_sentence_before_the_call_parses_into_content_and_call() -> None:
    text = ('The attic fan is on, so the office fan must be on.\n<tool_call>\n{"name": "set_device", '
            '"arguments": {"room": "office", "device": "fan", "state": "on"}}\n</tool_call>')
    r = parse_tool_calls(text, "hermes")
    assert r.content == "The attic fan is on, so the office fan must be on."
    assert [(c.name, c.arguments) for c in r.tool_calls] == [
        ("set_device", {"room": "office", "device": "fan", "state": "on"})]


def test_rationale_must_be_a_boolean() -> None:
    with pytest.raises(ValueError, match="rationale must be true or false"):
        HomeEnv(rationale="yes")  # type: ignore[arg-type]


def _copy_task():
    return _tasks(HomeEnv(), "copy", 1)[0]


def test_a_wrong_state_after_a_sentence_is_placed_where_the_sentence_went_wrong() -> None:
    from benchmark_module import load  # pytest puts tests/ on sys.path

    issue = load("real_multiturn")._sentence_issue
    d = _copy_task().data
    seen = d["initial"][d["source_room"]][d["device"]]
    other = "off" if seen == "on" else "on"
    assert seen == d["goal"]  # a copy
    assert issue(f"The {d['source_room']} {d['device']} is {other}, so it must be {other}.", d) == \
        " (sentence misreads the state)"
    assert issue(f"The {d['source_room']} {d['device']} is {seen}, so it must be {other}.", d) == \
        " (sentence reads right, concludes wrong)"
    assert issue(f"The {d['source_room']} {d['device']} is {seen}, so it must be {seen}.", d) == \
        " (call contradicts a right sentence)"
    assert issue("Setting it now.", d) == " (sentence without a reading and a conclusion)"


@pytest.mark.parametrize("kind", ["copy", "toggle"])
def test_the_probe_plays_each_task_under_both_readings_and_finds_the_state_words(kind: str) -> None:
    from benchmark_module import load

    probe = load("home_state_probe")
    task = _tasks(HomeEnv(), kind, 1)[0]
    for reading in ("on", "off"):
        t = probe.variant(task, reading)
        d = t.data
        look = d["source_room"] if kind == "copy" else d["room"]
        assert d["initial"][look][d["device"]] == reading
        assert (d["goal"] == reading) == (kind == "copy")
        assert d["initial"][d["room"]][d["device"]] != d["goal"]  # the call is still a change
        traj = HomeEnv(rationale=True).expert(t)
        assert traj.outcome.success
        text = "".join((m.content or "") + "".join(str(c.arguments) for c in m.tool_calls or [])
                       for m in traj.messages)
        text = text.replace("'state': '", '"state": "')
        at = probe.probe_points(text, t, rationale=True)
        assert text[at["read"]:].startswith(reading)
        assert text[at["decide"]:].startswith(d["goal"]) and text[at["call"]:].startswith(d["goal"])
    assert task.data["initial"] == _tasks(HomeEnv(), kind, 1)[0].data["initial"]  # the task itself is untouched


def test_the_table_of_runs_that_differ_in_other_settings_goes_where_json_says(tmp_path, capsys) -> None:
    """Runs with another RL temperature must not overwrite the rationale runs' results file."""
    import json

    from benchmark_module import load

    mod = load("real_multiturn")
    runs = []
    for seed, (sft, weak, rl) in enumerate([(0.94, 0.81, 0.9), (0.86, 0.56, 0.7)]):
        r = tmp_path / f"s{seed}"
        r.mkdir()
        (r / "summary.json").write_text(json.dumps({
            "settings": {**mod.DEFAULTS, "env_kwargs": {"rationale": True}, "rl_temperature": 0.7},
            "seed": seed, "base": 0.0, "sft": sft, "weak_step": 30 - seed, "weak": weak, "weak_rl_grounded": rl,
            "failures": {"sft": {"wrong state": seed}}, "seconds": {}, "peak_rss_mb_by_stage": {},
            "probe_train_success": {}}))
        runs.append(r)
    default = mod.Path(mod.__file__).parent / "results" / "real_multiturn_rationale.json"
    before = default.read_bytes() if default.exists() else None
    dest = tmp_path / "t07.json"
    mod.table(runs, dest)
    out = capsys.readouterr().out
    assert "| under-trained + GRPO, grounded reward (16 steps) | 90% / 70% |" in out
    assert "| wrong state | 0 / 1 |" in out
    assert {json.loads(dest.read_text())[str(r)]["seed"] for r in runs} == {0, 1}
    assert (default.read_bytes() if default.exists() else None) == before


def _replay(env: HomeEnv, t, texts: dict[int, str | None] | None = None) -> dict[str, float]:
    """Play the rationale expert's turns on ``t``, with assistant turn i's text replaced by texts[i];
    the final step's reward terms."""
    turns = _assistant(HomeEnv(rationale=True, chores=env.chores).expert(t))
    env.reset(t)
    for i, m in enumerate(turns):
        res = env.step(m.model_copy(update={"content": (texts or {}).get(i, m.content)}))
    assert res.done
    return res.info["reward_terms"]


@pytest.mark.parametrize("kind", ["copy", "toggle"])
def test_explained_pays_a_success_only_when_the_dependent_call_came_with_the_right_sentence(kind: str) -> None:
    env = HomeEnv(rationale=True)
    t = _tasks(env, kind, 1)[0]
    d = t.data
    seen = d["initial"][d["source_room"] if kind == "copy" else d["room"]][d["device"]]
    other = "off" if seen == "on" else "on"
    assert _replay(env, t) == {"observed": 1.0, "grounded": 1.0, "explained": 1.0}
    # the call is right each time, so success and grounded stay 1; only the sentence changes
    for text in (None, "Setting it now.", f"The lamp is {other}, so it must be {d['goal']}.",
                 f"The lamp is {seen}, so it must be {'off' if d['goal'] == 'on' else 'on'}.",
                 f"It must be {d['goal']}: it is {seen}."):
        assert _replay(env, t, {1: text}) == {"observed": 1.0, "grounded": 1.0, "explained": 0.0}, text
    # the right sentence on a failed episode pays nothing
    read, write, _ = _assistant(HomeEnv(rationale=True).expert(t))
    env.reset(t)
    env.step(read)
    wrong = write.tool_calls[0].model_copy(update={"arguments": {**write.tool_calls[0].arguments,
                                                                 "state": other if kind == "copy" else seen}})
    env.step(write.model_copy(update={"tool_calls": [wrong]}))
    assert env.step(Message(role="assistant", content="Done.")).info["reward_terms"]["explained"] == 0.0


def test_explained_checks_every_chore_and_is_reported_only_with_the_option() -> None:
    env = HomeEnv(rationale=True, chores=4)
    t = env.tasks("train", 1, seed=2)[0]
    turns = _assistant(env.expert(t))
    said = [i for i, m in enumerate(turns) if m.tool_calls and m.content]
    assert len(said) >= 2
    assert _replay(env, t)["explained"] == 1.0
    assert _replay(env, t, {said[-1]: None}) == {"observed": 1.0, "grounded": 1.0, "explained": 0.0}
    assert "explained" in env.reward_terms and "explained" not in HomeEnv().reward_terms
    plain = HomeEnv()
    u = _tasks(plain, "copy", 1)[0]
    plain.reset(u)
    for m in _assistant(plain.expert(u)):
        res = plain.step(m)
    assert set(res.info["reward_terms"]) == {"observed", "grounded"}


def test_explained_survives_snapshot_and_restore() -> None:
    env = HomeEnv(rationale=True)
    t = _tasks(env, "toggle", 1)[0]
    read, write, done = _assistant(env.expert(t))
    env.reset(t)
    env.step(read)
    env.step(write.model_copy(update={"content": None}))
    snap = env.snapshot()
    env.reset(t)
    env.restore(snap)
    assert env.step(done).info["reward_terms"]["explained"] == 0.0


def test_every_real_multiturn_arm_is_a_valid_rl_config_and_the_batch_arm_keeps_failed_groups(tmp_path) -> None:
    """A misspelt key in an arm would only show after an hour of SFT and probing."""
    from benchmark_module import load

    mod = load("real_multiturn")
    p = {**mod.DEFAULTS, "env_kwargs": {"rationale": True}}
    cfgs = {arm: mod.rl_config(tmp_path / "weak", tmp_path, p, 0, arm) for arm in mod.ARMS}
    assert set(mod.LABELS) == set(mod.ARMS)
    batch = cfgs["explained_batch"]
    assert batch.rl.estimator == "reinforce_pp" and not batch.rl.drop_equal_groups
    assert cfgs["explained"].rl.drop_equal_groups and cfgs["explained"].rl.estimator == "grpo"
    assert batch.rl.reward.names() == cfgs["explained"].rl.reward.names() == ["info.explained"]
    assert len({c.output_dir for c in cfgs.values()}) == len(cfgs)  # no two arms share a stage directory


def test_a_stage_read_back_without_earlier_figures_records_none_not_its_read_back_time() -> None:
    from benchmark_module import load

    figures = load("real_multiturn").stage_figures
    prev = {"seconds": {"sft": 900.0, "rl": 2000.0}, "peak_rss_mb_by_stage": {"sft": 300.0, "rl": 9000.0}}
    times = {"sft": 0.01, "probe": 0.2, "rl-new": 1800.0}
    peaks = {"sft": 350.0, "probe": 350.0, "rl-new": 9100.0}
    seconds, peak = figures(times, peaks, prev)
    # read back with earlier figures: kept; read back without: unknown; done here: measured;
    # not reached here: the earlier figures
    assert seconds == {"sft": 900.0, "probe": None, "rl-new": 1800.0, "rl": 2000.0}
    assert peak == {"sft": 300.0, "probe": None, "rl-new": 9100.0, "rl": 9000.0}
    assert figures(times, peaks, {}) == ({"sft": None, "probe": None, "rl-new": 1800.0},
                                         {"sft": None, "probe": None, "rl-new": 9100.0})


def test_the_weak_checkpoint_rule_skips_a_checkpoint_that_never_earns_the_reward_on_some_kind() -> None:
    """Seed 1's rationale checkpoint scored in range overall, but none of its sampled copies or
    toggles was paid, so RL never saw a paid one: with weak_min_kind it is no candidate."""
    from benchmark_module import load

    mod = load("real_multiturn")
    p = {**mod.DEFAULTS, "weak_min_kind": 0.05}
    probed = {2: 0.0, 4: 0.2, 6: 0.4, 8: 0.5, 10: 0.7, 12: 0.3}
    kinds = {2: {"copy": 0.0, "set": 0.0}, 4: {"copy": 0.1, "set": 0.3}, 6: {"copy": 0.1, "set": 0.7},
             8: {"copy": 0.0, "set": 1.0}, 10: {"copy": 0.5, "set": 0.9}, 12: {"copy": 0.3, "set": 0.3}}
    assert mod.choose_weak(probed, p, kinds) == 6  # 8 pays no copy; 10 is at the bound; 12 comes after it
    assert mod.choose_weak(probed, p) == 8  # without kinds: the overall rule alone, as before
    assert mod.choose_weak(probed, {**p, "weak_min_kind": 0.0}, kinds) == 8
    assert mod.choose_weak({2: 0.0, 4: 0.7}, p, {2: {"copy": 0.0}, 4: {"copy": 1.0}}) is None


def test_probe_scores_count_the_reward_term_per_task_kind(tmp_path) -> None:
    import json

    from benchmark_module import load
    from trajtune.envs.home import make_task

    mod = load("real_multiturn")
    seeds: dict[str, list[int]] = {}
    for seed in range(100):
        seeds.setdefault(make_task(seed, "train").data["kind"], []).append(seed)
    # copy: one paid of two (a success without the term is not paid); toggle: no term reported (cut off)
    eps = [(seeds["copy"][0], True, {"explained": 1.0}), (seeds["copy"][1], True, {"explained": 0.0}),
           (seeds["set"][0], True, {"explained": 1.0}), (seeds["toggle"][0], False, None)]
    with (tmp_path / "episodes.jsonl").open("w") as f:
        for seed, ok, terms in eps:
            meta = {"seed": seed, "split": "train", **({"reward_info": terms} if terms else {})}
            f.write(json.dumps({"id": f"home-train-{seed}", "metadata": meta, "outcome": {"success": ok}}) + "\n")
    p = {**mod.DEFAULTS, "probe_reward": "explained"}
    assert mod.probe_scores(tmp_path, p) == (0.5, {"copy": 0.5, "set": 1.0, "toggle": 0.0})
    assert mod.probe_scores(tmp_path, {**p, "probe_reward": "success"}) == (0.75, {"copy": 1.0, "set": 1.0, "toggle": 0.0})


def test_a_probe_reward_the_environment_does_not_report_is_refused_before_any_work(tmp_path) -> None:
    from benchmark_module import load

    mod = load("real_multiturn")
    with pytest.raises(SystemExit, match="does not report it"):
        mod.run(tmp_path / "run", {**mod.DEFAULTS, "probe_reward": "explained"}, 0)  # no rationale: no term
    assert not (tmp_path / "run").exists()  # nothing written: the corrected command can use the same --out


def test_weak_first_chooses_the_least_trained_checkpoint_paid_on_every_kind() -> None:
    from benchmark_module import load

    mod = load("real_multiturn")
    p = {**mod.DEFAULTS, "weak_min_kind": 0.05, "weak_first": True}
    probed = {2: 0.0, 4: 0.2, 6: 0.4, 8: 0.5}
    kinds = {2: {"copy": 0.0, "set": 0.0}, 4: {"copy": 0.0, "set": 0.4}, 6: {"copy": 0.1, "set": 0.7},
             8: {"copy": 0.2, "set": 0.8}}
    assert mod.choose_weak(probed, p, kinds) == 6
    assert mod.choose_weak(probed, {**p, "weak_first": False}, kinds) == 8
    assert mod.choose_weak({**probed, 6: 0.6}, p, kinds) is None  # the bound still ends the search
