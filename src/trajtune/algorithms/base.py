"""What the learner needs from an algorithm: a loss over a batch, normalised across accumulation.

An objective returns the *sum* of its per-unit losses and says, from the batch alone, how many
units the batch holds (tokens for token-mean, sequences for sequence-mean). The learner adds the
denominators of all micro-batches of one optimizer step and divides once, so gradient
accumulation gives exactly the loss of the full batch.
"""

from __future__ import annotations

from typing import Any, Protocol, Union

import torch

from trajtune.algorithms.batch import Batch


#: name -> (sum, denominator): the learner reports Σ sums / Σ denominators over a step's
#: micro-batches and updates; a plain float is a count and is summed.
Metrics = dict[str, Union[tuple[float, float], float]]


class Objective(Protocol):
    """``coupled_rows`` (optional attribute, default False): the loss of a row needs the other rows
    of its unit in the same forward (DPO pairs), so micro-batches never split a unit."""

    name: str

    def denominator(self, batch: Batch) -> float:
        """Units this batch contributes to the step's normaliser (computed without the model)."""
        ...

    def loss_sum(self, model: Any, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        """Un-normalised loss (a scalar tensor with grad) and metrics as (sum, denominator) pairs."""
        ...
