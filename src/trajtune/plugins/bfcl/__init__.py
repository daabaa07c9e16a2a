"""BFCL (Berkeley Function Calling Leaderboard) as trajtune eval tasks and environments.

Data come from the ``bfcl-eval`` wheel installed *without* its dependencies
(``pip install --no-deps bfcl-eval==2026.3.23``). Single-turn categories are scored by
``ast_checker`` (our own implementation of BFCL's matching rules); multi-turn categories run
as ``BFCLMultiTurnEnv`` over the package's executable API classes; ``runner`` ties a model's
``generate_fn`` to both and builds the per-category report; ``suite`` is ``trajtune eval --benchmark
bfcl`` (the eval-suite plug-in, registered through ``trajtune.plugins``).
"""

from trajtune.plugins.bfcl.ast_checker import (
    REASONS,
    CheckResult,
    UnsatisfiableAnswer,
    check_ast,
    check_relevance,
    ground_truth_calls,
    standardize_string,
)
from trajtune.plugins.bfcl.data import (
    ALL_CATEGORIES,
    AST_CATEGORIES,
    MULTI_TURN_CATEGORIES,
    RELEVANCE_CATEGORIES,
    SINGLE_TURN_CATEGORIES,
    BFCLNotInstalledError,
    bfcl_available,
    load_bfcl,
    resolve_categories,
)
from trajtune.plugins.bfcl.multi_turn import BFCLMultiTurnEnv
from trajtune.plugins.bfcl.runner import (
    BFCLItemResult,
    bfcl_report,
    default_parse_fn,
    run_bfcl,
    score_single_turn,
)

__all__ = [
    "BFCLItemResult", "BFCLMultiTurnEnv", "bfcl_report", "default_parse_fn", "run_bfcl", "score_single_turn",
    "ALL_CATEGORIES", "AST_CATEGORIES", "MULTI_TURN_CATEGORIES", "RELEVANCE_CATEGORIES",
    "SINGLE_TURN_CATEGORIES", "REASONS", "BFCLNotInstalledError", "CheckResult",
    "UnsatisfiableAnswer", "bfcl_available", "check_ast", "check_relevance", "ground_truth_calls",
    "load_bfcl", "resolve_categories", "standardize_string",
]
