"""DualTune (decoupled tool calling): the two masks, gradient isolation, two-stage decoding, saving."""

from __future__ import annotations

import json

import pytest
import torch

from trajtune.algorithms.dualtune import (
    SELECTOR,
    DualTuneObjective,
    DualTuneSpec,
    add_adapters,
    adapter_names,
    labels,
    split_by_adapter,
)
from trajtune.chat.call_spans import call_splits
from trajtune.chat.render import ChatRenderer, RenderConfig
from trajtune.schema import Message, ToolCall, ToolSpec, Trajectory
from trajtune.tokens import SOURCE_POLICY


def _traj() -> Trajectory:
    tools = [ToolSpec(name="set_device", description="switch a device",
                      parameters={"type": "object", "properties": {"room": {"type": "string"},
                                                                   "state": {"type": "string"}}}),
             ToolSpec(name="get_room", description="read a room",
                      parameters={"type": "object", "properties": {"room": {"type": "string"}}})]
    return Trajectory(id="t1", tools=tools, messages=[
        Message(role="user", content="Turn off the cellar heater."),
        Message(role="assistant", tool_calls=[
            ToolCall(id="c1", name="get_room", arguments={"room": "cellar"}),
            ToolCall(id="c2", name="set_device", arguments={"room": "cellar", "state": "off"})]),
        Message(role="tool", tool_call_id="c1", content="heater on"),
        Message(role="tool", tool_call_id="c2", content="ok"),
        Message(role="assistant", content="Done."),
    ])


# -- the scanner ------------------------------------------------------------------------------------

def test_call_splits_find_each_name_end_and_call_end_with_braces_inside_strings():
    text = ('<tool_call>\n{"name": "a.b", "arguments": {"q": "x}{\\"y"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "c", "arguments": {}}\n</tool_call>')
    s = call_splits(text)
    assert [c.name for c in s] == ["a.b", "c"]
    assert text[s[0].name_start:s[0].name_end] == "a.b" and text[s[0].name_end] == '"'
    assert text[s[0].args_end] == "}" and text[s[0].args_end + 1] == "\n"
    assert text[s[0].name_end + 1:s[0].args_end + 1] == ', "arguments": {"q": "x}{\\"y"}}'
    assert text[s[1].name_end + 1:s[1].args_end + 1] == ', "arguments": {}}'
    open_call = call_splits('<tool_call>{"name": "c", "arguments": {"q": 1')
    assert open_call[0].name == "c" and open_call[0].args_end is None


# -- the masks --------------------------------------------------------------------------------------

@pytest.mark.parametrize("tool_format", ["native", "hermes"])
def test_name_and_argument_masks_are_disjoint_and_cover_every_call_token(tiny_tok, tool_format):
    traj = _traj()
    tt = ChatRenderer(tiny_tok, RenderConfig(tool_format=tool_format, train_on="all")).render(traj)
    lab, is_name, policy = labels(tt, tiny_tok)
    turn0 = [i for i in range(len(tt)) if policy[i] and tt.turn[i] == 0]  # the turn with both calls
    sel = [i for i in turn0 if lab[i] is None]
    args = {tool: [i for i in turn0 if lab[i] == tool] for tool in ("get_room", "set_device")}
    assert set(sel).isdisjoint(args["get_room"]) and set(sel).isdisjoint(args["set_device"])
    assert sorted(sel + args["get_room"] + args["set_device"]) == turn0  # together: every policy token
    # each argument mask is that call's arguments, the name given: '[,] "arguments": {...}}' (the comma goes
    # with the name's closing quote when one token writes both)
    for call in traj.messages[1].tool_calls:
        text = tiny_tok.decode([tt.ids[i] for i in args[call.name]])
        assert text.lstrip(", ").startswith('"arguments"')
        assert json.loads('{"name": "x", ' + text.lstrip(", ")) == {"name": "x", "arguments": call.arguments}
    names = tiny_tok.decode([tt.ids[i] for i in turn0 if is_name[i]])
    assert "get_room" in names and "set_device" in names and "cellar" not in names
    assert all(lab[i] is None for i in turn0 if is_name[i])  # name tokens are the selector's
    # the answer turn has no call: all selector
    assert all(lab[i] is None for i in range(len(tt)) if policy[i] and tt.turn[i] == 1)


