#!/usr/bin/env python3
"""Long-sequence goldens from HF transformers (issue 15): RoPE far from position 0, dimensions that
are not multiples of 16, decode rows' routes, and the fused-expert checkpoint layout.

transformers writes a tiny random Qwen3MoeForCausalLM (save_pretrained, bf16); the checkpoint is
reloaded from disk in float64 with eager attention and the reference is computed from the reloaded
model. Sizes: vocab 500, hidden 72, 3 query heads of head_dim 40 over 1 KV head (q width 120),
10 experts top-3 of width 40, 3 layers, all MoE, max_position_embeddings 4096 (multiples of 8 where
the CUDA kernels need them, of 16 nowhere). One prompt of PROMPT_TOKENS = 1,573 tokens (seeded
random sentences over a word list, tokenized by a BPE tokenizer trained here; not a multiple of the
block size 16 nor of any chunk size the C++ test uses) and HF's greedy continuation of 16 tokens.

Output (OUT_DIR/hf_long/<checkpoint>/, the layout of tests/golden/hf_qwen3_moe, read by
tests/model/long_golden_test.cpp):
  fixture.json            moe_layers, num_experts, top_k, prompts[0]: source_text (the sentences
                          the prompt ids were cut from), prompt_ids, continuation_ids,
                          sequence_ids (prompt + continuation minus its last token, n = 1,588 rows),
                          continuation_top2_gaps (HF's top-1 minus top-2 logit at each greedy step),
                          logits_rows (the rows of p0_logits_rows.npy), versions
  p0_logits_last.npy      logits at the last prompt row                          [vocab]      f32
  p0_logits_rows.npy      logits of the teacher-forced sequence at logits_rows   [rows, vocab] f32
                          (rows 0-31, every 7th row, the rows either side of 64 / 500 / 1000, and
                          the last 48 rows: ~320 rows instead of 1,588 keep the folder ~2 MB)
  p0_router_logits_l{L}.npy  router logits of MoE layer L, every row            [n, E]       f32
  p0_topk_l{L}.npy        HF's top-k of those rows (prompt AND continuation rows) [n, K]       int32
Checkpoints:
  hf_long/qwen3moe_long        as save_pretrained wrote it (one tensor per expert, as transformers
                               5's reverse conversion saves and published checkpoints store them)
  hf_long/qwen3moe_long_fused  the same weights with each layer's experts stored fused, as
                               transformers 5 holds them in memory: mlp.experts.gate_up_proj
                               [E, 2I, H] (gate rows, then up rows) and mlp.experts.down_proj
                               [E, H, I]; same reference files (the model is the same).

Compared by tests/model/long_golden_test.cpp (CPU, or CUDA with SY_TEST_DEVICE=cuda), for both
checkpoints: the sequence prefilled in one piece (kernels modular and fused) against the stored
logits rows (tolerance 1e-3 CPU / 0.1 CUDA) and every row's routes against HF's top-k (near-tie
rows excluded as in hf_golden_test.cpp); then through the engine with max_num_batched_tokens 64,
500 and 1000 and prefix caching on, each request twice (computed in chunks, then served from the
prefix cache): the greedy tokens equal HF's and the routes of every prompt and decode row equal
HF's top-k.

Model seed: the first of 21..26 whose 16 greedy steps all have a top-1/top-2 logit gap >= 5e-3
(fixture.json "model_seed"), so that on the CPU (tolerance 1e-3) every continuation token is
compared; CUDA's tests stop comparing at a step whose gap is within its tolerance.

Self-checks (any failure stops the script with a message): the prompt has PROMPT_TOKENS tokens, all
ids < vocab; the saved tensors are named as Switchyard reads them; the reloaded weights are the
saved bf16 values; the teacher-forced logits' argmax at each continuation row is HF's greedy token
(greedy and teacher-forced runs agree); >= 90% of route rows have a k-th/(k+1)-th router-logit gap
>= 1e-4; the long context matters (the last row's logits change when the first half of the prompt
is replaced); the fused tensors equal the per-expert ones stacked and, where this transformers
holds experts fused in memory, its own gate_up_proj / down_proj. Also recorded, not required:
whether transformers reloads the fused folder to the same logits.

Usage (on the GPU machine; CPU float64, no network):
    python3 tools/gpu/long_goldens.py OUT_DIR
then copy OUT_DIR/hf_long into tests/golden/ (scripts/gpu-check.sh long-goldens does both).
"""
import json
import os
import random
import shutil
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

torch.set_grad_enabled(False)
if len(sys.argv) != 2:
    sys.exit(__doc__)
