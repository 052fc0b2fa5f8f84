"""The launch digest (issue 26 build 3): what each node would launch, per-node values masked,
compared before a generation; the leader plans none over a difference. Pure parts with scripted
input; the probe parts against a real git tree, a real script and the job's real Python."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from supervisor.cluster import digest
from supervisor.cluster.coord import Coordinator, Rules, WritePlan
from supervisor.cluster.digest import (LaunchFacts, build, differences, mask_names, mismatch, normalize_argv, seeds,
                                      select)
from supervisor.cluster.launchprobe import code_version, launch_digest, package_versions
from supervisor.cluster.runkeys import NodeRecord, Phase, View
from supervisor.config.model import ConfigError, config_from_table
from supervisor.job.launch import config_json
from supervisor.config.model import Config

DEFAULT = config_json(Config())


def facts(node: str, *, argv: tuple[str, ...] | None = None, env: dict[str, str] | None = None,
          config: dict | None = None, code: str = "git abc", packages: dict[str, str] | None = None) -> LaunchFacts:
    argv = argv or ("python", "train.py", f"/data/{node}/out", "--seed", "1")
    return LaunchFacts(argv, False, env or {}, config or DEFAULT, DEFAULT, code,
                       packages or {"python": "3.11.7", "torch": "2.5.1"}, (node, f"{node}.cluster.local"))


def test_per_node_flag_values_are_masked() -> None:
    argv = ["torchrun", "--node_rank", "3", "--master-addr=10.0.0.7", "--rdzv-endpoint", "n1:29500", "train.py"]
    assert normalize_argv(argv) == ["torchrun", "--node_rank", "<per-node>", "--master-addr=<per-node>",
                                    "--rdzv-endpoint", "<per-node>", "train.py"]
    shell = build(replace(facts("n1", argv=("torchrun --node-rank=2 --master_addr 10.1.1.1 train.py --seed 4 "
                                            "--hf_token=hf_abc",)), shell=True))
    assert json.loads(shell["argv"]) == ["torchrun", "--node-rank=<per-node>", "--master_addr", "<per-node>",
                                         "train.py", "--seed", "4", "--hf_token=<redacted>"]  # never to etcd


def test_each_nodes_own_names_are_read_as_node_so_the_same_launch_agrees() -> None:
    def on(node: str) -> dict[str, str]:
        return build(facts(node, argv=("python", "train.py", f"/data/{node}/out", f"--log={node}.cluster.local:9",
                                       "--fault-node", "n2", "--data", "/data/n10/shard", "--epochs", "1")))
    # the per-node path and host agree; "n2" named on every node agrees (on n2 as well); n10 is not n1
    assert differences({n: on(n) for n in ("n1", "n2", "n3")}) == []
    other = on("n3")
    other["argv"] = other["argv"].replace("/data/n10/shard", "/data/n3/shard")
    diffs = differences({"n1": on("n1"), "n2": on("n2"), "n3": other})
    assert [d.key for d in diffs] == ["argv"] and [ns for _, ns in diffs[0].values] == [("n1", "n2"), ("n3",)]
    assert mask_names("run 1 on n1, n10 and x-n1", ["n1", "1"]) == "run 1 on <node>, n10 and x-<node>"


def test_seeds_are_read_from_the_command_and_the_environment() -> None:
    argv = ["python", "train.py", "--seed", "7", "--data_seed=8", "trainer.seed=9", "--init-seed", "-1", "--x"]
    env = {"PYTHONHASHSEED": "0", "TSUP_SEEDLESS": "x", "HOME": "/root"}
    assert seeds(argv, False, env) == {"--seed": "7", "--data_seed": "8", "trainer.seed": "9", "--init-seed": "-1",
                                       "$PYTHONHASHSEED": "0"}
    assert seeds(["python train.py --seed 5 'a b'"], True, {}) == {"--seed": "5"}


def test_a_different_seed_is_named_with_each_nodes_value() -> None:
    ds = {"n1": build(facts("n1")), "n2": build(facts("n2")),
          "n3": build(facts("n3", argv=("python", "train.py", "/data/n3/out", "--seed", "2")))}
    diffs = differences(ds)
    assert [d.key for d in diffs] == ["argv", "seeds.--seed"]
    assert diffs[1].values == (("1", ("n1", "n2")), ("2", ("n3",)))
    msg = mismatch(ds)
    assert "argv, seeds.--seed differ" in msg and "seeds.--seed (n1, n2: 1; n3: 2)" in msg, msg


def test_config_code_and_packages_differences_are_named() -> None:
    table = {"job": {"command": ["python", "train.py"]}, "policy": {"max_restarts": 3},
             "state": {"dir": "/var/n2/state"}, "cluster": {"endpoints": ["http://127.0.0.1:2379"], "node_id": "n2", "nodes": 2}}
    mine = config_json(config_from_table(table))
    table["policy"] = {}
    table["state"] = {"dir": "/var/n1/state"}
    table["cluster"] = {**table["cluster"], "endpoints": ["http://localhost:2379"], "node_id": "n1"}  # type: ignore[dict-item]
    theirs = config_json(config_from_table(table))
    ds = {"n1": build(facts("n1", config=theirs)),
          "n2": build(facts("n2", config=mine, code="git abc+dirty", packages={"python": "3.11.7", "torch": "2.4.0"}))}
    # the node's own state dir, etcd endpoint and name are its own: not compared
    assert [d.key for d in differences(ds)] == ["code", "config.policy.max_restarts", "packages.torch"]
    assert "config.policy.max_restarts (n1: (default); n2: 3)" in mismatch(ds)


def test_require_same_selects_groups_or_keys_and_is_checked() -> None:
    d = build(facts("n1", env={"SEED": "4"}))
    assert set(select(d, ["packages.torch", "seeds"])) == {"packages.torch", "seeds.--seed", "seeds.$SEED", "~names"}
    assert differences({"n1": select(d, []), "n2": select(build(facts("n2", code="other")), [])}) == []
    base = {"job": {"command": ["python", "train.py"]}}
    ok = config_from_table({**base, "cluster": {"endpoints": ["http://127.0.0.1:2379"], "require_same": ["code", "packages.torch"]}})
    assert ok.cluster.require_same == ("code", "packages.torch")
    with pytest.raises(ConfigError, match="cluster.require_same: expected groups of argv, seeds"):
        config_from_table({**base, "cluster": {"endpoints": ["http://127.0.0.1:2379"], "require_same": ["argv", "sead"]}})


def test_a_digest_in_etcd_that_is_not_one_is_skipped_not_fatal() -> None:
    assert digest.decode(digest.encode({"a": "1"})) == {"a": "1"}
    with pytest.raises(ValueError):
        digest.decode("[1, 2]")
    from supervisor.cluster.runkeys import Keys

    keys = Keys("/p")
    v = View.parse(keys, [("/p/digest/n1", "[1]", 1), ("/p/digest/n2", '{"code": "x"}', 2)])
    assert v.digests == {"n2": {"code": "x"}}


RULES = Rules(nodes=2, min_nodes=2, wait_for_nodes_s=30.0, lease_ttl_s=5.0)


def _view(d1: dict[str, str], d2: dict[str, str]) -> View:
    recs = {n: NodeRecord(n, "10.0.0.1", Phase.WAITING, 0) for n in ("n1", "n2")}
    return View(recs, "n1", digests={"n1": d1, "n2": d2})


def test_the_leader_plans_no_generation_over_a_difference_and_gives_up_after_the_wait() -> None:
    lead = Coordinator("n1", RULES)
    me = NodeRecord("n1", "10.0.0.1", Phase.WAITING, 0)
    differ = _view({"seeds.--seed": "1"}, {"seeds.--seed": "2"})
    assert lead.step(differ, me, 0.0) == []
    assert lead.step(differ, me, 29.0) == []
    [wp] = lead.step(differ, me, 30.0)
    assert isinstance(wp, WritePlan) and wp.plan.nodes == ()
    assert wp.plan.give_up and "seeds.--seed (n1: 1; n2: 2)" in wp.plan.give_up
    lead = Coordinator("n1", RULES)  # the odd node restarted with the others' seed: the generation starts
    [wp] = lead.step(_view({"seeds.--seed": "1"}, {"seeds.--seed": "1"}), me, 0.0)
    assert isinstance(wp, WritePlan) and wp.plan.nodes == ("n1", "n2") and not wp.plan.give_up


def test_code_version_is_git_head_and_dirty_else_the_scripts_hash(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("print(1)\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert code_version(repo, ["python", "train.py"]) == f"git {head}"
    (repo / "train.py").write_text("print(2)\n")
    assert code_version(repo, ["python", "train.py"]) == f"git {head}+dirty"
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "train.py").write_text("print(1)\n")
    a = code_version(plain, ["python", "--flag", "train.py"])
    assert a.startswith("script train.py sha256:")
    (plain / "train.py").write_text("print(2)\n")
    assert code_version(plain, ["python", "--flag", "train.py"]) != a


def test_package_versions_come_from_the_jobs_python_without_importing_torch_here() -> None:
    got = package_versions(sys.executable)
    assert got["python"] == ".".join(map(str, sys.version_info[:3]))
    failed = package_versions("/nonexistent/python")
    assert failed["unknown"].startswith("could not run") and "torch" not in failed
    # a node whose probe failed is not compared on its packages (the rest still is)
    ds = {"n1": build(facts("n1")), "n2": build(facts("n2", packages=failed, code="git other"))}
    assert [d.key for d in differences(ds)] == ["code"]


def test_two_nodes_same_config_file_but_their_names_agree(tmp_path: Path) -> None:
    def cfg(node: str, seed: str) -> Config:
        d = tmp_path / node
        return config_from_table({
            "job": {"command": [sys.executable, str(tmp_path / "train.py"), str(d / "out"), "--seed", seed],
                    "workdir": str(tmp_path)},
            "state": {"dir": str(d / "state")}, "checkpoints": {"dir": str(d / "ck")},
            "cluster": {"endpoints": ["http://127.0.0.1:2379"], "node_id": node, "advertise_addr": f"10.0.0.{node[-1]}",
                        "nodes": 2}})
    (tmp_path / "train.py").write_text("print(1)\n")
    same = {"n1": launch_digest(cfg("n1", "1")), "n2": launch_digest(cfg("n2", "1"))}
    assert differences(same) == [], json.dumps(same, indent=1)
    assert same["n1"]["code"].startswith("script train.py")
    other = {"n1": same["n1"], "n2": launch_digest(cfg("n2", "2"))}
    assert [d.key for d in differences(other)] == ["argv", "seeds.--seed"]


def test_a_secret_one_node_alone_knows_never_keeps_the_launches_apart() -> None:
    """The redaction gate masks the values a node learned from its own environment (its daemon's
    secret-named variables): a node that learned one masks it in its digest, a node that did not
    shows it. Secrets are not compared, so the two agree when the rest agrees; a real difference
    beside the secret is still named."""
    import uuid

    from supervisor.redact import REDACTED, learn_secrets

    value = f"plainvalue-{uuid.uuid4().hex[:10]}"
    argv = ("python", "train.py", "--wandb-run", f"run-{value}", "--epochs", "1")
    cfg = config_from_table({"job": {"command": ["python"], "env": {"WANDB_RUN_GROUP": value}}})
    shown = build(facts("n2", argv=argv, config=config_json(cfg)))  # n2 never learned it
    learn_secrets([value])  # n1's daemon has it in a secret-named variable of its environment
    env_config = config_json(cfg)  # as the ledger stores it, masked by the gate
    masked = build(facts("n1", argv=argv, config=env_config))
    assert value not in json.dumps(masked) and f"run-{REDACTED}" in masked["argv"]
    assert value in shown["argv"] and value in shown["config.job.env.WANDB_RUN_GROUP"] and shown != masked
    assert differences({"n1": masked, "n2": shown}) == []
    other = build(facts("n3", argv=(*argv[:-1], "2"), config=env_config))
    diffs = differences({"n1": masked, "n2": shown, "n3": other})
    assert [d.key for d in diffs] == ["argv"] and [ns for _, ns in diffs[0].values] == [("n1", "n2"), ("n3",)]
    # A mask stands for text within one word, never for words of its own.
    longer = build(facts("n2", argv=(*argv, "--extra")))
    assert [d.key for d in differences({"n1": masked, "n2": {**shown, "argv": longer["argv"]}})] == ["argv"]
