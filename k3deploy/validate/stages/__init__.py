"""The stages this version implements, by name; STAGE_NAMES (k3deploy.validate.stage) holds the full order."""
from __future__ import annotations

from k3deploy.validate.stage import Stage
from k3deploy.validate.stages.shards import ShardsStage

IMPLEMENTED: dict[str, Stage] = {"shards": ShardsStage()}
