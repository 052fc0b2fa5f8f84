"""The demo job's model and data: a minimal GPT (pre-norm blocks, causal attention, tied nothing,
no dropout so the run is deterministic without RNG bookkeeping) and the corpus split 90/10, the
batch for index i drawn from a generator seeded by (seed, i), so the data order is a pure
function of the step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

CORPUS_PATH = Path(__file__).with_name("corpus.txt")


@dataclass(frozen=True)
class ModelConfig:
    vocab: int
    context: int
    d_model: int
    layers: int
    heads: int


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class Corpus:
    def __init__(self, path: Path) -> None:
        text = path.read_text(encoding="utf-8")
        self.chars = sorted(set(text))
        lookup = {c: i for i, c in enumerate(self.chars)}
        data = torch.tensor([lookup[c] for c in text], dtype=torch.long)
        cut = int(len(data) * 0.9)
        self.train, self.val = data[:cut], data[cut:]

    def batch(self, split: torch.Tensor, seed: int, index: int, size: int, context: int):
        g = torch.Generator().manual_seed(seed * 1_000_003 + index)
        ix = torch.randint(len(split) - context - 1, (size,), generator=g)
        x = torch.stack([split[i : i + context] for i in ix.tolist()])
        y = torch.stack([split[i + 1 : i + context + 1] for i in ix.tolist()])
        return x, y
