"""trajtune report: the self-contained HTML page, read back as data and driven in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trajtune.cli.main import app

runner = CliRunner()
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
XSS = "</script><script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">"


def _data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert m, "the page embeds its data"
    return json.loads(m.group(1))


@pytest.fixture(scope="module")
def rl_run(tmp_path_factory, tiny_dir) -> Path:
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.train import run

    out = tmp_path_factory.mktemp("report") / "rl"
    cfg = load_config(None, RLRunConfig, [f"model={tiny_dir}", f"output_dir={out}", "env=home",
                                          "rollout.max_turns=2", "rollout.max_new_tokens=12", "rollout.max_length=512",
                                          "rl.tasks_per_step=2", "rl.group_size=4", "rl.n_train_tasks=8",
                                          "rl.overlong={max_length: 24, cache: 20}", "train.steps=2"])
    run(cfg, quiet=True)
    # an episode whose model output tries to break out of the page (model output is data)
    lines = (out / "rollouts.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    rec["messages"][-1]["content"] = XSS
    rec["outcome"]["success"] = False
    (out / "rollouts.jsonl").write_text("\n".join([json.dumps(rec)] + lines[1:]) + "\n")
    r = runner.invoke(app, ["report", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return out


def test_a_finished_run_writes_a_self_contained_report(rl_run):
    page = (rl_run / "report.html").read_text()
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', page), "nothing is loaded from the network"
    assert "<link" not in page and "@import" not in page
    data = _data(page)
    eps = data["episodes"]
    assert len(eps) == 16 and {e["step"] for e in eps} == {1, 2}  # 2 steps x 2 tasks x 4 samples
    first = eps[0]
    # tokens: provenance of every token, and the policy's tokens are the trained ones
    assert len(first["tokens"]) == len(first["prov"]) == len(first["weight"])
    assert set(first["prov"]) == {0, 1, 2} or set(first["prov"]) >= {0, 1}
    assert all((w > 0) == (p == 1) for p, w in zip(first["prov"], first["weight"]))
    assert all(isinstance(e["advantage"], float) for e in eps)
    cut = [e for e in eps if e["termination"] in ("length", "context_overflow")]
    assert cut and all(e["cut"]["at"] == len(e["tokens"]) for e in cut)
    assert "<svg" in page and 'aria-label="loss"' in page and 'aria-label="reward"' in page
    assert "rollout:" in page  # the config section
    assert XSS not in page  # escaped in the embedded JSON


def test_report_false_turns_it_off_and_missing_pieces_are_named(tmp_path, tiny_dir):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.report import write_report
    from trajtune.train import run

    out = tmp_path / "rl"
    run(load_config(None, RLRunConfig, [f"model={tiny_dir}", f"output_dir={out}", "env=home", "report=false",
                                        "rollout.max_turns=1", "rollout.max_new_tokens=8", "rl.tasks_per_step=1",
                                        "rl.group_size=2", "train.steps=1"]), quiet=True)
    assert (out / "result.json").exists() and not (out / "report.html").exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text("algorithm: sft\nmodel: nowhere\noutput_dir: x\ndata: {path: gone.jsonl}\n")
    page = write_report(empty).read_text()
    assert "no episodes" in page and "no metrics.jsonl" in page and "no result.json" in page
    assert "gone.jsonl is not a local JSONL file" in page
    assert _data(page)["episodes"] == []
    r = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert r.exit_code == 3 and "no such run directory" in r.output


def test_eval_out_writes_a_report_of_its_episodes(tmp_path, tiny_dir):
    out = tmp_path / "ev"
    r = runner.invoke(app, ["eval", "--model", str(tiny_dir), "--env", "home", "--tasks", "3", "--max-new-tokens",
                            "8", "--max-turns", "1", "--out", str(out), "-q"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    data = _data((out / "report.html").read_text())
    assert [e["source"] for e in data["episodes"]] == ["eval"] * 3
    assert all(e["tokens"] for e in data["episodes"])
    r = runner.invoke(app, ["eval", "--model", str(tiny_dir), "--env", "home", "--tasks", "1", "--max-new-tokens",
                            "4", "--max-turns", "1", "--out", str(tmp_path / "ev2"), "-q", "--no-report"])
    assert r.exit_code == 0 and not (tmp_path / "ev2" / "report.html").exists()


@pytest.fixture(scope="module")
def browser():
    assert CHROMIUM and DRIVER, "make test installs chromium and chromium-driver (apt); install them to run this test"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield d
    d.quit()


def test_the_viewer_filters_expands_and_shows_provenance_in_a_browser(rl_run, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    d = browser
    d.get((rl_run / "report.html").as_uri())
    rows = lambda: d.find_elements(By.CSS_SELECTOR, "#episodes tbody tr.ep")  # noqa: E731
    assert len(rows()) == 16
    assert d.find_element(By.ID, "count").text == "16 of 16 episodes"
    # filter: failures only, then one step
    Select(d.find_element(By.ID, "f-outcome")).select_by_value("failure")
    failing = rows()
    assert failing and all(r.find_elements(By.TAG_NAME, "td")[4].text == "failure" for r in failing)
    Select(d.find_element(By.ID, "f-outcome")).select_by_value("")
    Select(d.find_element(By.ID, "f-step")).select_by_value("2")
    assert len(rows()) == 8 and all(r.find_elements(By.TAG_NAME, "td")[3].text == "2" for r in rows())
    Select(d.find_element(By.ID, "f-step")).select_by_value("")
    # expand the first episode: its messages, with the hostile text shown as text
    rows()[0].click()
    msgs = d.find_elements(By.CSS_SELECTOR, "tr.detail .msg")
    assert [m.get_attribute("class").split()[1] for m in msgs][:2] == ["system", "user"]
    assert any(XSS in m.text for m in msgs)
    assert d.execute_script("return window.__pwned === undefined")
    # provenance toggle: coloured tokens with weights and advantages, and the truncation mark
    d.find_element(By.ID, "f-tokens").click()
    toks = d.find_elements(By.CSS_SELECTOR, "tr.detail .tok")
    assert toks
    classes = {c for t in toks for c in t.get_attribute("class").split()}
    assert {"p0", "p1"} <= classes
    policy = [t for t in toks if "p1" in t.get_attribute("class").split()]
    assert all("advantage" in t.get_attribute("title") for t in policy)
    assert not d.find_element(By.ID, "legend").get_attribute("hidden")
    Select(d.find_element(By.ID, "f-term")).select_by_value("length")
    assert rows(), "the tiny model's 12-token turns end by length"
    if not d.find_elements(By.CSS_SELECTOR, "tr.detail"):  # the first one may be open already
        rows()[0].click()
    assert d.find_elements(By.CSS_SELECTOR, "tr.detail .cut")
    severe = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, tiny_dir, home_experts) -> Path:
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.config import load_config
    from trajtune.schema import write_trajectories
    from trajtune.train import run

    d = tmp_path_factory.mktemp("report-sft")
    write_trajectories(d / "train.jsonl", home_experts[:32])
    out = d / "sft"
    run(load_config(None, SFTRunConfig, [f"model={tiny_dir}", f"output_dir={out}", f"data.path={d / 'train.jsonl'}",
                                         "data.max_length=512", "train.steps=12", "train.lr=3e-3", "train.batch_size=8",
                                         "train.micro_batch_size=8"]), quiet=True)
    return out


def test_an_sft_report_shows_the_rendered_training_samples(sft_run, home_experts):
    data = _data((sft_run / "report.html").read_text())
    eps = data["episodes"]
    assert len(eps) == 32 and {e["source"] for e in eps} == {"training data"}
    assert eps[0]["task"] == home_experts[0].id
    # what was trained: weights on the assistant's tokens only, and their text is the expert's
    trained = "".join(t for t, w in zip(eps[0]["tokens"], eps[0]["weight"]) if w > 0)
    assert "Done" in trained and "You control a smart home" not in trained


def test_the_report_renders_visibly(sft_run, browser, tmp_path):
    """A screenshot of the page: drawn, with the curves and the table (not a blank or error page).
    TRAJTUNE_SCREENSHOTS=DIR also keeps the screenshots (the README's come from here)."""
    import os

    from PIL import Image
    from selenium.webdriver.common.by import By

    d = browser
    d.get((sft_run / "report.html").as_uri())
    assert d.find_elements(By.CSS_SELECTOR, "#curves svg.curve")
    shot = tmp_path / "report.png"
    d.save_screenshot(str(shot))
    img = Image.open(shot).convert("RGB")
    assert img.size[0] >= 1000 and img.size[1] >= 600
    colours = img.resize((64, 64)).getcolors(64 * 64)
    assert colours is not None and len(colours) > 20  # text, lines and shading: not a blank page
    assert not [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    keep = os.environ.get("TRAJTUNE_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "report-top.png")
        d.find_elements(By.CSS_SELECTOR, "#episodes tbody tr.ep")[0].click()
        d.execute_script("document.getElementById('viewer').scrollIntoView()")
        d.save_screenshot(str(Path(keep) / "report-messages.png"))
        d.find_element(By.ID, "f-tokens").click()
        d.save_screenshot(str(Path(keep) / "report-tokens.png"))


def test_evaluated_episodes_get_a_table_per_environment_with_their_reward_terms(tmp_path):
    from trajtune.report import collect

    def ep(env: str, success: bool, end: str, terms: dict) -> str:
        return json.dumps({"id": "x", "messages": [{"role": "user", "content": "hi"}], "reward": float(success),
                           "outcome": {"success": success, "termination": end},
                           "metadata": {"env": env, "reward_info": terms}})

    (tmp_path / "run.json").write_text(json.dumps({"model": "m", "env": "tau2"}))
    (tmp_path / "results.json").write_text(json.dumps({"metrics": {"success": 0.5}}))
    (tmp_path / "episodes.jsonl").write_text("\n".join([
        ep("tau2", True, "done", {"tau2_db": 1.0, "tau2_communicate": 1.0}),
        ep("tau2", False, "done", {"tau2_db": 0.0, "tau2_communicate": 1.0}),
        ep("tau2", False, "length", {}),
        ep("home", True, "done", {})]) + "\n")
    tables = collect(tmp_path).tables
    assert tables["env tau2"] == {"episodes": 3, "success": 1 / 3, "mean_reward": 1 / 3, "terminations.done": 2,
                                  "terminations.length": 1, "term.tau2_communicate": 1.0, "term.tau2_db": 0.5}
    assert tables["env home"]["episodes"] == 1 and tables["env home"]["success"] == 1.0
