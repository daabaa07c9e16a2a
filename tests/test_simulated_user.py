"""The simulated user in front of any environment: who writes its turns, what the agent sees, and how a
failing simulator ends an episode."""

from __future__ import annotations

import pytest
from test_judge import FakeJudgeServer
from turns import say, script

from trajtune.envs import make_env
from trajtune.envs.adapters.simulated_user import (
    GREETING,
    STOP,
    LocalUser,
    UserSession,
    make_user,
)
from trajtune.envs.home import HomeEnv
from trajtune.envs.runner import run_episode
from trajtune.errors import EnvError
from trajtune.schema import Message


def _expert_actions(task) -> list[Message]:
    return [m for m in HomeEnv().expert(task).messages if m.role == "assistant"]


def test_a_scripted_user_in_front_of_home_lets_the_expert_finish_and_answers_a_question_first():
    env = make_env("simulated_user", env="home")
    task = env.tasks("test", 1)[0]
    traj = run_episode(env, task, script(*_expert_actions(task)))
    assert traj.outcome.success and traj.outcome.termination == "done"
    request = HomeEnv().reset(task).messages[-1].text()
    assert traj.messages[1].role == "user" and traj.messages[1].text() == request  # scripted: the request itself
    # a question to the user is answered by the user, and the episode goes on to the inner environment
    asked = run_episode(env, task, script(say("Shall I go ahead? (yes/no)"), *_expert_actions(task)))
    i = next(i for i, m in enumerate(asked.messages) if m.text() == "Shall I go ahead? (yes/no)")
    answer = asked.messages[i + 1]
    assert answer.role == "user" and answer.text() == "Yes, please go ahead."
    assert asked.outcome.success


def test_an_endpoint_user_speaks_from_a_scenario_the_agent_never_sees():
    server = FakeJudgeServer(["Hello, could you turn something on for me?", "###STOP###"])
    try:
        env = make_env("simulated_user", env="home", user=f"openai:{server.url}", user_model="sim")
        task = env.tasks("test", 1)[0]
        request = HomeEnv().reset(task).messages[-1].text()
        res = env.reset(task)
        assert res.messages[-1].text() == "Hello, could you turn something on for me?"
        assert all(request not in m.text() for m in res.messages)  # only the user knows the full request
        sent = server.requests[0]
        assert sent["model"] == "sim" and request in sent["messages"][0]["content"]  # the scenario, to the user
        assert sent["messages"][1] == {"role": "user", "content": GREETING}
        out = env.step(say("Which device?"))
        assert out.done and out.info["user_stop"] == STOP
        assert server.requests[1]["messages"][-1] == {"role": "user", "content": "Which device?"}  # roles flipped
        assert server.requests[1]["messages"][-2]["role"] == "assistant"  # the user's own earlier turn
    finally:
        server.close()


def test_a_user_model_that_fails_ends_the_episode_as_an_env_error_not_as_the_agents_failure():
    server = FakeJudgeServer(["Please help me.", ""])
    try:
        env = make_env("simulated_user", env="home", user=f"openai:{server.url}")
        traj = run_episode(env, env.tasks("test", 1)[0], script(say("What do you need?")))
        assert traj.outcome.termination == "env_error" and "answered nothing" in env.user_error
        assert not traj.outcome.success
    finally:
        server.close()
    with pytest.raises(EnvError, match="openai:http"):
        make_user("openai:localhost:1")


def test_a_local_user_model_writes_what_the_model_decodes_greedily(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trajtune.envs.adapters.simulated_user import (
        UserSimulatorError,
        user_system_prompt,
    )

    user = LocalUser(str(tiny_dir), max_new_tokens=12)
    messages = [Message(role="system", content=user_system_prompt("You want the kitchen lamp on.")),
                Message(role="user", content=GREETING)]
    text = user(messages, {})
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    chat = [{"role": m.role, "content": m.text()} for m in messages]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False,
                             pad_token_id=tok.pad_token_id or tok.eos_token_id)
    want_ids = out[0, ids["input_ids"].shape[1]:].tolist()
    want = tok.decode(want_ids, skip_special_tokens=True)
    # the same greedy tokens as generate() on the chat template (the service is trajtune serve's)
    reply = user.service.complete({"messages": [{"role": m.role, "content": m.text()} for m in messages],
                                   "temperature": 0.0})
    got_ids = reply["choices"][0]["token_ids"]
    assert got_ids and got_ids == want_ids[:len(got_ids)]
    assert want and text == want.strip()
    # this untrained model writes only whitespace: the session refuses it as no answer at all
    assert not want.strip()
    with pytest.raises(UserSimulatorError, match="answered nothing"):
        UserSession(user, {"instructions": "You want the kitchen lamp on."}).opening()


def test_metrics_give_success_also_without_the_episodes_the_environment_broke():
    from trajtune.eval.metrics import summarize
    from trajtune.schema import Outcome, Trajectory

    def ep(i: int, success: bool, termination: str) -> Trajectory:
        return Trajectory(id=f"t{i}", messages=[Message(role="user", content="x"), say("y")],
                          outcome=Outcome(success=success, termination=termination))

    m = summarize([ep(0, True, "done"), ep(1, False, "done"), ep(2, False, "env_error"), ep(3, False, "env_error")])
    assert m["success"] == 0.25 and m["env_errors"] == 2 and m["success_without_env_errors"] == 0.5
    assert "env_errors" not in summarize([ep(0, True, "done")])


def test_a_local_user_model_is_loaded_once_per_process(tiny_dir):
    assert make_user(str(tiny_dir), max_new_tokens=5) is make_user(str(tiny_dir), max_new_tokens=5)
