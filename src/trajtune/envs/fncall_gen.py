"""Task generation for ``fncall``: randomised function schemas and the user requests that call them.

A task is drawn from one RNG (seeded by the task seed): a target function concept and 0-3
distractors (often from the same domain), each *instantiated* with a random name variant
(``calculate_bmi``, ``health.bmi``, ``bmi_calculator``), random parameter names, descriptions
and enum subsets; then argument values for the target and a request that states every value
exactly (numbers as digits, strings verbatim) in one of many phrasings: inline clauses after a
connector, fact sentences before or after the ask, question forms, with or without a preamble,
politeness and facts in shuffled order. Optional parameters are mentioned about half the time
(with a non-default value); unmentioned ones are left out of the expected call.

The request is built with a slot per value first, so the same pass yields the final text and a
*skeleton* (values replaced by ``<param>``) used to count distinct phrasings.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from random import Random
from typing import Any

from trajtune.envs import fncall_vocab as V
from trajtune.envs.fncall_vocab import FAMILIES, FUNCS, PARAMS, Func, Param

SINGLE_TURN_SYSTEMS = (
    "You are an expert in composing function calls. Given a question and a set of functions, make the one function "
    "call that answers it, with argument values taken from the question.",
    "You have access to the functions below. Reply with a single function call that fulfils the user's request.",
    "Pick the function that matches the request and call it with the right arguments.",
)
MULTI_TURN_SYSTEMS = (
    "You are a helpful assistant with access to functions. Call the function that answers the request, with "
    "arguments taken from the request, then give the user a short answer based on the result.",
    "You can call the functions listed below. Choose the one that fits the request and fill in its arguments "
    "exactly; once you have the result, answer briefly.",
    "You are a function-calling assistant. Make one function call, then summarise its result in one sentence.",
)

POLITE = ("", "Please ", "Could you ", "Can you ", "Would you ", "Could you please ", "Can you please ",
          "I'd like you to ", "Kindly ", "Hey, can you ")
NEEDS = ("I need to", "I want to", "I'd like to", "Help me", "I have to", "I'm trying to")
CONNECTORS = ("with", "for", "using", "given")
NUM_INLINE = ("{a} {noun} of {v}{u}", "{noun} {v}{u}", "{noun} = {v}{u}", "{noun} set to {v}{u}",
              "{v}{u} as the {noun}", "{v}{u} for the {noun}")
STR_INLINE = ("the {noun} {v}", "{noun} {v}", "{noun}: {v}", "{v} as the {noun}", "{noun} set to {v}")
ARR_INLINE = ("the {noun} {v}", "{noun}: {v}", "these {noun}: {v}", "{noun} {v}")
NUM_SENT = ("The {noun} is {v}{u}.", "{Noun}: {v}{u}.", "Use {v}{u} for the {noun}.", "Set the {noun} to {v}{u}.",
            "Take {v}{u} as the {noun}.")
STR_SENT = ("The {noun} is {v}.", "{Noun}: {v}.", "Use {v} as the {noun}.", "The {noun} should be {v}.")
ARR_SENT = ("The {noun} are {v}.", "{Noun}: {v}.", "Here are the {noun}: {v}.", "Use these {noun}: {v}.")
PARAM_DOCS = ("The {noun}.", "{Noun} to use.", "{Noun}.")
PARAM_DOCS_UNIT = ("The {noun} in {unit}.", "{Noun}, in {unit}.", "{Noun} ({unit}).")
ARRAY_DOCS = ("List of {noun}.", "The {noun}, as a list.", "An array of {noun}.")
DEFAULT_DOCS = (" Default is {d}.", " Defaults to {d}.", " Optional, default {d}.", " (default: {d})")
FORMAT_HINTS = {V.date: " Format YYYY-MM-DD.", V.past_date: " Format YYYY-MM-DD.", V.clock: " Format HH:MM (24-hour)."}
# Frames: {pre} preamble, {ask} polite + intent, {q} end mark, {need}, {intent}, {inline}, {facts}, {question}.
FRAMES = ("{pre}{ask} {conn} {inline}{q}", "{pre}{facts} {ask}{q}", "{pre}{ask}{q} {facts}",
          "{pre}{need} {intent}. {facts}", "{pre}{need} {intent} {conn} {inline}.", "{pre}{Intent}: {inline}.")
QUESTION_FRAMES = ("{pre}{question} {conn} {inline}?", "{pre}{facts} {question}?")
BARE_FRAMES = ("{pre}{ask}{q}", "{pre}{need} {intent}.")
BARE_QUESTION_FRAMES = ("{pre}{question}?",)
ALL_FRAMES = FRAMES + QUESTION_FRAMES + BARE_FRAMES + BARE_QUESTION_FRAMES
_STOP = {"of", "a", "an", "the", "in", "by", "from", "between", "after", "to"}


def snake(phrase: str) -> str:
    """``'roots of a quadratic equation'`` -> ``'roots_quadratic_equation'`` (lower case, no stop words)."""
    words = [w for w in re.split(r"[^a-z0-9]+", phrase.lower()) if w and w not in _STOP]
    return "_".join(words)


def name_candidates(func: Func) -> tuple[list[str], list[str]]:
    """All names ``func`` may get: (plain, dotted) lists, deduplicated in order."""
    fam = FAMILIES[func.family]
    objs = func.snake or (() if func.full else tuple(snake(o) for o in func.objs))
    plain: list[str] = []
    for o in objs:
        plain += [f"{v}_{o}" for v in fam.name_verbs]
        if fam.bare:
            plain.append(o)
        if fam.suffix and not o.endswith(fam.suffix):
            plain.append(f"{o}_{fam.suffix}")
    plain += list(func.full)
    plain = list(dict.fromkeys(plain))
    dotted = [f"{alias}.{n}" for alias in V.DOMAIN_ALIASES[func.domain] for n in plain]
    return plain, dotted


def is_held_out(func: Func, holdout: str) -> bool:
    """Whether ``func`` belongs to the test-only part under ``holdout`` ("none", "functions", "domains")."""
    if holdout == "domains":
        return func.domain in V.HOLDOUT_DOMAINS
    if holdout == "functions":
        return zlib.crc32(func.key.encode()) % 5 == 0
    return False


def function_pool(split: str, holdout: str) -> list[Func]:
    """The functions a split draws targets and distractors from (all of them when holdout is "none")."""
    if holdout == "none":
        return list(FUNCS)
    want = split == "test"
    return [f for f in FUNCS if is_held_out(f, holdout) == want]


# ---------------------------------------------------------------------------------------------
# Instantiating a function: name, description, parameters


@dataclass
class Arg:
    """One parameter of an instantiated function."""

    name: str
    param: Param
    required: bool
    schema: dict[str, Any]


@dataclass
class Instance:
    func: Func
    name: str
    description: str
    args: list[Arg]

    def tool(self) -> dict[str, Any]:
        """The function as an OpenAI-style tool dict (``ToolSpec`` fields)."""
        return {"name": self.name, "description": self.description,
                "parameters": {"type": "object", "properties": {a.name: a.schema for a in self.args},
                               "required": [a.name for a in self.args if a.required]}}


def _show_default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"'{value}'" if isinstance(value, str) else str(value)


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _param_doc(p: Param, required: bool, rng: Random) -> str:
    noun = p.nouns[0]
    if p.type == "boolean":
        doc = f"If true, {p.yes[0]}; if false, {p.no[0]}."
    elif p.type == "array":
        doc = rng.choice(ARRAY_DOCS)
    else:
        doc = rng.choice(PARAM_DOCS_UNIT if p.unit else PARAM_DOCS)
    doc = doc.format(noun=noun, Noun=_cap(noun), unit=p.unit)
    if p.gen in FORMAT_HINTS:
        doc += FORMAT_HINTS[p.gen]
    if not required:
        doc += rng.choice(DEFAULT_DOCS).format(d=_show_default(p.default))
    return doc


def _enum_subset(p: Param, rng: Random) -> list[str]:
    """3+ options of an enum (always with its default), in the pool's order."""
    k = rng.randint(min(3, len(p.pool)), len(p.pool))
    keep = set(rng.sample(p.pool, k))
    if p.default is not None:
        keep.add(p.default)
    return [o for o in p.pool if o in keep]