OUT = os.path.join(sys.argv[1], "hf_long")
VOCAB = 500
PROMPT_TOKENS = 1573
GREEDY_STEPS = 16
SEED = 21
NUM_EXPERTS = 10
MIN_GREEDY_GAP = 5e-3

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Mixture-of-experts models route every token to a few experts. Routing replay keeps training "
    "and inference in agreement.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828",
    "Les modèles de langage générent du texte; die Experten werden gewählt. ¿Qué tal? 你好，世界。",
    "Reinforcement learning from rollouts: the trainer replays the routes of the rollout engine.",
]
EXTRA_WORDS = ("position rotary window chunk cache block prefix decode prefill kernel layer token "
               "sequence router expert gate attention query key value head norm scale long far "
               "river mountain window garden silver winter summer eleven twelve forty").split()


def fail(message):
    sys.exit(f"long_goldens.py: SELF-CHECK FAILED: {message}")


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 2, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def long_prompt(tok, seed):
    """Seeded random sentences over the corpus' words, cut to exactly PROMPT_TOKENS token ids."""
    rng = random.Random(seed)
    words = sorted(set(" ".join(CORPUS).split()) | set(EXTRA_WORDS))
    sentences = []
    while True:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(5, 14)))
        sentences.append(sentence[0].upper() + sentence[1:] + rng.choice([".", ".", "?", "!", ";"]))
        text = " ".join(sentences)
        ids = tok.encode(text).ids
        if len(ids) >= PROMPT_TOKENS + 8:
            return text, ids[:PROMPT_TOKENS]


def saved_tensors(d):
    names = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), framework="pt") as sf:
                for key in sf.keys():
                    names[key] = sf.get_tensor(key)
    return names


def load_reference(d):
    # The eager experts loop: transformers' default grouped_mm experts do not take float64.
    for kwargs in ({"dtype": torch.float64, "experts_implementation": "eager"},
                   {"dtype": torch.float64}, {"torch_dtype": torch.float64}):
        try:
            return AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", **kwargs).eval()
        except (TypeError, ValueError):
            continue
    fail(f"cannot reload {d}")


def mlp_input_hook(store, i):
    """A forward pre-hook keeping the MLP's input rows (positional or hidden_states=)."""
    def fn(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        store[i] = x.reshape(-1, x.shape[-1]).detach().clone()
    return fn


def logits_rows(n, prompt_len):
    rows = set(range(min(32, n))) | set(range(0, n, 7)) | set(range(max(0, n - 48), n))
    for boundary in (64, 500, 1000):
        rows |= {r for r in (boundary - 1, boundary, boundary + 1) if 0 <= r < n}
    rows.add(prompt_len - 1)
    return sorted(rows)


def write_tokenizer(d, tok):
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "model_max_length": 4096}, f)


def fused_experts(names, layer, experts, inter, hidden):
    """The per-expert tensors of `layer` stacked as transformers 5 holds them in memory:
    gate_up [E, 2I, H] (expert e: gate rows then up rows) and down [E, H, I]."""
    p = f"model.layers.{layer}.mlp.experts."
    gate_up = torch.stack([torch.cat([names[f"{p}{e}.gate_proj.weight"], names[f"{p}{e}.up_proj.weight"]], dim=0)
                           for e in range(experts)])
    down = torch.stack([names[f"{p}{e}.down_proj.weight"] for e in range(experts)])
    if tuple(gate_up.shape) != (experts, 2 * inter, hidden) or tuple(down.shape) != (experts, hidden, inter):
        fail(f"layer {layer}: stacked experts have shapes {tuple(gate_up.shape)} / {tuple(down.shape)}")
    return gate_up.contiguous(), down.contiguous()


