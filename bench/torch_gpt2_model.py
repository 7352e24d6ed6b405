"""The PyTorch GPT-2 that strata's benchmarks run beside their own step: pre-LayerNorm blocks,
GELU (tanh) MLP, causal attention through F.scaled_dot_product_attention, learned positions, and
an LM head tied to the token embedding. Weights of linear layers and embeddings drawn from
N(0, 0.02), biases zero.

Shared by bench/side_by_side/torch_gpt2.py (the CPU, eager, fp32) and bench/gpu/torch_gpt2.py
(a GPU, bf16 autocast, torch.compile): one model, so the two comparisons measure the same thing.
Imported after torch, which the caller has checked is installed.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, channels, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(channels)
        self.c_attn = nn.Linear(channels, 3 * channels)
        self.attn_proj = nn.Linear(channels, channels)
        self.ln_2 = nn.LayerNorm(channels)
        self.c_fc = nn.Linear(channels, 4 * channels)
        self.mlp_proj = nn.Linear(4 * channels, channels)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """vocab: the embedding's rows, and the logits' width the loss runs over (a padded
    vocabulary, as nanoGPT's 50304, includes its padding in the softmax)."""

    def __init__(self, *, layers, channels, heads, vocab, max_seq):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(vocab, channels)
        self.wpe = nn.Embedding(max_seq, channels)
        self.h = nn.ModuleList(Block(channels, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(channels)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the tied head
        return F.cross_entropy(logits.view(-1, self.vocab), targets.view(-1))
