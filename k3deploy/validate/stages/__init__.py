"""The stages this version implements, by name; STAGE_NAMES (k3deploy.validate.stage) holds the full order."""
from __future__ import annotations

from k3deploy.validate.stage import STAGE_NAMES, Stage
from k3deploy.validate.stages.accuracy import AccuracyStage
from k3deploy.validate.stages.effort import EffortStage
from k3deploy.validate.stages.kernels import KernelsStage
from k3deploy.validate.stages.long import LongStage
from k3deploy.validate.stages.prefix_cache import PrefixCacheStage
from k3deploy.validate.stages.shards import ShardsStage
from k3deploy.validate.stages.short import ShortStage
from k3deploy.validate.stages.topology import TopologyStage
from k3deploy.validate.stages.vision import VisionStage

_STAGES: list[Stage] = [ShardsStage(), KernelsStage(), TopologyStage(), ShortStage(), VisionStage(), LongStage(),
                        PrefixCacheStage(), EffortStage(), AccuracyStage()]
# In the checklist's order whatever order they are listed in above.
IMPLEMENTED: dict[str, Stage] = {s.name: s for s in sorted(_STAGES, key=lambda s: STAGE_NAMES.index(s.name))}
