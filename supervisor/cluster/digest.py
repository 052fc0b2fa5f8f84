"""The launch digest of a multi-node run: what each node is about to run, in a form the nodes can
compare, so that a generation starts only on nodes that run the same thing (the seed: "rebooting
distributed jobs without synchronizing seeds and configurations can introduce hard-to-debug
divergence"). Pure: :mod:`supervisor.cluster.launchprobe` gathers the facts (git, the job's
Python), this module turns them into a flat ``key -> value`` mapping, selects the keys
``[cluster] require_same`` names, compares the nodes' digests and says what differs.

Keys, by group (``require_same`` names groups or dotted keys within them)::

    argv             the job's command, per-node values masked (see :func:`normalize_argv`)
    seeds.<name>     a seed named in the command (--seed 3, --data_seed=3, train.seed=3) or in
                     the job's environment ($PYTHONHASHSEED, $SEED, ...)
    config.<key>     the supervisor's config, keys that differ from the built-in default only
                     (secrets masked; the node's own paths and etcd settings left out)
    code             the job's working tree: git HEAD and the dirty flag, else a hash of the script
    packages.<dist>  the job's Python and key package versions (torch, transformers, lightning, ...)

Values are published as they are, with the node's names (``node_id``, host name, advertised
address). Two nodes' values agree when they are equal, or equal once each node's own names are
read as ``<node>`` (``/data/n1/ckpt`` on n1 and ``/data/n2/ckpt`` on n2); the command is compared
word by word that way, so an argument naming one node (``--fault-node n2``) on every node agrees
too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..redact import REDACTED, redact_argv
from .config import REQUIRE_SAME_GROUPS, check_require_same  # noqa: F401  (re-exported)
from .etcdtypes import wire_text

GROUPS = REQUIRE_SAME_GROUPS
DEFAULT_REQUIRE_SAME = GROUPS
NODE = "<node>"
PER_NODE = "<per-node>"
ABSENT = "(absent)"
DEFAULT = "(default)"  # a config key at its built-in default on this node
NAMES = "~names"  # the node's own names (JSON list): how its values are read, never compared
UNKNOWN_PACKAGES = "packages.unknown"  # the node's package probe failed (why): its packages are not compared
MAX_VALUE = 4000  # longer values are cut, with a hash of the whole: a digest stays small in etcd

# Command-line flags whose value is the node's own by design (torchrun, accelerate, deepspeed).
PER_NODE_FLAGS = ("--node_rank", "--node-rank", "--machine_rank", "--machine-rank", "--master_addr",
                  "--master-addr", "--rdzv_endpoint", "--rdzv-endpoint", "--local_rank", "--local-rank",
                  "--local-addr", "--local_addr")
_PER_NODE_RX = re.compile(r"(?P<flag>" + "|".join(re.escape(f) for f in PER_NODE_FLAGS) + r")(?P<sep>=|\s+)(?P<val>[^\s'\"]+)")
# Config keys that are the node's own: where it keeps its state and checkpoints, how it reaches
# etcd and who it is. Of [cluster], only these keys must agree:
SHARED_CLUSTER_KEYS = ("prefix", "nodes", "min_nodes", "lease_ttl_s", "wait_for_nodes_s", "master_port",
                       "require_same")
PER_NODE_CONFIG = ("state.dir", "checkpoints.dir", "job.command")  # job.command: the argv key has it
_SEED_ARG = re.compile(r"^(?P<name>--?[\w.-]*seed[\w.-]*)(?:=(?P<val>.*))?$", re.I)
_SEED_OVERRIDE = re.compile(r"^(?P<name>\+{0,2}[\w.]*seed[\w.]*)=(?P<val>.*)$", re.I)  # hydra: train.seed=3


@dataclass(frozen=True)
class LaunchFacts:
    """What a node is about to launch, as gathered on it."""

    argv: tuple[str, ...]  # the configured command (one string when run by the shell)
    shell: bool
    env: Mapping[str, str]  # the job's environment (only names with SEED are used)
    config: Mapping[str, Any]  # the config as stored in the ledger (secrets masked), nested
    default_config: Mapping[str, Any]  # the same for the built-in defaults
    code: str
    packages: Mapping[str, str]
    node_names: tuple[str, ...]  # this node's names: read as <node> when values are compared


@dataclass(frozen=True)
class Difference:
    key: str
    values: tuple[tuple[str, tuple[str, ...]], ...]  # (value, the nodes that have it), most nodes first

    def describe(self, width: int = 120) -> str:
        """``key (n1, n2: 1; n3: 2)``; long values from a little before where they start to differ."""
        vals = [v for v, _ in self.values]
        same = len(os.path.commonprefix(vals))
        start = same - 20 if same > 40 else 0
        return f"{self.key} (" + "; ".join(
            f"{', '.join(nodes)}: {'...' if start else ''}{_short(v[start:], width)}" for v, nodes in self.values) + ")"


# ---------------------------------------------------------------------- building
def mask_names(text: str, names: Iterable[str]) -> str:
    """``text`` with each of the node's names (2+ characters, not a bare number: "1" would hit
    every other number) replaced by ``<node>`` where it stands alone (not inside a longer word)."""
    for name in sorted({n for n in names if len(n) >= 2 and not n.isdigit()}, key=len, reverse=True):
        text = re.sub(r"(?<![A-Za-z0-9])" + re.escape(name) + r"(?![A-Za-z0-9])", NODE, text)
    return text


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """The command's words without per-node flag values (``--node_rank 3``, ``--master_addr=10.0.0.1``)."""
    out: list[str] = []
    mask_next = False
    for a in argv:
        if mask_next:
            out.append(PER_NODE)
            mask_next = False
            continue
        if a in PER_NODE_FLAGS:
            mask_next = True
            out.append(a)
            continue
        out.append(_PER_NODE_RX.sub(lambda m: m["flag"] + m["sep"] + PER_NODE, a))
    return out