def test_split_by_adapter_gives_each_policy_token_to_exactly_one_adapter(tiny_tok):
    tt = ChatRenderer(tiny_tok, RenderConfig(train_on="all")).render(_traj())
    copies, tools, counts = split_by_adapter([tt], tiny_tok, DualTuneSpec())
    assert tools == {"get_room": "args_get_room", "set_device": "args_set_device"}
    assert sorted(c.meta["adapter"] for c in copies) == ["args_get_room", "args_set_device", SELECTOR]
    total = [sum(c.weight[k] for c in copies) for k in range(len(tt))]
    assert total == [1.0 if s == SOURCE_POLICY else 0.0 for s in tt.source]
    assert sum(counts.values()) == tt.n_policy()
    shared, tools2, _ = split_by_adapter([tt], tiny_tok, DualTuneSpec(arguments="shared"))
    assert set(tools2.values()) == {"arguments"} and len(shared) == 2
    names_only, _, counts3 = split_by_adapter([tt], tiny_tok, DualTuneSpec(selector_learns="names",
                                                                            adapters="selector"))
    assert [c.meta["adapter"] for c in names_only] == [SELECTOR] and counts3[SELECTOR] < counts[SELECTOR]


def test_adapter_names_are_module_safe_and_unique():
    assert adapter_names(["a.b", "a-b", "x"], shared=False) == {"a-b": "args_a_b", "a.b": "args_a_b_2",
                                                                "x": "args_x"}


# -- gradient isolation -----------------------------------------------------------------------------

def test_a_selector_step_leaves_argument_adapter_gradients_exactly_zero_and_vice_versa(tiny_dir, tiny_tok):
    from trajtune.algorithms.batch import collate
    from trajtune.models.loading import LoraConfig, load_model

    model = load_model(str(tiny_dir), lora=LoraConfig(r=4, alpha=8))
    add_adapters(model, ["args_get_room", "args_set_device"])
    tt = ChatRenderer(tiny_tok, RenderConfig(train_on="all")).render(_traj())
    copies, _, _ = split_by_adapter([tt], tiny_tok, DualTuneSpec())
    by = {c.meta["adapter"]: c for c in copies}
    # LoRA B starts at 0, so A has no gradient on the first step; make B non-zero everywhere
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)

    def grads_after(adapter: str) -> dict[str, float]:
        model.zero_grad(set_to_none=True)
        loss, m = DualTuneObjective().loss_sum(model, collate([by[adapter]], tiny_tok.pad_token_id))
        loss.backward()
        out: dict[str, float] = {}
        for n, p in model.named_parameters():
            if "lora_" in n:
                key = n.split("lora_")[1].split(".")[1]  # lora_A.<adapter>.weight
                out[key] = out.get(key, 0.0) + (0.0 if p.grad is None else float(p.grad.abs().sum()))
        return out

    g = grads_after(SELECTOR)
    assert g[SELECTOR] > 0 and g["args_get_room"] == 0.0 and g["args_set_device"] == 0.0
    g = grads_after("args_set_device")
    assert g["args_set_device"] > 0 and g[SELECTOR] == 0.0 and g["args_get_room"] == 0.0
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)  # all stay trainable
    assert model.active_adapter == SELECTOR


# -- two-stage decoding -----------------------------------------------------------------------------

