# structured_output_test.py: djinnd --http's response_format on the demo model -
# 200 chat completions under random JSON schemas of the supported subset (four
# fixed seeds), each answer parsed by json and checked by validate() below (a
# hand-written validator of the subset: /usr/bin/python3 has no jsonschema).
# usage: python3 structured_output_test.py DJINND SOURCE_DIR
# A fifth, fresh seed is printed and run too; its failures are shown, not
# counted (replay them with STRUCTURED_SEED=N).
import concurrent.futures
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


FIXED_SEEDS = [1, 2, 3, 4]
PER_SEED = 50
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content | trim }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
NAMES = ["a", "b", "name", "id", "value", "tags", "x1", "nested"]


def same(a, b):
    """JSON equality (1 == 1.0, but True is not 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def has_type(v, t):
    return {"object": lambda: isinstance(v, dict), "array": lambda: isinstance(v, list),
            "string": lambda: isinstance(v, str), "boolean": lambda: isinstance(v, bool),
            "null": lambda: v is None,
            "number": lambda: isinstance(v, (int, float)) and not isinstance(v, bool),
            "integer": lambda: isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer()}[t]()


def validate(root, s, v):
    """Why v is not valid under s (None: valid)."""
    if s is True:
        return None
    if "$ref" in s:
        ref = s["$ref"]
        return validate(root, root if ref == "#" else root["$defs"][ref[len("#/$defs/"):]], v)
    if "enum" in s and not any(same(e, v) for e in s["enum"]):
        return f"{v!r} not in enum {s['enum']!r}"
    if "const" in s and not same(s["const"], v):
        return f"{v!r} is not const {s['const']!r}"
    if "anyOf" in s and all(validate(root, a, v) for a in s["anyOf"]):
        return f"{v!r} matches no anyOf"
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(has_type(v, t) for t in types):
            return f"{v!r} is not of type {types}"
    if isinstance(v, dict):
        props = s.get("properties", {})
        for k, x in v.items():
            if k in props:
                why = validate(root, props[k], x)
                if why:
                    return f"{k}: {why}"
            elif s.get("additionalProperties") is False:
                return f"{k} is not allowed"
        for k in s.get("required", []):
            if k not in v:
                return f"{k} is required"
    if isinstance(v, list):
        for x in v:
            why = validate(root, s.get("items", True), x)
            if why:
                return f"item: {why}"
        if len(v) < s.get("minItems", 0) or len(v) > s.get("maxItems", len(v)):
            return f"{len(v)} items"
    return None


def random_value(r):
    k = r.randrange(5)
    if k == 0:
        return r.choice(["red", "green", "a b", "caf\u00e9", "", "x\"y"])
    if k == 1:
        return r.randrange(200) - 50
    if k == 2:
        return r.randrange(100) / 4
    if k == 3:
        return r.random() < 0.5
    return None


def random_schema(r, depth, n_defs):
    types = ["string", "number", "integer", "boolean", "null"]
    k = r.randrange(7) if depth >= 3 else r.randrange(12)
    if k < 5:
        s = {"type": types[k]}
    elif k == 5:
        s = {"enum": [random_value(r) for _ in range(1 + r.randrange(4))]}
    elif k == 6:
        s = {"$ref": f"#/$defs/d{r.randrange(n_defs)}"} if n_defs and r.random() < 0.5 else {"const": random_value(r)}
    elif k in (7, 8):
        props, req = {}, []
        for _ in range(1 + r.randrange(4)):
            name = r.choice(NAMES)
            if name in props:
                continue
            props[name] = random_schema(r, depth + 1, n_defs)
            if r.randrange(3):
                req.append(name)
        s = {"type": "object", "properties": props, "required": req}
        if r.random() < 0.5:
            s["additionalProperties"] = False
    elif k == 9:
        s = {"type": "array", "items": random_schema(r, depth + 1, n_defs)}
        lo = r.randrange(3)
        if r.random() < 0.5:
            s["minItems"] = lo
        if r.random() < 0.5:
            s["maxItems"] = lo + r.randrange(4)
    elif k == 10:
        s = {"anyOf": [random_schema(r, depth + 1, n_defs), random_schema(r, depth + 1, n_defs)]}
    else:
        s = {"type": [types[r.randrange(3)], "null"]}
    if r.randrange(4) == 0:
        s["description"] = "an annotation"
    return s


def random_root(r):
    n_defs = r.randrange(3)
    defs = {f"d{i}": random_schema(r, 2, 0) for i in range(n_defs)}
    while True:
        root = random_schema(r, 0, n_defs)
        if root.get("type") == "object":
            break
    if n_defs:
        root["$defs"] = defs
    return root


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def one(port, seed, i):
    """One generation: (ok, what). A schema the compiler refuses is refused
    for a reason the subset states (it admits no finite value)."""
    r = random.Random(seed * 1000 + i)
    schema = random_root(r)
    body = {"model": "demo-chat", "messages": [{"role": "user", "content": f"Write JSON number {i}"}],
            "max_tokens": 60 + r.randrange(100), "temperature": 1, "seed": seed * 1000 + i,
            "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}}
    st, ans = post(port, body)
    if st == 400 and "admits no" in ans.get("error", {}).get("message", ""):
        return None, f"refused: {ans['error']['message']}"
    if st != 200:
        return False, f"status {st}: {ans} for {json.dumps(schema)}"
    text = ans["choices"][0]["message"]["content"]
    try:
        why = validate(schema, schema, json.loads(text))
    except ValueError as e:
        why = f"not JSON: {e}"
    if why:
        return False, f"schema {json.dumps(schema)} (max_tokens {body['max_tokens']}): {text!r}: {why[:200]}"
    return True, text


def run_seed(port, seed):
    ok = bad = refused = 0
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for good, what in pool.map(lambda i: one(port, seed, i), range(PER_SEED)):
            if good is None:
                refused += 1
            elif good:
                ok += 1
            else:
                bad += 1
                print(f"FAIL (seed {seed}): {what}", file=sys.stderr)
    return ok, bad, refused


def self_check():
    """The validator refuses what it must (so a pass means something)."""
    s = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", 1]},
                                          "c": {"type": "array", "items": {"type": "null"}, "maxItems": 1}},
         "required": ["a"], "additionalProperties": False}
    for bad in [{}, {"a": 1.5}, {"a": 1, "b": "y"}, {"a": 1, "b": True}, {"a": 1, "c": [None, None]},
                {"a": 1, "c": [0]}, {"a": 1, "d": 0}, [], {"a": True}]:
        assert validate(s, s, bad), bad
    for good in [{"a": 1}, {"a": -2, "b": 1.0, "c": [None]}, {"a": 3.0, "b": "x", "c": []}]:
        assert not validate(s, s, good), good


def main():
    self_check()
    djinnd, src = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp()
    store = os.path.join(tmp, "store")
    os.makedirs(os.path.join(store, "demo-chat"))
    for f in ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json"]:
        os.symlink(os.path.join(src, "models/demo", f), os.path.join(store, "demo-chat", f))
    with open(os.path.join(store, "demo-chat", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "chat_template": TEMPLATE}, f)
    ports = os.path.join(tmp, "ports")
    log = open(os.path.join(tmp, "log"), "w")
    d = subprocess.Popen([djinnd, "--models", store, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                          "--port-file", ports], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(400):
            if os.path.exists(ports) and len(open(ports).read().split()) >= 2:
                break
            time.sleep(0.05)
        port = int(open(ports).read().split()[1])
        total_ok = total_bad = total_refused = 0
        t0 = time.time()
        # STRUCTURED_SEEDS: a shorter fixed list (the sanitizer build runs one seed: 50 requests, not 200)
        fixed = [int(x) for x in os.environ["STRUCTURED_SEEDS"].split(",")] if "STRUCTURED_SEEDS" in os.environ \
            else FIXED_SEEDS
        for seed in ([int(os.environ["STRUCTURED_SEED"])] if "STRUCTURED_SEED" in os.environ else fixed):
            ok, bad, refused = run_seed(port, seed)
            total_ok, total_bad, total_refused = total_ok + ok, total_bad + bad, total_refused + refused
        print(f"structured_output: {total_ok} valid, {total_bad} invalid, {total_refused} schemas refused "
              f"(admit no value) of {total_ok + total_bad + total_refused}, {time.time() - t0:.1f} s")
        if "STRUCTURED_SEED" not in os.environ and "STRUCTURED_SEEDS" not in os.environ:
            fresh = random.SystemRandom().randrange(1 << 30)
            ok, bad, refused = run_seed(port, fresh)
            print(f"structured_output: fresh seed {fresh} (not counted; STRUCTURED_SEED={fresh} replays it): "
                  f"{ok} valid, {bad} invalid, {refused} refused")
        asked = total_ok + total_bad + total_refused
        return 1 if total_bad or total_ok < 0.95 * asked else 0
    finally:
        d.terminate()
        d.wait(timeout=20)


if __name__ == "__main__":
    sys.exit(main())
