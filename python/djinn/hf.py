"""hf.py: a transformers-shaped facade - AutoModelForCausalLM.from_pretrained
("name", server=...) gives a model whose generate() and forward take and
return torch tensors like transformers' do, while the weights and the compute
stay on djinnd. Needs PyTorch."""

try:
    import torch
except ImportError:  # the rest of djinn works without it
    raise ImportError("djinn.hf needs PyTorch (Debian: apt install python3-torch); "
                      "djinn itself works without it") from None

from . import _wire
from .client import Client
from .model import _ids_list, _number

# from_pretrained arguments about local weights: meaningless here, accepted and ignored
_IGNORED_LOAD = {"torch_dtype", "dtype", "device_map", "low_cpu_mem_usage", "trust_remote_code", "revision",
                 "attn_implementation", "cache_dir", "local_files_only", "use_safetensors"}
# generate() arguments that change nothing here when given with these values
_HARMLESS = {"use_cache": (True, None), "num_beams": (1, None), "output_attentions": (False, None),
             "output_hidden_states": (False, None), "output_scores": (False, None),
             "return_dict_in_generate": (False, None), "min_new_tokens": (0, None), "min_length": (0, None),
             "token_type_ids": None}


class Config(dict):
    """A config.json (or generation_config.json) with attribute access, like
    transformers' PretrainedConfig: cfg.vocab_size, cfg["vocab_size"]."""

    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError("config has no %r" % k) from None

    def to_dict(self):
        return dict(self)


class CausalLMOutput:
    """What forward returns: .logits, a torch tensor [batch, seq, vocab]."""

    def __init__(self, logits):
        self.logits = logits
        self.loss = None
        self.past_key_values = None

    def __getitem__(self, k):
        return {"logits": self.logits}[k] if isinstance(k, str) else (self.logits,)[k]


