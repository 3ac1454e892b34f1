"""test_hf.py: djinn.hf's transformers-shaped facade - generate and forward
take and return torch tensors with transformers' conventions (EOS kept,
pad after it, left padding through attention_mask, one session per row)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import djinn  # noqa: E402
from djinn import hf  # noqa: E402
from conftest import reference  # noqa: E402


@pytest.fixture
def demo(client):
    return hf.AutoModelForCausalLM.from_pretrained("demo", server=client)


@pytest.fixture
def tiny(client):
    """The Llama 3 fixture: tiny, so the suite stays quick under ASan."""
    return hf.AutoModelForCausalLM.from_pretrained("llama3", server=client)


def test_from_pretrained(daemon):
    m = hf.AutoModelForCausalLM.from_pretrained("some-org/demo", server=daemon.addr, torch_dtype=torch.bfloat16,
                                                device_map="auto")
    assert m.config.vocab_size == 4096 and m.config["num_hidden_layers"] == 8
    assert m.generation_config.do_sample is True and m.eval() is m and m.to("cuda") is m
    m.close()
    assert m.client.closed
    with pytest.raises(djinn.NotFoundError):
        hf.AutoModelForCausalLM.from_pretrained("nope", server=daemon.addr)
    with pytest.raises(TypeError):
        hf.AutoModelForCausalLM.from_pretrained("demo", server=daemon.addr, load_in_8bit=True)


def test_greedy_generate_equals_reference(tiny):
    ref = reference("llama3")
    ids = torch.tensor([ref["prompt_ids"]])
    out = tiny.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    assert out.dtype == torch.long and out.shape == (1, len(ref["prompt_ids"]) + 24)
    assert out[0, :ids.shape[1]].tolist() == ref["prompt_ids"]
    assert out[0, ids.shape[1]:].tolist() == ref["greedy"]


def test_batch_left_padding_equals_single_rows(tiny):
    ref = reference("llama3")
    p = ref["prompt_ids"]
    short = p[:9]
    pad = 1
    batch = torch.tensor([p, [pad] * (len(p) - len(short)) + short])
    mask = torch.tensor([[1] * len(p), [0] * (len(p) - len(short)) + [1] * len(short)])
    out = tiny.generate(input_ids=batch, attention_mask=mask, max_new_tokens=12, do_sample=False)
    one = tiny.generate(torch.tensor([short]), max_new_tokens=12, do_sample=False)
    assert torch.equal(out[0, len(p):], torch.tensor(ref["greedy"][:12]))
    assert torch.equal(out[1, len(p):], one[0, len(short):])
    assert torch.equal(out[:, :len(p)], batch)


def test_eos_kept_then_pad(tiny):
    ref = reference("llama3")
    ids = torch.tensor([ref["prompt_ids"]])
    eos = ref["greedy"][4]
    first = ref["greedy"].index(eos)
    out = tiny.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=eos, pad_token_id=7)
    new = out[0, ids.shape[1]:].tolist()
    assert new == ref["greedy"][:first + 1]  # the EOS is kept, as transformers does
    # rows finishing at different lengths: each is padded after its EOS
    p, short = ref["prompt_ids"], ref["prompt_ids"][:9]
    batch = torch.tensor([p, [7] * (len(p) - 9) + short])
    mask = torch.tensor([[1] * len(p), [0] * (len(p) - 9) + [1] * 9])
    out2 = tiny.generate(batch, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=eos,
                         pad_token_id=7)
    lengths = []
    for r in range(2):
        row = out2[r, len(p):].tolist()
        n = row.index(eos) + 1 if eos in row else 24
        assert all(x == 7 for x in row[n:])
        lengths.append(n)
    assert out2[0, len(p):len(p) + lengths[0]].tolist() == ref["greedy"][:first + 1]
    assert out2.shape[1] == len(p) + max(lengths)


def test_sampling_follows_torch_seed(tiny, client):
    ids = torch.tensor([reference("llama3")["prompt_ids"]])
    kw = dict(max_new_tokens=8, do_sample=True, temperature=0.9, top_p=0.9, top_k=40)
    torch.manual_seed(3)
    a = tiny.generate(ids, **kw)
    torch.manual_seed(3)
    b = tiny.generate(ids, **kw)
    assert torch.equal(a, b)
    # seed= is the session's sampler seed: equal to djinn's own generate
    c = tiny.generate(ids, seed=11, **kw)
    g = client.model("llama3").generate(ids[0], max_new_tokens=8, temperature=0.9, top_p=0.9, top_k=40, seed=11,
                                        stop_ids=[1, 2], ignore_eos=True, stream=False)
    assert c[0, ids.shape[1]:ids.shape[1] + len(g.ids)].tolist() == g.ids
    # num_return_sequences: one row per (prompt, sequence), seeds seed, seed + 1
    d = tiny.generate(ids, seed=11, num_return_sequences=2, **kw)
    assert d.shape[0] == 2 and torch.equal(d[0], c[0])


def test_generation_config_defaults(demo, tiny):
    """Without do_sample, the model's generation_config.json decides (the demo
    samples), as in transformers; max_length counts the prompt."""
    ids = torch.tensor([reference("demo")["prompt_ids"]])
    torch.manual_seed(0)
    a = demo.generate(ids, max_new_tokens=4)
    torch.manual_seed(0)
    b = demo.generate(ids, max_new_tokens=4)
    assert torch.equal(a, b)
    ref = reference("llama3")
    out = tiny.generate(torch.tensor([ref["prompt_ids"]]), max_length=len(ref["prompt_ids"]) + 3)
    assert out[0, len(ref["prompt_ids"]):].tolist() == ref["greedy"][:3]  # no generation_config: greedy


def test_forward_logits(tiny):
    ref = reference("llama3")
    ids = torch.tensor([ref["prompt_ids"]])
    logits = tiny(ids).logits
    assert logits.shape == (1, ids.shape[1], 320) and logits.dtype == torch.float32
    want = np.array(ref["last_logits"], dtype=np.float32)
    assert np.max(np.abs(logits[0, -1].numpy() - want)) < 2e-3 * max(1.0, np.max(np.abs(want)))
    mask = torch.tensor([[0, 0] + [1] * (ids.shape[1] - 2)])
    padded = tiny(input_ids=ids, attention_mask=mask).logits
    assert torch.all(padded[0, :2] == 0)
    direct = tiny(ids[:, 2:]).logits
    assert torch.allclose(padded[0, 2:], direct[0], atol=1e-5)


def test_unsupported_arguments_are_clear(tiny):
    ids = torch.tensor([[0, 5, 9]])
    for kw in ({"num_beams": 4}, {"return_dict_in_generate": True}, {"logits_processor": []}):
        with pytest.raises(ValueError, match="not supported"):
            tiny.generate(ids, max_new_tokens=2, **kw)
    out = tiny.generate(ids, max_new_tokens=2, do_sample=False, use_cache=True, num_beams=1)
    assert out.shape == (1, 5)
    with pytest.raises(ValueError):
        tiny.generate(torch.zeros((1, 2, 3), dtype=torch.long))
    with pytest.raises(TypeError):
        tiny.generate(torch.zeros((1, 3)))
    with pytest.raises(ValueError):
        tiny.generate(ids, attention_mask=torch.zeros_like(ids))
    with pytest.raises(ValueError):
        tiny.generate(torch.tensor([[320]]))


def test_sessions_take_torch_ids(client):
    ref = reference("llama3")
    with client.model("llama3").session() as s:
        t = s.step(torch.tensor(ref["prompt_ids"]))
        assert int(t.torch().argmax()) == ref["greedy"][0]
    g = client.model("llama3").generate(torch.tensor(ref["prompt_ids"], dtype=torch.int32), max_new_tokens=5,
                                        ignore_eos=True, stream=False)
    assert g.ids == ref["greedy"][:5]
    with pytest.raises(TypeError):
        client.model("llama3").generate(torch.tensor([1.0, 2.0]), max_new_tokens=2)
