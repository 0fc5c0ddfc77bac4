"""The catalog of conformance checks: stable ids, one-line statements, and what each
check is generated over. Imports nothing heavy; ``docs/conformance.md`` repeats the
statements (a test keeps the two in sync).

Scopes decide how a check is multiplied out of a plugin's registrations:
``plugin`` (once per plugin), ``architecture`` (once per registration),
``example`` (registration x example config) and ``capability`` (registration x
capability). A check with ``capability`` set is about that capability: it runs when
the capability is declared ``supported``, runs as a strict xfail when it is declared
``xfail`` (a pass then fails the run), and is not generated when it is unsupported,
where CR-BOUND-05 checks that enabling it is refused instead. A capability declared
``not applicable`` (triton_attention of a model without attention layers) has its checks
generated on every tier to check the claim, then reported "not run: not applicable".
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    id: str
    group: str  # registration | state | equivalence | bounds
    scope: str  # plugin | architecture | example | capability
    statement: str
    func: str  # "module:function" inside core_runner.conformance
    # the capability it is about; "prefix:*" = every capability of that prefix (one case each)
    capability: str | None = None
    gpu: bool = False  # needs a CUDA device (tier gpu)
    task: str | None = "generate"  # the task a registration must serve (None: any)
    also_tasks: tuple[str, ...] = ()  # registrations serving one of these get the check too

    def applies_to(self, tasks: tuple[str, ...] | list[str]) -> bool:
        return self.task is None or any(t in tasks for t in (self.task, *self.also_tasks))


def _c(id: str, scope: str, func: str, statement: str, **kw) -> Check:
    group = {"REG": "registration", "STATE": "state", "EQ": "equivalence", "BOUND": "bounds",
             "TP": "equivalence", "SPEC": "equivalence", "SO": "equivalence",
             "LP": "equivalence"}[id.split("-")[1]]
    if group == "registration":
        kw.setdefault("task", None)
    return Check(id=id, group=group, scope=scope, statement=statement, func=func, **kw)


_R, _S, _E, _B = "checks_registration", "checks_state", "checks_equivalence", "checks_bounds"
_P, _V = "checks_pooling", "checks_perturbed"

CHECKS: tuple[Check, ...] = (
    _c("CR-REG-01", "plugin", f"{_R}:fresh_process_load",
       "The entry point loads in a fresh spawned process and registers at least one architecture."),
    _c("CR-REG-02", "plugin", f"{_R}:no_cuda_at_registration",
       "Registering initialises no CUDA: torch.cuda is never initialised while the plugin loads."),
    _c("CR-REG-03", "plugin", f"{_R}:no_model_at_registration",
       "Registering builds no model: no model (or plugin state) module is imported and no nn.Module is constructed."),
    _c("CR-REG-04", "plugin", f"{_R}:no_silent_override",
       "No silent override: the plugin loads beside every installed plugin, and registering its "
       "architectures a second time is refused unless the registration says override=True."),
    _c("CR-REG-05", "architecture", f"{_R}:registration_complete",
       "Each registration is complete: model, model_state and reference import, every example builds a "
       "reference config, the state serves the declared tasks, and registry.toml agrees for built-ins."),
    _c("CR-STATE-01", "example", f"{_S}:reused_row_is_fresh",
       "A reused request row behaves exactly like a fresh one after every per-row buffer (runner, sampling "
       "and ModelState tables, row caches) and every free KV block is filled with garbage."),
    _c("CR-STATE-02", "example", f"{_S}:dummy_run_changes_nothing",
       "A dummy run changes no persistent state (before any request, mid-generation, after a finish) and "
       "later real steps stay bit-identical; the engine's caches, released and bound again (as the GPU memory "
       "profile does), leave no released tensor referenced."),
    _c("CR-STATE-03", "example", f"{_S}:settings_survive_chunking_and_preemption",
       "Per-request settings (temperature, top-k, top-p, seed, logprobs) survive chunked prefill and preemption."),
    _c("CR-STATE-04", "example", f"{_S}:event_order",
       "ModelState events within a step follow the contract: remove < add < apply_staged_writes < "
       "prepare_inputs < prepare_attn < forward < postprocess_state, each for the right rows."),
    _c("CR-STATE-05", "example", f"{_S}:buffers_sized_from_limits",
       "Per-row buffers and caches are sized from the workload limits (max_num_seqs, max_model_len, "
       "block_size, num_kv_blocks), never from a global maximum."),
    _c("CR-STATE-06", "architecture", "machine:random_lifecycles",
       "Random add / step / preempt / abort / finish sequences (a Hypothesis state machine) keep every "
       "request's tokens a prefix of its uninterrupted greedy reference."),
    _c("CR-EQ-01", "example", f"{_E}:logits_match_reference",
       "Logits equal the registration's reference class within 1e-4 (float32) at every prefill and decode "
       "position, and greedy tokens equal the reference's."),
    _c("CR-EQ-02", "example", f"{_E}:chunked_equals_full_prefill",
       "Chunked prefill gives the same greedy tokens as a one-step prefill, with logits within 1e-4 of the "
       "reference at every chunk end.", capability="chunked_prefill"),
    _c("CR-EQ-03", "example", f"{_E}:batch_and_row_do_not_matter",
       "Batch composition and row index do not change a request's greedy tokens or its logits (within 1e-4)."),
    _c("CR-EQ-04", "example", f"{_E}:preempt_resume_equals_uninterrupted",
       "Preempt + resume (from a small KV pool where the model has paged layers, and forced mid-prefill and "
       "mid-decode) equals an uninterrupted run."),
    _c("CR-EQ-05", "example", f"{_E}:same_seed_same_output",
       "The same seed gives the same sampled tokens whatever the batch, row or engine; another seed gives "
       "other tokens; the engine seed fixes the output of unseeded requests."),
    _c("CR-EQ-06", "capability", f"{_E}:graph_equals_eager",
       "CUDA graph replay gives the same tokens as eager execution (GPU).", capability="cuda_graphs", gpu=True),
    _c("CR-EQ-07", "capability", f"{_E}:async_equals_sync",
       "Async scheduling gives the same tokens as synchronous scheduling.", capability="async_scheduling"),
    _c("CR-EQ-08", "capability", f"{_E}:triton_equals_torch_attention",
       "Triton attention gives the same tokens, and logits within 1e-4, as the torch reference attention (GPU).",
       capability="triton_attention", gpu=True),
    _c("CR-EQ-09", "capability", "checks_prefix:prefix_hit_equals_miss",
       "With the prefix cache on, outputs equal those with it off (greedy tokens and float32 logits within 1e-5 at "
       "every position both engines compute; last-token embeddings within 1e-5 for a pooling model), with 4-token "
       "blocks and a prefix of several blocks shared by: a repeated prompt (a hit up to its last block), a partly "
       "shared one, hits while the owner runs and after it finished, chunked prefill after a hit, and a preempted "
       "request resuming from its cached blocks; the cache-on engine reports hits, the cache-off one none. For a "
       "hybrid model this is the check that its recurrent state is right on a hit.",
       capability="prefix_caching", task=None),
    _c("CR-EQ-10", "example", f"{_P}:embeddings_match_reference",
       "Embeddings equal the reference class's final hidden states pooled the same way within 1e-4, for every "
       "pooling type the model accepts, raw and L2-normalised, over prompts of mixed lengths in one batch, and in "
       "one batch mixing every type and both normalisations across its prompts; every request finishes normally "
       "with one vector of the hidden size.", task="embed"),
    _c("CR-EQ-11", "example", f"{_P}:embedding_independent_of_batch_row_and_chunks",
       "Every accepted pooling type gives the reference's embedding (1e-4) and the same one as in a single "
       "unchunked step (1e-5): alone, in a batch and in reversed order; with chunked prefill, at step budgets of 5 "
       "and 7 tokens that put chunk ends inside every prompt, types mixed in the batch; and in rows freed by "
       "longer earlier requests (chunked where supported); every request finishes normally with one vector of the "
       "hidden size.", task="embed"),
    _c("CR-EQ-15", "example", "checks_classify:probabilities_match_reference",
       "Classifier probabilities (sigmoid for num_labels 1 or multi-label, else softmax) equal the reference "
       "sequence classifier's within 1e-5 and raw logits (use_activation=False) within 1e-4 (float32), over "
       "prompts of mixed lengths in one batch mixing both, under chunked prefill at budgets of 5 and 7 tokens "
       "(where supported) and in rows freed by longer requests; every request finishes normally with num_labels "
       "values, in prompt order.", task="classify"),
    _c("CR-EQ-16", "example", "checks_classify:rewards_match_reference",
       "Reward scores (LLM.reward: the head's logits, raw by default; activated with use_activation=True) equal the "
       "reference head's within 1e-4 raw and 1e-5 activated (float32): one row of num_labels at the last token for "
       "a sequence head, one per prompt token for a per-token head; over CR-EQ-15's workload (mixed lengths, "
       "chunks of 5 and 7 tokens where supported, rows freed by longer requests) and, for a model that also "
       "classifies, in one batch mixing reward and classify requests, each with its task's default activation "
       "(CR-EQ-15 runs the same mix).", task="reward"),
    _c("CR-EQ-17", "example", "checks_score:scores_match_reference",
       "LLM.score(text_1, text_2) equals the reference within 1e-5 (float32): for a cross-encoder the classifier's "
       "sigmoid of its one logit on the pair encoded by the checkpoint's tokenizer with its pair template and token "
       "types (raw logits within 1e-4), for an embedding model the cosine of the two texts' reference embeddings; "
       "1 vs N and N vs N pairings of texts of mixed lengths, under chunked prefill at budgets of 5 and 7 tokens "
       "(where supported); a classifier of several labels is refused naming num_labels.",
       task="score", also_tasks=("embed",)),
    _c("CR-EQ-12", "example", f"{_V}:perturbed_config_fields",
       "Field sensitivity: every field of the reference config (numbers, bools, strings with the values the "
       "reference's source compares them with, lists of layer kinds or indices, nested RoPE parameters and kinds, "
       "None fields by their annotated type; dormant fields again together with the fields that share a word of "
       "their name) is moved until the reference's output on a 40-token probe changes; that variant, sharing the "
       "example's weights, gives the reference's logits (1e-4) at every recorded position of a batch under chunked "
       "prefill and its greedy tokens (embeddings, every accepted pooling type, for an embedding model), or is "
       "refused by name when the engine is built; a plugin whose output does not move is reported as ignoring the "
       "field.", task=None),
    _c("CR-EQ-13", "example", f"{_V}:long_positions",
       "A request whose positions reach past the original maximum of a scaled RoPE (at least 8,192 positions; "
       "4,096 for unscaled RoPE or a model without positions; max_position_embeddings raised where the example is "
       "smaller) gives the "
       "reference's logits at every prefill chunk end and decode step, and its greedy tokens, and finishes by "
       "length with every token it asked for."),
    _c("CR-EQ-14", "example", "checks_window:windowed_attention",
       "Sliding windows (examples with a windowed layer): a request several windows long beside a short one, "
       "under chunked prefill with 4-token blocks, gives the reference's logits at every chunk end and decode "
       "step; each windowed KV cache group holds no more blocks for it than its window and one step need while "
       "full groups hold the whole sequence; preempted mid-decode it continues the same; with prefix caching, "
       "a request extending its prompt hits past the window and equals the cache-off engine (tokens, logits "
       "within 1e-5)."),
    _c("CR-EQ-18", "capability", "checks_quantized:quantized_checkpoint_matches_dequantized",
       "Quantized checkpoints (every quantization method declared supported): the first unquantized example "
       "written in each of the method's schemes (block fp8 with weight_block_size; compressed-tensors "
       "float-quantized per tensor and per channel, through the compressed-tensors library) gives the logits "
       "(1e-4, float32) and greedy tokens of the reference class loaded from the dequantized weights; every layer "
       "that receives a quantized tensor holds float8_e4m3fn weights with float32 scales on the method's grid "
       "unless it is dense by construction (noted), none built for fp8 fell back to dense and at least one is fp8; "
       "a variant of the method it cannot load and a checkpoint of every method not declared are refused by name.",
       capability="quantization:*"),
    _c("CR-TP-01", "capability", "checks_parallel:tensor_parallel_equals_one_rank",
       "Tensor parallelism equals one rank: at tensor_parallel_size=2 (CPU, gloo) every example, and a "
       "one-KV-head variant where the example has as many KV heads as ranks, gives the same greedy tokens and "
       "logits within 1e-4 (float32) as tensor_parallel_size=1, under chunked prefill and a forced preemption "
       "(embeddings within 1e-4 for a pooling model).",
       capability="tensor_parallel", task=None),
    _c("CR-SPEC-01", "example", "checks_spec:speculation_equals_plain_decoding",
       "With n-gram speculation (3 proposals a step, lookup 1..3 tokens), greedy tokens equal those without it "
       "and the reference's, and seeded sampled requests (top_p 0.9, temperature 0.8 and 0.1) give the same "
       "tokens, with the logits of every output token within 1e-4, for repetitive prompts (proposals accepted) "
       "and random ones (mostly rejected), under chunked prefill and a forced preemption mid-decode; proposals "
       "were made, some accepted and some rejected.", capability="speculative_decoding"),
    _c("CR-SPEC-02", "example", "checks_spec:reused_row_after_speculation_is_fresh",
       "A row reused after a speculative request behaves as fresh: greedy and seeded requests that take it give "
       "the same tokens, and logits within 1e-4 at every output token, as in a fresh engine.",
       capability="speculative_decoding"),
    _c("CR-SPEC-03", "example", "checks_spec_draft:own_draft_equals_plain_decoding",
       "With the family's own draft model (a draft registered for the architecture itself, e.g. MTP layers; "
       "random weights from the example's config), CR-SPEC-01's workload gives the same tokens and logits as "
       "without speculation, under chunked prefill and a preemption; proposals were made. Not applicable to a "
       "family without one.", capability="speculative_decoding"),
    _c("CR-SO-01", "example", "checks_grammar:grammars_hold",
       "Structured outputs: greedy requests constrained by a JSON schema, a regex, a choice and json_object, in "
       "one batch with requests without a grammar, give outputs that parse and validate (a json_object output cut "
       "by max_tokens only a prefix the grammar accepts), and every request, with or without a grammar, gets the "
       "tokens it gets alone."),
    _c("CR-LP-01", "example", "checks_processors:processors_batch_invariant",
       "Logits processors are batch invariant: with a processor the suite registers through the public "
       "LogitsProcessor contract (per-request extra_args; its edit depends on the row's output so far) and every "
       "installed one, greedy and seeded requests with and without arguments get the tokens they get alone in a "
       "batch whose rows finish, are added while it runs and are preempted (chunked prefill where supported), and "
       "greedy requests with arguments get the reference's greedy tokens under the same edit."),
    _c("CR-BOUND-01", "example", f"{_B}:scheduler_limits_around_max_model_len",
       "Step budgets above, equal to and below max_model_len give the reference output (below needs chunked "
       "prefill and is otherwise rejected at config time)."),
    _c("CR-BOUND-02", "example", f"{_B}:prompt_of_max_model_len_minus_one",
       "A prompt of exactly max_model_len - 1 tokens runs in a KV pool of one max-length request and yields "
       "one reference token with finish_reason 'length'."),
    _c("CR-BOUND-03", "example", f"{_B}:bad_prompts_rejected_cleanly",
       "Over-length, empty and out-of-vocabulary prompts are rejected with a ValueError on add, leaving "
       "running requests and the engine untouched."),
    _c("CR-BOUND-04", "architecture", "options:every_option_has_an_effect",
       "Every EngineConfig option has an observable effect or rejects an invalid value (one probe per field; "
       "a field without a probe fails)."),
    _c("CR-BOUND-05", "capability", f"{_B}:unsupported_capability_refused",
       "A capability declared unsupported cannot be enabled: asking for it raises UnsupportedError at config "
       "time (strict mode for plan-level capabilities); one declared not applicable is checked to be so "
       "(triton_attention: the model has no paged KV cache).", task=None),
)

BY_ID = {c.id: c for c in CHECKS}


def select(patterns: list[str] | None) -> list[Check]:
    """Checks whose id equals or starts with one of ``patterns`` (all when None)."""
    if not patterns:
        return list(CHECKS)
    chosen = [c for c in CHECKS if any(c.id == p or c.id.startswith(p.rstrip("*")) for p in patterns)]
    unknown = [p for p in patterns if not any(c.id == p or c.id.startswith(p.rstrip("*")) for c in CHECKS)]
    if unknown:
        raise ValueError(f"unknown check id(s) {unknown}: known ids are {[c.id for c in CHECKS]}")
    return chosen
