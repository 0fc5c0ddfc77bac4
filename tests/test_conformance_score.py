"""CR-EQ-17 (core_runner/conformance/checks_score.py) and the suite's tokenizer
(core_runner/conformance/tokenizer.py): the pooling plugin's cross-encoders and embedding
models score text pairs as transformers does (checked on the background conformance run's
report, tests/test_conformance_plugins.py); a BERT cross-encoder that never receives the
pair's token types (tests/conformance_fixtures/score_token_types_ignored.py) passes CR-EQ-15
and fails CR-EQ-17."""
from __future__ import annotations

import importlib
import json
import types

import pytest

from core_runner.conformance import run_suite
from core_runner.conformance.tokenizer import min_vocab_size, write_tokenizer
from core_runner.plugins import PluginManager

pytest.importorskip("core_runner_pooling", reason="pip install -e plugins/pooling (requirements-dev)")


@pytest.mark.parametrize("vocab", [256, 512, 1000])
@pytest.mark.parametrize("encoder", [True, False])
def test_the_suite_tokenizer_has_the_config_vocab_and_the_specials(tmp_path, vocab, encoder):
    from transformers import AutoTokenizer

    cfg = types.SimpleNamespace(vocab_size=vocab, **({"type_vocab_size": 2} if encoder else {}))
    assert write_tokenizer(tmp_path, cfg)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == vocab and len(json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]) == vocab
    text = 'say {"n": 12} twice'
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text
    enc = tok("one two", "three", return_token_type_ids=True)
    if encoder:
        assert enc["input_ids"][0] == tok.cls_token_id and enc["input_ids"][-1] == tok.sep_token_id
        assert enc["input_ids"].count(tok.sep_token_id) == 2 and set(enc["token_type_ids"]) == {0, 1}
    else:
        assert tok.eos_token_id == 0 and "assistant" in tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert not write_tokenizer(tmp_path / "small", types.SimpleNamespace(vocab_size=min_vocab_size() - 1))


def test_ignored_token_types_fail_cr_eq_17_not_cr_eq_15():
    pm = PluginManager()
    pm.register_module("types_ignored", importlib.import_module("conformance_fixtures.score_token_types_ignored"))
    cases = {c["id"]: c for c in run_suite("types_ignored", pm=pm, checks=["CR-EQ-15", "CR-EQ-17"],
                                             tier="cpu")["checks"]}
    assert cases["CR-EQ-15"]["outcome"] == "passed", cases["CR-EQ-15"]["message"]
    c = cases["CR-EQ-17"]
    assert c["outcome"] == "failed", c
    assert "cross-encoder" in c["message"] and "the reference's" in c["message"], c["message"]
