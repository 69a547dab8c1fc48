"""A softmax-routed MoE block of transformers with its routing replaced by given expert ids: the
replay oracle of the golden scripts (family_goldens.py writes forced-route references in
float64 with it; bf16_sensitivity.py runs the same routes in bf16)."""
import torch
import torch.nn.functional as F


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
            ids = self.forced.to(x.device)
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

