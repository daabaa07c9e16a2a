"""One sampler selection (generation.sampler_for) and the algorithm load hook (registry.load_trained):
a model carries its own sampler and generic code never names the algorithm that set it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trajtune.algorithms import registry
from trajtune.generation import SAMPLER_HOOK, CachedSampler, carried_sampler, sampler_for

SRC = Path(__file__).parent.parent / "src" / "trajtune"


class _Scripted:
    """A sampler with ``CachedSampler.turn``'s signature that writes a fixed turn, recording its calls."""

    def __init__(self, turn_ids: list[int]):
        self.turn_ids, self.calls = turn_ids, []

    def turn(self, rows, max_new, seed):
        self.calls.append([list(ids) for _cache, ids in rows])
        return [(list(self.turn_ids), [-0.5] * len(self.turn_ids), True, None) for _ in rows]


class _Wrapper:
    """What accelerate / DDP put around a model: the model under ``module``."""

    def __init__(self, module):
        self.module = module


def _carry(model, sampler, seen=None):
    def factory(m, tok, temperature, top_p, stop_ids):
        if seen is not None:
            seen.append((m, temperature, top_p, list(stop_ids)))
        return sampler

    model.__dict__[SAMPLER_HOOK] = factory


def test_a_carried_sampler_is_found_through_wrappers_and_handed_the_sampling_settings(tiny_model, tiny_tok):
    own, seen = _Scripted([1]), []
    _carry(tiny_model, own, seen)
    wrapped = _Wrapper(_Wrapper(tiny_model))
    assert carried_sampler(wrapped) is tiny_model.__dict__[SAMPLER_HOOK]
    got = sampler_for(wrapped, tiny_tok, temperature=0.7, top_p=0.9, stop_ids=[5, 6], reuse_cache=False)
    assert got is own
    assert seen == [(wrapped, 0.7, 0.9, [5, 6])]


def test_without_a_sampler_of_its_own_a_model_gets_the_cached_sampler_or_none(tiny_model, tiny_tok):
    assert carried_sampler(tiny_model) is None
    cached = sampler_for(tiny_model, tiny_tok, temperature=1.0, top_p=1.0, stop_ids=[3])
    assert type(cached) is CachedSampler and cached.stops == {3}
    assert sampler_for(tiny_model, tiny_tok, temperature=1.0, top_p=1.0, stop_ids=[3], reuse_cache=False) is None
    _carry(tiny_model, None)  # a hook that declines (e.g. a DualTune hook on a model without a spec)
    assert type(sampler_for(tiny_model, tiny_tok, temperature=1.0, top_p=1.0, stop_ids=[3])) is CachedSampler