class _ScriptedPeft(torch.nn.Module):
    """A stand-in PEFT model: each adapter writes its own fixed turn, token k at generated position k
    (so which adapter wrote which token shows in the text)."""

    def __init__(self, scripts: dict[str, list[int]], prompt_len: int, vocab: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.peft_config = {a: None for a in scripts}
        self.active_adapter = SELECTOR
        self.scripts, self.prompt_len, self.vocab = scripts, prompt_len, vocab

    def set_adapter(self, name: str) -> None:
        self.active_adapter = name

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        past_key_values.n_seen = getattr(past_key_values, "n_seen", 0) + input_ids.shape[1]  # tokens so far
        k = past_key_values.n_seen - self.prompt_len
        logits = torch.zeros(1, input_ids.shape[1], self.vocab)
        script = self.scripts[self.active_adapter]
        logits[0, -1, script[min(k, len(script) - 1)]] = 10.0
        return type("O", (), {"logits": logits})()


def _scripted(tok, spec_args, selector_value="SEL", arg_value="ARG", tool="get_room"):
    from trajtune.algorithms.dualtune_decode import DualTuneSampler

    def turn(value):
        return tok.encode('<tool_call>{"name": "' + tool + '", "arguments": {"room": "' + value
                          + '"}}</tool_call><|im_end|>', add_special_tokens=False)

    scripts = {SELECTOR: turn(selector_value), **{a: turn(arg_value) for a in set(spec_args.values())}}
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    model = _ScriptedPeft(scripts, len(prompt), len(tok))
    sampler = DualTuneSampler(model, tok, {"arguments": spec_args, "shared": None}, 0.0, 1.0,
                              [tok.convert_tokens_to_ids("<|im_end|>")])
    return sampler, prompt


def test_two_stage_decoding_selector_writes_the_name_and_the_named_adapter_the_arguments(tiny_tok):
    from trajtune.chat.parsers import parse_tool_calls

    sampler, prompt = _scripted(tiny_tok, {"get_room": "args_get_room"})
    ((ids, lps, ended, cache),) = sampler.turn([(None, prompt)], [64], seed=0)
    text = tiny_tok.decode(ids[:-1])
    parsed = parse_tool_calls(text, "hermes")
    assert ended and cache is None and not parsed.errors
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_room", {"room": "ARG"})]
    used = sampler.last_adapters[0]
    by = {a: tiny_tok.decode([t for t, u in zip(ids, used) if u == a]) for a in set(used)}
    assert by["args_get_room"] == ' "arguments": {"room": "ARG"}}'
    assert by[SELECTOR] == '<tool_call>{"name": "get_room",</tool_call><|im_end|>'
    # decoding switched exactly where training cuts the same turn into selector and argument tokens
    from trajtune.algorithms.dualtune import turn_labels

    lab, _ = turn_labels(tiny_tok, ids)
    assert used == [SELECTOR if x is None else "args_" + x for x in lab]
    assert len(lps) == len(ids) and all(lp <= 0 for lp in lps)


def test_two_stage_decoding_falls_back_to_the_selector_for_a_tool_without_an_adapter(tiny_tok):
    sampler, prompt = _scripted(tiny_tok, {"set_device": "args_set_device"}, tool="get_room")
    ((ids, _, ended, _),) = sampler.turn([(None, prompt)], [64], seed=0)
    assert ended and set(sampler.last_adapters[0]) == {SELECTOR}
    assert '"room": "SEL"' in tiny_tok.decode(ids)


# -- training end to end: saving, loading, decoding with the saved adapters ---------------------------

def test_dualtune_run_saves_peft_multi_adapter_layout_that_loads_and_decodes_in_two_stages(tmp_path, tiny_dir,
                                                                                            home_experts, monkeypatch):
    from trajtune.algorithms.registry import load_run_config
    from trajtune.algorithms.dualtune_decode import DualTuneSampler, dualtune_spec
    from trajtune.algorithms.registry import load_trained
    from trajtune.schema import write_trajectories
    from trajtune.train import run

    write_trajectories(tmp_path / "train.jsonl", home_experts[:16])
    cfg_path = tmp_path / "dt.yaml"
    cfg_path.write_text(f"algorithm: dualtune\nmodel: {{name_or_path: {tiny_dir}, lora: {{r: 4, alpha: 8}}}}\n"
                        f"output_dir: {tmp_path / 'run'}\ndata: {{path: {tmp_path / 'train.jsonl'}, max_length: 512}}\n"
                        "train: {steps: 2, lr: 1.0e-2, batch_size: 8, micro_batch_size: 8}\nreport: false\n"
                        "eval: {env: home, n_tasks: 1}\n")
    calls = []
    real_turn = DualTuneSampler.turn

    def counting_turn(self, rows, max_new, seed):
        calls.append(len(rows))
        return real_turn(self, rows, max_new, seed)

    monkeypatch.setattr(DualTuneSampler, "turn", counting_turn)
    result = run(load_run_config(cfg_path), quiet=True)
    assert calls and "success" in str(result["eval"])  # the run's own evaluation decoded in two stages
    final = tmp_path / "run" / "final"
    spec = json.loads((final / "dualtune.json").read_text())
    tools = result["dualtune"]["tools"]
    assert spec["arguments"] == tools and len(tools) >= 2
    assert (final / "adapter_config.json").exists()  # the selector: peft's default adapter, on top
    for a in tools.values():
        assert (final / a / "adapter_model.safetensors").exists()

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    a0 = sorted(tools.values())[0]
    pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_dir)), str(final))
    pm.load_adapter(str(final / a0), adapter_name=a0)  # plain peft reads the layout too
    assert set(pm.peft_config) == {"default", a0}

    model = load_trained(str(final)).eval()
    assert dualtune_spec(model)["arguments"] == tools
    trained = {n.split("lora_B.")[1].split(".")[0] for n, p in model.named_parameters()
               if "lora_B" in n and p.abs().sum() > 0}
    assert trained == {SELECTOR, *tools.values()}  # every adapter learned something and was loaded
    # the sampler's log-probs are those of the adapter that wrote each token
    tok_prompt = ChatRenderer(__import__("trajtune.models.loading", fromlist=["x"]).load_tokenizer(str(final)))
    prompt = tok_prompt.encode(tok_prompt.prompt_text(home_experts[0].messages[:2], home_experts[0].tools))
    sampler = DualTuneSampler(model, tok_prompt.tok, dualtune_spec(model), 0.0, 1.0, tok_prompt.stop_ids())
    ((ids, lps, _, _),) = sampler.turn([(None, prompt)], [12], seed=0)
    from trajtune.algorithms.dualtune import activate

    with torch.no_grad():
        for k, (t, lp, a) in enumerate(zip(ids, lps, sampler.last_adapters[0])):
            activate(model, a)
            logits = model(input_ids=torch.tensor([prompt + ids[:k]])).logits[0, -1].float()
            assert abs(float(torch.log_softmax(logits, -1)[t]) - lp) < 1e-4
    activate(model, SELECTOR)

    # trajtune eval --model RUN: the run directory stands for its final model, decoded in two stages
    from typer.testing import CliRunner

    from trajtune.cli.main import app

    calls.clear()
    r = CliRunner().invoke(app, ["eval", "--model", str(tmp_path / "run"), "--env", "home", "--tasks", "2",
                                 "--max-new-tokens", "8", "--max-turns", "1", "--quiet", "--device", "cpu"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert sum(calls) == 2  # both episodes' turns went through the two-stage sampler
    from trajtune.eval.backends import HFBackend  # single-turn benchmarks (BFCL) too

    out = HFBackend(model, tok_prompt.tok, max_new_tokens=4, renderer=tok_prompt).complete(
        [(home_experts[0].messages[:2], home_experts[0].tools)], seed=0)
    assert sum(calls) == 3 and isinstance(out[0], str)


def test_dualtune_run_resumes_every_adapter_from_its_checkpoint(tmp_path, tiny_dir, home_experts):
    from safetensors.torch import load_file

    from trajtune.algorithms.registry import load_run_config
    from trajtune.train import run

    write_trajectories = __import__("trajtune.schema", fromlist=["x"]).write_trajectories
    write_trajectories(tmp_path / "train.jsonl", home_experts[:8])
    text = (f"algorithm: dualtune\nmodel: {{name_or_path: {tiny_dir}, lora: {{r: 4, alpha: 8}}}}\n"
            f"output_dir: {tmp_path / 'run'}\ndata: {{path: {tmp_path / 'train.jsonl'}, max_length: 512}}\n"
            "dualtune: {arguments: shared}\ntrain: {steps: 2, lr: 1.0e-2, batch_size: 4, micro_batch_size: 4, "
            "save_every: 1}\nreport: false\n")
    (tmp_path / "dt.yaml").write_text(text)
    assert run(load_run_config(tmp_path / "dt.yaml"), quiet=True, stop_after=1)["stopped"]
    run(load_run_config(tmp_path / "dt.yaml"), quiet=True, resume=True)
    (tmp_path / "dt.yaml").write_text(text.replace("/run", "/straight"))
    run(load_run_config(tmp_path / "dt.yaml"), quiet=True)
    for sub in ("", "arguments/"):  # resumed == trained straight through, for both adapters
        a = load_file(tmp_path / "run" / "final" / sub / "adapter_model.safetensors")
        b = load_file(tmp_path / "straight" / "final" / sub / "adapter_model.safetensors")
        assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_dualtune_config_refuses_settings_that_would_do_nothing(tmp_path):
    from trajtune.algorithms.registry import load_run_config
    from trajtune.errors import ConfigError

    base = "algorithm: dualtune\noutput_dir: runs/x\ndata: {path: d.jsonl}\n"
    cases = {"model: {name_or_path: m, lora: {r: 4}}\ndualtune: {adapters: arguments, selector_learns: names}\n":
                 "selector_learns does nothing",
             "model: {name_or_path: m, lora: {r: 4}}\ndualtune: {adapters: selector, arguments: shared}\n":
                 "arguments does nothing"}
    for extra, msg in cases.items():
        (tmp_path / "c.yaml").write_text(base + extra)
        with pytest.raises(ConfigError, match=msg):
            load_run_config(tmp_path / "c.yaml")
    (tmp_path / "c.yaml").write_text(base + "model: m\n")  # without model.lora: LoRA with its defaults
    assert load_run_config(tmp_path / "c.yaml").model.lora.r == 8
