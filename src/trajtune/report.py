"""``trajtune report RUN_DIR``: one self-contained HTML page to look inside a run.

Why: agent fine-tuning is judged by reading trajectories (what the model said, which tokens were
trained, what the tool returned, what each turn earned), next to the curves. The page holds the
config, metric curves (inline SVG), eval tables and a trajectory viewer with filters and a token
view coloured by provenance (prompt / policy / env) with per-token weights and advantages and the
place where truncation cut. No network, no CDN: CSS and JS are inline and it opens from disk.

What it reads, whichever of these the directory has:

- a training run (``config.yaml``, ``metrics.jsonl``, ``result.json``): RL rollouts
  (``rollouts.jsonl``), RFT's kept attempts (``rft/iter-*.jsonl``), the SFT training data named by
  the config (rendered samples: what the model was trained on);
- an evaluation (``trajtune eval --out``: ``run.json``, ``episodes.jsonl``, ``results.json``);
- evaluations stored as ``eval/NAME.json`` + ``eval/NAME.episodes.jsonl`` (the demo);
- missing pieces are listed at the top of the page instead of failing.

Model output is data: every string reaches the page through ``textContent`` (never ``innerHTML``)
and the embedded JSON escapes ``</`` so text cannot close its script element.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trajtune.chat.render import ChatRenderer
from trajtune.errors import InputNotFoundError
from trajtune.folding import expand_folds
from trajtune.models.loading import load_tokenizer
from trajtune.progress import console
from trajtune.schema import Trajectory, atomic_write_text
from trajtune.tokens import SOURCE_NAMES

REPORT_FILE = "report.html"
MAX_TOKENS_PER_EPISODE = 4096


@dataclass
class _Data:
    title: str
    kind: str
    config: str | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)  # eval name -> flat metrics
    episodes: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    result: dict[str, Any] | None = None


# -- reading a run directory ----------------------------------------------------------------------

def _jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a killed run's partial last line
                continue
    return rows


def _spread(rows: list[Any], n: int) -> list[Any]:
    """``n`` rows evenly spaced over the list (all of them when there are fewer), in order."""
    if len(rows) <= n:
        return rows
    return [rows[round(i * (len(rows) - 1) / max(1, n - 1))] for i in range(n)]


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "categories":
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[f"{prefix}{k}"] = v
    return out


def _episode(rec: dict[str, Any], source: str) -> dict[str, Any]:
    """The viewer's record of one trajectory (IR JSON) from ``source``."""
    meta = rec.get("metadata") or {}
    outcome = rec.get("outcome") or {}
    task = (meta.get("eval") or {}).get("task_id") or rec.get("id") or "?"
    msgs = []
    for m in rec.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
        msgs.append({
            "role": m.get("role", "?"), "content": content if content is not None else "",
            "calls": [{"name": c.get("name", "?"), "arguments": c.get("arguments"), "id": c.get("id")}
                      for c in m.get("tool_calls") or []],
            "name": m.get("name"), "reward": m.get("reward"), "errors": (m.get("extra") or {}).get("parse_errors"),
        })
    step = rec.get("step")
    return {
        "source": source, "id": rec.get("id") or "?", "task": str(task), "step": step,
        "success": outcome.get("success"), "termination": outcome.get("termination") or "-",
        "reward": rec.get("reward"), "turns": sum(1 for m in msgs if m["role"] == "assistant"),
        "advantage": meta.get("advantage"), "policy_version": meta.get("policy_version"), "messages": msgs,
        "_record": rec,
    }


def _read_config(run: Path) -> tuple[str | None, dict[str, Any]]:
    for name in ("config.yaml", "demo_config.yaml"):
        p = run / name
        if p.exists():
            text = p.read_text(encoding="utf-8")
            try:
                data = yaml.safe_load(text) or {}
            except yaml.YAMLError:
                data = {}
            return text, data if isinstance(data, dict) else {}
    p = run / "run.json"  # an evaluation's settings
    if p.exists():
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError:
            return None, {}
        if "kind" not in data or len(data) > 2:
            return yaml.safe_dump(data, sort_keys=False), data
    return None, {}