def test_rollouts_and_eval_completions_decode_with_the_models_own_sampler(tiny_model, tiny_tok):
    from trajtune.chat.render import ChatRenderer
    from trajtune.envs import make_env
    from trajtune.eval.backends import HFBackend
    from trajtune.rollout import RolloutConfig, run_rollouts
    from trajtune.schema import Message

    renderer = ChatRenderer(tiny_tok)
    answer = tiny_tok.encode("done", add_special_tokens=False) + [renderer.stop_ids()[0]]
    own = _Scripted(answer)
    _carry(tiny_model, own)
    env = make_env("home")
    tasks = env.tasks("test", 2, seed=0)
    eps = run_rollouts(tiny_model, tiny_tok, lambda: make_env("home"), tasks,
                       RolloutConfig(max_turns=1, max_new_tokens=8, temperature=0.0), renderer=renderer)
    assert len(own.calls) == 1 and len(own.calls[0]) == 2  # one turn, both episodes, through the model's sampler
    for e in eps:
        policy = [i for i, s in zip(e.tokens.ids, e.tokens.source) if s == 1]
        assert policy == answer and e.trajectory.messages[-1].content == "done"

    own.calls.clear()
    backend = HFBackend(tiny_model, tiny_tok, renderer=renderer, max_new_tokens=8, max_length=512)
    out = backend.complete([([Message(role="user", content="hi")], [])], seed=0)
    assert out == ["done"] and len(own.calls) == 1

    # the server and the canary probe pick their sampler the same way
    from trajtune.safety.canaries import greedy_continuations
    from trajtune.serve import ChatService

    own.calls.clear()
    reply = ChatService(tiny_model, tiny_tok, renderer, name="tiny").complete(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
    assert reply["choices"][0]["message"]["content"] == "done" and len(own.calls) == 1
    own.calls.clear()
    assert greedy_continuations(tiny_model, renderer, [[1, 2, 3]], [8]) == [answer] and len(own.calls) == 1


def test_load_trained_runs_every_algorithms_load_hook_on_a_saved_adapter_directory_only(tmp_path, tiny_dir,
                                                                                       monkeypatch):
    from trajtune.models.loading import LoraConfig, load_model

    load_model(str(tiny_dir), lora=LoraConfig(r=2, alpha=4)).save_pretrained(tmp_path / "adapter")
    calls = []

    def hook(model, path):
        calls.append(path)
        model.trajtune_probe = path
        return model

    probe = registry.Algorithm("probe", object, "a test algorithm", lambda c, x: None, lambda c, x, p: None,
                               load_hook=hook)
    monkeypatch.setitem(registry._ALGORITHMS, "probe", probe)
    model = registry.load_trained(str(tmp_path / "adapter"))
    assert calls == [str(tmp_path / "adapter")] and model.trajtune_probe == str(tmp_path / "adapter")
    assert not any(p.requires_grad for p in model.parameters())  # loaded for inference
    registry.load_trained(str(tiny_dir))  # a full model directory: no adapter for a hook to complete
    assert calls == [str(tmp_path / "adapter")]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize("module", ["generation.py", "rollout.py", "experience.py", "config.py",
                                    "models/loading.py", "eval/backends.py"])
def test_generic_modules_import_no_algorithm(module):
    """Sampling, the agent loop, the experience sources, the shared config and model loading sit below
    the algorithms: an import from ``trajtune.algorithms`` there (even inside a function) is a circle
    in the making."""
    found = sorted(n for n in _imports(SRC / module) if n.startswith("trajtune.algorithms"))
    assert found == [], f"{module} imports {found}"


def test_a_saved_dualtune_directory_loads_with_its_adapters_and_decodes_in_two_stages(tmp_path, tiny_dir, tiny_tok):
    """The dualtune algorithm's load hook, reached through the registry: all adapters, the spec, and
    the sampler the model now carries; a directory missing an adapter it names is refused."""
    import json

    from trajtune.algorithms.dualtune_decode import DualTuneSampler, dualtune_spec
    from trajtune.errors import ModelLoadError
    from trajtune.models.loading import LoraConfig, load_model

    final = tmp_path / "final"
    load_model(str(tiny_dir), lora=LoraConfig(r=2, alpha=4)).save_pretrained(final)  # the selector
    (final / "dualtune.json").write_text(json.dumps({"version": 1, "selector": "default",
                                                     "arguments": {"get_room": "args_get_room"}, "shared": None}))
    with pytest.raises(ModelLoadError, match="args_get_room"):
        registry.load_trained(str(final))
    load_model(str(tiny_dir), lora=LoraConfig(r=2, alpha=4)).save_pretrained(final / "args_get_room")

    assert dualtune_spec(load_model(str(final), trainable=False)) is None  # model loading knows no algorithm
    model = registry.load_trained(str(final))
    assert dualtune_spec(model)["arguments"] == {"get_room": "args_get_room"}
    assert set(model.peft_config) == {"default", "args_get_room"} and model.active_adapter == "default"
    sampler = sampler_for(model, tiny_tok, temperature=0.0, top_p=1.0, stop_ids=[0])
    assert type(sampler) is DualTuneSampler and sampler.adapter_for("get_room") == "args_get_room"
