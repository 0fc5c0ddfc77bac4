"""The published config.json of the embedding checkpoints, shrunk in size only, as
conformance examples (published sizes in the comments; EOS / BOS ids left to the suite).
Imports nothing."""

ALL_MINILM_L6_V2 = {  # sentence-transformers/all-MiniLM-L6-v2 (nreimers/MiniLM-L6-H384-uncased)
    "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": False,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 48,  # 384 (12 heads of 4 instead of 32)
    "initializer_range": 0.02,
    "intermediate_size": 192,  # 1536
    "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
    "num_hidden_layers": 2,  # 6
    "pad_token_id": 0, "position_embedding_type": "absolute", "type_vocab_size": 2, "use_cache": True,
    "vocab_size": 512,  # 30522
}

QWEN3_EMBEDDING_0_6B = {  # Qwen/Qwen3-Embedding-0.6B (served as Qwen3Model, last-token pooling)
    "architectures": ["Qwen3Model"], "attention_bias": False, "attention_dropout": 0.0,
    "head_dim": 32,  # 128
    "hidden_act": "silu",
    "hidden_size": 64,  # 1024
    "intermediate_size": 192,  # 3072
    "max_position_embeddings": 32768, "max_window_layers": 2,  # 28
    "model_type": "qwen3",
    "num_attention_heads": 4,  # 16
    "num_hidden_layers": 2,  # 28
    "num_key_value_heads": 2,  # 8
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "use_cache": True, "use_sliding_window": False,
    "vocab_size": 512,  # 151669
}

# Sequence classifiers (task classify / score). Written from memory without hub access:
# recheck field values against the hub when one is reachable.
MS_MARCO_MINILM_L6_V2 = {  # cross-encoder/ms-marco-MiniLM-L-6-v2: a reranker, one logit (sigmoid)
    "architectures": ["BertForSequenceClassification"], "attention_probs_dropout_prob": 0.1,
    "classifier_dropout": None, "gradient_checkpointing": False, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 48,  # 384
    "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}, "initializer_range": 0.02,
    "intermediate_size": 192,  # 1536
    "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
    "num_hidden_layers": 2,  # 6
    "pad_token_id": 0, "position_embedding_type": "absolute", "type_vocab_size": 2, "use_cache": True,
    "vocab_size": 512,  # 30522
}

TOXIC_BERT = {  # unitary/toxic-bert: six independent labels (multi-label: sigmoid per label)
    "architectures": ["BertForSequenceClassification"], "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 48,  # 768 (12 heads of 4 instead of 64)
    "id2label": {"0": "toxic", "1": "severe_toxic", "2": "obscene", "3": "threat", "4": "insult",
                 "5": "identity_hate"},
    "label2id": {"toxic": 0, "severe_toxic": 1, "obscene": 2, "threat": 3, "insult": 4, "identity_hate": 5},
    "initializer_range": 0.02,
    "intermediate_size": 192,  # 3072
    "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
    "num_hidden_layers": 2,  # 12
    "pad_token_id": 0, "position_embedding_type": "absolute", "problem_type": "multi_label_classification",
    "type_vocab_size": 2,
    "vocab_size": 512,  # 30522
}

QWEN3_RERANKER_0_6B_SEQ_CLS = {  # tomaarsen/Qwen3-Reranker-0.6B-seq-cls (Qwen/Qwen3-Reranker-0.6B's
    # "yes" - "no" logits folded into one score row): last-token classifier, one logit
    "architectures": ["Qwen3ForSequenceClassification"], "attention_bias": False, "attention_dropout": 0.0,
    "head_dim": 32,  # 128
    "hidden_act": "silu",
    "hidden_size": 64,  # 1024
    "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
    "intermediate_size": 192,  # 3072
    "max_position_embeddings": 40960, "max_window_layers": 2,  # 28
    "model_type": "qwen3",
    "num_attention_heads": 4,  # 16
    "num_hidden_layers": 2,  # 28
    "num_key_value_heads": 2,  # 8
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "use_cache": False, "use_sliding_window": False,
    "vocab_size": 512,  # 151669
}

