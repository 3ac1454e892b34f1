#!/usr/bin/env python3
"""chat_template_ref.py: reference renderings of a chat template with Python's
jinja2, in the environment transformers' apply_chat_template builds
(trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception,
strftime_now). tests/test_chat_template.c compares djinn's renderer with it.

usage: chat_template_ref.py TOKENIZER_CONFIG.json|MODEL_DIR CASES.json
       chat_template_ref.py --templates TEMPLATES.json
CASES.json: a list of objects, each the variables of one rendering
({"messages": [...], "tools": [...], "add_generation_prompt": true, ...}).
TEMPLATES.json: a list of {"template": SOURCE, "vars": {...}}.
Prints a JSON list: {"text": ...} or {"error": ...} per case."""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(tpl, v):
    try:
        return {"text": tpl.render(**v)}
    except Exception as e:  # the renderer must fail too
        return {"error": f"{type(e).__name__}: {e}"}


def load(path):
    """(tokenizer_config, template source) of a tokenizer_config.json or of a
    model directory, as transformers' from_pretrained reads them: the
    directory's chat_template.jinja (text mode) takes priority over the
    config's chat_template; the config may be absent then."""
    if not os.path.isdir(path):
        cfg = json.load(open(path, encoding="utf-8"))
        src = None
    else:
        cfg_path = os.path.join(path, "tokenizer_config.json")
        cfg = json.load(open(cfg_path, encoding="utf-8")) if os.path.exists(cfg_path) else {}
        tpl_path = os.path.join(path, "chat_template.jinja")
        src = open(tpl_path, encoding="utf-8").read() if os.path.exists(tpl_path) else None
    if src is None:
        src = cfg["chat_template"]
        if isinstance(src, list):
            src = next(t["template"] for t in src if t["name"] == "default")
    return cfg, src


def main():
    if sys.argv[1] == "--templates":
        out = []
        for case in json.load(open(sys.argv[2], encoding="utf-8")):
            try:
                tpl = environment().from_string(case["template"])
            except Exception as e:
                out.append({"error": f"{type(e).__name__}: {e}"})
                continue
            out.append(render(tpl, case["vars"]))
        json.dump(out, sys.stdout, ensure_ascii=False)
        return
    cfg, src = load(sys.argv[1])
    cases = json.load(open(sys.argv[2], encoding="utf-8"))

    def special(key):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return v if isinstance(v, str) else ""

    tpl = environment().from_string(src)
    out = []
    for case in cases:
        v = dict(case)
        v.setdefault("bos_token", special("bos_token"))
        v.setdefault("eos_token", special("eos_token"))
        out.append(render(tpl, v))
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
