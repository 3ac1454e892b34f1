"""test_capture_transformers.py: hand-built BERT and GPT-2 modules written as HF transformers
writes them (transformers is not installed here), captured and run by the C executor against eager."""

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from conftest import capture_close  # noqa: E402
from djinn.capture import CapturedModule  # noqa: E402


class BertSelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def split(self, x):
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.hd).permute(0, 2, 1, 3)

    def forward(self, h, ext_mask):
        q, k, v = self.split(self.query(h)), self.split(self.key(h)), self.split(self.value(h))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd) + ext_mask
        probs = nn.functional.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(ctx.size()[:-2] + (self.heads * self.hd,))


class BertLayer(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.att = BertSelfAttention(dim, heads)
        self.att_out, self.ln1 = nn.Linear(dim, dim), nn.LayerNorm(dim, eps=1e-12)
        self.inter, self.out, self.ln2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim), nn.LayerNorm(dim, eps=1e-12)

    def forward(self, h, ext_mask):
        h = self.ln1(self.att_out(self.att(h, ext_mask)) + h)
        return self.ln2(self.out(F.gelu(self.inter(h))) + h)


class TinyBert(nn.Module):
    """HF BertModel's forward: word + position + token type embeddings, the extended attention
    mask (1 - mask) * finfo.min, post-norm layers with erf GELU, a tanh pooler."""

    def __init__(self, vocab=60, dim=32, heads=4, layers=2, max_pos=24):
        super().__init__()
        self.word, self.pos, self.tt = nn.Embedding(vocab, dim, padding_idx=0), nn.Embedding(max_pos, dim), nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim, eps=1e-12)
        self.register_buffer("position_ids", torch.arange(max_pos).expand((1, -1)))
        self.layers = nn.ModuleList([BertLayer(dim, heads) for _ in range(layers)])
        self.pool = nn.Linear(dim, dim)

    def forward(self, input_ids, attention_mask, token_type_ids):
        t = input_ids.shape[1]
        h = self.ln(self.word(input_ids) + self.tt(token_type_ids) + self.pos(self.position_ids[:, :t]))
        ext = attention_mask[:, None, None, :].to(dtype=h.dtype)
        ext = (1.0 - ext) * torch.finfo(h.dtype).min
        for layer in self.layers:
            h = layer(h, ext)
        return {"last_hidden_state": h, "pooler_output": torch.tanh(self.pool(h[:, 0]))}


class Conv1D(nn.Module):
    """GPT-2's transposed linear: addmm on a flattened view."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.randn(nf) * 0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Block(nn.Module):
    def __init__(self, dim, heads, n_pos, tanh_gelu):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_attn, self.c_proj = Conv1D(3 * dim, dim), Conv1D(dim, dim)
        self.c_fc, self.mlp_proj = Conv1D(4 * dim, dim), Conv1D(dim, 4 * dim)
        self.register_buffer("bias", torch.tril(torch.ones((n_pos, n_pos), dtype=torch.bool)).view(1, 1, n_pos, n_pos))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.tanh_gelu = tanh_gelu

    def split(self, x):
        return x.view(x.size()[:-1] + (self.heads, self.hd)).permute(0, 2, 1, 3)

    def forward(self, x, attn_mask):
        h = self.ln_1(x)
        q, k, v = self.c_attn(h).split(self.heads * self.hd, dim=2)
        q, k, v = self.split(q), self.split(k), self.split(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
        t = q.size(-2)
        causal = self.bias[:, :, :t, :t]
        w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
        w = nn.functional.softmax(w + attn_mask, dim=-1)
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
        x = x + self.c_proj(a.view(a.size()[:-2] + (self.heads * self.hd,)))
        m = self.c_fc(self.ln_2(x))
        m = F.gelu(m, approximate="tanh") if self.tanh_gelu else gelu_new(m)
        return x + self.mlp_proj(m)


class TinyGPT2(nn.Module):
    """HF GPT2LMHeadModel's forward: wte + wpe, pre-norm blocks with a causal bool buffer and
    torch.where, gelu_new (both its tanh formula and F.gelu(approximate="tanh")), an LM head tied
    to wte, and the next token by argmax."""

    def __init__(self, vocab=70, dim=32, heads=4, n_pos=32):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(n_pos, dim)
        self.h = nn.ModuleList([GPT2Block(dim, heads, n_pos, tanh_gelu=i == 1) for i in range(2)])
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, input_ids, attention_mask):
        b, t = input_ids.shape
        pos = torch.arange(0, t, dtype=torch.long).unsqueeze(0)
        am = attention_mask.view(b, -1)[:, None, None, :].to(dtype=self.wte.weight.dtype)
        am = (1.0 - am) * torch.finfo(self.wte.weight.dtype).min
        x = self.wte(input_ids) + self.wpe(pos)
        for blk in self.h:
            x = blk(x, am)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return logits, logits[:, -1].argmax(-1)


class SdpaBlock(nn.Module):
    """torch 1.13's (private) scaled_dot_product_attention with a causal flag and with a float mask."""

    def __init__(self, dim=24, heads=3):
        super().__init__()
        self.qkv, self.heads = nn.Linear(dim, 3 * dim), heads

    def forward(self, x, mask, keep):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a, _ = F._scaled_dot_product_attention(q, k, v, None, 0.0, True)
        m, _ = F._scaled_dot_product_attention(q, k, v, mask, 0.0, False)
        kb, _ = F._scaled_dot_product_attention(q, k, v, keep, 0.0, False)
        return a + m + kb


def test_tiny_bert_matches_eager(ex):
    torch.manual_seed(21)
    m = TinyBert().eval()
    ids = torch.tensor([[2, 15, 33, 7, 9, 0, 0], [4, 8, 51, 22, 3, 18, 5]])
    mask = (ids != 0).long()
    types = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1]])
    with torch.no_grad():
        want = m(ids, mask, types)
    got = CapturedModule(m, ex)(ids, mask, types)
    capture_close(got["last_hidden_state"], want["last_hidden_state"])
    capture_close(got["pooler_output"], want["pooler_output"])


def test_tiny_gpt2_matches_eager(ex):
    torch.manual_seed(22)
    m = TinyGPT2().eval()
    ids = torch.tensor([[5, 61, 7, 30, 2, 9, 11, 40], [1, 2, 3, 4, 5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])   # left padding
    with torch.no_grad():
        want, want_next = m(ids, mask)
    cm = CapturedModule(m, ex)
    got, got_next = cm(ids, mask)
    capture_close(got, want)
    assert torch.equal(torch.as_tensor(got_next), want_next)
    got2, _ = cm(ids.flip(1), mask)   # the same signature again: the plan replayed
    with torch.no_grad():
        capture_close(got2, m(ids.flip(1), mask)[0])


def test_sdpa_matches_eager(ex):
    torch.manual_seed(23)
    m = SdpaBlock().eval()
    x = torch.randn(2, 5, 24)
    mask = torch.randn(2, 3, 5, 5)
    keep = (torch.rand(5, 5) > 0.5) | torch.eye(5, dtype=torch.bool)   # a bool mask: true attends
    with torch.no_grad():
        want = m(x, mask, keep)
    capture_close(CapturedModule(m, ex)(x, mask, keep), want)
