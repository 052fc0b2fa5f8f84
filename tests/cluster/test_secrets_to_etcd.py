"""No secret leaves the node for etcd (issue 34: "no secret on the wire"). The human texts a node
writes there (an end request's summary: the job's failure as the daemon saw it; a plan's reason
and give-up: the leader's words around that summary; a give-up note: the daemon's exit reason)
pass the one redaction gate as they leave, with the values learned on the node (its job's env)
included: no node compares or digests these texts. A real etcd; its keys are read back raw over
etcd's own HTTP gateway, not through the supervisor's client."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from supervisor.cluster.agent import ClusterGaveUp
from supervisor.redact import REDACTED, learn_secrets
from tests.cluster.daemons import all_finish, node_config, start
from tests.cluster.etcdserver import EtcdServer
from tests.cluster.test_agent import RULES, barrier, nodes
from tests.conftest import ROOT, Daemon
from tests.secretcorpus import SECRET_LINES, leaks
from tests.util import wait_for


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def raw_keys(etcd: EtcdServer, prefix: str) -> dict[str, str]:
    """Every key starting with ``prefix`` and its value, as etcd holds them."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # etcd's range end for "every key starting with prefix"
    body = json.dumps({"key": _b64(prefix.encode()), "range_end": _b64(end.encode())}).encode()
    req = urllib.request.Request(f"{etcd.endpoint}/v3/kv/range", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        kvs = json.load(r).get("kvs") or []
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode() for kv in kvs}


def test_a_secret_in_a_failure_summary_or_a_reason_never_reaches_etcd(etcd: EtcdServer) -> None:
    prefix = f"/tsup/test-{uuid.uuid4().hex[:8]}"
    learned = f"plainvalue-{uuid.uuid4().hex[:10]}"  # a job's env value: only the learned values catch it
    learn_secrets([learned])
    summary = ("loss is nan at step 70; the job printed: " + " | ".join(line for line, _ in SECRET_LINES)
               + f" | and {learned} alone")
    assert leaks(summary) and learned in summary  # what the daemon hands the agent holds the secrets
    ns = nodes(etcd, prefix, RULES)
    with ThreadPoolExecutor(3) as pool:
        try:
            [f.result(timeout=30) for f in barrier(pool, ns)]
            # The failure is the node's decision to give up: the leader's plan says why, with the summary.
            ns[1].agent.request_end("nan", summary, 70, 65, "give_up")
            for f in barrier(pool, ns):
                with pytest.raises(ClusterGaveUp, match="gave up after nan: loss is nan at step 70"):
                    f.result(timeout=30)
            ns[1].agent.close(gave_up=f"node n2: restart budget spent ({summary})")  # its daemon's exit reason
            keys = wait_for(lambda: (k := raw_keys(etcd, prefix + "/")) and f"{prefix}/gave_up/n2" in k and k,
                            timeout=15, what="the give-up note in etcd")
        finally:
            for n in ns:
                n.agent.close()
    end = json.loads(keys[f"{prefix}/end/1"])
    plan = json.loads(keys[f"{prefix}/plan"])
    note = json.loads(keys[f"{prefix}/gave_up/n2"])
    for text in (end["summary"], plan["reason"], plan["give_up"], note["reason"]):
        assert "loss is nan at step 70; the job printed:" in text and REDACTED in text, text  # said, masked
    assert plan["give_up"].startswith("the cluster gives up: node n2 gave up after nan: loss is nan")
    for key, value in keys.items():  # every key and value under the run's prefix, raw
        assert not leaks(key + value) and learned not in key + value, (key, leaks(key + value))