# XLM-RoBERTa (written from memory without hub access, like the classifiers above)
BGE_M3 = {  # BAAI/bge-m3: served as XLMRobertaModel, CLS pooling, L2-normalised
    "architectures": ["XLMRobertaModel"], "attention_probs_dropout_prob": 0.1, "bos_token_id": 0,
    "classifier_dropout": None, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 64,  # 1024
    "initializer_range": 0.02,
    "intermediate_size": 256,  # 4096
    "layer_norm_eps": 1e-05, "max_position_embeddings": 8194, "model_type": "xlm-roberta",
    "num_attention_heads": 16,  # 16 (heads of 4 instead of 64)
    "num_hidden_layers": 2,  # 24
    "output_past": True, "pad_token_id": 1, "position_embedding_type": "absolute", "type_vocab_size": 1,
    "use_cache": True,
    "vocab_size": 512,  # 250002
}

BGE_RERANKER_V2_M3 = {  # BAAI/bge-reranker-v2-m3: a cross-encoder, one logit (sigmoid)
    **BGE_M3, "architectures": ["XLMRobertaForSequenceClassification"],
    "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
}

# Reward models (task reward; written from memory without hub access: recheck against the hub)
SKYWORK_REWARD_LLAMA_3_1_8B = {  # Skywork/Skywork-Reward-Llama-3.1-8B-v0.2: one raw reward at the last token
    "architectures": ["LlamaForSequenceClassification"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128009,
    "head_dim": 16,  # 128
    "hidden_act": "silu",
    "hidden_size": 64,  # 4096
    "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}, "initializer_range": 0.02,
    "intermediate_size": 224,  # 14336
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 4,  # 32
    "num_hidden_layers": 2,  # 32
    "num_key_value_heads": 1,  # 8 (the 4:1 grouping kept)
    # pad_token_id 128256 (an added token) left out: it lies outside the shrunk vocabulary
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "use_cache": True,
    "vocab_size": 512,  # 128256
}

# ModernBERT (written without hub access from transformers' ModernBertConfig defaults, which
# are answerdotai/ModernBERT-base's, and the published config.json's legacy fields as
# remembered: recheck against the hub). The published checkpoint is a ModernBertForMaskedLM;
# the encoder is served as ModernBertModel (what ModernBERT embedders declare).
MODERNBERT_BASE = {  # answerdotai/ModernBERT-base
    "architectures": ["ModernBertModel"],  # ModernBertForMaskedLM
    "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 425, "cls_token_id": 425, "eos_token_id": 426, "sep_token_id": 426,  # 50281 / 50282
    "pad_token_id": 427,  # 50283 (special ids keep their distance from the end of the vocabulary)
    "classifier_activation": "gelu", "classifier_bias": False, "classifier_dropout": 0.0,
    "classifier_pooling": "mean", "decoder_bias": True, "deterministic_flash_attn": False, "embedding_dropout": 0.0,
    "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0, "hidden_activation": "gelu",
    "hidden_size": 96,  # 768 (12 heads of 8 instead of 64)
    "initializer_cutoff_factor": 2.0, "initializer_range": 0.02,
    "intermediate_size": 144,  # 1152
    "local_attention": 16,  # 128: a window shorter than the suite's prompts, so local layers differ from global
    "local_rope_theta": 10000.0, "max_position_embeddings": 8192, "mlp_bias": False, "mlp_dropout": 0.0,
    "model_type": "modernbert", "norm_bias": False, "norm_eps": 1e-05, "num_attention_heads": 12,
    "num_hidden_layers": 4,  # 22 (layers 0 and 3 global, 1 and 2 local, as in the published pattern)
    "sparse_pred_ignore_index": -100, "sparse_prediction": False, "tie_word_embeddings": True,
    "vocab_size": 512,  # 50368
}

MODERNBERT_BASE_CLS3 = {  # ModernBERT-base fine-tuned as a three-way classifier (CLS pooling)
    **MODERNBERT_BASE, "architectures": ["ModernBertForSequenceClassification"], "classifier_pooling": "cls",
    "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
    "label2id": {"negative": 0, "neutral": 1, "positive": 2},
}

GTE_RERANKER_MODERNBERT_BASE = {  # Alibaba-NLP/gte-reranker-modernbert-base: a cross-encoder, one logit
    **MODERNBERT_BASE, "architectures": ["ModernBertForSequenceClassification"],
    "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
}
