"""core-runner plugin for LlamaForCausalLM (a template for third-party plugins)."""