def test_a_text_past_the_wire_bound_is_cut_and_still_masked(etcd: EtcdServer) -> None:
    """A summary of 100x the wire bound (a job's whole traceback) reaches etcd cut, the secrets in
    the part kept masked: a few kB a key, never a value etcd refuses (1.5 MiB)."""
    from supervisor.cluster.etcdtypes import WIRE_TEXT_CHARS

    prefix = f"/tsup/test-{uuid.uuid4().hex[:8]}"
    secret_line, secret = SECRET_LINES[0]
    summary = (secret_line + " ") * (100 * WIRE_TEXT_CHARS // (len(secret_line) + 1))
    ns = nodes(etcd, prefix, RULES)
    with ThreadPoolExecutor(3) as pool:
        try:
            [f.result(timeout=30) for f in barrier(pool, ns)]
            ns[0].agent.request_end("crash", summary, None, None, "restart")
            keys = wait_for(lambda: (k := raw_keys(etcd, prefix + "/")) and f"{prefix}/end/1" in k and k, timeout=15,
                            what="the end request in etcd")
        finally:
            for n in ns:
                n.agent.close()
    shown = json.loads(keys[f"{prefix}/end/1"])["summary"]
    assert len(shown) < 2 * WIRE_TEXT_CHARS and shown.endswith("chars)") and "…(+" in shown, len(shown)
    assert secret not in shown and REDACTED in shown


JOB = """
import json, os, sys, time
gen = int(os.environ["TSUP_GENERATION"])
print(json.dumps({"step": 1, "loss": 1.0}), flush=True)
open(os.path.join(sys.argv[1], f"running-{gen}"), "w").close()
if gen == 1:
    time.sleep(120)  # until the operator's restart ends the generation
"""


def test_an_operators_restart_reason_with_secrets_reaches_etcd_masked(etcd: EtcdServer, tmp_path: Path) -> None:
    """Through the real daemons and the real CLI: the operator of n2 restarts with a reason that
    holds the job's HF_TOKEN value (no name, no shape beside it), a password and a URL password;
    n2's daemon asks the cluster to end the generation with that reason in its summary. Every key
    under the run's prefix, polled raw while the daemons run (the end request lives on n2's
    lease), holds none of them; the reason is there, masked."""
    prefix = f"/tsup/e2e-{uuid.uuid4().hex[:8]}"
    token = f"plainvalue-{uuid.uuid4().hex[:10]}"
    script = tmp_path / "job.py"
    script.write_text(JOB)
    ds: dict[str, Daemon] = {}
    for n in ("n1", "n2"):
        (tmp_path / n).mkdir()
        cfg = node_config(tmp_path, n, etcd, prefix, nodes=2, job_args=[],
                          command=[sys.executable, str(script), str(tmp_path / n)], wait_for_nodes_s=15.0)
        cfg.write_text(cfg.read_text().replace("[state]", f'env = {{ HF_TOKEN = "{token}" }}\n[state]', 1))
        ds[n] = start(tmp_path, n, cfg)
    seen: set[str] = set()  # every key=value etcd held while the daemons ran
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                seen.update(f"{k}={v}" for k, v in raw_keys(etcd, prefix + "/").items())
            except OSError:
                pass  # etcd busy for a moment: the next poll reads it
            done.wait(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        wait_for(lambda: all((tmp_path / n / "running-1").exists() for n in ds), timeout=90,
                 what="generation 1 running on both nodes")
        reason = f"rotated the hub token to {token}; password: 918273645; db postgres://trainer:urlpw-4455@db/x"
        r = subprocess.run([sys.executable, "-m", "supervisor", "restart", "--state-dir", str(tmp_path / "n2" / "state"),
                            "--reason", reason], cwd=str(ROOT), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        all_finish(ds, 120)
    finally:
        done.set()
        poller.join(5)
        for d in ds.values():
            if d.proc.poll() is None:
                d.kill()
    ends = [json.loads(kv.split("=", 1)[1]) for kv in seen if kv.startswith(f"{prefix}/end/1=")]
    assert ends and ends[0]["by"] == "n2" and "operator restart: rotated the hub token to" in ends[0]["summary"], ends
    assert REDACTED in ends[0]["summary"], ends
    for kv in seen:
        for secret in (token, "918273645", "urlpw-4455"):
            assert secret not in kv, kv
