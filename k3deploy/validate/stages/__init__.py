"""The stages this version implements, by name; STAGE_NAMES (k3deploy.validate.stage) holds the full order."""
from __future__ import annotations

from k3deploy.validate.stage import Stage
from k3deploy.validate.stages.kernels import KernelsStage
from k3deploy.validate.stages.shards import ShardsStage
from k3deploy.validate.stages.short import ShortStage
from k3deploy.validate.stages.topology import TopologyStage

IMPLEMENTED: dict[str, Stage] = {"shards": ShardsStage(), "kernels": KernelsStage(), "topology": TopologyStage(),
                                 "short": ShortStage()}