def build(seed, tok, text, prompt_ids):
    """A fresh checkpoint folder written by save_pretrained, reloaded from disk in float64, and its
    greedy continuation. Returns (d, names, in_memory, model, continuation, logits_last, gaps)."""
    torch.manual_seed(seed)
    d = os.path.join(OUT, "qwen3moe_long")
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    write_tokenizer(d, tok)
    cfg = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=72, num_attention_heads=3, num_key_value_heads=1,
                         head_dim=40, num_hidden_layers=3, intermediate_size=88, moe_intermediate_size=40,
                         num_experts=10, num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=1,
                         mlp_only_layers=[], max_position_embeddings=4096, rope_theta=10000.0,
                         rms_norm_eps=1e-6, eos_token_id=0, bos_token_id=0, initializer_range=0.08,
                         tie_word_embeddings=False)
    model = Qwen3MoeForCausalLM(cfg).eval()
    # Routers decisive (not a near-uniform softmax); norms random so a wrong norm weight shows.
    for pname, p in model.named_parameters():
        if pname.endswith("mlp.gate.weight"):
            p.normal_(0.0, 3.0 / np.sqrt(cfg.hidden_size))
        elif "norm" in pname:
            p.uniform_(0.5, 1.5)
    model = model.to(torch.bfloat16)
    in_memory = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.save_pretrained(d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 0, "do_sample": False}, f)
    names = saved_tensors(d)
    for layer in range(cfg.num_hidden_layers):
        for e in range(NUM_EXPERTS):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                key = f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
                if key not in names:
                    fail(f"the checkpoint has no {key} (Switchyard's qwen3_moe adapter reads it); layer {layer} "
                         f"has {sorted(n for n in names if n.startswith(f'model.layers.{layer}.mlp'))[:8]}")

    model = load_reference(d)
    state = model.state_dict()
    compared = 0
    for key, value in in_memory.items():
        if key in state and state[key].shape == value.shape:
            if not torch.equal(state[key].to(torch.bfloat16), value):
                fail(f"reloaded {key} differs from what was saved")
            compared += 1
    if compared < 10:
        fail(f"only {compared} reloaded tensors could be compared with the saved ones")

    # Greedy continuation (a full forward pass per step, as the other goldens do).
    seq = list(prompt_ids)
    logits_last, gaps = None, []
    for step in range(GREEDY_STEPS):
        out = model(torch.tensor([seq])).logits[0]
        if step == 0:
            logits_last = out[len(prompt_ids) - 1].numpy()
        top2 = torch.topk(out[-1], 2).values
        gaps.append(float(top2[0] - top2[1]))
        seq.append(int(out[-1].argmax()))
    return d, names, in_memory, model, seq[len(prompt_ids):], logits_last, gaps


