#!/usr/bin/env python3
"""Golden fixtures for the CPU reference engine, made with HF transformers (run on the GPU machine).

Builds tiny random Qwen3-MoE checkpoints with transformers' own save_pretrained (bf16; one sharded;
one with norm_topk_prob false and a dense layer), a small byte-level BPE tokenizer trained with the
`tokenizers` library, and records in float32:
  - logits at the last prompt position,
  - the greedy continuation,
  - every MoE layer's router logits and HF's top-k for the teacher-forced sequence,
  - for replay: random forced routes and the logits of HF's forward pass run with those forced ids
    (the MoE block's routing replaced by the forced ids, gating weights recomputed from the router's
    softmax at those ids, then renormalised as the model does). The replacement is validated by
    first reproducing HF's own logits with free routing.

Usage: python3 tools/gpu/model_goldens.py OUT_DIR   (writes OUT_DIR/<checkpoint>/...)
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

torch.set_grad_enabled(False)
OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Mixture-of-experts models route every token to a few experts. Routing replay keeps training "
    "and inference in agreement.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828",
    "Les modèles de langage générent du texte; die Experten werden gewählt. ¿Qué tal? 你好，世界。",
    "Reinforcement learning from rollouts: the trainer replays the routes of the rollout engine.",
]
PROMPTS = [
    "The quick brown fox",
    "Routing replay keeps training and inference in",
    "def add(a, b):\n    return",
]
VOCAB = 512


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 2, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def expert_weights(mlp, e, inter):
    """(gate [I,H], up [I,H], down [H,I]) of expert e, for transformers 4 and 5 layouts."""
    experts = mlp.experts
    if hasattr(experts, "gate_up_proj"):
        gate_up = experts.gate_up_proj[e]
        down = experts.down_proj[e]
        if gate_up.shape[0] != 2 * inter:  # stored transposed ([H, 2I])
            gate_up = gate_up.t()
            down = down.t()
        return gate_up[:inter], gate_up[inter:], down
    ex = experts[e]
    return ex.gate_proj.weight, ex.up_proj.weight, ex.down_proj.weight


def router_weight(mlp):
    return mlp.gate.weight


class ForcedMoe(torch.nn.Module):
    """Qwen3-MoE sparse block with routing replaced by given ids (or free top-k when None)."""

    def __init__(self, mlp, cfg, layer):
        super().__init__()
        self.mlp, self.cfg, self.layer = mlp, cfg, layer
        self.forced = None  # LongTensor [seq, K] or None

    def forward(self, hidden):
        b, s, h = hidden.shape
        x = hidden.reshape(-1, h)
        logits = F.linear(x, router_weight(self.mlp))
        probs = F.softmax(logits, dim=1, dtype=torch.float)
        if self.forced is None:
            weights, ids = torch.topk(probs, self.cfg.num_experts_per_tok, dim=-1)
        else:
            ids = self.forced
            weights = probs.gather(1, ids)
        if self.cfg.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        inter = self.cfg.moe_intermediate_size
        for t in range(x.shape[0]):
            for k in range(ids.shape[1]):
                g, u, d = expert_weights(self.mlp, int(ids[t, k]), inter)
                y = F.linear(F.silu(F.linear(x[t], g)) * F.linear(x[t], u), d)
                out[t] += weights[t, k] * y
        return out.reshape(b, s, h)


def num_experts_of(cfg):
    return getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts")


def make_checkpoint(name, seed, shard, **kw):
    torch.manual_seed(seed)
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    tok = train_tokenizer()
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "model_max_length": 4096}, f)
    cfg = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6,
                         eos_token_id=0, bos_token_id=0, initializer_range=0.08, **kw)
    model = Qwen3MoeForCausalLM(cfg).eval()
    E = num_experts_of(cfg)
    # Router weights scaled so routing is decisive (not a near-uniform softmax), and norms
    # randomised so a wrong norm weight shows.
    for name_, p in model.named_parameters():
        if name_.endswith("mlp.gate.weight"):
            p.normal_(0.0, 1.0 / np.sqrt(cfg.hidden_size) * 3.0)
        elif "norm" in name_:
            p.uniform_(0.5, 1.5)
    model = model.to(torch.bfloat16)
    if shard:
        model.save_pretrained(d, max_shard_size="100KB")
    else:
        model.save_pretrained(d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 0, "do_sample": False}, f)

    # Reload what was saved, compute in float32 with eager attention.
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    cfg = model.config
    layers = model.model.layers
    moe_layers = [i for i, l in enumerate(layers) if hasattr(l.mlp, "gate")]

    # Router inputs (the hidden states HF feeds its router) via hooks on each MoE block.
    captured = {}

    def hook(i):
        def fn(module, args):
            captured[i] = args[0].reshape(-1, args[0].shape[-1]).detach().clone()
        return fn

    handles = [layers[i].mlp.register_forward_pre_hook(hook(i)) for i in moe_layers]
    fixture = {"name": name, "moe_layers": moe_layers, "num_experts": E,
               "top_k": cfg.num_experts_per_tok, "prompts": []}
    for pi, text in enumerate(PROMPTS):
        ids = tok.encode(text).ids
        seq = list(ids)
        logits_last = None
        for step in range(12):
            out = model(torch.tensor([seq])).logits[0]
            if step == 0:
                logits_last = out[len(ids) - 1].float().numpy()
            seq.append(int(out[-1].argmax()))
        continuation = seq[len(ids):]
        # Teacher-forced full sequence (prompt + continuation minus the last, which never went in).
        forced_input = seq[:-1]
        captured.clear()
        full_logits = model(torch.tensor([forced_input])).logits[0].float().numpy()
        rec = {"text": text, "prompt_ids": ids, "continuation_ids": continuation,
               "sequence_ids": forced_input}
        np.save(os.path.join(d, f"p{pi}_logits_last.npy"), logits_last.astype(np.float32))
        np.save(os.path.join(d, f"p{pi}_logits_all.npy"), full_logits.astype(np.float32))
        for li in moe_layers:
            x = captured[li]
            r_logits = F.linear(x, router_weight(layers[li].mlp)).float()
            probs = F.softmax(r_logits, dim=1, dtype=torch.float)
            _, topk = torch.topk(probs, cfg.num_experts_per_tok, dim=-1)
            np.save(os.path.join(d, f"p{pi}_router_logits_l{li}.npy"), r_logits.numpy().astype(np.float32))
            np.save(os.path.join(d, f"p{pi}_topk_l{li}.npy"), topk.numpy().astype(np.int32))
        fixture["prompts"].append(rec)
    for h in handles:
        h.remove()

    # Replay oracle: swap in ForcedMoe; free routing must reproduce HF's logits first.
    originals = {i: layers[i].mlp for i in moe_layers}
    forced_blocks = {i: ForcedMoe(originals[i], cfg, i) for i in moe_layers}
    for i in moe_layers:
        layers[i].mlp = forced_blocks[i]
    rng = np.random.default_rng(seed + 1)
    check = []
    for pi, rec in enumerate(fixture["prompts"]):
        seq = rec["sequence_ids"]
        free = model(torch.tensor([seq])).logits[0].float().numpy()
        ref = np.load(os.path.join(d, f"p{pi}_logits_all.npy"))
        check.append(float(np.abs(free - ref).max()))
        L, K = cfg.num_hidden_layers, cfg.num_experts_per_tok
        routes = np.zeros((len(seq), L, K), dtype=np.int32)
        for t in range(len(seq)):
            for li in moe_layers:
                routes[t, li] = rng.choice(E, size=K, replace=False)
        for li in moe_layers:
            forced_blocks[li].forced = torch.tensor(routes[:, li, :], dtype=torch.long)
        forced_logits = model(torch.tensor([seq])).logits[0].float().numpy()
        for li in moe_layers:
            forced_blocks[li].forced = None
        np.save(os.path.join(d, f"p{pi}_forced_routes.npy"), routes)
        np.save(os.path.join(d, f"p{pi}_forced_logits_all.npy"), forced_logits.astype(np.float32))
    fixture["forced_block_free_max_abs_diff"] = check
    assert max(check) < 1e-4, f"ForcedMoe does not reproduce HF: {check}"
    fixture["versions"] = {"transformers": transformers.__version__, "torch": torch.__version__,
                           "numpy": np.__version__}
    with open(os.path.join(d, "fixture.json"), "w") as f:
        json.dump(fixture, f, indent=1)
    print(name, "moe_layers", moe_layers, "E", E, "free-vs-HF", check, "files", sorted(os.listdir(d))[:6], flush=True)


make_checkpoint("qwen3moe_sharded", 1, True, num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32,
                num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                mlp_only_layers=[], tie_word_embeddings=False)
make_checkpoint("qwen3moe_dense_nonorm", 2, False, num_hidden_layers=4, intermediate_size=96,
                moe_intermediate_size=32, num_experts=16, num_experts_per_tok=4, norm_topk_prob=False,
                decoder_sparse_step=1, mlp_only_layers=[1], tie_word_embeddings=True)
make_checkpoint("qwen3moe_sparse_step", 3, False, num_hidden_layers=4, intermediate_size=96,
                moe_intermediate_size=16, num_experts=32, num_experts_per_tok=8, norm_topk_prob=True,
                decoder_sparse_step=2, mlp_only_layers=[], tie_word_embeddings=False, attention_bias=True)
print("config sample:", open(os.path.join(OUT, "qwen3moe_sharded", "config.json")).read())