def _kind(run: Path, cfg: dict[str, Any]) -> str:
    if cfg.get("algorithm"):
        return str(cfg["algorithm"])
    try:
        kind = json.loads((run / "run.json").read_text()).get("kind") if (run / "run.json").exists() else None
    except json.JSONDecodeError:
        kind = None
    if kind:
        return str(kind)
    if (run / "episodes.jsonl").exists() or (run / "results.json").exists():
        return "eval"
    if (run / "demo_config.yaml").exists():
        return "demo"
    return "run"


#: Files of which a run, an evaluation or a demo directory holds at least one.
RUN_MARKERS = ("config.yaml", "run.json", "metrics.jsonl", "result.json", "results.json", "summary.json",
               "rollouts.jsonl", "episodes.jsonl", "demo_settings.json")


def collect(run_dir: str | Path, *, max_episodes: int = 200) -> _Data:
    run = Path(run_dir)
    if not run.is_dir():
        raise InputNotFoundError(f"{run}: no such run directory (give the output_dir of a run or an eval --out)")
    if (run / "recipe.yaml").exists():
        return _collect_recipe(run, max_episodes)
    if not any((run / m).exists() for m in RUN_MARKERS):  # a report would be an empty page dropped in any folder
        raise InputNotFoundError(f"{run}: not a run directory (it has none of {', '.join(RUN_MARKERS)}); give the "
                                 "output_dir of a training run, an `eval --out` directory or a demo directory")
    config_text, cfg = _read_config(run)
    data = _Data(title=run.resolve().name, kind=_kind(run, cfg), config=config_text)
    if config_text is None:
        data.notes.append("no config.yaml (or evaluation run.json): the run's settings are not shown")
    if (run / "metrics.jsonl").exists():
        data.metrics = _jsonl(run / "metrics.jsonl")
    elif data.kind not in ("eval", "demo"):
        data.notes.append("no metrics.jsonl: no training curves (the run has not logged a step yet)")
    for name in ("result.json", "summary.json"):
        if (run / name).exists():
            try:
                data.result = json.loads((run / name).read_text())
            except json.JSONDecodeError:
                data.notes.append(f"{name} is not valid JSON")
            break
    if data.result is None and data.kind not in ("eval", "demo") and (run / "config.yaml").exists():
        data.notes.append("no result.json: the run has not finished")
    if isinstance(data.result, dict) and isinstance(data.result.get("eval"), dict):
        data.tables["final eval"] = _flat(data.result["eval"])
    if (run / "results.json").exists():
        res = json.loads((run / "results.json").read_text())
        data.tables["results"] = _flat(res.get("metrics", res) if isinstance(res, dict) else {})
        if isinstance(res, dict) and isinstance(res.get("safety"), dict):  # eval --suite safety (docs/safety.md)
            data.tables["safety"] = _flat({k: v for k, v in res["safety"].items() if k != "metrics"})
    for p in sorted((run / "eval").glob("*.json")) if (run / "eval").is_dir() else []:
        try:
            doc = json.loads(p.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("metrics"), dict):
            data.tables[p.stem] = _flat(doc["metrics"])

    sources: list[tuple[str, list[dict[str, Any]]]] = []
    if (run / "rollouts.jsonl").exists():
        sources.append(("rollouts", _jsonl(run / "rollouts.jsonl")))
    if (run / "episodes.jsonl").exists():
        sources.append(("eval", _jsonl(run / "episodes.jsonl")))
    for p in sorted((run / "eval").glob("*.episodes.jsonl")) if (run / "eval").is_dir() else []:
        sources.append((f"eval:{p.name.removesuffix('.episodes.jsonl')}", _jsonl(p)))
    for p in sorted((run / "rft").glob("iter-*.jsonl")) if (run / "rft").is_dir() else []:
        sources.append((f"rft:{p.stem}", _jsonl(p)))
    data_path = (cfg.get("data") or {}).get("path") if isinstance(cfg.get("data"), dict) else None
    if data_path and data.kind in ("sft", "rft") and (cfg.get("data") or {}).get("format") == "text":
        data.notes.append(f"training data {data_path} is a plain-text corpus (continual pre-training): no "
                          "conversations to show")
    elif data_path and data.kind in ("sft", "rft"):
        p = Path(data_path)
        if p.exists() and p.suffix in (".jsonl", ".json"):
            try:
                sources.append(("training data", _jsonl(p)))
            except (OSError, UnicodeDecodeError) as e:
                data.notes.append(f"training data {p} could not be read: {e}")
        else:
            data.notes.append(f"training data {data_path} is not a local JSONL file here: no samples shown")
    data.tables.update(env_tables(sources))
    total = sum(len(rows) for _, rows in sources)
    if not sources:
        data.notes.append("no episodes: the directory has no rollouts.jsonl, episodes.jsonl, eval/*.episodes.jsonl "
                          "or rft/iter-*.jsonl, and its config names no local training data")
    per_source = max(1, max_episodes // max(1, len(sources)))
    for name, rows in sources:
        shown = _spread(rows, per_source)
        data.episodes += [_episode(r, name) for r in shown]
        if len(shown) < len(rows):
            data.notes.append(f"{name}: showing {len(shown)} of {len(rows)} episodes, evenly spread "
                              "(--max-episodes to change)")
    if total and not data.episodes:
        data.notes.append("episodes were found but none could be read")
    return data


def _collect_recipe(run: Path, max_episodes: int) -> _Data:
    """A recipe's stages on one page: one table column per stage (what recipe.json recorded and the
    stage's own evaluation tables), the training stages' curves one after another on a shared step
    axis, and episodes from every stage (source ``STAGE:source``)."""
    text = (run / "recipe.yaml").read_text(encoding="utf-8")
    recipe = yaml.safe_load(text) or {}
    status = json.loads((run / "recipe.json").read_text()) if (run / "recipe.json").exists() else {"stages": {}}
    data = _Data(title=run.resolve().name, kind="recipe", config=text, result=status)
    stages = [s for s in recipe.get("stages") or [] if isinstance(s, dict) and "name" in s]
    offset = 0
    subs: list[tuple[str, _Data]] = []
    for s in stages:
        name, d = str(s["name"]), run / str(s["name"])
        done = status.get("stages", {}).get(name)
        row: dict[str, Any] = {"run": s.get("run"), "status": "finished" if done else "not finished"}
        if done:
            row.update(_flat({k: v for k, v in done.items() if k not in ("run", "model", "data", "merged")}))
        if d.is_dir() and any((d / m).exists() for m in RUN_MARKERS):
            sub = collect(d, max_episodes=max_episodes)
            for table, values in sub.tables.items():
                row.update({f"{table}/{k}": v for k, v in values.items()})
            steps = [r["step"] for r in sub.metrics if isinstance(r.get("step"), (int, float))]
            data.metrics += [{**r, "step": r["step"] + offset} for r in sub.metrics if "step" in r]
            offset += int(max(steps, default=0))
            subs.append((name, sub))
        data.tables[name] = row
    if offset:
        data.notes.append("curves: the training stages one after another ("
                          + ", ".join(n for n, sub in subs if sub.metrics) + "), steps counted across the recipe")
    per_stage = max(1, max_episodes // max(1, len(subs)))
    for name, sub in subs:
        data.episodes += [{**e, "source": f"{name}:{e['source']}"} for e in _spread(sub.episodes, per_stage)]
    if not status.get("finished"):
        data.notes.append("the recipe has not finished: stages marked 'not finished' have no results yet")
    return data


def env_tables(sources: list[tuple[str, list[dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    """Evaluated episodes by environment (``metadata.env``): how many, success, mean reward, how they
    ended, and the mean of each reward term the environment reports (τ²-bench's database and
    communicate checks, reasoning-gym's answer format and score, ...), which the run's overall
    metrics do not break down."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for name, rows in sources:
        if name == "eval" or name.startswith("eval:"):
            for r in rows:
                env = (r.get("metadata") or {}).get("env")
                if isinstance(env, str):
                    groups.setdefault(env, []).append(r)
    tables = {}
    for env, rows in sorted(groups.items()):
        row: dict[str, Any] = {"episodes": len(rows),
                               "success": sum(bool((r.get("outcome") or {}).get("success")) for r in rows) / len(rows),
                               "mean_reward": sum(float(r.get("reward") or 0.0) for r in rows) / len(rows)}
        ends: dict[str, int] = {}
        terms: dict[str, list[float]] = {}
        for r in rows:
            end = (r.get("outcome") or {}).get("termination") or "unknown"
            ends[end] = ends.get(end, 0) + 1
            for k, v in ((r.get("metadata") or {}).get("reward_info") or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    terms.setdefault(k, []).append(float(v))
        row.update({f"terminations.{k}": v for k, v in sorted(ends.items())})
        row.update({f"term.{k}": sum(v) / len(v) for k, v in sorted(terms.items())})
        tables[f"env {env}"] = row
    return tables


# -- tokens ---------------------------------------------------------------------------------------

def _tokenizer_for(run: Path, cfg: dict[str, Any]) -> tuple[Any, Any] | str:
    """(tokenizer, renderer) the run rendered with, or why there is none."""
    # lazy: imports torch, needed only to re-render a training run's tokens
    from trajtune.config import load_render

    model = cfg.get("model")
    name = model.get("name_or_path") if isinstance(model, dict) else model
    template = model.get("chat_template") if isinstance(model, dict) else None
    candidates = [str(run / "final")] if (run / "final" / "tokenizer_config.json").exists() else []
    if name:
        candidates.append(str(name))
    if (run / "base-model").is_dir():
        candidates.append(str(run / "base-model"))
    if not candidates:
        return "no model named in the config: token view off"
    err = ""
    for c in candidates:
        try:
            tok = load_tokenizer(c, template)
            render = load_render(cfg.get("render") or {}, "config render")
            train_on = (cfg.get("data") or {}).get("train_on", "hint") if isinstance(cfg.get("data"), dict) else "hint"
            return tok, ChatRenderer(tok, render.to_render_config(train_on=train_on))
        except Exception as e:  # noqa: BLE001 - the report still shows everything else
            err = f"{type(e).__name__}: {e}"
    return f"the tokenizer could not be loaded ({err.splitlines()[0] if err else '?'}): token view off"


def add_tokens(data: _Data, run: Path, cfg: dict[str, Any]) -> None:
    """Render each shown episode with the run's tokenizer and chat template: per token its text,
    provenance and weight, the episode's advantage, and where truncation cut."""
    got = _tokenizer_for(run, cfg)
    if isinstance(got, str):
        data.notes.append(got)
        return
    tok, renderer = got
    data_cfg = cfg.get("data") if isinstance(cfg.get("data"), dict) else {}
    rollout_cfg = cfg.get("rollout") if isinstance(cfg.get("rollout"), dict) else {}
    failed = 0
    for ep in data.episodes:
        try:
            rec = {k: v for k, v in ep["_record"].items() if k != "step"}  # rollouts.jsonl tags the step
            # a folded episode (context folding): the context active at its end, as the model last saw it
            tt = renderer.render(expand_folds(Trajectory.model_validate(rec))[-1])
        except Exception as e:  # noqa: BLE001 - one record that does not render keeps its message view
            ep["token_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            failed += 1
            continue
        ids = tt.ids[:MAX_TOKENS_PER_EPISODE]
        ep["tokens"] = [tok.decode([i], skip_special_tokens=False) for i in ids]
        ep["prov"] = tt.source[: len(ids)]
        ep["weight"] = [round(float(w), 4) for w in tt.weight[: len(ids)]]
        cut = None
        if ep["source"] == "training data":
            limit = int(data_cfg.get("max_length", 2048))
            if len(tt.ids) > limit:
                cut = {"at": limit, "why": f"data.max_length {limit} ({data_cfg.get('truncation', 'drop')})"}
        elif ep["termination"] in ("length", "context_overflow"):
            why = ("rollout.max_new_tokens: the turn was cut" if ep["termination"] == "length"
                   else f"rollout.max_length {rollout_cfg.get('max_length', '?')}: the episode was cut")
            cut = {"at": len(tt.ids), "why": why}
        if len(tt.ids) > MAX_TOKENS_PER_EPISODE:
            ep["tokens_cut"] = len(tt.ids)
        ep["cut"] = cut
    if failed:
        data.notes.append(f"{failed} episode(s) could not be rendered into tokens (each says why)")


# -- the page -------------------------------------------------------------------------------------

def _svg_curve(rows: list[dict[str, Any]], key: str, width: int = 320, height: int = 150) -> str | None:
    pts = [(r.get("step"), r.get(key)) for r in rows]
    pts = [(float(s), float(v)) for s, v in pts if isinstance(s, (int, float)) and isinstance(v, (int, float))
           and math.isfinite(float(v))]
    if not pts:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad_l, pad_b, pad_t, pad_r = 46, 20, 18, 8
    digits = next((d for d in range(3, 8) if f"{y0:.{d}g}" != f"{y1:.{d}g}"), 8)

    def sx(x: float) -> float:
        return pad_l + (x - x0) / ((x1 - x0) or 1) * (width - pad_l - pad_r)

    def sy(y: float) -> float:
        return height - pad_b - (y - y0) / (y1 - y0) * (height - pad_b - pad_t)

    line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2"><title>step {x:g}: {key} = {y:.4g}</title></circle>'
                   for x, y in (pts if len(pts) <= 200 else _spread(pts, 200)))
    e = html.escape
    return (f'<svg class="curve" width="{width}" height="{height}" role="img" aria-label="{e(key)}">'
            f'<text x="{pad_l}" y="12" class="ct">{e(key)}</text>'
            f'<line x1="{pad_l}" y1="{height - pad_b}" x2="{width - pad_r}" y2="{height - pad_b}" class="ax"/>'
            f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{height - pad_b}" class="ax"/>'
            f'<text x="{pad_l - 4}" y="{sy(y1) + 4:.1f}" class="tk" text-anchor="end">{y1:.{digits}g}</text>'
            f'<text x="{pad_l - 4}" y="{sy(y0) + 4:.1f}" class="tk" text-anchor="end">{y0:.{digits}g}</text>'
            f'<text x="{pad_l}" y="{height - 6}" class="tk">{x0:g}</text>'
            f'<text x="{width - pad_r}" y="{height - 6}" class="tk" text-anchor="end">step {x1:g}</text>'
            f'<polyline points="{line}" class="ln"/>{dots}</svg>')


CURVE_ORDER = ("loss", "reward", "success", "token_accuracy", "reward_accuracy", "margin", "grad_norm", "lr",
               "kl", "clip_frac", "ratio", "format_errors", "mean_len", "policy_lag")


def _curves(rows: list[dict[str, Any]]) -> str:
    keys = [k for k in CURVE_ORDER if any(k in r for r in rows)]
    keys += sorted(k for k in {k for r in rows for k in r}
                   if k not in keys and k not in ("step", "seconds") and
                   any(isinstance(r.get(k), (int, float)) for r in rows))[:12]
    svgs = [s for s in (_svg_curve(rows, k) for k in keys) if s]
    return "".join(svgs)


def _table(tables: dict[str, dict[str, Any]]) -> str:
    e = html.escape
    names = list(tables)
    keys = list(dict.fromkeys(k for t in tables.values() for k in t))

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return e(str(v)) if v is not None else ""

    head = "".join(f"<th>{e(n)}</th>" for n in names)
    body = "".join(f"<tr><td>{e(k)}</td>" + "".join(f"<td>{cell(tables[n].get(k))}</td>" for n in names) + "</tr>"
                   for k in keys)
    return f'<table class="evals"><thead><tr><th>metric</th>{head}</tr></thead><tbody>{body}</tbody></table>'


def _script_json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False).replace("</", "<\\/").replace("<!--", "<\\!--")


def render_html(data: _Data) -> str:
    e = html.escape
    episodes = [{k: v for k, v in ep.items() if k != "_record"} for ep in data.episodes]
    notes = "".join(f"<li>{e(n)}</li>" for n in data.notes)
    curves = _curves(data.metrics) if data.metrics else ""
    result = (f"<details><summary>result</summary><pre>{e(json.dumps(data.result, indent=1, default=str))}</pre>"
              "</details>") if data.result is not None else ""
    return (_PAGE.replace("__TITLE__", e(f"trajtune report: {data.title}"))
            .replace("__KIND__", e(data.kind))
            .replace("__NAME__", e(data.title))
            .replace("__NOTES__", f'<ul id="notes">{notes}</ul>' if notes else '<ul id="notes"></ul>')
            .replace("__CONFIG__", f"<pre id='config'>{e(data.config)}</pre>" if data.config
                     else "<p class='missing'>no config</p>")
            .replace("__CURVES__", f'<div id="curves">{curves}</div>' if curves
                     else "<p class='missing'>no metric curves</p>")
            .replace("__TABLES__", _table(data.tables) if data.tables else "<p class='missing'>no evaluation</p>")
            .replace("__RESULT__", result)
            .replace("__DATA__", _script_json({"episodes": episodes, "sources": SOURCE_NAMES})))


def write_report(run_dir: str | Path, out: str | Path | None = None, *, max_episodes: int = 200,
                 tokens: bool = True) -> Path:
    """Write the report (``RUN_DIR/report.html`` unless ``out``), atomically; returns its path."""
    run = Path(run_dir)
    data = collect(run, max_episodes=max_episodes)
    if tokens and data.episodes and data.kind != "recipe":  # a recipe's stages show tokens in their own reports
        _, cfg = _read_config(run)
        if data.kind == "eval" and "model" in cfg:
            cfg = {"model": cfg["model"], "render": cfg.get("render") or {}}
        add_tokens(data, run, cfg)
    path = Path(out) if out is not None else run / REPORT_FILE
    atomic_write_text(path, render_html(data))
    return path


def report_after_run(run_dir: str | Path, quiet: bool = False) -> Path | None:
    """The report a finished run or evaluation writes: a failure to write it is a warning, never a
    failed run (the model and results are already saved)."""
    try:
        path = write_report(run_dir)
    except Exception as e:  # noqa: BLE001 - see above
        console.print(f"[yellow]warning[/yellow]: the HTML report was not written ({type(e).__name__}: {e}); "
                      f"try `trajtune report {run_dir}`", soft_wrap=True)
        return None
    if not quiet:
        console.print(f"report: {path}", soft_wrap=True)
    return path


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#1d2330;background:#f6f7fa}
header{background:#1d2330;color:#fff;padding:12px 20px}header h1{font-size:18px;margin:0}
header .kind{opacity:.75;font-size:13px}
main{padding:12px 20px;max-width:1400px}
section{background:#fff;border:1px solid #dde1ea;border-radius:6px;margin:12px 0;padding:10px 14px}
h2{font-size:15px;margin:4px 0 10px}
pre{background:#f3f4f8;padding:8px;overflow:auto;max-height:320px;font-size:12px;white-space:pre-wrap}
#notes li{color:#8a4b00}.missing{color:#8a4b00}
#curves{display:flex;flex-wrap:wrap;gap:10px}
svg.curve{background:#fbfbfd;border:1px solid #e6e8ef;border-radius:4px}
svg .ln{fill:none;stroke:#2f6fdf;stroke-width:1.5}svg circle{fill:#2f6fdf}svg .ax{stroke:#9aa3b5}
svg .tk{font-size:10px;fill:#5b6477}svg .ct{font-size:12px;font-weight:600;fill:#1d2330}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #e1e4ec;padding:3px 8px;text-align:left}
th{background:#f0f2f7}
#filters{display:flex;flex-wrap:wrap;gap:10px;align-items:center;margin-bottom:8px}
#filters label{font-size:13px}
#episodes tr.ep{cursor:pointer}#episodes tr.ep:hover{background:#eef3ff}
.ok{color:#0b7a36;font-weight:600}.fail{color:#b3261e;font-weight:600}
.detail td{background:#fafbfd}
.msg{border-left:4px solid #c5cad6;margin:6px 0;padding:4px 8px;background:#fff}
.msg.assistant{border-color:#2f6fdf}.msg.tool{border-color:#1f9d55}.msg.user{border-color:#d08c00}
.msg.system{border-color:#7a7f8c}
.role{font-size:11px;text-transform:uppercase;letter-spacing:.04em;color:#5b6477}
.content{white-space:pre-wrap;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
.call{font-family:ui-monospace,Menlo,monospace;font-size:12px;background:#eef3ff;padding:2px 6px;margin:2px 0}
.reward{font-size:12px;color:#5b2fb0}.info{font-size:12px;color:#5b6477;margin-bottom:4px}
.tokens{font-family:ui-monospace,Menlo,monospace;font-size:12px;white-space:pre-wrap;line-height:1.8}
.tok{border-radius:2px;box-shadow:inset -1px 0 rgba(255,255,255,.95)}.p0{background:#e9ebf0}.p1{background:#cfe0ff}.p2{background:#d5f2dd}
.tok.w0.p1{background:#e6e9f2;text-decoration:line-through}
.cut{background:#b3261e;color:#fff;font-weight:700;padding:0 4px;margin:0 2px}
.legend span{padding:1px 6px;margin-right:6px;border-radius:2px}
</style></head>
<body>
<header><h1>__NAME__</h1><div class="kind">trajtune __KIND__ run report</div></header>
<main>
__NOTES__
<section><h2>Metrics</h2>__CURVES__</section>
<section><h2>Evaluation</h2>__TABLES__ __RESULT__</section>
<section id="viewer"><h2>Trajectories</h2>
<div id="filters">
<label>source <select id="f-source"></select></label>
<label>task <input id="f-task" type="search" placeholder="task id contains"></label>
<label>outcome <select id="f-outcome"><option value="">all</option><option value="success">success</option>
<option value="failure">failure</option><option value="unknown">unknown</option></select></label>
<label>termination <select id="f-term"></select></label>
<label>step <select id="f-step"></select></label>
<label><input id="f-tokens" type="checkbox"> token view (provenance, weights, advantages)</label>
<span id="count"></span>
</div>
<div class="legend" id="legend" hidden><span class="p0">prompt</span><span class="p1">policy (trained)</span>
<span class="p1 tok w0">policy, weight 0</span><span class="p2">env</span><span class="cut">✂ truncation</span></div>
<table id="episodes"><thead><tr><th>#</th><th>source</th><th>task</th><th>step</th><th>outcome</th>
<th>termination</th><th>reward</th><th>turns</th></tr></thead><tbody></tbody></table>
</section>
<section><h2>Config</h2>__CONFIG__</section>
</main>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const EPS = DATA.episodes;
const $ = (id) => document.getElementById(id);
function el(tag, cls, text) {
  const n = document.createElement(tag);
  if (cls) n.className = cls;
  if (text !== undefined && text !== null) n.textContent = String(text);
  return n;
}
function outcome(ep) { return ep.success === true ? "success" : ep.success === false ? "failure" : "unknown"; }
function fill(sel, values, label) {
  sel.appendChild(new Option(label, ""));
  for (const v of values) sel.appendChild(new Option(String(v), String(v)));
}
fill($("f-source"), [...new Set(EPS.map(e => e.source))], "all");
fill($("f-term"), [...new Set(EPS.map(e => e.termination))].sort(), "all");
fill($("f-step"), [...new Set(EPS.map(e => e.step).filter(s => s !== null && s !== undefined))]
  .sort((a, b) => a - b), "all");
let open = new Set();
function shown() {
  const src = $("f-source").value, task = $("f-task").value.trim(), out = $("f-outcome").value;
  const term = $("f-term").value, step = $("f-step").value;
  return EPS.map((e, i) => [e, i]).filter(([e]) =>
    (!src || e.source === src) && (!task || e.task.includes(task)) && (!out || outcome(e) === out) &&
    (!term || e.termination === term) && (!step || String(e.step) === step));
}
function messagesView(ep) {
  const box = el("div", "messages");
  for (const m of ep.messages) {
    const d = el("div", "msg " + m.role);
    d.appendChild(el("div", "role", m.role + (m.name ? " · " + m.name : "")));
    if (m.content) d.appendChild(el("div", "content", m.content));
    for (const c of m.calls) {
      const args = typeof c.arguments === "string" ? c.arguments : JSON.stringify(c.arguments);
      d.appendChild(el("div", "call", "→ " + c.name + "(" + args + ")"));
    }
    if (m.errors) d.appendChild(el("div", "reward", "format errors: " + JSON.stringify(m.errors)));
    if (m.reward !== null && m.reward !== undefined && m.role === "assistant")
      d.appendChild(el("div", "reward", "turn reward " + m.reward));
    box.appendChild(d);
  }
  return box;
}
function tokensView(ep) {
  const box = el("div", "tokens");
  if (!ep.tokens) { box.appendChild(el("span", "missing", ep.token_error || "no tokens for this episode")); return box; }
  const adv = ep.advantage;
  for (let i = 0; i < ep.tokens.length; i++) {
    if (ep.cut && ep.cut.at === i) box.appendChild(el("span", "cut", "✂ " + ep.cut.why));
    const p = ep.prov[i], w = ep.weight[i];
    const s = el("span", "tok p" + p + (w === 0 ? " w0" : ""), ep.tokens[i]);
    let tip = DATA.sources[p] + " · weight " + w;
    if (p === 1 && adv !== null && adv !== undefined) tip += " · advantage " + adv;
    s.title = tip;
    box.appendChild(s);
  }
  if (ep.cut && ep.cut.at >= ep.tokens.length) box.appendChild(el("span", "cut", "✂ " + ep.cut.why));
  if (ep.tokens_cut) box.appendChild(el("div", "missing", "(first " + ep.tokens.length + " of " + ep.tokens_cut + " tokens shown)"));
  return box;
}
function detail(ep) {
  const td = el("td"); td.colSpan = 8;
  const info = [];
  if (ep.advantage !== null && ep.advantage !== undefined) info.push("advantage " + ep.advantage);
  if (ep.policy_version !== null && ep.policy_version !== undefined) info.push("policy version " + ep.policy_version);
  info.push("id " + ep.id);
  td.appendChild(el("div", "info", info.join(" · ")));
  td.appendChild($("f-tokens").checked ? tokensView(ep) : messagesView(ep));
  const tr = el("tr", "detail"); tr.appendChild(td);
  return tr;
}
function draw() {
  const body = $("episodes").tBodies[0];
  body.replaceChildren();
  const rows = shown();
  $("count").textContent = rows.length + " of " + EPS.length + " episodes";
  $("legend").hidden = !$("f-tokens").checked;
  for (const [ep, i] of rows) {
    const tr = el("tr", "ep"); tr.dataset.index = i;
    const oc = outcome(ep);
    for (const [v, cls] of [[i + 1], [ep.source], [ep.task], [ep.step ?? ""], [oc, oc === "success" ? "ok" : oc === "failure" ? "fail" : ""],
                            [ep.termination], [ep.reward ?? ""], [ep.turns]])
      tr.appendChild(el("td", cls || "", v));
    tr.addEventListener("click", () => { open.has(i) ? open.delete(i) : open.add(i); draw(); });
    body.appendChild(tr);
    if (open.has(i)) body.appendChild(detail(ep));
  }
}
for (const id of ["f-source", "f-outcome", "f-term", "f-step", "f-tokens"]) $(id).addEventListener("change", draw);
$("f-task").addEventListener("input", draw);
draw();
</script>
</body></html>
"""
