"""The client's rank: torchrun's variables, then Slurm's (srun launching one task per rank)."""
from __future__ import annotations

import pytest

from supervisor.client._env import RANK_VARIABLES, ClientUsageError, rank


@pytest.fixture
def env(monkeypatch):
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("variables, expected", [
    ({}, 0),
    ({"RANK": "5", "LOCAL_RANK": "1"}, 5),                                   # torchrun
    ({"SLURM_PROCID": "13", "SLURM_LOCALID": "5"}, 13),                     # srun, a task per rank
    ({"RANK": "9", "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}, 9),          # srun torchrun: torchrun's rank
    ({"LOCAL_RANK": "3"}, 3),
    ({"SLURM_LOCALID": "2"}, 2),
    ({"RANK": "0", "SLURM_PROCID": "7"}, 0),                                 # rank 0 is a rank, not "unset"
])
def test_rank_sources(env, variables, expected):
    for k, v in variables.items():
        env.setenv(k, v)
    assert rank() == expected


def test_malformed_slurm_rank_is_named(env):
    env.setenv("SLURM_PROCID", "abc")
    with pytest.raises(ClientUsageError, match="SLURM_PROCID"):
        rank()
