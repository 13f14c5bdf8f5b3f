"""`launch.slurm`: how the Slurm executor asks for its allocation (the job text's #SBATCH lines)."""
# No `from __future__ import annotations` here (as in settings.py: pydantic would compile the strings).

import re

from pydantic import Field, field_validator

from k3deploy.topology.base import Strict

# sbatch --time forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (man sbatch), or UNLIMITED.
_TIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
# A value written into an #SBATCH line: no whitespace, quotes or shell specials (sbatch reads the line itself).
_WORD = re.compile(r"^[A-Za-z0-9_.,:=+@%\-\[\]/|&!()*]+$")


class SlurmSettings(Strict):
    """Slurm job settings for `launch.executor: slurm` and `k3deploy render --format slurm`; nodes come from
    the allocation (the topology's nodes give their count, interfaces and rank order)."""

    partition: str | None = Field(None, description="partition (sbatch --partition), else the cluster's default")
    account: str | None = Field(None, description="account charged (sbatch --account)")
    time_limit: str | None = Field(None, description="job time limit as sbatch --time takes it (HH:MM:SS, "
                                   "D-HH:MM, minutes, ...); the engine is stopped when it is reached")
    gres: str | None = Field(None, description="generic resources per node (sbatch --gres, e.g. gpu:8); "
                             "default: --gpus-per-node from hardware.gpus_per_node on GPU hardware")
    constraint: str | None = Field(None, description="node features required (sbatch --constraint)")
    nodelist: list[str] | None = Field(None, min_length=1, description="exactly these Slurm nodes (sbatch "
                                       "--nodelist); else any the scheduler picks")

    @field_validator("partition", "account", "gres", "constraint")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        if v is not None and not _WORD.fullmatch(v):
            raise ValueError("must be one word of letters, digits and _.,:=+@%-[]/|&!()* as sbatch takes it")
        return v

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not _TIME.fullmatch(v):
            raise ValueError("not an sbatch --time value (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)")
        return v

    @field_validator("nodelist")
    @classmethod
    def _nodes(cls, v: list[str] | None) -> list[str] | None:
        for name in v or []:
            if not re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+", name):
                raise ValueError(f"{name!r} is not a Slurm node name or hostlist")
        return v
