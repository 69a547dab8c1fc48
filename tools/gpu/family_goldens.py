#!/usr/bin/env python3
"""Golden fixtures for the Mixtral, OLMoE, Qwen2-MoE and gpt-oss adapters, made with HF transformers.

For each family, transformers itself writes a tiny random checkpoint (save_pretrained, bf16), the
checkpoint is reloaded from disk in float64 with eager attention, and the reference is computed
from that reloaded model (not the in-memory one that was saved). The output has the layout of
tests/golden/hf_qwen3_moe (tests/model/hf_golden_test.cpp reads both):
  fixture.json                      name, moe_layers, num_experts, top_k, prompts (ids), versions
  p{i}_logits_last.npy              logits at the last prompt position          [vocab]   f32
  p{i}_logits_all.npy               logits of the teacher-forced sequence       [n, vocab] f32
  p{i}_router_logits_l{L}.npy       router logits of MoE layer L (its input as HF computes it)
  p{i}_topk_l{L}.npy                HF's top-k for those rows                    int32
  p{i}_group_gap_l{L}.npy           (n_group > 1) the topk_group-th group score minus the next, per row
  p{i}_forced_routes.npy            random routes [n, layers, k] (dense layers' rows 0)
  p{i}_forced_logits_all.npy        logits of HF's forward pass with those routes forced
Sizes: hidden 72 (not a multiple of 16), head_dim 18 / 12, experts 8 / 16 / 12; prompts of at
least 60 tokens; Mixtral and Qwen2-MoE with a sliding window of 24, shorter than every prompt.

Self-checks (any failure stops the script with a message): prompts long enough and longer than
the window; the saved tensor names are ones Switchyard's adapter reads; the reloaded weights are
the saved bf16 values; the sliding window changes the logits (it is really applied); the forced-
routing block with free routing reproduces HF's own logits; most route rows are decisive.

gpt-oss (make_gpt_oss below): transformers writes a bf16 GptOssForCausalLM whose expert
weights lie on the MXFP4 grid (save_pretrained: hf_gpt_oss/gptoss_bf16); the same weights are
then stored as published checkpoints store them (experts as *_blocks / *_scales U8, written by
the independent quantizer below, config.json with quantization_config mxfp4: hf_gpt_oss/
gptoss_mxfp4), and the MXFP4 folder is reloaded by transformers with
Mxfp4Config(dequantize=True), i.e. through transformers' own MXFP4 dequantisation
(integrations/mxfp4.py convert_moe_packed_tensors), then cast to float64 (exact: MXFP4 values are
bf16 values). If that load path fails, the bf16 model is reloaded and its experts are replaced by
convert_moe_packed_tensors of the MXFP4 files (fixture.json's "mxfp4_reference" says which).
Sizes: hidden 64, expert width 96 (MXFP4 needs multiples of 32; H, I and 2I all differ, so a
transposed expert tensor cannot pass a shape check), head_dim 24 with 5 query heads
(q width 120, not a multiple of 16) over 1 KV head, 6 experts top-2, sliding window 24 on layers
0 and 2, YaRN (factor 8 over an original context of 32), swiglu_limit 7 with expert weights large
enough that the clamp acts (checked).

GLM-4.5 MoE and DeepSeek-V3 (make_sigmoid_family below): sigmoid routers with
e_score_correction_bias for selection only (set random here: transformers initialises the buffer
to zero), n_group/topk_group (DeepSeek: 4 groups of 3, 2 kept), routed_scaling_factor 2.5, shared
experts, layer 0 dense. GLM: partial rotary 0.5 (head_dim 20: RoPE on 10 dims), q/k/v biases,
per-head q/k norm. DeepSeek: MLA (q_lora 40, kv_lora 24, nope 12 + rope 10, v 14), interleaved
RoPE, YaRN factor 8 over 32 with mscale 1 != mscale_all_dim 0.8. After save_pretrained one
multi-token-prediction layer (index num_hidden_layers: a copy of the last layer's tensors plus
eh_proj, enorm, hnorm, shared_head.norm) is added to the file, as published checkpoints hold one;
transformers and Switchyard must both leave it alone. transformers selects with
torch.topk(sorted=False), so fixture.json says "route_order": "set" and the C++ test compares
these routes as sets; p{i}_router_logits_l{L}.npy holds the selection scores (sigmoid + bias,
dropped groups -inf) whose gaps decide near-ties. Self-checks: the correction bias changes some
selections (and, for DeepSeek, so do the groups); GLM's rotary embedding has rotary_dim / 2
frequencies; the forced-routing block with free routing reproduces HF's logits.

Qwen3.5-MoE (qwen3_5_moe below): transformers writes a tiny Qwen3_5MoeForCausalLM (config model_type
qwen3_5_moe_text, tensors under model.; hf_qwen3_5_moe/qwen35moe_hybrid): hidden 72, layers linear,
linear, full, linear attention; gated DeltaNet with 2 key heads of 12 and 4 value heads of 10 (each
key head serving two value heads), conv kernel 4; gated full attention with 4 query / 2 KV heads of
24, partial rotary 0.25 (6 dims); 10 experts top-3 of width 20 and a sigmoid-gated shared expert of
28. Zero-centred norms (1 + w) random around 0, the DeltaNet's own norm around 1. transformers runs
the DeltaNet core (torch_chunk_gated_delta_rule) and every RMSNorm in float32 even in a float64
model, so this reference is float32-accurate there (fixture.json "fla_available" says whether the
flash-linear-attention kernels were importable: they must not be, the torch fallback is the
definition). Self-checks: the DeltaNet layers and their decay change the logits (out_proj zeroed,
A_log -> -inf, each restored exactly).

Usage (on the GPU machine; CPU float64, no network):
    python3 tools/gpu/family_goldens.py OUT_DIR [FAMILY ...]
FAMILY: mixtral, olmoe, qwen2_moe, gpt_oss, glm4_moe, deepseek_v3, qwen3_5_moe (default: all).
Writes OUT_DIR/hf_mixtral/mixtral_window, OUT_DIR/hf_olmoe/olmoe_nonorm,
OUT_DIR/hf_qwen2_moe/qwen2moe_shared_window, OUT_DIR/hf_gpt_oss/gptoss_mxfp4,
OUT_DIR/hf_gpt_oss/gptoss_bf16, OUT_DIR/hf_glm4_moe/glm4moe_partial_rotary,
OUT_DIR/hf_deepseek_v3/deepseekv3_groups and OUT_DIR/hf_qwen3_5_moe/qwen35moe_hybrid; copy
OUT_DIR/hf_* into tests/golden/.
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
from forced_moe import ForcedMoe, expert_weights  # (tools/gpu/forced_moe.py)
from transformers import (AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM)

torch.set_grad_enabled(False)
FAMILIES = ("mixtral", "olmoe", "qwen2_moe", "gpt_oss", "glm4_moe", "deepseek_v3", "qwen3_5_moe")
if len(sys.argv) < 2 or any(f not in FAMILIES for f in sys.argv[2:]):
    sys.exit(__doc__)
OUT = sys.argv[1]
WANTED = set(sys.argv[2:]) or set(FAMILIES)
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


def saved_tensors(d):
    names = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), framework="pt") as sf:
                for key in sf.keys():
                    names[key] = sf.get_tensor(key)
    return names


def check_expert_names(names, kind, inter, layer=0):
    p = f"model.layers.{layer}."
    in_layer = [n for n in names if n.startswith(p)]
    accepted = [p + "mlp.experts.gate_up_proj", p + "mlp.experts.0.gate_proj.weight"]
    if kind == "mixtral":
        accepted.append(p + "block_sparse_moe.experts.0.w1.weight")
    if not any(a in names for a in accepted):
        fail(f"{kind}: the checkpoint names no expert tensor Switchyard reads (one of {accepted}); "
             f"layer {layer} has {sorted(in_layer)}")
    fused = names.get(p + "mlp.experts.gate_up_proj")
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
    if kind == "qwen3_5_moe":
        from transformers import Qwen3_5MoeForCausalLM
        cls = Qwen3_5MoeForCausalLM
    else:
        cls = {"mixtral": MixtralForCausalLM, "olmoe": OlmoeForCausalLM, "qwen2_moe": Qwen2MoeForCausalLM}[kind]
    model = cls(cfg).eval()
    # Routers decisive (not a near-uniform softmax); norms and biases random so a wrong or
    # missing one shows.
    for pname, p in model.named_parameters():
        if pname.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
            p.normal_(0.0, 3.0 / np.sqrt(cfg.hidden_size))
        elif kind == "qwen3_5_moe" and "norm" in pname and "linear_attn.norm" not in pname:
            p.uniform_(-0.5, 0.5)  # zero-centred: applied as 1 + w
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
    renormalize = True if kind in ("mixtral", "qwen3_5_moe") else bool(cfg.norm_topk_prob)
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
        if kind == "qwen3_5_moe":  # after the router inputs above were used (its passes refill them)
            hybrid_checks(name, model, forced_input, full_logits)
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
    if kind == "qwen3_5_moe":
        from transformers.utils import is_flash_linear_attention_available
        fixture["fla_available"] = bool(is_flash_linear_attention_available())
        if fixture["fla_available"]:
            fail(f"{name}: flash-linear-attention is importable; run where only the torch fallback exists")
        fixture["layer_types"] = list(cfg.layer_types)
    with open(os.path.join(d, "fixture.json"), "w") as f:
        json.dump(fixture, f, indent=1)
    print(name, "moe_layers", moe_layers, "E", num_experts, "k", top_k, "window", window,
          "prompt tokens", [len(p["prompt_ids"]) for p in fixture["prompts"]],
          "decisive", f"{decisive:.3f}", "free-vs-HF", check, flush=True)

def hybrid_checks(name, model, seq, full_logits):
    """Qwen3.5: the DeltaNet layers and their decay really act (zeroing out_proj, or A_log -> -inf
    so that the state never decays, changes the logits), and restoring them restores the logits."""
    linear = [layer.linear_attn for layer in model.model.layers if hasattr(layer, "linear_attn")]
    if len(linear) < 2 or len(linear) == len(model.model.layers):
        fail(f"{name}: expected both linear- and full-attention layers, got {len(linear)} linear")
    for what, param, value in (("the DeltaNet output", lambda la: la.out_proj.weight, 0.0),
                               ("the decay", lambda la: la.A_log, -1e30)):  # exp(-1e30) = 0: g = 0
        saved = [param(la).data.clone() for la in linear]
        for la in linear:
            param(la).data.fill_(value)
        other = model(torch.tensor([seq])).logits[0].numpy()
        for la, kept in zip(linear, saved):
            param(la).data.copy_(kept)
        if np.abs(other - full_logits).max() < 1e-4:
            fail(f"{name}: {what} does not change the logits")
    again = model(torch.tensor([seq])).logits[0].numpy()
    if np.abs(again - full_logits).max() > 1e-12:
        fail(f"{name}: restoring the DeltaNet weights did not restore the logits")


def qwen3_5_moe_config():
    from transformers import Qwen3_5MoeTextConfig
    return Qwen3_5MoeTextConfig(
        vocab_size=VOCAB, hidden_size=72, num_hidden_layers=4, max_position_embeddings=4096,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=12, linear_value_head_dim=10, linear_conv_kernel_dim=4, num_experts=10,
        num_experts_per_tok=3, moe_intermediate_size=20, shared_expert_intermediate_size=28, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [1, 1, 1], "mrope_interleaved": True},
        eos_token_id=0, bos_token_id=0, pad_token_id=0, initializer_range=0.08, tie_word_embeddings=False)

# ---------------------------------------------------------------------------------------------
# gpt-oss: MXFP4 experts, attention sinks, YaRN, alternating sliding window, clamped SwiGLU.

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)
GPT_OSS_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def mxfp4_quantize(w):
    """An independent MXFP4 quantizer: w [..., out, in] (float) -> (blocks uint8 [..., out, in/32, 16],
    scales uint8 [..., out, in/32]). Per 32-value block, scale 2^s with s the least exponent that
    puts the block's largest magnitude within e2m1's 6; values rounded to the nearest e2m1 value
    (ties to the smaller magnitude); low nibble = even element."""
    w = np.asarray(w, dtype=np.float64)
    *prefix, out, inp = w.shape
    if inp % 32:
        fail(f"MXFP4 needs the input width to be a multiple of 32, got {inp}")
    blocks = w.reshape(*prefix, out, inp // 32, 32)
    amax = np.abs(blocks).max(axis=-1)
    exponent = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-300) / 6.0)), -127).astype(np.int64)
    exponent = np.clip(exponent, -127, 127)
    scaled = blocks / np.ldexp(1.0, exponent)[..., None]
    magnitude = np.abs(scaled)
    code = np.abs(magnitude[..., None] - E2M1).argmin(axis=-1)  # first (smaller) on ties
    code = code | np.where((scaled < 0) & (code > 0), 8, 0)
    code = code.astype(np.uint8)
    packed = (code[..., 0::2] | (code[..., 1::2] << 4)).astype(np.uint8)
    return packed, (exponent + 127).astype(np.uint8)


def mxfp4_decode(blocks, scales):
    """blocks [..., G, 16], scales [..., G] -> [..., G * 32] float64, by the e2m1 bit fields."""
    lo, hi = blocks & 0x0F, blocks >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    sign = np.where(codes & 8, -1.0, 1.0)
    exp_bits, mant = (codes >> 1) & 3, codes & 1
    value = np.where(exp_bits == 0, 0.5 * mant, np.ldexp(1.0 + 0.5 * mant, exp_bits.astype(np.int64) - 1))
    value = sign * value * np.ldexp(1.0, scales.astype(np.int64) - 127)[..., None]
    return value.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def gpt_oss_config(seed_cls):
    import inspect
    # max_position_embeddings = factor x original_max_position_embeddings: transformers 4.5x take the
    # factor from that ratio, later versions from "factor"; both agree here (as in the published config).
    rope = {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "original_max_position_embeddings": 32, "truncate": False}
    kwargs = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=5,
                  num_key_value_heads=1, head_dim=24, num_local_experts=6, num_experts_per_tok=2,
                  sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                  attention_bias=True, swiglu_limit=7.0, rms_norm_eps=1e-5, max_position_embeddings=256,
                  tie_word_embeddings=False, eos_token_id=0, bos_token_id=0, pad_token_id=0,
                  initializer_range=0.08, attention_dropout=0.0)
    params = inspect.signature(seed_cls.__init__).parameters
    if "rope_parameters" in params:  # transformers 5
        kwargs["rope_parameters"] = dict(rope, rope_theta=150000.0)
    else:
        kwargs["rope_scaling"] = rope
        kwargs["rope_theta"] = 150000.0
    return seed_cls(**kwargs)


def gpt_oss_experts_layout(experts, hidden, inter):
    """(gate_up [E, H, 2I], down [E, I, H]) of GptOssExperts, whatever this transformers stores
    (H, I and 2I differ in these configs, so the shapes say which)."""
    if len({hidden, inter, 2 * inter}) != 3:
        fail(f"gpt_oss: hidden {hidden} and expert width {inter} make the expert layouts ambiguous")
    gu, dn = experts.gate_up_proj, experts.down_proj
    if tuple(gu.shape[1:]) == (hidden, 2 * inter) and tuple(dn.shape[1:]) == (inter, hidden):
        return gu, dn
    if tuple(gu.shape[1:]) == (2 * inter, hidden) and tuple(dn.shape[1:]) == (hidden, inter):
        return gu.transpose(1, 2), dn.transpose(1, 2)
    fail(f"gpt_oss: unexpected expert shapes gate_up {tuple(gu.shape)} down {tuple(dn.shape)}")


def mlp_input_hook(store, i):
    """A forward pre-hook keeping the MLP's input rows (positional or hidden_states=)."""
    def fn(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        store[i] = x.reshape(-1, x.shape[-1]).detach().clone()
    return fn


class ForcedGptOssMlp(torch.nn.Module):
    """GptOssMLP with routing optionally forced: logits = x W^T + b; free: top-k on the logits;
    weights = softmax over the chosen logits (forced ids too: gating recomputed at those ids);
    experts: gate_up = x @ W + b, gate/up interleaved, gate <= limit, |up| <= limit,
    (up + 1) * gate * sigmoid(alpha gate), @ down + b."""

    def __init__(self, mlp, top_k, hidden, inter, returns_tuple):
        super().__init__()
        self.mlp, self.top_k, self.hidden, self.inter, self.returns_tuple = mlp, top_k, hidden, inter, returns_tuple
        self.forced = None

    def forward(self, hidden_states, *args, **kwargs):
        b, s, h = hidden_states.shape
        x = hidden_states.reshape(-1, h)
        router, experts = self.mlp.router, self.mlp.experts
        logits = F.linear(x, router.weight, router.bias)
        if self.forced is None:
            top, ids = torch.topk(logits, self.top_k, dim=-1)
        else:
            ids = self.forced
            top = logits.gather(1, ids)
        weights = F.softmax(top, dim=-1)
        gate_up_w, down_w = gpt_oss_experts_layout(experts, self.hidden, self.inter)
        limit, alpha = float(experts.limit), float(experts.alpha)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for k in range(ids.shape[1]):
                e = int(ids[t, k])
                gu = x[t] @ gate_up_w[e] + experts.gate_up_proj_bias[e]
                gate, up = gu[::2].clamp(max=limit), gu[1::2].clamp(min=-limit, max=limit)
                y = ((up + 1) * (gate * torch.sigmoid(gate * alpha))) @ down_w[e] + experts.down_proj_bias[e]
                out[t] += weights[t, k] * y
        out = out.reshape(b, s, h)
        return (out, logits) if self.returns_tuple else out


def dequantised_as_quantised(model, quantized, hidden, inter):
    """Whether every layer's experts hold exactly the decoded MXFP4 weights that were written."""
    for i, layer in enumerate(model.model.layers):
        got_gu, got_dn = gpt_oss_experts_layout(layer.mlp.experts, hidden, inter)
        if not (np.array_equal(got_gu.detach().double().cpu().numpy(), mxfp4_decode(*quantized[i][0]).transpose(0, 2, 1))
                and np.array_equal(got_dn.detach().double().cpu().numpy(),
                                   mxfp4_decode(*quantized[i][1]).transpose(0, 2, 1))):
            return False
    return True


def load_gpt_oss_mxfp4_reference(mx_dir, bf16_dir, hidden, inter, quantized):
    """The MXFP4 folder as transformers loads it, in float64: Mxfp4Config(dequantize=True) (its own
    dequantisation); failing that (or if the experts it loaded are not the MXFP4 values), the bf16
    model with experts from transformers' convert_moe_packed_tensors of the MXFP4 files. Returns
    (model, how)."""
    errors = []
    try:
        from transformers import Mxfp4Config
        for kwargs in ({"dtype": torch.float64, "experts_implementation": "eager"}, {"dtype": torch.float64},
                       {"experts_implementation": "eager"}, {}):
            try:
                model = AutoModelForCausalLM.from_pretrained(mx_dir, attn_implementation="eager",
                                                             quantization_config=Mxfp4Config(dequantize=True),
                                                             **kwargs)
            except (TypeError, ValueError) as e:
                errors.append(repr(e)[:300])
                continue
            model = model.to(torch.float64).eval()
            if dequantised_as_quantised(model, quantized, hidden, inter):
                return model, f"from_pretrained(quantization_config=Mxfp4Config(dequantize=True), {kwargs})"
            errors.append(f"from_pretrained({kwargs}) loaded experts that are not the MXFP4 values")
            break
    except Exception as e:  # ImportError, or the quantizer refusing this machine
        errors.append(repr(e)[:300])
    print("gpt_oss: transformers' MXFP4 load path failed:", errors, "; using convert_moe_packed_tensors", flush=True)
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    model = load_reference(bf16_dir)
    files = saved_tensors(mx_dir)
    for i, layer in enumerate(model.model.layers):
        experts = layer.mlp.experts
        for proj in ("gate_up_proj", "down_proj"):
            key = f"model.layers.{i}.mlp.experts.{proj}"
            deq = convert_moe_packed_tensors(files[key + "_blocks"], files[key + "_scales"]).to("cpu", torch.float64)
            if tuple(deq.shape) != tuple(getattr(experts, proj).shape):
                deq = deq.transpose(1, 2).contiguous()
            getattr(experts, proj).data.copy_(deq)
    if not dequantised_as_quantised(model, quantized, hidden, inter):
        fail("gpt_oss: transformers' convert_moe_packed_tensors does not give the MXFP4 values written")
    return model.eval(), "bf16 model + transformers' convert_moe_packed_tensors; errors: " + " | ".join(errors)


def make_gpt_oss():
    from transformers import GptOssConfig, GptOssForCausalLM
    seed = 14
    torch.manual_seed(seed)
    cfg = gpt_oss_config(GptOssConfig)
    H, I, E = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts
    top_k = cfg.num_experts_per_tok
    tok = train_tokenizer()
    model = GptOssForCausalLM(cfg).eval()
    rot = getattr(model.model, "rotary_emb", None)
    expected_mscale = 0.1 * np.log(8.0) + 1.0
    if rot is not None and abs(float(rot.attention_scaling) - expected_mscale) > 1e-9:
        fail(f"gpt_oss: the rotary embedding is not YaRN with factor 8 (attention_scaling {rot.attention_scaling})")
    for pname, p in model.named_parameters():
        if pname.endswith("mlp.router.weight"):
            p.normal_(0.0, 3.0 / np.sqrt(H))
        elif "norm" in pname:
            p.uniform_(0.5, 1.5)
        elif pname.endswith("sinks"):
            p.normal_(0.0, 1.0)
        elif pname.endswith((".bias", "_bias")):
            p.normal_(0.0, 0.1)
    # Expert weights on the MXFP4 grid, large enough that the clamp at swiglu_limit acts. No
    # forward pass here (the freshly built model's default kernels need not run on this CPU): the
    # experts' input is an RMSNorm output, rows of RMS 1 times the norm weight, so random such rows
    # stand in for it; the gate_up scale is raised until 5-30% of the pre-activations pass the
    # limit (measured again on the real inputs of the reloaded model: gpt_oss_fixtures).
    gen = torch.Generator().manual_seed(seed)
    proxy = torch.randn(256, H, generator=gen, dtype=torch.float64)
    proxy = proxy / proxy.pow(2).mean(-1, keepdim=True).sqrt()
    quantized = {}
    chosen_std = None
    for gate_up_std in (0.3, 0.45, 0.6, 0.8, 1.0, 1.3):
        passed = total = 0
        for i, layer in enumerate(model.model.layers):
            ex = layer.mlp.experts
            gu_w, dn_w = gpt_oss_experts_layout(ex, H, I)
            gu = torch.randn(E, 2 * I, H, generator=gen, dtype=torch.float64) * gate_up_std  # [E, out, in]
            dn = torch.randn(E, H, I, generator=gen, dtype=torch.float64) * 0.04
            quantized[i] = (mxfp4_quantize(gu.numpy()), mxfp4_quantize(dn.numpy()))
            gu_deq = torch.tensor(mxfp4_decode(*quantized[i][0]))  # [E, 2I, H]
            dn_deq = torch.tensor(mxfp4_decode(*quantized[i][1]))  # [E, H, I]
            gu_w.data.copy_(gu_deq.transpose(1, 2).to(gu_w.dtype))
            dn_w.data.copy_(dn_deq.transpose(1, 2).to(dn_w.dtype))
            x = proxy * layer.post_attention_layernorm.weight.double()
            pre = torch.einsum("th,eoh->eto", x, gu_deq) + ex.gate_up_proj_bias.double()[:, None, :]
            passed += int((pre[..., ::2] > cfg.swiglu_limit).sum() + (pre[..., 1::2].abs() > cfg.swiglu_limit).sum())
            total += pre.numel()
        fraction = passed / total
        print(f"gpt_oss: gate_up std {gate_up_std}: {fraction:.1%} of proxy pre-activations past the limit", flush=True)
        if 0.05 <= fraction <= 0.3:
            chosen_std = gate_up_std
            break
    if chosen_std is None:
        fail("gpt_oss: no expert scale made the SwiGLU clamp act on 5-30% of pre-activations")

    model = model.to(torch.bfloat16)
    in_memory = {k: v.detach().clone() for k, v in model.state_dict().items()}
    bf16_dir = os.path.join(OUT, "hf_gpt_oss", "gptoss_bf16")
    mx_dir = os.path.join(OUT, "hf_gpt_oss", "gptoss_mxfp4")
    for d in (bf16_dir, mx_dir):
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                       "model_max_length": 4096}, f)
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": 0, "do_sample": False}, f)
    model.save_pretrained(bf16_dir)
    names = saved_tensors(bf16_dir)
    for need in ("model.layers.0.self_attn.sinks", "model.layers.0.mlp.router.bias",
                 "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.gate_up_proj_bias",
                 "model.layers.0.mlp.experts.down_proj", "model.layers.0.mlp.experts.down_proj_bias",
                 "model.layers.0.self_attn.o_proj.bias"):
        if need not in names:
            fail(f"gpt_oss: the bf16 checkpoint has no {need}; layer 0 has "
                 f"{sorted(n for n in names if n.startswith('model.layers.0.'))}")
    if tuple(names["model.layers.0.mlp.experts.gate_up_proj"].shape) != (E, H, 2 * I):
        fail(f"gpt_oss: gate_up_proj saved as {tuple(names['model.layers.0.mlp.experts.gate_up_proj'].shape)}; "
             f"Switchyard reads transformers' [E, H, 2I] = {(E, H, 2 * I)}")

    # The MXFP4 folder: the same tensors, experts as blocks/scales, quantization_config mxfp4.
    from safetensors.torch import save_file
    mx_tensors = {}
    for key, value in names.items():
        proj = next((p for p in ("gate_up_proj", "down_proj") if key.endswith("mlp.experts." + p)), None)
        if proj is None:
            mx_tensors[key] = value.contiguous()
            continue
        layer_index = int(key.split(".")[2])
        blocks, scales = quantized[layer_index][0 if proj == "gate_up_proj" else 1]
        # The saved bf16 values are exactly the MXFP4 values (transposed to [in, out]).
        if not np.array_equal(mxfp4_decode(blocks, scales).transpose(0, 2, 1), value.double().numpy()):
            fail(f"gpt_oss: saved {key} is not the decoded MXFP4 weights")
        mx_tensors[key + "_blocks"] = torch.from_numpy(blocks.copy())
        mx_tensors[key + "_scales"] = torch.from_numpy(scales.copy())
    save_file(mx_tensors, os.path.join(mx_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(bf16_dir, "config.json")) as f:
        mx_config = json.load(f)
    mx_config["quantization_config"] = {"modules_to_not_convert": GPT_OSS_NOT_CONVERTED, "quant_method": "mxfp4"}
    with open(os.path.join(mx_dir, "config.json"), "w") as f:
        json.dump(mx_config, f, indent=2)

    bf16_model = load_reference(bf16_dir)
    check_reloaded("gptoss_bf16", bf16_model, in_memory)
    gpt_oss_fixtures(bf16_model, bf16_dir, "gptoss_bf16", tok, seed, {"gate_up_std": chosen_std})
    mx_model, how = load_gpt_oss_mxfp4_reference(mx_dir, bf16_dir, H, I, quantized)
    check_reloaded("gptoss_mxfp4", mx_model, in_memory)
    if float(mx_model.model.layers[0].mlp.experts.limit) != float(cfg.swiglu_limit):
        fail(f"gpt_oss: transformers' experts clamp at {mx_model.model.layers[0].mlp.experts.limit}, "
             f"config swiglu_limit {cfg.swiglu_limit}")
    probe = torch.tensor([tok.encode(PROMPTS[0]).ids])
    same = float((mx_model(probe).logits - bf16_model(probe).logits).abs().max())
    if same > 1e-12:
        fail(f"gpt_oss: the MXFP4 and bf16 reloads differ by {same}")
    gpt_oss_fixtures(mx_model, mx_dir, "gptoss_mxfp4", tok, seed, {"mxfp4_reference": how, "gate_up_std": chosen_std})


def check_reloaded(name, model, in_memory):
    """The reloaded weights are the saved bf16 values (where the names coincide)."""
    state = model.state_dict()
    compared = 0
    for key, value in in_memory.items():
        if key in state and state[key].shape == value.shape:
            if not torch.equal(state[key].to(torch.bfloat16), value):
                fail(f"{name}: reloaded {key} differs from what was saved")
            compared += 1
    if compared < 10:
        fail(f"{name}: only {compared} reloaded tensors could be compared with the saved ones")


def gpt_oss_fixtures(model, d, name, tok, seed, extra):
    cfg = model.config
    H, I, E, top_k = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts, cfg.num_experts_per_tok
    layers = model.model.layers
    moe_layers = list(range(cfg.num_hidden_layers))
    captured = {}
    handles = [layer.mlp.register_forward_pre_hook(mlp_input_hook(captured, i), with_kwargs=True)
               for i, layer in enumerate(layers)]
    fixture = {"name": name, "model_type": "gpt_oss", "moe_layers": moe_layers, "num_experts": E, "top_k": top_k,
               "reference_dtype": "float64", "sliding_window": cfg.sliding_window,
               "layer_types": list(cfg.layer_types), "prompts": [],
               "stored_tensor_sample": sorted(saved_tensors(d))[:12], **extra}
    gaps = []
    clamp_counts = [0, 0]
    windowed = [layer for layer in layers if getattr(layer.self_attn, "sliding_window", None)]
    if not windowed:
        fail(f"{name}: no layer has a sliding window")
    for pi, text in enumerate(PROMPTS):
        ids = tok.encode(text).ids
        if len(ids) < MIN_PROMPT_TOKENS or len(ids) <= cfg.sliding_window:
            fail(f"prompt {pi} has {len(ids)} tokens: need >= {MIN_PROMPT_TOKENS} and > the window {cfg.sliding_window}")
        seq = list(ids)
        logits_last = None
        for step in range(GREEDY_STEPS):
            out = model(torch.tensor([seq])).logits[0]
            if step == 0:
                logits_last = out[len(ids) - 1].numpy()
            seq.append(int(out[-1].argmax()))
        forced_input = seq[:-1]
        captured.clear()
        full_logits = model(torch.tensor([forced_input])).logits[0].numpy()
        # Each block is really applied: without it the logits change (then restored exactly).
        saved_window = cfg.sliding_window
        cfg.sliding_window = 1 << 20
        for layer in windowed:
            layer.self_attn.sliding_window = 1 << 20
        unwindowed = model(torch.tensor([forced_input])).logits[0].numpy()
        cfg.sliding_window = saved_window
        for layer in windowed:
            layer.self_attn.sliding_window = saved_window
        sinks = [layer.self_attn.sinks.data.clone() for layer in layers]
        for layer in layers:
            layer.self_attn.sinks.data.fill_(-1e30)
        sinkless = model(torch.tensor([forced_input])).logits[0].numpy()
        for layer, saved in zip(layers, sinks):
            layer.self_attn.sinks.data.copy_(saved)
        for what, other in (("sliding window", unwindowed), ("attention sinks", sinkless)):
            if np.abs(other - full_logits).max() < 1e-6:
                fail(f"{name}: the {what} does not change the logits")
        captured.clear()
        again = model(torch.tensor([forced_input])).logits[0].numpy()
        if np.abs(again - full_logits).max() > 1e-12:
            fail(f"{name}: restoring the window and sinks did not restore the logits")
        np.save(os.path.join(d, f"p{pi}_logits_last.npy"), logits_last.astype(np.float32))
        np.save(os.path.join(d, f"p{pi}_logits_all.npy"), full_logits.astype(np.float32))
        for li in moe_layers:
            router = layers[li].mlp.router
            r_logits = F.linear(captured[li], router.weight, router.bias)
            _, topk = torch.topk(r_logits, top_k, dim=-1)
            srt = np.sort(r_logits.numpy(), axis=1)[:, ::-1]
            gaps.extend((srt[:, top_k - 1] - srt[:, top_k]).tolist())
            np.save(os.path.join(d, f"p{pi}_router_logits_l{li}.npy"), r_logits.numpy().astype(np.float32))
            np.save(os.path.join(d, f"p{pi}_topk_l{li}.npy"), topk.numpy().astype(np.int32))
        fixture["prompts"].append({"text": text, "prompt_ids": ids, "continuation_ids": seq[len(ids):],
                                   "sequence_ids": forced_input})
        for li in moe_layers:  # the clamp acts on the real inputs
            ex = layers[li].mlp.experts
            gu_w, _ = gpt_oss_experts_layout(ex, H, I)
            pre = torch.einsum("th,ehk->etk", captured[li], gu_w) + ex.gate_up_proj_bias[:, None, :]
            clamp_counts[0] += int((pre[..., ::2] > ex.limit).sum() + (pre[..., 1::2].abs() > ex.limit).sum())
            clamp_counts[1] += pre.numel()
    for h in handles:
        h.remove()
    fixture["clamped_fraction"] = clamp_counts[0] / clamp_counts[1]
    if fixture["clamped_fraction"] < 0.005:
        fail(f"{name}: the SwiGLU clamp acts on only {fixture['clamped_fraction']:.2%} of expert pre-activations")
    decisive = float(np.mean(np.array(gaps) >= 1e-4))
    fixture["decisive_route_rows"] = decisive
    if decisive < 0.9:
        fail(f"{name}: only {decisive:.0%} of route rows have a k-th gap >= 1e-4")
    rot = getattr(model.model, "rotary_emb", None)
    if rot is not None:  # what transformers computed, for the C++ test to compare with its own
        fixture["rope_inv_freq"] = [float(v) for v in rot.inv_freq.float()]
        fixture["rope_attention_scaling"] = float(rot.attention_scaling)

    # Replay oracle: free routing through ForcedGptOssMlp must reproduce HF first.
    probe = layers[0].mlp(torch.zeros(1, 1, H, dtype=torch.float64))
    returns_tuple = isinstance(probe, tuple)
    forced_blocks = {}
    originals = {}
    for i in moe_layers:
        originals[i] = layers[i].mlp
        forced_blocks[i] = ForcedGptOssMlp(layers[i].mlp, top_k, H, I, returns_tuple)
        layers[i].mlp = forced_blocks[i]
    rng = np.random.default_rng(seed + 1)
    check = []
    for pi, rec in enumerate(fixture["prompts"]):
        seq = rec["sequence_ids"]
        free = model(torch.tensor([seq])).logits[0].numpy()
        check.append(float(np.abs(free - np.load(os.path.join(d, f"p{pi}_logits_all.npy"))).max()))
        routes = np.zeros((len(seq), cfg.num_hidden_layers, top_k), dtype=np.int32)
        for t in range(len(seq)):
            for li in moe_layers:
                routes[t, li] = rng.choice(E, size=top_k, replace=False)
        for li in moe_layers:
            forced_blocks[li].forced = torch.tensor(routes[:, li, :], dtype=torch.long)
        forced_logits = model(torch.tensor([seq])).logits[0].numpy()
        for li in moe_layers:
            forced_blocks[li].forced = None
        if np.abs(forced_logits - free).max() < 1e-2:
            fail(f"{name}: forced routes barely change the logits")
        np.save(os.path.join(d, f"p{pi}_forced_routes.npy"), routes)
        np.save(os.path.join(d, f"p{pi}_forced_logits_all.npy"), forced_logits.astype(np.float32))
    for i in moe_layers:
        layers[i].mlp = originals[i]
    fixture["forced_block_free_max_abs_diff"] = check
    if max(check) > 1e-5:
        fail(f"{name}: ForcedGptOssMlp does not reproduce HF: {check}")
    fixture["versions"] = {"transformers": transformers.__version__, "torch": torch.__version__,
                           "numpy": np.__version__}
    with open(os.path.join(d, "fixture.json"), "w") as f:
        json.dump(fixture, f, indent=1)
    print(name, "E", E, "k", top_k, "window", cfg.sliding_window, "prompt tokens",
          [len(p["prompt_ids"]) for p in fixture["prompts"]], "decisive", f"{decisive:.3f}", "free-vs-HF", check,
          extra, flush=True)


# ---------------------------------------------------------------------------------------------
# GLM-4.5 MoE and DeepSeek-V3: sigmoid routers, a selection-only bias, expert groups.


def sigmoid_route(block, cfg, x, drop_bias=False, drop_groups=False):
    """HF's noaux_tc routing of rows x: (scores [T, E] f32, choice [T, E] f32 with the dropped
    groups at 0.0 as HF masks them, kept [T, E] bool). Router logits in float32 (HF's routers cast
    to float32 whatever the model's dtype), sigmoid, + e_score_correction_bias, groups ranked by
    the sum of their two best choice scores, topk_group kept."""
    logits = F.linear(x.float(), block.gate.weight.float())
    scores = logits.sigmoid()
    choice = scores if drop_bias else scores + block.gate.e_score_correction_bias.float()
    experts = scores.shape[-1]
    groups = 1 if drop_groups else cfg.n_group
    keep = 1 if drop_groups else cfg.topk_group
    group_scores = choice.view(-1, groups, experts // groups).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=keep, dim=-1, sorted=False)[1]
    kept = torch.zeros_like(group_scores).scatter_(1, group_idx, 1).bool()
    kept = kept.unsqueeze(-1).expand(-1, groups, experts // groups).reshape(-1, experts)
    return scores, choice.masked_fill(~kept, 0.0), kept


class ForcedSigmoidMoe(torch.nn.Module):
    """A GLM-4.5 / DeepSeek-V3 MoE block with routing replaced by given ids (or free when forced is
    None): sigmoid_route -> top-k of the choice scores -> weights = unbiased scores at the ids,
    renormalised (+1e-20, as HF) if norm_topk_prob, times routed_scaling_factor -> routed experts
    -> plus the ungated shared experts."""

    def __init__(self, block, cfg, inter, returns_tuple):
        super().__init__()
        self.block, self.cfg, self.inter, self.returns_tuple = block, cfg, inter, returns_tuple
        self.forced = None  # LongTensor [tokens, K] or None

    def forward(self, hidden, *args, **kwargs):
        b, s, h = hidden.shape
        x = hidden.reshape(-1, h)
        scores, choice, _ = sigmoid_route(self.block, self.cfg, x)
        ids = torch.topk(choice, self.cfg.num_experts_per_tok, dim=-1)[1] if self.forced is None else self.forced
        weights = scores.gather(1, ids)
        if self.cfg.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * self.cfg.routed_scaling_factor
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for k in range(ids.shape[1]):
                g, u, d = expert_weights(self.block.experts, int(ids[t, k]), self.inter)
                out[t] += weights[t, k].to(x.dtype) * F.linear(F.silu(F.linear(x[t], g)) * F.linear(x[t], u), d)
        out = out + self.block.shared_experts(x)
        out = out.reshape(b, s, h)
        return (out, None) if self.returns_tuple else out


def config_with_rope(cls, kwargs, rope):
    """cls(**kwargs) with RoPE as this transformers spells it: rope_parameters (5) or rope_theta +
    rope_scaling / partial_rotary_factor at the top level (4)."""
    import inspect
    kwargs = dict(kwargs)
    if "rope_parameters" in inspect.signature(cls.__init__).parameters:
        kwargs["rope_parameters"] = dict(rope)
    else:
        kwargs["rope_theta"] = rope["rope_theta"]
        if "partial_rotary_factor" in rope:
            kwargs["partial_rotary_factor"] = rope["partial_rotary_factor"]
        if rope.get("rope_type", "default") != "default":
            kwargs["rope_scaling"] = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    return cls(**kwargs)


def add_mtp_layer(d, layers, hidden):
    """Appends a multi-token-prediction layer (index `layers`) to d/model.safetensors as published
    GLM / DeepSeek checkpoints hold one: the last decoder layer's tensors under the new index plus
    eh_proj [H, 2H], enorm, hnorm and shared_head.norm [H]. Returns the added names."""
    from safetensors.torch import save_file
    path = os.path.join(d, "model.safetensors")
    if not os.path.exists(path):
        fail(f"{d}: expected one model.safetensors to add the MTP layer to, found {sorted(os.listdir(d))}")
    tensors = saved_tensors(d)
    src, dst = f"model.layers.{layers - 1}.", f"model.layers.{layers}."
    extra = {k.replace(src, dst, 1): v.clone() for k, v in tensors.items() if k.startswith(src)}
    gen = torch.Generator().manual_seed(99)
    extra[dst + "eh_proj.weight"] = (torch.randn(hidden, 2 * hidden, generator=gen) * 0.02).to(torch.bfloat16)
    for norm in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
        extra[dst + norm] = torch.ones(hidden, dtype=torch.bfloat16)
    tensors.update(extra)
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})
    return sorted(extra)


def make_sigmoid_family(kind, folder, name, seed, cfg, must_have):
    torch.manual_seed(seed)
    d = os.path.join(OUT, folder, name)
    os.makedirs(d, exist_ok=True)
    tok = train_tokenizer()
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "model_max_length": 4096}, f)
    if kind == "glm4_moe":
        from transformers import Glm4MoeForCausalLM as cls
    else:
        from transformers import DeepseekV3ForCausalLM as cls
    model = cls(cfg).eval()
    # Routers decisive; the correction bias random (HF starts it at zero: it would steer nothing);
    # norms and biases random so a wrong or missing one shows.
    for pname, p in model.named_parameters():
        if pname.endswith("mlp.gate.weight"):
            p.normal_(0.0, 3.0 / np.sqrt(cfg.hidden_size))
        elif "norm" in pname:
            p.uniform_(0.5, 1.5)
        elif pname.endswith(".bias"):
            p.normal_(0.0, 0.1)
    biased = 0
    for bname, buf in model.named_buffers():
        if bname.endswith("e_score_correction_bias"):
            buf.normal_(0.0, 0.1)
            biased += 1
    if biased == 0:
        fail(f"{name}: no e_score_correction_bias buffer in {cls.__name__}")
    model = model.to(torch.bfloat16)
    in_memory = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.save_pretrained(d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 0, "do_sample": False}, f)
    names = saved_tensors(d)
    inter = cfg.moe_intermediate_size
    check_expert_names(names, kind, inter, layer=cfg.first_k_dense_replace)  # layer 0 is dense
    for need in must_have:
        if need not in names:
            fail(f"{name}: the checkpoint has no {need}; layer 1 has "
                 f"{sorted(n for n in names if n.startswith('model.layers.1.'))}")

    model = load_reference(d)
    cfg = model.config
    check_reloaded(name, model, in_memory)
    layers = model.model.layers
    blocks = {i: moe_block(l) for i, l in enumerate(layers)}
    moe_layers = [i for i, (attr, b) in blocks.items() if b is not None]
    if moe_layers != list(range(cfg.first_k_dense_replace, cfg.num_hidden_layers)):
        fail(f"{name}: MoE layers {moe_layers}, expected from first_k_dense_replace {cfg.first_k_dense_replace} on")
    top_k, num_experts = cfg.num_experts_per_tok, cfg.n_routed_experts
    captured = {}
    handles = [blocks[i][1].register_forward_pre_hook(mlp_input_hook(captured, i), with_kwargs=True)
               for i in moe_layers]
    fixture = {"name": name, "model_type": kind, "moe_layers": moe_layers, "num_experts": num_experts,
               "top_k": top_k, "reference_dtype": "float64", "route_order": "set", "prompts": [],
               "n_group": cfg.n_group, "topk_group": cfg.topk_group,
               "stored_tensor_sample": sorted(names)[:12]}
    rot = getattr(model.model, "rotary_emb", None)
    if kind == "glm4_moe":
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        if rot is None or 2 * len(rot.inv_freq) != int(head_dim * 0.5):
            fail(f"{name}: the rotary embedding has {None if rot is None else len(rot.inv_freq)} frequencies; "
                 f"partial rotary 0.5 of head_dim {head_dim} needs {int(head_dim * 0.5) // 2}")
        fixture["rotary_dim"] = 2 * len(rot.inv_freq)
    elif rot is not None:  # YaRN: what transformers computed, for the C++ test to compare with its own
        fixture["rope_inv_freq"] = [float(v) for v in rot.inv_freq.float()]
        fixture["rope_attention_scaling"] = float(rot.attention_scaling)
    gaps, changed_by_bias, changed_by_groups, rows = [], 0, 0, 0
    for pi, text in enumerate(PROMPTS):
        ids = tok.encode(text).ids
        if len(ids) < MIN_PROMPT_TOKENS:
            fail(f"prompt {pi} has {len(ids)} tokens, fewer than {MIN_PROMPT_TOKENS}")
        seq = list(ids)
        logits_last = None
        for step in range(GREEDY_STEPS):
            out = model(torch.tensor([seq])).logits[0]
            if step == 0:
                logits_last = out[len(ids) - 1].numpy()
            seq.append(int(out[-1].argmax()))
        forced_input = seq[:-1]
        captured.clear()
        full_logits = model(torch.tensor([forced_input])).logits[0].numpy()
        np.save(os.path.join(d, f"p{pi}_logits_last.npy"), logits_last.astype(np.float32))
        np.save(os.path.join(d, f"p{pi}_logits_all.npy"), full_logits.astype(np.float32))
        for li in moe_layers:
            block = blocks[li][1]
            _, choice, kept = sigmoid_route(block, cfg, captured[li])
            topk = torch.topk(choice, top_k, dim=-1)[1]
            if not bool(kept.gather(1, topk).all()):
                fail(f"{name}: layer {li} selected an expert of a dropped group (a negative choice score "
                     f"below HF's 0.0 mask); make the correction bias smaller")
            for variant, counter in (({"drop_bias": True}, "bias"), ({"drop_groups": True}, "groups")):
                _, other, _ = sigmoid_route(block, cfg, captured[li], **variant)
                other_topk = torch.topk(other, top_k, dim=-1)[1]
                differ = sum(set(a) != set(b) for a, b in zip(topk.tolist(), other_topk.tolist()))
                if counter == "bias":
                    changed_by_bias += differ
                else:
                    changed_by_groups += differ
            rows += topk.shape[0]
            gap_scores = choice.masked_fill(~kept, float("-inf")).numpy()
            srt = np.sort(gap_scores, axis=1)[:, ::-1]
            gaps.extend((srt[:, top_k - 1] - srt[:, top_k]).tolist())
            np.save(os.path.join(d, f"p{pi}_router_logits_l{li}.npy"), gap_scores.astype(np.float32))
            if cfg.n_group > 1:
                # The group choice's margin per row: the topk_group-th group score (sum of its two
                # best choice scores) minus the next; a near-tie here swaps whole groups, however
                # decisive the expert gaps look.
                _, unmasked, _ = sigmoid_route(block, cfg, captured[li], drop_groups=True)
                group_scores = unmasked.view(-1, cfg.n_group, unmasked.shape[-1] // cfg.n_group)
                group_scores = group_scores.topk(2, dim=-1)[0].sum(dim=-1)
                gsrt = torch.sort(group_scores, dim=-1, descending=True)[0].numpy()
                group_gap = gsrt[:, cfg.topk_group - 1] - gsrt[:, cfg.topk_group]
                np.save(os.path.join(d, f"p{pi}_group_gap_l{li}.npy"), group_gap.astype(np.float32))
            np.save(os.path.join(d, f"p{pi}_topk_l{li}.npy"), topk.numpy().astype(np.int32))
        fixture["prompts"].append({"text": text, "prompt_ids": ids, "continuation_ids": seq[len(ids):],
                                   "sequence_ids": forced_input})
    for h in handles:
        h.remove()
    fixture["rows_changed_without_bias"] = changed_by_bias
    fixture["rows_changed_without_groups"] = changed_by_groups
    if changed_by_bias == 0:
        fail(f"{name}: the correction bias changes no selection in {rows} rows")
    if cfg.n_group > 1 and changed_by_groups == 0:
        fail(f"{name}: the expert groups change no selection in {rows} rows")
    decisive = float(np.mean(np.array(gaps) >= 1e-4))
    fixture["decisive_route_rows"] = decisive
    if decisive < 0.9:
        fail(f"{name}: only {decisive:.0%} of route rows have a k-th gap >= 1e-4")

    # Replay oracle: swap in ForcedSigmoidMoe; free routing must reproduce HF's logits first.
    check = []
    forced_blocks = {}
    originals = {}
    for i in moe_layers:
        attr, block = blocks[i]
        probe = block(torch.zeros(1, 1, cfg.hidden_size, dtype=torch.float64))
        originals[i] = (attr, block)
        forced_blocks[i] = ForcedSigmoidMoe(block, cfg, inter, isinstance(probe, tuple))
        setattr(layers[i], attr, forced_blocks[i])
    rng = np.random.default_rng(seed + 1)
    for pi, rec in enumerate(fixture["prompts"]):
        seq = rec["sequence_ids"]
        free = model(torch.tensor([seq])).logits[0].numpy()
        check.append(float(np.abs(free - np.load(os.path.join(d, f"p{pi}_logits_all.npy"))).max()))
        routes = np.zeros((len(seq), cfg.num_hidden_layers, top_k), dtype=np.int32)
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
    for i, (attr, block) in originals.items():
        setattr(layers[i], attr, block)
    fixture["forced_block_free_max_abs_diff"] = check
    if max(check) > 1e-5:
        fail(f"{name}: ForcedSigmoidMoe does not reproduce HF: {check}")
    # Last, the MTP layer into the file (the reference above was computed without it; Switchyard
    # must load the file with it and ignore it).
    fixture["mtp_tensors_added"] = add_mtp_layer(d, cfg.num_hidden_layers, cfg.hidden_size)
    with open(os.path.join(d, "config.json")) as f:
        saved_config = json.load(f)
    saved_config["num_nextn_predict_layers"] = 1
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(saved_config, f, indent=2)
    fixture["versions"] = {"transformers": transformers.__version__, "torch": torch.__version__,
                           "numpy": np.__version__}
    with open(os.path.join(d, "fixture.json"), "w") as f:
        json.dump(fixture, f, indent=1)
    print(name, "moe_layers", moe_layers, "E", num_experts, "k", top_k, "prompt tokens",
          [len(p["prompt_ids"]) for p in fixture["prompts"]], "decisive", f"{decisive:.3f}",
          "rows changed without bias / groups", changed_by_bias, changed_by_groups, "of", rows,
          "free-vs-HF", check, flush=True)


def make_glm4_moe():
    from transformers import Glm4MoeConfig
    # head_dim 20 over 6 heads (q width 120), partial rotary 0.5: RoPE on the first 10 dims.
    cfg = config_with_rope(Glm4MoeConfig, dict(
        vocab_size=VOCAB, hidden_size=72, intermediate_size=88, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=2, head_dim=20, moe_intermediate_size=20, n_routed_experts=12, num_experts_per_tok=3,
        n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True, rms_norm_eps=1e-5,
        max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=0, bos_token_id=0, pad_token_id=0,
        initializer_range=0.08), {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    make_sigmoid_family("glm4_moe", "hf_glm4_moe", "glm4moe_partial_rotary", 15, cfg, [
        "model.layers.1.mlp.gate.e_score_correction_bias", "model.layers.1.mlp.shared_experts.gate_proj.weight",
        "model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.mlp.gate_proj.weight"])


def make_deepseek_v3():
    from transformers import DeepseekV3Config
    # max_position_embeddings = factor x original (transformers 4.5x derive the factor from it).
    params = dict(
        vocab_size=VOCAB, hidden_size=72, intermediate_size=88, moe_intermediate_size=20, num_hidden_layers=3,
        num_attention_heads=3, num_key_value_heads=3, q_lora_rank=40, kv_lora_rank=24, qk_nope_head_dim=12,
        qk_rope_head_dim=10, v_head_dim=14, n_routed_experts=12, n_group=4, topk_group=2, num_experts_per_tok=3,
        n_shared_experts=2, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_interleave=True, attention_bias=False, rms_norm_eps=1e-6, max_position_embeddings=256,
        tie_word_embeddings=False, eos_token_id=0, bos_token_id=0, pad_token_id=0, initializer_range=0.08)
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": 1.0, "mscale_all_dim": 0.8, "original_max_position_embeddings": 32}
    make_sigmoid_family("deepseek_v3", "hf_deepseek_v3", "deepseekv3_groups", 16,
                        config_with_rope(DeepseekV3Config, dict(params), dict(rope)), [
        "model.layers.1.mlp.gate.e_score_correction_bias", "model.layers.1.mlp.shared_experts.gate_proj.weight",
        "model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.0.self_attn.kv_b_proj.weight", "model.layers.0.mlp.gate_proj.weight"])
    # The same model with MLA head dims the CUDA backend expands for prefill on tensor cores
    # (qk_nope + qk_rope a multiple of 8, v_head_dim <= it: 16 + 8, v 16): its prompts run the
    # expanded path, deepseekv3_groups' (12 + 10) the absorbed one.
    params.update(qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    make_sigmoid_family("deepseek_v3", "hf_deepseek_v3", "deepseekv3_mla24", 17,
                        config_with_rope(DeepseekV3Config, dict(params), dict(rope)), [
        "model.layers.1.mlp.gate.e_score_correction_bias", "model.layers.0.self_attn.kv_b_proj.weight"])


common = dict(vocab_size=VOCAB, hidden_size=72, num_hidden_layers=3, max_position_embeddings=4096,
              eos_token_id=0, bos_token_id=0, initializer_range=0.08, tie_word_embeddings=False)

if "mixtral" in WANTED:
    make_family("mixtral", "hf_mixtral", "mixtral_window", 11, MixtralConfig(
        intermediate_size=40, num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
        num_experts_per_tok=2, sliding_window=WINDOW, rope_theta=1e6, rms_norm_eps=1e-5, **common))
if "olmoe" in WANTED:
    make_family("olmoe", "hf_olmoe", "olmoe_nonorm", 12, OlmoeConfig(
        intermediate_size=24, num_attention_heads=6, num_key_value_heads=3, num_experts=16, num_experts_per_tok=4,
        norm_topk_prob=False, rms_norm_eps=1e-5, rope_theta=10000.0, clip_qkv=None, **common))
if "qwen2_moe" in WANTED:
    make_family("qwen2_moe", "hf_qwen2_moe", "qwen2moe_shared_window", 13, Qwen2MoeConfig(
        intermediate_size=88, moe_intermediate_size=24, shared_expert_intermediate_size=56, num_attention_heads=4,
        num_key_value_heads=2, num_experts=12, num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[1], use_sliding_window=True, sliding_window=WINDOW, max_window_layers=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], qkv_bias=True,
        rms_norm_eps=1e-6, rope_theta=1e6, **common))
if "gpt_oss" in WANTED:
    make_gpt_oss()
if "glm4_moe" in WANTED:
    make_glm4_moe()
if "deepseek_v3" in WANTED:
    make_deepseek_v3()
if "qwen3_5_moe" in WANTED:
    make_family("qwen3_5_moe", "hf_qwen3_5_moe", "qwen35moe_hybrid", 15, qwen3_5_moe_config())
for family, folder, name in (("mixtral", "hf_mixtral", "mixtral_window"), ("olmoe", "hf_olmoe", "olmoe_nonorm"),
                             ("qwen2_moe", "hf_qwen2_moe", "qwen2moe_shared_window"),
                             ("gpt_oss", "hf_gpt_oss", "gptoss_mxfp4"), ("gpt_oss", "hf_gpt_oss", "gptoss_bf16"),
                             ("glm4_moe", "hf_glm4_moe", "glm4moe_partial_rotary"),
                             ("deepseek_v3", "hf_deepseek_v3", "deepseekv3_groups"),
                             ("deepseek_v3", "hf_deepseek_v3", "deepseekv3_mla24"),
                             ("qwen3_5_moe", "hf_qwen3_5_moe", "qwen35moe_hybrid")):
    if family in WANTED:
        print("config:", folder, open(os.path.join(OUT, folder, name, "config.json")).read().replace("\n", " ")[:600])
print("OK: copy", os.path.join(OUT, "hf_*"), "into tests/golden/")