def _schema(p: Param, required: bool, rng: Random) -> dict[str, Any]:
    jtype = "string" if p.type == "enum" else p.type
    out: dict[str, Any] = {"type": jtype, "description": _param_doc(p, required, rng)}
    if p.type == "enum":
        out["enum"] = _enum_subset(p, rng)
    if p.type == "array":
        out["items"] = {"type": p.item}
    if not required and rng.random() < 0.5:
        out["default"] = p.default
    return out


def instantiate(func: Func, rng: Random, dotted: float = 0.3) -> Instance:
    """A concrete schema for ``func``: a name variant, descriptions, parameter names and enum subsets."""
    plain, dots = name_candidates(func)
    name = rng.choice(dots if rng.random() < dotted else plain)
    fam = FAMILIES[func.family]
    description = rng.choice(func.doc or tuple(d.format(obj=func.objs[0]) for d in fam.docs))
    style = rng.randrange(1000)
    args: list[Arg] = []
    for ref in func.params:
        p = PARAMS[ref.lstrip("?")]
        required = not ref.startswith("?")
        taken = {a.name for a in args}
        names = [n for n in p.names[style % len(p.names):] + p.names if n not in taken] or [p.key]
        args.append(Arg(names[0], p, required, _schema(p, required, rng)))
    return Instance(func, name, description, args)