def main():
    os.makedirs(OUT, exist_ok=True)
    name = "qwen3moe_long"
    tok = train_tokenizer()
    text, prompt_ids = long_prompt(tok, SEED)
    if len(prompt_ids) != PROMPT_TOKENS or max(prompt_ids) >= VOCAB:
        fail(f"the prompt has {len(prompt_ids)} tokens (want {PROMPT_TOKENS}), largest id {max(prompt_ids)}")
    # A greedy step whose top-2 logits are closer than MIN_GREEDY_GAP could flip under the CPU's f32
    # rounding: such a seed is passed over, so that the CPU compares every continuation token.
    for seed in range(SEED, SEED + 6):
        d, names, in_memory, model, continuation, logits_last, gaps = build(seed, tok, text, prompt_ids)
        print("seed", seed, "greedy top-2 gaps min", f"{min(gaps):.3g}", flush=True)
        if min(gaps) >= MIN_GREEDY_GAP:
            break
    else:
        fail(f"six seeds each had a greedy step with a top-2 logit gap below {MIN_GREEDY_GAP}")
    hidden, inter, num_experts, top_k = 72, 40, NUM_EXPERTS, 3
    cfg = model.config
    layers = model.model.layers
    moe_layers = [i for i, layer in enumerate(layers) if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts")]
    if moe_layers != [0, 1, 2]:
        fail(f"MoE layers {moe_layers}, expected [0, 1, 2]")
    sequence = list(prompt_ids) + continuation[:-1]
    n = len(sequence)

    captured = {}
    handles = [layers[i].mlp.register_forward_pre_hook(mlp_input_hook(captured, i), with_kwargs=True)
               for i in moe_layers]
    full_logits = model(torch.tensor([sequence])).logits[0].numpy()
    for h in handles:
        h.remove()
    for j in range(-1, GREEDY_STEPS - 1):  # row P - 1 + j + 1 predicts continuation token j + 1
        row = len(prompt_ids) + j
        if int(full_logits[row].argmax()) != continuation[j + 1]:
            fail(f"teacher-forced row {row} argmax {int(full_logits[row].argmax())} is not the greedy token "
                 f"{continuation[j + 1]}")
    # The long context matters: replacing the prompt's first half changes the last row's logits.
    other = list(sequence)
    rng = np.random.default_rng(SEED)
    for i in range(n // 2):
        other[i] = int(rng.integers(2, 256))
    changed = model(torch.tensor([other])).logits[0, -1].numpy()
    if np.abs(changed - full_logits[-1]).max() < 1e-3:
        fail("the last row's logits do not depend on the first half of the sequence")

    rows = logits_rows(n, len(prompt_ids))
    fixture = {"name": name, "model_type": "qwen3_moe", "moe_layers": moe_layers, "num_experts": num_experts,
               "top_k": top_k, "reference_dtype": "float64", "experts_layout": "per_expert", "model_seed": seed,
               "prompts": [{"source_text": text, "prompt_ids": prompt_ids, "continuation_ids": continuation,
                            "sequence_ids": sequence, "continuation_top2_gaps": gaps, "logits_rows": rows}]}
    files = {"p0_logits_last.npy": logits_last.astype(np.float32),
             "p0_logits_rows.npy": full_logits[rows].astype(np.float32)}
    route_gaps = []
    for li in moe_layers:
        x = captured[li]
        if x.shape[0] != n:
            fail(f"layer {li}: the hook saw {x.shape[0]} rows, expected {n}")
        r_logits = F.linear(x, layers[li].mlp.gate.weight)
        probs = F.softmax(r_logits, dim=-1, dtype=torch.float)
        _, topk = torch.topk(probs, top_k, dim=-1)
        srt = np.sort(r_logits.numpy(), axis=1)[:, ::-1]
        route_gaps.extend((srt[:, top_k - 1] - srt[:, top_k]).tolist())
        files[f"p0_router_logits_l{li}.npy"] = r_logits.numpy().astype(np.float32)
        files[f"p0_topk_l{li}.npy"] = topk.numpy().astype(np.int32)
    decisive = float(np.mean(np.array(route_gaps) >= 1e-4))
    fixture["decisive_route_rows"] = decisive
    if decisive < 0.9:
        fail(f"only {decisive:.0%} of route rows have a k-th gap >= 1e-4")
    fixture["versions"] = {"transformers": transformers.__version__, "torch": torch.__version__,
                           "numpy": np.__version__}
    for fname, array in files.items():
        np.save(os.path.join(d, fname), array)
    with open(os.path.join(d, "fixture.json"), "w") as f:
        json.dump(fixture, f, indent=1)
    print(name, "prompt", len(prompt_ids), "rows", n, "continuation", continuation, "top-2 gaps min",
          f"{min(gaps):.3g}", "decisive", f"{decisive:.3f}", "logits rows stored", len(rows), flush=True)

    # The fused-expert layout: the same weights, experts stacked into transformers 5's in-memory form.
    fd = os.path.join(OUT, name + "_fused")
    if os.path.exists(fd):
        shutil.rmtree(fd)
    shutil.copytree(d, fd)
    for f in os.listdir(fd):
        if f.endswith(".safetensors") or f.endswith(".safetensors.index.json"):
            os.remove(os.path.join(fd, f))
    fused = {}
    checked_in_memory = 0
    for key, value in names.items():
        if ".mlp.experts." not in key:
            fused[key] = value
    for layer in moe_layers:
        gate_up, down = fused_experts(names, layer, num_experts, inter, hidden)
        p = f"model.layers.{layer}.mlp.experts."
        fused[p + "gate_up_proj"], fused[p + "down_proj"] = gate_up, down
        theirs_gu, theirs_d = in_memory.get(p + "gate_up_proj"), in_memory.get(p + "down_proj")
        if theirs_gu is not None:  # transformers 5: experts fused in memory; its layout is the truth
            if tuple(theirs_gu.shape) != tuple(gate_up.shape):
                theirs_gu, theirs_d = theirs_gu.transpose(1, 2), theirs_d.transpose(1, 2)
            if not torch.equal(theirs_gu, gate_up) or not torch.equal(theirs_d, down):
                fail(f"layer {layer}: the stacked experts differ from transformers' own fused gate_up_proj / down_proj")
            checked_in_memory += 1
    save_file(fused, os.path.join(fd, "model.safetensors"), metadata={"format": "pt"})
    fused_fixture = dict(fixture, name=name + "_fused", experts_layout="fused",
                         fused_checked_against_transformers_in_memory=checked_in_memory)
    try:
        again = load_reference(fd)
        reloaded = again(torch.tensor([sequence])).logits[0].numpy()
        fused_fixture["transformers_reloads_fused_max_abs_diff"] = float(np.abs(reloaded - full_logits).max())
    except (Exception, SystemExit) as error:  # recorded, not required: the stacking check is the test
        fused_fixture["transformers_reloads_fused_error"] = str(error)[:300]
    with open(os.path.join(fd, "fixture.json"), "w") as f:
        json.dump(fused_fixture, f, indent=1)
    print(name + "_fused", "layers checked against transformers' in-memory experts", checked_in_memory,
          "reload:", fused_fixture.get("transformers_reloads_fused_max_abs_diff",
                                       fused_fixture.get("transformers_reloads_fused_error")), flush=True)
    for folder in (d, fd):
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        print(folder, f"{size / 1e6:.2f} MB", sorted(os.listdir(folder)), flush=True)
    print("config:", open(os.path.join(d, "config.json")).read().replace("\n", " ")[:600])
    print("OK: copy", OUT, "into tests/golden/")


main()
