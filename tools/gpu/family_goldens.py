#!/usr/bin/env python3
"""Golden fixtures for the Mixtral, OLMoE and Qwen2-MoE adapters, made with HF transformers.

For each family, transformers itself writes a tiny random checkpoint (save_pretrained, bf16), the
checkpoint is reloaded from disk in float64 with eager attention, and the reference is computed
from that reloaded model (not the in-memory one that was saved). The output has the layout of
tests/golden/hf_qwen3_moe (tests/model/hf_golden_test.cpp reads both):
  fixture.json                      name, moe_layers, num_experts, top_k, prompts (ids), versions
  p{i}_logits_last.npy              logits at the last prompt position          [vocab]   f32
  p{i}_logits_all.npy               logits of the teacher-forced sequence       [n, vocab] f32
  p{i}_router_logits_l{L}.npy       router logits of MoE layer L (its input as HF computes it)
  p{i}_topk_l{L}.npy                HF's top-k for those rows                    int32
  p{i}_forced_routes.npy            random routes [n, layers, k] (dense layers' rows 0)
  p{i}_forced_logits_all.npy        logits of HF's forward pass with those routes forced
Sizes: hidden 72 (not a multiple of 16), head_dim 18 / 12, experts 8 / 16 / 12; prompts of at
least 60 tokens; Mixtral and Qwen2-MoE with a sliding window of 24, shorter than every prompt.

Self-checks (any failure stops the script with a message): prompts long enough and longer than
the window; the saved tensor names are ones Switchyard's adapter reads; the reloaded weights are
the saved bf16 values; the sliding window changes the logits (it is really applied); the forced-
routing block with free routing reproduces HF's own logits; most route rows are decisive.

Usage (on the GPU machine; CPU float64, no network):
    python3 tools/gpu/family_goldens.py OUT_DIR
writes OUT_DIR/hf_mixtral/mixtral_window, OUT_DIR/hf_olmoe/olmoe_nonorm and
OUT_DIR/hf_qwen2_moe/qwen2moe_shared_window; copy OUT_DIR/hf_* into tests/golden/.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM)

torch.set_grad_enabled(False)
if len(sys.argv) != 2:
    sys.exit(__doc__)
OUT = sys.argv[1]
VOCAB = 512
WINDOW = 24
MIN_PROMPT_TOKENS = 60
GREEDY_STEPS = 12

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
    "Mixture-of-experts models route every token to a few experts, and a sliding window keeps only "
    "the most recent keys in view. Routing replay keeps training and inference in agreement: the "
    "trainer replays the routes",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\nNumbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 "
    "3.14159 2.71828. The quick brown fox jumps over the lazy dog, and then the fox",
]


def fail(message):
    sys.exit(f"family_goldens.py: SELF-CHECK FAILED: {message}")


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 2, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def moe_block(layer):
    """The layer's MoE block (transformers 5: mlp; 4: Mixtral's block_sparse_moe), or None."""
    for attr in ("mlp", "block_sparse_moe"):
        block = getattr(layer, attr, None)
        if block is not None and hasattr(block, "gate") and hasattr(block, "experts"):
            return attr, block
    return None, None


def expert_weights(experts, e, inter):
    """(gate [I,H], up [I,H], down [H,I]) of expert e: fused (transformers 5) or per expert (4)."""
    if hasattr(experts, "gate_up_proj"):
        gate_up, down = experts.gate_up_proj[e], experts.down_proj[e]
        if gate_up.shape[0] != 2 * inter:  # stored transposed ([H, 2I])
            gate_up, down = gate_up.t(), down.t()
        return gate_up[:inter], gate_up[inter:], down
    ex = experts[e]
    if hasattr(ex, "w1"):
        return ex.w1.weight, ex.w3.weight, ex.w2.weight
    return ex.gate_proj.weight, ex.up_proj.weight, ex.down_proj.weight


class ForcedMoe(torch.nn.Module):
    """A family's MoE block with routing replaced by given ids (or free top-k when forced is None):
    softmax (in float32, as HF's routers compute it) -> top-k -> renormalise if the family does ->
    routed experts -> plus the sigmoid-gated shared expert (Qwen2-MoE)."""

    def __init__(self, block, top_k, renormalize, inter, returns_tuple):
        super().__init__()
        self.block, self.top_k, self.renormalize, self.inter = block, top_k, renormalize, inter
        self.returns_tuple = returns_tuple
        self.forced = None  # LongTensor [tokens, K] or None

    def forward(self, hidden, *args, **kwargs):
        b, s, h = hidden.shape
        x = hidden.reshape(-1, h)
        logits = F.linear(x, self.block.gate.weight)
        probs = F.softmax(logits, dim=-1, dtype=torch.float)
        if self.forced is None:
            weights, ids = torch.topk(probs, self.top_k, dim=-1)
        else:
            ids = self.forced
            weights = probs.gather(1, ids)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for k in range(ids.shape[1]):
                g, u, d = expert_weights(self.block.experts, int(ids[t, k]), self.inter)
                out[t] += weights[t, k] * F.linear(F.silu(F.linear(x[t], g)) * F.linear(x[t], u), d)
        if hasattr(self.block, "shared_expert"):
            shared = self.block.shared_expert(x)
            if hasattr(self.block, "shared_expert_gate"):
                shared = torch.sigmoid(self.block.shared_expert_gate(x)) * shared
            out = out + shared
        out = out.reshape(b, s, h)
        return (out, logits) if self.returns_tuple else out


def saved_tensors(d):
    names = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), framework="pt") as sf:
                for key in sf.keys():
                    names[key] = sf.get_tensor(key)
    return names


def check_expert_names(names, kind, inter):
    layer0 = [n for n in names if n.startswith("model.layers.0.")]
    accepted = ["model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.0.gate_proj.weight"]
    if kind == "mixtral":
        accepted.append("model.layers.0.block_sparse_moe.experts.0.w1.weight")
    if not any(a in names for a in accepted):
        fail(f"{kind}: the checkpoint names no expert tensor Switchyard reads (one of {accepted}); "
             f"layer 0 has {sorted(layer0)}")
    fused = names.get("model.layers.0.mlp.experts.gate_up_proj")
    if fused is not None and (fused.dim() != 3 or fused.shape[1] != 2 * inter):
        fail(f"{kind}: fused gate_up_proj has shape {tuple(fused.shape)}; Switchyard reads [E, 2I, H] with I = {inter}")


def load_reference(d):
    # The eager experts loop: transformers' default grouped_mm experts do not take float64.
    for kwargs in ({"dtype": torch.float64, "experts_implementation": "eager"},
                   {"dtype": torch.float64}, {"torch_dtype": torch.float64}):
        try:
            return AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", **kwargs).eval()
        except (TypeError, ValueError):
            continue
    fail(f"cannot reload {d}")


def make_family(kind, folder, name, seed, cfg):
    torch.manual_seed(seed)
    d = os.path.join(OUT, folder, name)
    os.makedirs(d, exist_ok=True)
    tok = train_tokenizer()
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "model_max_length": 4096}, f)
    cls = {"mixtral": MixtralForCausalLM, "olmoe": OlmoeForCausalLM, "qwen2_moe": Qwen2MoeForCausalLM}[kind]
    model = cls(cfg).eval()
    # Routers decisive (not a near-uniform softmax); norms and biases random so a wrong or
    # missing one shows.
    for pname, p in model.named_parameters():
        if pname.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
            p.normal_(0.0, 3.0 / np.sqrt(cfg.hidden_size))
        elif "norm" in pname:
            p.uniform_(0.5, 1.5)
        elif pname.endswith(".bias"):
            p.normal_(0.0, 0.1)
    model = model.to(torch.bfloat16)
    in_memory = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.save_pretrained(d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 0, "do_sample": False}, f)
    names = saved_tensors(d)
    check_expert_names(names, kind, getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size)

    model = load_reference(d)
    cfg = model.config
    # The reloaded weights are the saved bf16 values (checked where the names coincide).
    state = model.state_dict()
    compared = 0
    for key, value in in_memory.items():
        if key in state and state[key].shape == value.shape:
            if not torch.equal(state[key].to(torch.bfloat16), value):
                fail(f"{name}: reloaded {key} differs from what was saved")
            compared += 1
    if compared < 10:
        fail(f"{name}: only {compared} reloaded tensors could be compared with the saved ones")

    layers = model.model.layers
    blocks = {i: moe_block(l) for i, l in enumerate(layers)}
    moe_layers = [i for i, (attr, b) in blocks.items() if b is not None]
    top_k = cfg.num_experts_per_tok
    num_experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    inter = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    renormalize = True if kind == "mixtral" else bool(cfg.norm_topk_prob)
    window = getattr(cfg, "sliding_window", None) if kind != "olmoe" else None

    captured = {}

    def hook(i):
        def fn(module, args, kwargs=None):
            captured[i] = args[0].reshape(-1, args[0].shape[-1]).detach().clone()
        return fn

    handles = [blocks[i][1].register_forward_pre_hook(hook(i)) for i in moe_layers]
    fixture = {"name": name, "model_type": kind, "moe_layers": moe_layers, "num_experts": num_experts,
               "top_k": top_k, "reference_dtype": "float64", "sliding_window": window, "prompts": [],
               "stored_tensor_sample": sorted(names)[:12]}
    gaps = []
    for pi, text in enumerate(PROMPTS):
        ids = tok.encode(text).ids
        if len(ids) < MIN_PROMPT_TOKENS:
            fail(f"prompt {pi} has {len(ids)} tokens, fewer than {MIN_PROMPT_TOKENS}")
        if window and len(ids) <= window:
            fail(f"prompt {pi} ({len(ids)} tokens) is not longer than the sliding window {window}")
        seq = list(ids)
        logits_last = None
        for step in range(GREEDY_STEPS):
            out = model(torch.tensor([seq])).logits[0]
            if step == 0:
                logits_last = out[len(ids) - 1].numpy()
            seq.append(int(out[-1].argmax()))
        continuation = seq[len(ids):]
        forced_input = seq[:-1]
        captured.clear()
        full_logits = model(torch.tensor([forced_input])).logits[0].numpy()
        if window:
            # The window is really applied: without it the last logits change.
            saved_window = cfg.sliding_window
            cfg.sliding_window = 1 << 20
            for layer in layers:
                if getattr(layer.self_attn, "sliding_window", None):
                    layer.self_attn.sliding_window = 1 << 20
            unwindowed = model(torch.tensor([forced_input])).logits[0].numpy()
            cfg.sliding_window = saved_window
            for layer in layers:
                if getattr(layer.self_attn, "sliding_window", None):
                    layer.self_attn.sliding_window = saved_window
            if np.abs(unwindowed[-1] - full_logits[-1]).max() < 1e-6:
                fail(f"{name}: the sliding window of {window} does not change the logits")
            again = model(torch.tensor([forced_input])).logits[0].numpy()
            if np.abs(again - full_logits).max() > 1e-12:
                fail(f"{name}: restoring the sliding window did not restore the logits")
        rec = {"text": text, "prompt_ids": ids, "continuation_ids": continuation, "sequence_ids": forced_input}
        np.save(os.path.join(d, f"p{pi}_logits_last.npy"), logits_last.astype(np.float32))
        np.save(os.path.join(d, f"p{pi}_logits_all.npy"), full_logits.astype(np.float32))
        for li in moe_layers:
            x = captured[li]
            r_logits = F.linear(x, blocks[li][1].gate.weight)
            probs = F.softmax(r_logits, dim=-1, dtype=torch.float)
            _, topk = torch.topk(probs, top_k, dim=-1)
            srt = np.sort(r_logits.numpy(), axis=1)[:, ::-1]
            gaps.extend((srt[:, top_k - 1] - srt[:, top_k]).tolist())
            np.save(os.path.join(d, f"p{pi}_router_logits_l{li}.npy"), r_logits.numpy().astype(np.float32))
            np.save(os.path.join(d, f"p{pi}_topk_l{li}.npy"), topk.numpy().astype(np.int32))
        fixture["prompts"].append(rec)
    for h in handles:
        h.remove()
    decisive = float(np.mean(np.array(gaps) >= 1e-4))
    fixture["decisive_route_rows"] = decisive
    if decisive < 0.9:
        fail(f"{name}: only {decisive:.0%} of route rows have a k-th gap >= 1e-4")

    # Replay oracle: swap in ForcedMoe; free routing must reproduce HF's logits first.
    check = []
    forced_blocks = {}
    for i in moe_layers:
        attr, block = blocks[i]
        probe = block(torch.zeros(1, 1, cfg.hidden_size, dtype=torch.float64))
        forced_blocks[i] = ForcedMoe(block, top_k, renormalize, inter, isinstance(probe, tuple))
        setattr(layers[i], attr, forced_blocks[i])
    rng = np.random.default_rng(seed + 1)
    for pi, rec in enumerate(fixture["prompts"]):
        seq = rec["sequence_ids"]
        free = model(torch.tensor([seq])).logits[0].numpy()
        ref = np.load(os.path.join(d, f"p{pi}_logits_all.npy"))
        check.append(float(np.abs(free - ref).max()))
        L = cfg.num_hidden_layers
        routes = np.zeros((len(seq), L, top_k), dtype=np.int32)
        for t in range(len(seq)):
            for li in moe_layers:
                routes[t, li] = rng.choice(num_experts, size=top_k, replace=False)
        for li in moe_layers:
            forced_blocks[li].forced = torch.tensor(routes[:, li, :], dtype=torch.long)
        forced_logits = model(torch.tensor([seq])).logits[0].numpy()
        for li in moe_layers:
            forced_blocks[li].forced = None
        if np.abs(forced_logits - free).max() < 1e-2:
            fail(f"{name}: forced routes barely change the logits")
        np.save(os.path.join(d, f"p{pi}_forced_routes.npy"), routes)
        np.save(os.path.join(d, f"p{pi}_forced_logits_all.npy"), forced_logits.astype(np.float32))
    fixture["forced_block_free_max_abs_diff"] = check
    # The f32-saved reference vs the float64 forced block: f32 rounding of the saved logits only.
    if max(check) > 1e-5:
        fail(f"{name}: ForcedMoe does not reproduce HF: {check}")
    fixture["versions"] = {"transformers": transformers.__version__, "torch": torch.__version__,
                           "numpy": np.__version__}
    with open(os.path.join(d, "fixture.json"), "w") as f:
        json.dump(fixture, f, indent=1)
    print(name, "moe_layers", moe_layers, "E", num_experts, "k", top_k, "window", window,
          "prompt tokens", [len(p["prompt_ids"]) for p in fixture["prompts"]],
          "decisive", f"{decisive:.3f}", "free-vs-HF", check, flush=True)


common = dict(vocab_size=VOCAB, hidden_size=72, num_hidden_layers=3, max_position_embeddings=4096,
              eos_token_id=0, bos_token_id=0, initializer_range=0.08, tie_word_embeddings=False)

make_family("mixtral", "hf_mixtral", "mixtral_window", 11, MixtralConfig(
    intermediate_size=40, num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
    num_experts_per_tok=2, sliding_window=WINDOW, rope_theta=1e6, rms_norm_eps=1e-5, **common))
make_family("olmoe", "hf_olmoe", "olmoe_nonorm", 12, OlmoeConfig(
    intermediate_size=24, num_attention_heads=6, num_key_value_heads=3, num_experts=16, num_experts_per_tok=4,
    norm_topk_prob=False, rms_norm_eps=1e-5, rope_theta=10000.0, clip_qkv=None, **common))
make_family("qwen2_moe", "hf_qwen2_moe", "qwen2moe_shared_window", 13, Qwen2MoeConfig(
    intermediate_size=88, moe_intermediate_size=24, shared_expert_intermediate_size=56, num_attention_heads=4,
    num_key_value_heads=2, num_experts=12, num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=1,
    mlp_only_layers=[1], use_sliding_window=True, sliding_window=WINDOW, max_window_layers=3,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"], qkv_bias=True,
    rms_norm_eps=1e-6, rope_theta=1e6, **common))
for folder, name in (("hf_mixtral", "mixtral_window"), ("hf_olmoe", "olmoe_nonorm"),
                     ("hf_qwen2_moe", "qwen2moe_shared_window")):
    print("config:", folder, open(os.path.join(OUT, folder, name, "config.json")).read().replace("\n", " ")[:400])
print("OK: copy", os.path.join(OUT, "hf_*"), "into tests/golden/")
