"""Entry point module: registers the embedding architectures. Imports no torch."""
from core_runner.sdk import hookimpl
from core_runner_pooling.examples import (
    ALL_MINILM_L6_V2,
    BGE_M3,
    BGE_RERANKER_V2_M3,
    GTE_RERANKER_MODERNBERT_BASE,
    MODERNBERT_BASE,
    MODERNBERT_BASE_CLS3,
    MS_MARCO_MINILM_L6_V2,
    QWEN3_EMBEDDING_0_6B,
    QWEN3_RERANKER_0_6B_SEQ_CLS,
    SKYWORK_REWARD_LLAMA_3_1_8B,
    TOXIC_BERT,
)

# the core_runner.sdk versions this plugin is written for: any 1.x (docs/plugin_contract.md)
SDK_RANGE = ">=1.4,<2"  # the standard decoder blocks (SDK 1.4)

STATE = "model_states.pooling:PoolingModelState"
CLASSIFY_STATE = "model_states.classify:ClassifyModelState"
REWARD_STATE = "model_states.reward:RewardModelState"
TOKEN_REWARD_STATE = "model_states.reward:TokenRewardModelState"

BERT_CAPABILITIES = {
    # bidirectional attention: every token sees the whole prompt, so a prompt cannot be
    # split across steps
    "chunked_prefill": "unsupported",
    "cuda_graphs": "unsupported",  # prefill-only steps: eager (not yet measured on a GPU)
    "async_scheduling": "supported",
    # bidirectional: a block's hidden states depend on the tokens after it, so no prefix
    # can be reused
    "prefix_caching": "unsupported",
    "triton_attention": "supported",
    # heads and intermediate features split across ranks; pooling runs on every rank over
    # the same all-reduced hidden states
    "tensor_parallel": "supported",
    "expert_parallel": "unsupported",  # no MoE layers
    "speculative_decoding": "unsupported",  # embeds: generates no tokens
}

QWEN3_EMBED_CAPABILITIES = {
    "chunked_prefill": "supported",  # causal: last-token pooling reads only the final chunk
    "cuda_graphs": "unsupported",
    "async_scheduling": "supported",
    # causal: a cached prefix's KV is reused; mean / cls pooling requests read every prompt
    # token's hidden state, so they compute the whole prompt (Request.prefix_cacheable)
    "prefix_caching": "supported",
    "triton_attention": "supported",
    # the decoder stack is core-runner-qwen3's, split across ranks by its layers
    "tensor_parallel": "supported",
    "expert_parallel": "unsupported",  # dense: no MoE layers
    "speculative_decoding": "unsupported",  # embeds: generates no tokens
}

TINY_BERT = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, max_position_embeddings=128, type_vocab_size=2, layer_norm_eps=1e-12,
    hidden_act="gelu",
)

TINY_XLMR = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    max_position_embeddings=130, type_vocab_size=1, layer_norm_eps=1e-5, hidden_act="gelu", pad_token_id=1,
)

# ModernBERT: BERT's reasons, except attention: its local layers use the symmetric window
# (attention option bidirectional_window), which the Triton kernel does not implement
MODERNBERT_CAPABILITIES = {**BERT_CAPABILITIES, "triton_attention": "unsupported"}
TINY_MODERNBERT = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
    pad_token_id=0, bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2, global_attn_every_n_layers=2,
    local_attention=8, max_position_embeddings=512, norm_bias=True, mlp_bias=True, attention_bias=True,
    classifier_bias=True,
)

TINY_LLAMA = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu",
)

# Llama decoders (causal): the same reasons as Qwen3's, except per-token rewards, which read
# every prompt token's hidden state, so no cached prefix can stand in for them
LLAMA_REWARD_CAPABILITIES = dict(QWEN3_EMBED_CAPABILITIES)
LLAMA_TOKEN_REWARD_CAPABILITIES = {**QWEN3_EMBED_CAPABILITIES, "prefix_caching": "unsupported"}
# the Llama layers implement exactly these config values (pretraining_tp is transformers' training split)
LLAMA_ACCEPTED = {"hidden_act": ["silu"], "pretraining_tp": [1]}

TINY_QWEN3 = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
    rms_norm_eps=1e-6, rope_theta=10000.0,
)