def command_tokens(argv: Sequence[str], shell: bool) -> list[str]:
    """The command's words (a shell command split as the shell would, roughly)."""
    if not shell:
        return list(argv)
    try:
        return shlex.split(" ".join(argv))
    except ValueError:  # unbalanced quotes: the shell reports it; a rough split finds the seeds
        return " ".join(argv).split()


def seeds(argv: Sequence[str], shell: bool, env: Mapping[str, str]) -> dict[str, str]:
    """Seeds named in the command (``--seed 3``, ``--seed=3``, ``train.seed=3``) and in the
    environment (names with SEED; the supervisor's own TSUP_ variables excepted)."""
    out: dict[str, str] = {}
    toks = command_tokens(argv, shell)
    for i, t in enumerate(toks):
        m = _SEED_ARG.match(t)
        if m:
            val = m["val"]
            if val is None:
                nxt = toks[i + 1] if i + 1 < len(toks) else ""
                val = "" if nxt.startswith("-") and not _is_number(nxt) else nxt
            out[m["name"]] = val
            continue
        m = _SEED_OVERRIDE.match(t)
        if m:
            out[m["name"]] = m["val"]
    for k, v in env.items():
        if "SEED" in k.upper() and not k.startswith("TSUP_"):
            out["$" + k] = v
    return out


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, path))
        else:
            out[path] = v
    return out


def _shared(path: str) -> bool:
    if path in PER_NODE_CONFIG:
        return False
    if path.startswith("cluster."):
        return path.split(".", 2)[1] in SHARED_CLUSTER_KEYS
    return True


def config_keys(config: Mapping[str, Any], default: Mapping[str, Any]) -> dict[str, str]:
    """The config's keys that differ from the built-in default, the node's own keys left out."""
    mine, base = _flatten(config), _flatten(default)
    return {path: json.dumps(v, sort_keys=True) for path, v in mine.items()
            if _shared(path) and (path not in base or base[path] != v)}


def build(f: LaunchFacts) -> dict[str, str]:
    """The full digest of one node's launch (every group; :func:`select` picks the compared keys)."""
    argv = normalize_argv(redact_argv(command_tokens(f.argv, f.shell)))  # it goes to etcd and the logs
    d: dict[str, str] = {"argv": json.dumps(argv), "code": f.code}
    d.update({f"seeds.{k}": v for k, v in seeds(f.argv, f.shell, f.env).items()})
    d.update({f"config.{k}": v for k, v in config_keys(f.config, f.default_config).items()})
    d.update({f"packages.{k}": v for k, v in f.packages.items()})
    d = {k: _bounded(v) for k, v in d.items()}
    d[NAMES] = json.dumps(sorted(set(f.node_names)))
    return d


def _bounded(v: str) -> str:
    if len(v) <= MAX_VALUE:
        return v
    return f"{v[:80]}... sha256:{hashlib.sha256(v.encode()).hexdigest()[:16]}"


def selected(key: str, require_same: Iterable[str]) -> bool:
    """``key`` is compared when ``require_same`` names it or a group (or dotted prefix) above it."""
    return any(key == s or key.startswith(s + ".") for s in require_same)


def select(digest: Mapping[str, str], require_same: Iterable[str]) -> dict[str, str]:
    req = tuple(require_same)
    return {k: v for k, v in digest.items() if k == NAMES or selected(k, req)}


# ---------------------------------------------------------------------- etcd form
def encode(digest: Mapping[str, str]) -> str:
    return json.dumps(dict(digest), sort_keys=True)


def decode(text: str) -> dict[str, str]:
    """Raises ValueError when ``text`` is not a digest."""
    d = json.loads(text)
    if not isinstance(d, dict):
        raise ValueError("a launch digest is a JSON object")
    return {str(k): str(v) for k, v in d.items()}


# ---------------------------------------------------------------------- comparing
def _names(node: str, d: Mapping[str, str]) -> tuple[str, ...]:
    try:
        listed = json.loads(d.get(NAMES, "[]"))
    except ValueError:
        listed = []
    return (node, *(str(n) for n in listed if isinstance(n, str)))