# ---------------------------------------------------------------------------------------------
# Values


def _number(p: Param, rng: Random) -> int | float:
    if p.dp == 0 or (p.hi - p.lo >= 10 and rng.random() < 0.2):  # whole values only where they are plausible
        return int(round(rng.uniform(p.lo, p.hi)))
    v = round(rng.uniform(p.lo, p.hi), p.dp)
    return int(v) if float(v).is_integer() else v


def _string(p: Param, rng: Random) -> str:
    return p.gen(rng) if p.gen is not None else rng.choice(p.pool)


def _array(p: Param, rng: Random) -> list[Any]:
    n = rng.randint(*p.size)
    if p.item == "string":
        if p.gen is not None:
            return [p.gen(rng) for _ in range(n)]
        return rng.sample(p.pool, min(n, len(p.pool)))
    if p.dp == 0:
        return [rng.randint(int(p.lo), int(p.hi)) for _ in range(n)]
    return [round(rng.uniform(p.lo, p.hi), p.dp) for _ in range(n)]


def draw_value(arg: Arg, rng: Random) -> Any:
    p = arg.param
    if p.type == "integer":
        lo = -(-int(p.lo) // p.step) * p.step
        return rng.randrange(lo, int(p.hi) + 1, p.step)
    if p.type == "number":
        return _number(p, rng)
    if p.type == "boolean":
        return rng.random() < 0.5
    if p.type == "enum":
        return rng.choice(arg.schema["enum"])
    if p.type == "array":
        return _array(p, rng)
    return _string(p, rng)


def draw_arguments(inst: Instance, rng: Random, optional_rate: float = 0.5) -> dict[str, Any]:
    """Values for the required parameters and a random subset of the optional ones (never their default)."""
    out: dict[str, Any] = {}
    for arg in inst.args:
        if not arg.required and rng.random() >= optional_rate:
            continue
        used = {v for v in out.values() if isinstance(v, str)}
        for _ in range(30):  # distinct from the default, and strings from each other (from != to)
            v = draw_value(arg, rng)
            if (arg.required or v != arg.param.default) and not (isinstance(v, str) and v in used):
                break
        else:
            if not arg.required:
                continue  # no usable value (a small enum fully taken): leave the optional out
        out[arg.name] = v
    return out


# ---------------------------------------------------------------------------------------------
# Phrasing


def num_text(v: int | float) -> str:
    """Digits exactly as the argument value reads (``repr`` of a float is its shortest round-trip form)."""
    return str(v) if isinstance(v, int) else repr(float(v))


def scalar_text(v: Any) -> str:
    return num_text(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def _quote(s: str, rng: Random) -> str:
    return rng.choice(("'{}'", '"{}"')).format(s)


def value_text(p: Param, v: Any, rng: Random, inline: bool) -> str:
    """How the value appears in the request (lists bracketed inside inline clauses, so clauses stay apart)."""
    if isinstance(v, list):
        items = [scalar_text(x) for x in v]
        if p.item == "string" and rng.random() < 0.4:
            items = [_quote(x, rng) for x in items]
        if inline or rng.random() < 0.4:
            return "[" + ", ".join(items) + "]"
        return join_and(items, rng)
    s = scalar_text(v)
    if p.type == "string" and (p.quote or rng.random() < 0.15):
        return _quote(s, rng)
    return s


def join_and(items: list[str], rng: Random) -> str:
    if len(items) == 1:
        return items[0]
    if rng.random() < 0.2:
        return ", ".join(items)
    comma = "," if len(items) > 2 and rng.random() < 0.3 else ""
    return ", ".join(items[:-1]) + f"{comma} and " + items[-1]


def _article(noun: str) -> str:
    return "an" if noun[:1].lower() in "aeiou" else "a"


def _fits_of_form(noun: str) -> bool:
    return " of " not in noun and not (noun.endswith("s") and not noun.endswith("ss"))


@dataclass
class Clause:
    text: str  # with "\x00<arg>\x00" where the value goes
    form: str  # template id, for counting phrasings
    prepositional: bool  # attaches to the intent ("in Paris") rather than to a connector


def _slot(name: str) -> str:
    return f"\x00{name}\x00"


def _noun_clause(arg: Arg, v: Any, rng: Random, sentence: bool) -> Clause:
    p = arg.param
    noun = rng.choice(p.nouns)
    if isinstance(v, list):
        forms = ARR_SENT if sentence else ARR_INLINE
    elif p.type in ("integer", "number"):
        forms = NUM_SENT if sentence else tuple(f for f in NUM_INLINE if "{a}" not in f or _fits_of_form(noun))
    else:
        forms = STR_SENT if sentence else STR_INLINE
    i = rng.randrange(len(forms))
    value, unit = _with_unit(p, _slot(arg.name), rng)
    text = forms[i].format(a=_article(noun), noun=noun, Noun=_cap(noun), v=value, u=unit)
    return Clause(text, f"{'S' if sentence else 'I'}{p.type[0]}{i}{'$' if value[0] == '$' else ''}", False)


def _with_unit(p: Param, value: str, rng: Random) -> tuple[str, str]:
    """The value and the unit after it: "5000 dollars", or "$5000" / "4.5%" (the digits stay exact)."""
    if not p.unit or p.type not in ("integer", "number"):
        return value, ""
    if p.unit == "dollars" and rng.random() < 0.4:
        return "$" + value, ""
    if p.unit == "percent" and rng.random() < 0.4:
        return value + "%", ""
    return value, f" {p.unit}"


def make_clause(arg: Arg, v: Any, rng: Random, sentence: bool) -> Clause:
    """One mention of ``arg = v``: a prepositional phrase (``says``/boolean) or a noun clause/sentence."""
    p = arg.param
    if p.type == "boolean":
        phrases = p.yes if v else p.no
        i = rng.randrange(len(phrases))
        return Clause(phrases[i], f"b{int(v)}{i}", True)
    if p.says and rng.random() < 0.5:
        i = rng.randrange(len(p.says))
        return Clause(p.says[i].format(v=_slot(arg.name)), f"p{i}", True)
    return _noun_clause(arg, v, rng, sentence)


def intent_phrase(func: Func, rng: Random) -> tuple[str, str]:
    """What the user asks for, lower-case (``calculate the compound interest``) and its template id."""
    if func.asks:
        i = rng.randrange(len(func.asks))
        return func.asks[i], f"a{i}"
    fam = FAMILIES[func.family]
    verb, obj = rng.choice(fam.verbs), rng.choice(func.objs)
    art = fam.article if fam.article != "a" else _article(obj)
    return " ".join(w for w in (verb, art, obj) if w), f"v{fam.verbs.index(verb)}"


def _question(func: Func, rng: Random) -> str | None:
    fam = FAMILIES[func.family]
    if func.asks or not fam.asks:
        return None
    return rng.choice(fam.asks).format(obj=rng.choice(func.objs))


def _preamble(func: Func, rng: Random) -> str:
    r = rng.random()
    if r < 0.2:
        return rng.choice(V.PRE_AMBLES[func.domain]) + " "
    if r < 0.3:
        return rng.choice(V.GENERIC_PREAMBLES) + " "
    return ""


@dataclass
class Request:
    text: str
    skeleton: str  # the text with every value replaced by <param name>
    template: str  # the structural template id (frame, politeness, clause forms)


def _fill(text: str, values: dict[str, str]) -> str:
    return re.sub("\x00([^\x00]*)\x00", lambda m: values[m.group(1)], text)


def phrase_request(inst: Instance, args: dict[str, Any], rng: Random) -> Request:
    """A user request that states every value of ``args`` (see module docstring)."""
    by_name = {a.name: a for a in inst.args}
    order = list(args)
    rng.shuffle(order)
    question = _question(inst.func, rng)
    frames = FRAMES + (QUESTION_FRAMES if question else ())
    frame = rng.choice(frames)
    sentence = "{facts}" in frame
    clauses = [make_clause(by_name[n], args[n], rng, sentence) for n in order]
    nouns = [c for c in clauses if not c.prepositional]
    preps = " ".join(c.text for c in clauses if c.prepositional)
    if not nouns:
        frame = rng.choice(BARE_FRAMES + (BARE_QUESTION_FRAMES if question else ()))
    intent, intent_id = intent_phrase(inst.func, rng)
    intent_full = f"{intent} {preps}".strip()
    polite = rng.choice(POLITE)
    fields = {
        "pre": _preamble(inst.func, rng), "intent": intent_full, "Intent": _cap(intent_full),
        "ask": polite + (intent_full if polite else _cap(intent_full)),
        "q": "?" if polite.strip().startswith(("Could", "Can", "Would", "Hey")) else ".",
        "need": rng.choice(NEEDS), "conn": rng.choice(CONNECTORS),
        "inline": join_and([c.text for c in nouns], rng) if nouns else "",
        "facts": " ".join(c.text for c in nouns),
        "question": f"{question} {preps}".strip() if question else "",
    }
    raw = _cap(frame.format(**fields))
    texts = {n: value_text(by_name[n].param, args[n], rng, inline=not sentence) for n in args}
    template = "|".join([str(ALL_FRAMES.index(frame)), str(POLITE.index(polite)),
                         intent_id, *sorted(c.form for c in clauses)])
    return Request(_fill(raw, texts), _fill(raw, {n: f"<{n}>" for n in args}), template)


# ---------------------------------------------------------------------------------------------
# Tasks


def pick_distractors(target: Func, pool: list[Func], n: int, same_domain: float, rng: Random) -> list[Func]:
    """``n`` other functions, each from the target's domain with probability ``same_domain`` when possible."""
    chosen: list[Func] = []
    for _ in range(n):
        free = [f for f in pool if f is not target and f not in chosen]
        near = [f for f in free if f.domain == target.domain]
        options = near if near and rng.random() < same_domain else free
        if not options:
            break
        chosen.append(rng.choice(options))
    return chosen


def build_task(rng: Random, pool: list[Func], *, n_distractors: tuple[int, int], same_domain: float,
               single_turn: bool) -> dict[str, Any]:
    """Everything one episode needs, as JSON-able task data."""
    func = rng.choice(pool)
    others = pick_distractors(func, pool, rng.randint(*n_distractors), same_domain, rng)
    target = instantiate(func, rng)
    tools = [target] + [instantiate(f, rng) for f in others]
    rng.shuffle(tools)
    args = draw_arguments(target, rng)
    request = phrase_request(target, args, rng)
    ordered = {a.name: args[a.name] for a in target.args if a.name in args}
    return {
        "domain": func.domain, "function": func.key, "prompt": request.text, "skeleton": request.skeleton,
        "template": request.template,
        "system": rng.choice(SINGLE_TURN_SYSTEMS if single_turn else MULTI_TURN_SYSTEMS),
        "tools": [t.tool() for t in tools],
        "target": {"name": target.name, "arguments": ordered,
                   "defaults": {a.name: a.param.default for a in target.args if not a.required},
                   "params": {a.name: a.param.key for a in target.args}},
        "result": {"kind": func.result, "noun": func.objs[0], "family": func.family},
    }