@hookimpl
def register_models(registry):
    registry.add(
        architecture="BertModel",
        model="core_runner_pooling.bert:BertModel",
        model_state=STATE,
        capabilities=BERT_CAPABILITIES,
        reference="transformers:BertModel",
        sdk_version=SDK_RANGE,
        tasks=("embed",),
        examples=[{"name": "tiny-bert", "config": TINY_BERT},
                  {"name": "all-minilm-l6-v2-shape", "config": ALL_MINILM_L6_V2}],
    )
    registry.add(
        architecture="Qwen3Model",
        model="core_runner_pooling.qwen3_embed:Qwen3EmbeddingModel",
        model_state=STATE,
        capabilities=QWEN3_EMBED_CAPABILITIES,
        # the Qwen3 layers it reuses: full attention, SiLU-gated MLPs
        accepted_config={"use_sliding_window": [False], "hidden_act": ["silu"]},
        reference="transformers:Qwen3Model",
        sdk_version=SDK_RANGE,
        tasks=("embed",),
        examples=[{"name": "tiny-qwen3-embed", "config": TINY_QWEN3},
                  {"name": "qwen3-embedding-0.6b-shape", "config": QWEN3_EMBEDDING_0_6B}],
    )
    registry.add(
        architecture="BertForSequenceClassification",
        model="core_runner_pooling.bert:BertForSequenceClassification",
        model_state=CLASSIFY_STATE,
        capabilities=BERT_CAPABILITIES,
        reference="transformers:BertForSequenceClassification",
        sdk_version=SDK_RANGE,
        tasks=("classify", "score"),
        examples=[{"name": "tiny-bert-cls", "config": {**TINY_BERT, "num_labels": 3}},
                  {"name": "ms-marco-minilm-l6-v2-shape", "config": MS_MARCO_MINILM_L6_V2},
                  {"name": "toxic-bert-shape", "config": TOXIC_BERT}],
    )
    registry.add(
        architecture="Qwen3ForSequenceClassification",
        model="core_runner_pooling.qwen3_embed:Qwen3ForSequenceClassification",
        model_state=CLASSIFY_STATE,
        capabilities=QWEN3_EMBED_CAPABILITIES,
        accepted_config={"use_sliding_window": [False], "hidden_act": ["silu"]},
        reference="transformers:Qwen3ForSequenceClassification",
        sdk_version=SDK_RANGE,
        tasks=("classify", "score"),
        examples=[{"name": "tiny-qwen3-cls", "config": {**TINY_QWEN3, "num_labels": 2}},
                  {"name": "qwen3-reranker-0.6b-seq-cls-shape", "config": QWEN3_RERANKER_0_6B_SEQ_CLS}],
    )
    registry.add(
        architecture="XLMRobertaModel",
        model="core_runner_pooling.xlm_roberta:XLMRobertaModel",
        model_state=STATE,
        capabilities=BERT_CAPABILITIES,  # BERT's encoder: the same reasons
        reference="transformers:XLMRobertaModel",
        sdk_version=SDK_RANGE,
        tasks=("embed",),
        examples=[{"name": "tiny-xlm-roberta", "config": TINY_XLMR},
                  {"name": "bge-m3-shape", "config": BGE_M3}],
    )
    registry.add(
        architecture="XLMRobertaForSequenceClassification",
        model="core_runner_pooling.xlm_roberta:XLMRobertaForSequenceClassification",
        model_state=CLASSIFY_STATE,
        capabilities=BERT_CAPABILITIES,
        reference="transformers:XLMRobertaForSequenceClassification",
        sdk_version=SDK_RANGE,
        tasks=("classify", "score"),
        examples=[{"name": "tiny-xlm-roberta-cls", "config": {**TINY_XLMR, "num_labels": 3}},
                  {"name": "bge-reranker-v2-m3-shape", "config": BGE_RERANKER_V2_M3}],
    )
    registry.add(
        architecture="LlamaForSequenceClassification",
        model="core_runner_pooling.llama_reward:LlamaForSequenceClassification",
        model_state=REWARD_STATE,
        capabilities=LLAMA_REWARD_CAPABILITIES,
        accepted_config=LLAMA_ACCEPTED,
        reference="transformers:LlamaForSequenceClassification",
        sdk_version=">=1.4,<2",  # the standard decoder blocks (SDK 1.4)
        tasks=("reward", "classify", "score"),
        examples=[{"name": "tiny-llama-reward", "config": {**TINY_LLAMA, "num_labels": 1, "attention_bias": True}},
                  {"name": "skywork-reward-llama-3.1-8b-shape", "config": SKYWORK_REWARD_LLAMA_3_1_8B}],
    )
    registry.add(
        architecture="LlamaForTokenClassification",
        model="core_runner_pooling.llama_reward:LlamaForTokenClassification",
        model_state=TOKEN_REWARD_STATE,
        capabilities=LLAMA_TOKEN_REWARD_CAPABILITIES,
        accepted_config=LLAMA_ACCEPTED,
        reference="transformers:LlamaForTokenClassification",
        sdk_version=">=1.4,<2",
        tasks=("reward",),
        examples=[{"name": "tiny-llama-token-reward", "config": {**TINY_LLAMA, "num_labels": 2, "mlp_bias": True}}],
    )
    registry.add(
        architecture="ModernBertModel",
        model="core_runner_pooling.modernbert:ModernBertModel",
        model_state=STATE,
        capabilities=MODERNBERT_CAPABILITIES,
        reference="transformers:ModernBertModel",
        sdk_version=">=1.4,<2",  # Attention(bidirectional_window=)
        tasks=("embed",),
        examples=[{"name": "tiny-modernbert", "config": TINY_MODERNBERT},
                  {"name": "modernbert-base-shape", "config": MODERNBERT_BASE}],
    )
    registry.add(
        architecture="ModernBertForSequenceClassification",
        model="core_runner_pooling.modernbert:ModernBertForSequenceClassification",
        model_state=CLASSIFY_STATE,
        capabilities=MODERNBERT_CAPABILITIES,
        reference="transformers:ModernBertForSequenceClassification",
        sdk_version=">=1.4,<2",
        tasks=("classify", "score"),
        examples=[{"name": "tiny-modernbert-cls", "config": {**TINY_MODERNBERT, "num_labels": 2,
                                                             "classifier_pooling": "mean"}},
                  {"name": "modernbert-base-cls3-shape", "config": MODERNBERT_BASE_CLS3},
                  {"name": "gte-reranker-modernbert-base-shape", "config": GTE_RERANKER_MODERNBERT_BASE}],
    )
