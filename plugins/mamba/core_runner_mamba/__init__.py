"""core-runner plugin: Mamba2ForCausalLM, an attention-free state-space model."""