def _words(v: str) -> list[str] | None:
    try:
        w = json.loads(v)
    except ValueError:
        return None
    return [str(x) for x in w] if isinstance(w, list) else None


def _canonical(key: str, values: Mapping[str, str], names: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """Each node's value as compared: as it is where every node has the same, else with the
    node's own names read as <node>; the command word by word (see the module's doc)."""
    if key == "argv":
        words = {n: _words(v) for n, v in values.items()}
        lists = [w for w in words.values() if w is not None]
        if len(lists) == len(words) and len({len(w) for w in lists}) == 1:
            same = [len({w[i] for w in lists}) == 1 for i in range(len(lists[0]))]
            return {n: json.dumps([t if same[i] else mask_names(t, names[n]) for i, t in enumerate(w or [])])
                    for n, w in words.items()}
    return {n: mask_names(v, names[n]) for n, v in values.items()}


def _glob(masked: str, shown: str) -> bool:
    """``shown`` is ``masked`` with each ``<redacted>`` standing for some text (leftmost search
    of the literal parts: linear, whatever the input)."""
    parts = masked.split(REDACTED)
    if not (shown.startswith(parts[0]) and shown.endswith(parts[-1])
            and len(shown) >= len(parts[0]) + len(parts[-1])):
        return False
    at, end = len(parts[0]), len(shown) - len(parts[-1])
    for part in parts[1:-1]:
        found = shown.find(part, at, end)
        if found < 0:
            return False
        at = found + len(part)
    return True


def _agrees(key: str, masked: str, shown: str) -> bool:
    if key == "argv":  # word by word: a mask stands for text within one word
        a, b = _words(masked), _words(shown)
        if a is not None and b is not None:
            return len(a) == len(b) and all(x == y or (REDACTED in x and _glob(x, y)) for x, y in zip(a, b))
    return _glob(masked, shown)


def _secrets_not_compared(key: str, values: dict[str, str]) -> dict[str, str]:
    """Secrets are not compared, and a node masks more than the others: the values it learned
    from its own environment (redact.learn_secrets). A value masked on one node (``--x
    <redacted>``) and shown on another that did not learn it agree when the rest agrees: the
    second node is read as having the masked value, so a secret known to one node alone never
    keeps a generation from starting."""
    masked = sorted({v for v in values.values() if REDACTED in v}, key=lambda v: (-v.count(REDACTED), v))
    if not masked:
        return values
    return {n: v if REDACTED in v else next((m for m in masked if _agrees(key, m, v)), v) for n, v in values.items()}


def differences(digests: Mapping[str, Mapping[str, str]]) -> list[Difference]:
    """Every key on which the nodes' digests disagree (a key one node lacks counts: for a config
    key that means its built-in default there)."""
    out: list[Difference] = []
    if len(digests) < 2:
        return out
    names = {n: _names(n, d) for n, d in digests.items()}
    keys = sorted(set().union(*(set(d) for d in digests.values())) - {NAMES, UNKNOWN_PACKAGES})
    for key in keys:
        values = {n: d.get(key, DEFAULT if key.startswith("config.") else ABSENT) for n, d in digests.items()
                  if not (key.startswith("packages.") and UNKNOWN_PACKAGES in d)}  # a failed probe says nothing
        if len(set(values.values())) <= 1:
            continue
        by_value: dict[str, list[str]] = {}
        for node, v in sorted(_secrets_not_compared(key, _canonical(key, values, names)).items()):
            by_value.setdefault(v, []).append(node)
        if len(by_value) > 1:
            vals = sorted(by_value.items(), key=lambda kv: (-len(kv[1]), kv[1]))
            out.append(Difference(key, tuple((v, tuple(ns)) for v, ns in vals)))
    return out


def mismatch(digests: Mapping[str, Mapping[str, str]], limit: int = 8) -> str:
    """What differs between the nodes' launches, in one sentence ("" when they agree)."""
    diffs = differences(digests)
    if not diffs:
        return ""
    shown = "; ".join(d.describe() for d in diffs[:limit])
    more = f"; and {len(diffs) - limit} more key(s)" if len(diffs) > limit else ""
    return (f"the nodes would not run the same launch: {', '.join(d.key for d in diffs)} differ: "
            f"{shown}{more}")


def _short(v: str, width: int) -> str:
    return v if len(v) <= width else v[: width - 3] + "..."


@dataclass(frozen=True)
class Mismatch:
    """``P/mismatch``: what differs between the waiting nodes' launches (:func:`mismatch`), and
    which nodes; the leader writes it on its lease, every waiting node named says it."""

    text: str
    nodes: tuple[str, ...]

    def to_json(self) -> str:
        # The values in it were gated when each digest was built; the text is gated again as it
        # leaves (wire_text): the leader compares notes only before they are written.
        return json.dumps({"text": wire_text(self.text), "nodes": list(self.nodes)}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Mismatch":
        d = json.loads(text)
        return Mismatch(str(d["text"]), tuple(str(n) for n in d["nodes"]))
