"""Loss bookkeeping shared by exporters to the simpler (id-less, reward-less) formats."""

from __future__ import annotations

from trajtune.formats._base import ConversionReport, foreign_extra_losses
from trajtune.schema import Message, Trajectory


def declare_message_losses(m: Message, own: str, report: ConversionReport, *, keeps_thought: bool = False,
                           keeps_reasoning: bool = False, keeps_train: bool = False,
                           keeps_ids: bool = False, keeps_custom: bool = False) -> None:
    """Declare the per-message IR fields a text-only export cannot carry."""
    foreign_extra_losses(m.extra, own, report)
    if m.thought is not None and not keeps_thought:
        report.lose("thought")
    if m.reasoning_content is not None and not keeps_reasoning:
        report.lose("reasoning_content")
    if m.train is not None and not keeps_train:
        report.lose("train_flags")
    if m.reward is not None:
        report.lose("message_reward")
    if m.role == "user" and m.origin not in (None, "user"):
        report.lose("observation_source")
    for c in m.tool_calls or []:
        foreign_extra_losses(c.extra, own, report)
        if not c.id_generated and not keeps_ids:
            report.lose("call_ids")
        if c.code is not None:
            report.lose("code_action")
        if c.type == "custom" and not keeps_custom:
            report.lose("custom_input")


def declare_trajectory_losses(t: Trajectory, own: str, report: ConversionReport, *, keeps_reward: bool = False) -> None:
    foreign_extra_losses(t.extra, own, report)
    if t.reward is not None and not keeps_reward:
        report.lose("reward")
    if t.outcome is not None:
        report.lose("outcome")
    if t.reference is not None:
        report.lose("reference")
    if t.metadata:
        report.lose("metadata")
