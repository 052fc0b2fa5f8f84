"""What a follower says about differing launches: the leader's note (launchreport.py), pure (the
note as the trust check left it in the view; no etcd is reached: report() sends nothing)."""

from __future__ import annotations

from typing import Any

from supervisor.cluster.digest import Mismatch
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.launchreport import LaunchReport
from supervisor.cluster.runkeys import Keys, View

TEXT = "seeds.--seed differ: seeds.--seed (n1: 1; n2: 2)"


def test_a_waiting_follower_says_the_leaders_note_once_and_says_when_the_launches_agree() -> None:
    said: list[tuple[str, str, dict[str, Any]]] = []
    r = LaunchReport(EtcdClient(["http://127.0.0.1:9"]), Keys("/tsup/run"), "n2", 60.0,
                     lambda event, level, message, **data: said.append((event, message, data)))
    noted = View(mismatch=Mismatch(TEXT, ("n1", "n2")))
    r.report(noted, following=True, waiting_here=False)  # not waiting (yet): nothing to say
    r.report(View(mismatch=Mismatch(TEXT, ("n1", "n3"))), following=True, waiting_here=True)  # not named
    assert said == []
    r.report(noted, following=True, waiting_here=True)
    r.report(noted, following=True, waiting_here=True)  # once per difference
    assert [(e, d["nodes"]) for e, _m, d in said] == [("cluster_launch_mismatch", ["n1", "n2"])]
    assert said[0][1].startswith(TEXT + "; no generation starts until they agree") and "60 s" in said[0][1]
    r.report(View(), following=True, waiting_here=True)  # the leader deleted its note
    assert [e for e, _m, _d in said] == ["cluster_launch_mismatch", "cluster_launch_agreed"]
