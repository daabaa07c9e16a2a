"""``search_qa``: multi-hop questions over a small local corpus, with ``search`` and ``open`` tools.

The corpus is synthetic (invented companies, people, cities and countries generated from a fixed
seed), so answers cannot come from a model's memory: they must be found by searching and
reading. Retrieval is BM25 via ``bm25s`` (the ``search`` extra); without it a small built-in
BM25 gives the same kind of ranking so the environment still works.

Questions need 2-3 hops (company -> founder -> birthplace -> country). Train questions are about
even-numbered companies and test questions about odd-numbered ones, so the splits never share a
question. Success is on state: the answer passed to ``submit_answer`` matches after
normalisation (case, punctuation, articles).
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Generator
from typing import Any

from trajtune.envs.base import Task
from trajtune.envs.toolenv import ToolEnv, assistant_call, assistant_text, scripted_policy, split_task_seed
from trajtune.envs.tools import ToolError
from trajtune.schema import Message, ToolSpec

_SYL = ["ka", "lo", "ven", "dra", "mir", "tes", "qua", "bel", "zor", "nim", "ost", "rua", "fen", "gal", "hir",
        "ius", "jen", "mar", "pol", "sen", "tav", "uri", "wex", "yal"]
_FIRST = ["Ada", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kavya", "Luca",
          "Mina", "Nils", "Olga", "Pavel", "Rosa", "Sami", "Tariq", "Ulla"]
_INDUSTRY = ["robotics", "biotech", "logistics", "solar energy", "fintech", "gaming", "textile", "shipbuilding"]
_JOB = ["chemist", "engineer", "economist", "architect", "physician", "designer", "geologist", "pilot"]
_FEATURE = ["glass bridges", "tea markets", "old harbour", "river festivals", "clock towers", "salt caves"]


def _word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_SYL) for _ in range(n)).capitalize()


@functools.lru_cache(maxsize=1)
def corpus() -> dict[str, Any]:
    """The fixed synthetic world and its documents (built once, deterministic)."""
    rng = random.Random(20261129)
    names: set[str] = set()

    def fresh(n: int) -> str:
        while True:
            w = _word(rng, n)
            if w not in names:
                names.add(w)
                return w

    countries = [fresh(3) for _ in range(8)]
    cities = [{"name": fresh(2) + "a", "country": countries[i % 8], "feature": rng.choice(_FEATURE)} for i in range(24)]
    people = [{"name": f"{rng.choice(_FIRST)} {fresh(3)}", "city": rng.choice(cities)["name"], "job": rng.choice(_JOB)}
              for _ in range(40)]
    companies = []
    founders = rng.sample(range(40), 30)
    for i in range(30):
        companies.append({"name": f"{fresh(2)} {rng.choice(['Labs', 'Works', 'Systems', 'Group'])}",
                          "founder": people[founders[i]]["name"], "city": rng.choice(cities)["name"],
                          "year": rng.randint(1950, 2020), "industry": rng.choice(_INDUSTRY)})
    founded = {c["founder"]: c["name"] for c in companies}
    docs = []
    for c in companies:
        docs.append({"title": c["name"], "text": f"{c['name']} is a {c['industry']} company headquartered in {c['city']}. "
                     f"It was founded in {c['year']} by {c['founder']}."})
    for p in people:
        extra = f" {p['name']} founded {founded[p['name']]}." if p["name"] in founded else ""
        docs.append({"title": p["name"], "text": f"{p['name']} is a {p['job']} born in {p['city']}.{extra}"})
    for c in cities:
        docs.append({"title": c["name"], "text": f"{c['name']} is a city in {c['country']}, known for its {c['feature']}."})
    for i, k in enumerate(countries):
        docs.append({"title": k, "text": f"{k} is a country. Its largest city is {cities[i]['name']}."})
    for i, d in enumerate(docs):
        d["doc_id"] = f"D{i:03d}"
    return {"countries": countries, "cities": cities, "people": people, "companies": companies, "docs": docs}


def _tokens(text: str) -> list[str]:
    stop = {"the", "a", "an", "of", "in", "is", "was", "by", "who", "what", "which", "and", "its", "it", "to"}
    return [t for t in re.findall(r"[a-z0-9]+", text.lower()) if t not in stop]


class _MiniBM25:
    """Fallback BM25 (k1=1.5, b=0.75) used only when ``bm25s`` is not installed."""

    def __init__(self, texts: list[str]):
        self.docs = [Counter(_tokens(t)) for t in texts]
        self.avg = sum(sum(d.values()) for d in self.docs) / max(1, len(self.docs))
        df: Counter[str] = Counter()
        for d in self.docs:
            df.update(d.keys())
        n = len(self.docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def top(self, query: str, k: int) -> list[tuple[int, float]]:
        q = _tokens(query)
        scores = []
        for i, d in enumerate(self.docs):
            length = sum(d.values())
            s = sum(self.idf.get(t, 0.0) * d[t] * 2.5 / (d[t] + 1.5 * (0.25 + 0.75 * length / self.avg)) for t in q if t in d)
            if s > 0:
                scores.append((i, s))
        return sorted(scores, key=lambda x: (-x[1], x[0]))[:k]


class _Bm25sIndex:
    def __init__(self, texts: list[str]):
        import bm25s

        self.bm25s = bm25s
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
        self.n = len(texts)

    def top(self, query: str, k: int) -> list[tuple[int, float]]:
        q = self.bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not q.vocab:
            return []
        ids, scores = self.retriever.retrieve(q, k=min(k, self.n), show_progress=False)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]


def make_index(texts: list[str]) -> Any:
    """A BM25 index of ``texts`` with ``top(query, k) -> [(i, score)]``: ``bm25s`` when installed,
    else the built-in one (the ranking is of the same kind; tests check they agree on entities)."""
    try:
        return _Bm25sIndex(texts)
    except ImportError:
        return _MiniBM25(texts)


@functools.lru_cache(maxsize=1)
def index() -> Any:
    return make_index([d["title"] + ". " + d["text"] for d in corpus()["docs"]])


def normalize_answer(s: str) -> str:
    s = re.sub(r"[^a-z0-9 ]", " ", str(s).lower())
    return " ".join(w for w in s.split() if w not in ("a", "an", "the"))


def _build(split: str, rng: random.Random) -> dict[str, Any]:
    w = corpus()
    pool = [c for i, c in enumerate(w["companies"]) if i % 2 == (0 if split == "train" else 1)]
    c = rng.choice(pool)
    city_country = {x["name"]: x["country"] for x in w["cities"]}
    person_city = {p["name"]: p["city"] for p in w["people"]}
    kind = rng.choice(["founder_country", "hq_country", "founder_year"])
    if kind == "founder_country":
        q = f"In which country was the founder of {c['name']} born?"
        ans = city_country[person_city[c["founder"]]]
    elif kind == "hq_country":
        q = f"In which country is {c['name']} headquartered?"
        ans = city_country[c["city"]]
    else:
        q = f"In what year was the company founded by {c['founder']} established?"
        ans = str(c["year"])
    return {"kind": kind, "question": q, "answer": ans, "company": c["name"], "founder": c["founder"]}


class SearchQAEnv(ToolEnv):
    """Multi-hop QA over a synthetic local corpus with BM25 ``search`` and ``open``."""

    name = "search_qa"
    description = "Multi-hop questions over a local synthetic corpus; tools: search (BM25), open, submit_answer."
    max_turns = 10
    system_prompt = ("Answer the question using only the documents you find with search and open. Call "
                     "submit_answer with a short answer, then reply with one line.")
    tool_names = ("search", "open", "submit_answer")

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        out = []
        for i in range(n):
            s = split_task_seed(split, i, seed)
            out.append(Task(id=f"search_qa-{split}-{s}", seed=s, split=split, data=_build(split, random.Random(s))))
        return out

    def setup(self, task: Task) -> None:
        self.submitted: str | None = None
        self.opened: list[str] = []
        self.queries: list[str] = []

    def prompt(self, task: Task) -> str:
        return task.data["question"]

    def search(self, query: str) -> list[dict[str, str]]:
        """Search the document collection (BM25) and return the 5 best matches.

        Args:
            query: keywords to search for
        """
        self.queries.append(query)
        docs = corpus()["docs"]
        hits = index().top(query, 5)
        if not hits:
            raise ToolError("no results; try other keywords")
        return [{"doc_id": docs[i]["doc_id"], "title": docs[i]["title"], "snippet": docs[i]["text"][:60]} for i, _ in hits]

    def open(self, doc_id: str) -> dict[str, str]:
        """Read a whole document.

        Args:
            doc_id: id from the search results, e.g. D012
        """
        for d in corpus()["docs"]:
            if d["doc_id"] == doc_id:
                self.opened.append(doc_id)
                return {"title": d["title"], "text": d["text"]}
        raise ToolError(f"no document {doc_id!r}")

    def submit_answer(self, answer: str) -> str:
        """Submit the final short answer (a later submission replaces it).

        Args:
            answer: the answer, e.g. a country name or a year
        """
        self.submitted = answer
        return "answer recorded"

    def success(self) -> bool:
        return (self.task is not None and self.submitted is not None
                and normalize_answer(self.submitted) == normalize_answer(self.task.data["answer"]))

    def state_view(self) -> str:
        return f"queries={self.queries} opened={self.opened} submitted={self.submitted!r}"

    # -- expert -----------------------------------------------------------------------------------
    def expert_policy(self, task: Task) -> Callable[[list[Message], list[ToolSpec]], Message]:
        return scripted_policy(self._script(task.data))

    def _lookup(self, title: str) -> Generator[Message, str, str]:
        """Search for an entity by name, open its own page, return its text."""
        import json

        hits = json.loads((yield assistant_call("search", query=title)))
        doc = next(h for h in hits if h["title"] == title)
        page = json.loads((yield assistant_call("open", doc_id=doc["doc_id"])))
        return page["text"]

    def _script(self, d: dict[str, Any]) -> Generator[Message, str, None]:
        if d["kind"] == "founder_year":
            text = yield from self._lookup(d["founder"])
            company = re.search(r"founded (.+?)\.$", text).group(1)  # type: ignore[union-attr]
            text = yield from self._lookup(company)
            answer = re.search(r"founded in (\d{4})", text).group(1)  # type: ignore[union-attr]
        else:
            text = yield from self._lookup(d["company"])
            if d["kind"] == "founder_country":
                person = re.search(r"founded in \d{4} by (.+?)\.$", text).group(1)  # type: ignore[union-attr]
                text = yield from self._lookup(person)
                city = re.search(r"born in (\w+)\.", text).group(1)  # type: ignore[union-attr]
            else:
                city = re.search(r"headquartered in (\w+)\.", text).group(1)  # type: ignore[union-attr]
            text = yield from self._lookup(city)
            answer = re.search(r"is a city in (\w+),", text).group(1)  # type: ignore[union-attr]
        yield assistant_call("submit_answer", answer=answer)
        yield assistant_text(f"The answer is {answer}.")
