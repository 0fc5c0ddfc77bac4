"""A tensor-parallel Llama for the loader's engine-level test: the template plugin's
model with its projections split (QKVParallelLinear / RowParallelLinear /
MergedColumnParallelLinear; the embedding and LM head already are), registered as a
plugin that declares ``tensor_parallel`` and ``quantization:fp8``. Its forwards are the
template's own; only the constructors choose the split layers and the rank's head
counts. Workers import it by name ("tp_llama_fixture:TPLlamaForCausalLM"): the test's
sys.path travels to them."""
from __future__ import annotations

from typing import Any

from core_runner_llama_template import model as template
from torch import nn

from core_runner import hookimpl
from core_runner.layers import (
    Attention,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RMSNorm,
    RowParallelLinear,
    SiluAndMul,
    get_rope,
)


class TPLlamaAttention(template.LlamaAttention):
    def __init__(self, config: Any) -> None:
        nn.Module.__init__(self)
        hidden, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, heads, kv)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(heads * self.head_dim, hidden)
        self.rotary_emb = get_rope(config, self.head_dim)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5)
        self.split = [self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                      self.num_kv_heads * self.head_dim]


class TPLlamaMLP(template.LlamaMLP):
    def __init__(self, config: Any) -> None:
        nn.Module.__init__(self)
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter])
        self.down_proj = RowParallelLinear(inter, config.hidden_size)
        self.act = SiluAndMul()


class TPLlamaDecoderLayer(template.LlamaDecoderLayer):
    def __init__(self, config: Any) -> None:
        nn.Module.__init__(self)
        self.self_attn = TPLlamaAttention(config)
        self.mlp = TPLlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class TPLlamaForCausalLM(template.LlamaForCausalLM):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.model.layers = nn.ModuleList(TPLlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))


@hookimpl
def register_models(registry):
    registry.add(
        architecture="LlamaForCausalLM", model="tp_llama_fixture:TPLlamaForCausalLM",
        model_state="model_states.default:DefaultModelState",
        capabilities={"tensor_parallel": "supported", "quantization:fp8": "supported",
                      "chunked_prefill": "supported"},
    )
