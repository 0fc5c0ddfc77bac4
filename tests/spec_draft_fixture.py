"""A minimal draft model written as a third party would (``core_runner.sdk.DraftModel``
from ``core_runner.layers``), registered for method "eagle" under its own architecture
name: it exercises the runner's draft path (first pass over the step, decode passes,
the draft's own paged cache, lookahead blocks) without any plugin's draft classes."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from core_runner.layers import Attention, Linear, QKVParallelLinear, VocabParallelEmbedding, get_rope
from core_runner.sdk import DraftModel

ARCH = "TinyDraftForTest"


class TinyDraft(DraftModel):
    """x = fc([embed(token at p + 1), target hidden at p]); x += o(attention(x)); logits
    = lm_head(x). Hidden size and vocabulary are the target's."""

    def __init__(self, config, target_config, weight_names) -> None:
        super().__init__()
        h, heads, kv, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, h)
        self.fc = Linear(2 * h, h)
        self.qkv_proj = QKVParallelLinear(h, d, heads, kv)
        self.o_proj = Linear(heads * d, h)
        self.rotary_emb = get_rope(config, d)
        self.attn = Attention(heads, kv, d, d ** -0.5)
        self.lm_head = Linear(h, config.vocab_size)
        self.sizes = [heads * d, kv * d, kv * d]
        self.shape = (heads, kv, d)
        self.hidden_size = h

    def forward(self, input_ids, positions, hidden_states, spec_step_idx=0):
        x = self.fc(torch.cat([self.embed_tokens(input_ids), hidden_states], dim=-1))
        q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        heads, kv, d = self.shape
        q, k = self.rotary_emb(positions, q.reshape(-1, heads, d), k.reshape(-1, kv, d))
        x = x + self.o_proj(self.attn(q, k, v))
        return x, x

    def compute_logits(self, hidden_states, spec_step_idx=0):
        return self.lm_head(hidden_states)


def write_draft(path: Path, target_config: dict, seed: int = 3, scale: float = 0.2) -> str:
    """A random TinyDraft checkpoint for a target with ``target_config`` (Qwen3 / Llama fields)."""
    path.mkdir(parents=True, exist_ok=True)
    c = target_config
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or h // heads
    cfg = {"architectures": [ARCH], "model_type": "llama", "hidden_size": h, "num_attention_heads": heads,
           "num_key_value_heads": kv, "head_dim": d, "vocab_size": c["vocab_size"], "num_hidden_layers": 1,
           "intermediate_size": c["intermediate_size"], "max_position_embeddings": c["max_position_embeddings"],
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
    (path / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * scale).contiguous()

    save_file({
        "embed_tokens.weight": rand(c["vocab_size"], h), "fc.weight": rand(h, 2 * h),
        "q_proj.weight": rand(heads * d, h), "k_proj.weight": rand(kv * d, h), "v_proj.weight": rand(kv * d, h),
        "o_proj.weight": rand(h, heads * d), "lm_head.weight": rand(c["vocab_size"], h),
    }, str(path / "model.safetensors"))
    return str(path)


TinyDraft.packed_modules_mapping = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"),
                                    "v_proj": ("qkv_proj", "v")}


def write_copying_pair(root: Path, cfg: dict, seed: int = 1) -> tuple[str, str]:
    """(target, draft) paths: a Qwen3 target whose attention adds nothing (o_proj zero, so
    each position's logits depend on its own token only) and a TinyDraft that copies it:
    its embedding row of token t is the target's final hidden state for t, its fc keeps
    the embedding, its attention adds nothing and its LM head is the target's, so it
    proposes exactly the target's next greedy token."""
    import transformers
    from safetensors.torch import load_file

    torch.manual_seed(seed)
    flat = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**cfg)).float().eval()
    with torch.no_grad():
        for layer in flat.model.layers:
            layer.self_attn.o_proj.weight.zero_()
        per_token = flat.model(input_ids=torch.arange(cfg["vocab_size"])[:, None]).last_hidden_state[:, 0]
    flat.save_pretrained(str(root / "flat"))
    copy = write_draft(root / "copy", cfg)
    w = load_file(str(Path(copy) / "model.safetensors"))
    h = cfg["hidden_size"]
    w["embed_tokens.weight"] = per_token.contiguous()
    w["fc.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)
    w["o_proj.weight"] = torch.zeros_like(w["o_proj.weight"])
    w["lm_head.weight"] = flat.lm_head.weight.detach().clone()
    save_file(w, str(Path(copy) / "model.safetensors"))
    return str(root / "flat"), copy


def plugins_with_draft():
    from core_runner.plugins import load_plugins

    pm = load_plugins()
    if pm.registry.find_draft(ARCH, "eagle") is None:
        pm.registry.add_draft(architecture=ARCH, method="eagle", model="spec_draft_fixture:TinyDraft")
    return pm