class DjinnForCausalLM:
    """A model on djinnd behind transformers' causal-LM interface. .ghost is
    the djinn.Model; .client its connection (closed by close() when this
    object opened it)."""

    def __init__(self, model, own_client):
        self.ghost = model
        self.client = model.client
        self._own_client = own_client
        self.name_or_path = model.name
        self.config = Config(model.config)
        self.generation_config = Config(model.generation_config)
        self.device = torch.device("cpu")  # where outputs land; the compute is on the server
        self.dtype = torch.float32

    def __repr__(self):
        return "DjinnForCausalLM(%r on %s)" % (self.name_or_path, self.client.addr)

    # torch.nn.Module habits that mean nothing for remote weights
    def eval(self):
        return self

    def to(self, *args, **kwargs):
        return self

    def cuda(self, *args, **kwargs):
        return self

    def cpu(self):
        return self

    def close(self):
        if self._own_client:
            self.client.close()

    # ---- shared ----

    def _rows(self, input_ids, attention_mask):
        """The real (unpadded) ids of each row, as lists."""
        if not isinstance(input_ids, torch.Tensor):
            input_ids = torch.as_tensor(input_ids)
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
        if input_ids.dim() != 2:
            raise ValueError("input_ids must be [batch, seq], got shape %s" % (tuple(input_ids.shape),))
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise TypeError("input_ids must be integer token ids, got %s" % input_ids.dtype)
        if attention_mask is not None:
            attention_mask = torch.as_tensor(attention_mask)
            if attention_mask.dim() == 1:
                attention_mask = attention_mask.unsqueeze(0)
            if tuple(attention_mask.shape) != tuple(input_ids.shape):
                raise ValueError("attention_mask has shape %s, input_ids %s: they must match"
                                 % (tuple(attention_mask.shape), tuple(input_ids.shape)))
        rows = []
        for r in range(input_ids.shape[0]):
            ids = input_ids[r]
            if attention_mask is not None:
                ids = ids[attention_mask[r].bool()]
            if ids.numel() == 0:
                raise ValueError("row %d of input_ids has no tokens (attention_mask is all 0)" % r)
            rows.append(_ids_list(ids, self.ghost.vocab_size, "input_ids"))
        return input_ids, attention_mask, rows

    def _setting(self, name, given, gc, default):
        if given is not None:
            return given
        if gc is not None and getattr(gc, name, None) is not None:
            return getattr(gc, name)
        v = self.generation_config.get(name)
        return default if v is None else v

    # ---- generate ----

    def generate(self, input_ids=None, attention_mask=None, max_new_tokens=None, max_length=None, do_sample=None,
                 temperature=None, top_p=None, top_k=None, eos_token_id=None, pad_token_id=None,
                 repetition_penalty=None, num_return_sequences=1, generation_config=None, streamer=None, seed=None,
                 inputs=None, **kwargs):
        """transformers' generate: returns a LongTensor [batch * num_return_sequences,
        prompt + new] - the input rows as given, then each row's new tokens
        (its EOS included), finished rows padded with pad_token_id. Each row
        runs in a session of its own, all at once on the server. Sampling
        seeds come from torch's generator (torch.manual_seed makes it
        repeatable) unless seed= is given."""
        if input_ids is None:
            input_ids = inputs
        if input_ids is None:
            raise ValueError("generate needs input_ids (token ids; djinn.hf takes no text)")
        for k, v in kwargs.items():
            if k not in _HARMLESS:
                raise ValueError("generate(%s=...) is not supported by djinn.hf" % k)
            if _HARMLESS[k] is not None and v not in _HARMLESS[k]:
                raise ValueError("generate(%s=%r) is not supported by djinn.hf (only %r)" % (k, v, _HARMLESS[k][0]))
        gc = generation_config
        input_ids, attention_mask, rows = self._rows(input_ids, attention_mask)
        if not isinstance(num_return_sequences, int) or num_return_sequences < 1:
            raise ValueError("num_return_sequences must be an int >= 1, got %r" % (num_return_sequences,))
        do_sample = bool(self._setting("do_sample", do_sample, gc, False))
        temperature = float(self._setting("temperature", temperature, gc, 1.0))
        top_p = float(self._setting("top_p", top_p, gc, 1.0))
        top_k = int(self._setting("top_k", top_k, gc, 50) or 0)
        rep = self._setting("repetition_penalty", repetition_penalty, gc, 1.0)
        eos = self._setting("eos_token_id", eos_token_id, gc, None)
        if eos is None:
            eos = self.ghost.eos_token_ids
        eos = [int(eos)] if isinstance(eos, int) or (isinstance(eos, torch.Tensor) and eos.dim() == 0) \
            else [int(x) for x in eos]
        pad = self._setting("pad_token_id", pad_token_id, gc, None)
        if pad is None:
            pad = self.config.get("pad_token_id")
        if pad is None:
            pad = eos[0] if eos else 0
        in_len = input_ids.shape[1]
        # the caller's max_new_tokens, else the caller's max_length, else the
        # generation configs' (max_new_tokens before max_length), else 20 in all
        if max_new_tokens is None and max_length is None:
            max_new_tokens = self._setting("max_new_tokens", None, gc, None)
            if max_new_tokens is None:
                max_length = self._setting("max_length", None, gc, 20)
        if max_new_tokens is None:
            max_new_tokens = max(int(max_length) - in_len, 0)
        max_new_tokens = _number("max_new_tokens", max_new_tokens, 0, integer=True)
        for k, v in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k), ("seed", seed),
                     ("repetition_penalty", rep)):
            if v is not None:
                _wire.sampling_value(k, v)  # the C table's bounds (docs/protocol.md)
        if do_sample and temperature <= 0:
            raise ValueError("do_sample=True needs temperature > 0, got %r" % temperature)
        if seed is None and do_sample:
            seed = int(torch.randint(0, 2 ** 62, (1,)).item())
        rows = [r for r in rows for _ in range(num_return_sequences)]
        if streamer is not None and len(rows) != 1:
            raise ValueError("a streamer works with one row (batch 1, num_return_sequences 1)")
        meta = {"max_tokens": int(max_new_tokens), "temperature": temperature if do_sample else 0.0,
                "top_p": top_p if do_sample else 1.0, "top_k": top_k if do_sample else 0,
                "stop_ids": eos, "ignore_eos": True}
        if rep not in (None, 1.0):
            meta["repetition_penalty"] = float(rep)
        new = self._run_rows(rows, meta, seed or 0, streamer, input_ids)
        width = max(len(n) for n in new)
        out = torch.full((len(rows), in_len + width), int(pad), dtype=torch.long)
        src = input_ids.to(torch.long).repeat_interleave(num_return_sequences, dim=0)
        out[:, :in_len] = src
        for r, n in enumerate(new):
            if n:
                out[r, in_len:in_len + len(n)] = torch.tensor(n, dtype=torch.long)
        return out

    def _run_rows(self, rows, meta, seed, streamer, input_ids):
        """Every row's new ids (with the EOS that stopped it), all rows
        generating at once, each in its own session."""
        c = self.client
        sessions, answers = [], []
        try:
            for r, ids in enumerate(rows):
                s = self.ghost.session(expected_tokens=min(len(ids) + meta["max_tokens"] + 1, self.ghost.max_ctx))
                sessions.append(s)
                req = dict(meta, session=s.id, ids=ids, seed=(seed + r) % (1 << 64))
                answers.append(c._begin(_wire.GENERATE, req))
            if streamer is not None:
                streamer.put(input_ids.cpu())
            out = []
            for q in answers:
                ids = []
                while True:
                    msg_type, m, _ = c._next_frame(q)
                    if msg_type == _wire.TOKEN:
                        ids.append(int(m["id"]))
                        if streamer is not None:
                            streamer.put(torch.tensor([ids[-1]], dtype=torch.long))
                        continue
                    if msg_type == _wire.ERROR:
                        from . import errors
                        raise errors.from_meta(m)
                    if m.get("reason") == "stop" and m.get("stop_id") is not None:
                        ids.append(int(m["stop_id"]))
                        if streamer is not None:
                            streamer.put(torch.tensor([ids[-1]], dtype=torch.long))
                    break
                out.append(ids)
            if streamer is not None:
                streamer.end()
            return out
        finally:
            for q in answers:
                c._forget(q)
            for s in sessions:
                s.close()

    # ---- forward ----

    def __call__(self, input_ids=None, attention_mask=None, **kwargs):
        return self.forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    def forward(self, input_ids=None, attention_mask=None, use_cache=None, return_dict=None, **kwargs):
        """Logits of every position: CausalLMOutput(logits [batch, seq, vocab]
        float32). Padded positions (attention_mask 0) get zeros."""
        for k in kwargs:
            if k not in ("token_type_ids", "output_attentions", "output_hidden_states", "past_key_values"):
                raise ValueError("forward(%s=...) is not supported by djinn.hf" % k)
            if k == "past_key_values" and kwargs[k] is not None:
                raise ValueError("forward(past_key_values=...) is not supported: use djinn sessions to keep a context")
        if input_ids is None:
            raise ValueError("forward needs input_ids")
        input_ids, attention_mask, rows = self._rows(input_ids, attention_mask)
        b, t = input_ids.shape
        logits = torch.zeros((b, t, self.ghost.vocab_size), dtype=torch.float32)
        for r, ids in enumerate(rows):
            with self.ghost.session(expected_tokens=min(len(ids) + 1, self.ghost.max_ctx)) as s:
                rt = s.step(ids, logits="all").torch()
            if attention_mask is None:
                logits[r] = rt
            else:
                logits[r, attention_mask[r].bool()] = rt
        return CausalLMOutput(logits)


class AutoModelForCausalLM:
    """from_pretrained("name", server="HOST:PORT" or a djinn.Client, token=None)."""

    def __init__(self):
        raise TypeError("use AutoModelForCausalLM.from_pretrained(name, server=...)")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, server="127.0.0.1:7070", token=None, **kwargs):
        for k in kwargs:
            if k not in _IGNORED_LOAD:
                raise TypeError("from_pretrained() got an unexpected keyword argument %r" % k)
        name = pretrained_model_name_or_path
        if not isinstance(name, str):
            raise TypeError("the model name must be a str (a folder of the server's model store)")
        name = name.rstrip("/").rsplit("/", 1)[-1]  # "org/name" or a path: the store knows folder names
        if isinstance(server, Client):
            return DjinnForCausalLM(server.model(name), own_client=False)
        client = Client(server, token=token)
        try:
            return DjinnForCausalLM(client.model(name), own_client=True)
        except BaseException:
            client.close()
            raise


__all__ = ["AutoModelForCausalLM", "DjinnForCausalLM", "CausalLMOutput", "Config"]
