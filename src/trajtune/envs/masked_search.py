"""``masked_search``: retrieval-augmented masked prediction over a document collection (MaskSearch,
2025): agentic continual pre-training data and an RL task from plain text.

Why: a model becomes a search agent by practising search on text it can check. A sentence of the
corpus has one word masked; the agent sees the masked sentence, searches a BM25 index of the same
corpus with ``search``, reads the passages that come back, and answers with ``submit_answer``. The
verifier is the masked word itself, so any document folder becomes verifiable tasks without
labels. ``trajtune data generate --env masked_search --env-arg corpus=DIR`` writes the scripted
expert's trajectories (search for the sentence's other words, read the hit, answer), for SFT or for
continual pre-training (``data.train_on: all_tokens``); ``env: masked_search`` trains on it with RL.

The corpus (option ``corpus``): a ``.txt``/``.md`` file, a JSONL file with a string ``text`` per
line, or a folder of them (``trajtune.formats.text.iter_documents``); without it, the general
English paragraphs shipped with trajtune. Documents are cut into paragraphs (blank lines); every
fifth paragraph is a test passage, the others train passages, so held-out tasks ask about text no
training task masked. The index holds every passage: finding the sentence is the skill.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Generator
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trajtune.envs.base import Task, parse_env_options
from trajtune.envs.search_qa import SearchQAEnv, make_index
from trajtune.envs.toolenv import assistant_call, assistant_text, split_task_seed
from trajtune.envs.tools import ToolError
from trajtune.errors import EnvError
from trajtune.schema import Message

MASK = "[MASK]"
_STOP = frozenset("""about above after again against their there these those which while would could should
where being other every under until through before because between during without within""".split())
_WORD = re.compile(r"[A-Za-z]+")


class MaskedSearchOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    corpus: str | None = Field(None, description="a .txt/.md file, a JSONL file of {\"text\": ...} lines or a folder "
                                                 "of them (default: the shipped general English paragraphs)")
    top_k: int = Field(3, gt=0, description="passages a search returns")
    min_word_length: int = Field(5, gt=1, description="the masked word has at least this many letters")


@functools.lru_cache(maxsize=8)
def passages(corpus: str | None) -> tuple[str, ...]:
    """The corpus cut into paragraphs (whitespace normalised), in order."""
    from trajtune.formats.text import iter_documents

    if corpus is None:
        texts = [resources.files("trajtune.data").joinpath("general_text.txt").read_text(encoding="utf-8")]
    else:
        texts = [t for _, t in iter_documents(corpus)]
    out = []
    for text in texts:
        for para in re.split(r"\n\s*\n", text):
            para = " ".join(para.split())
            if len(para.split()) >= 6:
                out.append(para)
    return tuple(out)


@functools.lru_cache(maxsize=8)
def _index(corpus: str | None) -> Any:
    return make_index(list(passages(corpus)))


def _sentences(passage: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", passage) if len(s.split()) >= 6]


def _candidates(sentence: str, min_len: int) -> list[str]:
    words = _WORD.findall(sentence)
    lower = [w.lower() for w in words]
    return [w for w in words if len(w) >= min_len and w.lower() not in _STOP and lower.count(w.lower()) == 1]


def build_task(corpus: str | None, split: str, rng: random.Random, min_len: int) -> dict[str, Any]:
    ps = passages(corpus)
    pool = [i for i in range(len(ps)) if (i % 5 == 4) == (split == "test")
            and any(_candidates(s, min_len) for s in _sentences(ps[i]))]
    if not pool:
        raise EnvError(f"masked_search: the corpus has no {split} passage with a sentence of 6+ words and a word of "
                       f"{min_len}+ letters (it has {len(ps)} paragraphs; every fifth is a test passage)")
    i = rng.choice(pool)
    sentence = rng.choice([s for s in _sentences(ps[i]) if _candidates(s, min_len)])
    word = rng.choice(_candidates(sentence, min_len))
    masked = re.sub(rf"\b{re.escape(word)}\b", MASK, sentence, count=1)
    return {"passage": f"P{i:04d}", "sentence": sentence, "masked": masked, "answer": word}


class MaskedSearchEnv(SearchQAEnv):
    """Masked prediction with BM25 ``search`` over a document collection; tools: search, submit_answer
    (search_qa's answer check and expert machinery, another corpus and task)."""

    name = "masked_search"
    description = ("Retrieval-augmented masked prediction over a document collection (any text folder): find the "
                   "masked word with BM25 search; tools: search, submit_answer.")
    max_turns = 6
    system_prompt = ("A word of a sentence from the document collection is hidden as [MASK]. Find the sentence with "
                     "search, call submit_answer with the hidden word, then reply with one line.")
    tool_names = ("search", "submit_answer")
    options_model = MaskedSearchOptions  # `trajtune envs show` lists its fields: the keywords are not in the signature

    def __init__(self, **options: Any) -> None:
        self.options = parse_env_options(MaskedSearchOptions, "masked_search", options)
        passages(self.options.corpus)  # a missing or empty corpus is an error now, not at the first task
        super().__init__()

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        o = self.options
        out = []
        for i in range(n):
            s = split_task_seed(split, i, seed)
            out.append(Task(id=f"masked_search-{split}-{s}", seed=s, split=split,
                            data=build_task(o.corpus, split, random.Random(s), o.min_word_length)))
        return out

    def setup(self, task: Task) -> None:
        self.submitted: str | None = None
        self.queries: list[str] = []

    def prompt(self, task: Task) -> str:
        return f"Which word does [MASK] stand for?\n\n{task.data['masked']}"

    def search(self, query: str) -> list[dict[str, str]]:
        """Search the document collection (BM25) and return the best passages.

        Args:
            query: keywords to search for
        """
        self.queries.append(query)
        ps = passages(self.options.corpus)
        hits = _index(self.options.corpus).top(query, self.options.top_k)
        if not hits:
            raise ToolError("no results; try other keywords")
        return [{"passage_id": f"P{i:04d}", "text": ps[i]} for i, _ in hits]

    def submit_answer(self, answer: str) -> str:
        """Submit the hidden word (a later submission replaces it).

        Args:
            answer: the word that [MASK] stands for
        """
        self.submitted = answer
        return "answer recorded"

    def state_view(self) -> str:
        return f"queries={self.queries} submitted={self.submitted!r}"

    # -- expert (success and expert_policy are search_qa's: the normalised answer, the scripted _script)
    def _script(self, d: dict[str, Any]) -> Generator[Message, str, None]:
        import json

        before, _, after = d["masked"].partition(MASK)
        pattern = re.compile(re.escape(" ".join(before.split())) + r"\s*([A-Za-z]+)\s*"
                             + re.escape(" ".join(after.split())))
        query = " ".join(_WORD.findall(before + " " + after))
        hits = json.loads((yield assistant_call("search", query=query)))
        answer = next((m.group(1) for h in hits if (m := pattern.search(h["text"]))), None)
        if answer is None:  # the passage was not among the hits: search with the sentence's own words around the mask
            near = " ".join((_WORD.findall(before)[-4:] + _WORD.findall(after)[:4]))
            hits = json.loads((yield assistant_call("search", query=near)))
            answer = next((m.group(1) for h in hits if (m := pattern.search(h["text"]))), "unknown")
        yield assistant_call("submit_answer", answer=answer)
        yield assistant_text(f"The hidden word is {answer}.")
