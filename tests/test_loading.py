"""Loading weights: sharded safetensors through the index, pickles refused, every part of
every fused parameter accounted for, non-finite weights refused; each error names the
file, the tensor and what was expected. Uses the session's tiny Qwen3 checkpoints."""
from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import pytest
import torch
from checkpoint_surgery import copy_checkpoint, edit_tensors

from core_runner.loader import INDEX, CheckpointError, build_model, load_hf_config, load_weights


def qwen3(path: str | Path, dtype: torch.dtype = torch.float32):
    from core_runner_qwen3.model import Qwen3ForCausalLM

    return build_model(Qwen3ForCausalLM, load_hf_config(path), dtype, "cpu", path)


def empty_qwen3(path: str | Path):
    from core_runner_qwen3.model import Qwen3ForCausalLM

    return Qwen3ForCausalLM(load_hf_config(path))


@pytest.fixture(scope="module")
def sharded(untied, tmp_path_factory):
    path = tmp_path_factory.mktemp("sharded") / "ckpt"
    untied.hf.save_pretrained(str(path), max_shard_size="60KB")
    return path


def test_sharded_loads_and_equals_the_single_file(untied, sharded):
    shards = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert (sharded / INDEX).is_file() and len(shards) >= 3, shards
    # a stray file the index does not name is never read (this one is not even safetensors)
    (sharded / "zz-stray.safetensors").write_bytes(b"not a safetensors file")
    a, b = qwen3(untied.path), qwen3(sharded)
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    for name in pa:
        assert torch.equal(pa[name], pb[name]), name
    assert torch.isfinite(pa["model.layers.0.self_attn.qkv_proj.weight"]).all()


def test_index_naming_a_missing_shard(sharded, tmp_path):
    ckpt = copy_checkpoint(sharded, tmp_path / "ckpt")
    victim = sorted(ckpt.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=rf"{INDEX} names shard\(s\) \['{victim.name}'\] that are not in"):
        load_weights(empty_qwen3(ckpt), ckpt)


def test_index_naming_a_tensor_its_shard_lacks(sharded, tmp_path):
    import json

    ckpt = copy_checkpoint(sharded, tmp_path / "ckpt")
    index = json.loads((ckpt / INDEX).read_text())
    wm = index["weight_map"]
    wm["model.norm.weight"] = next(f for f in sorted(set(wm.values())) if f != wm["model.norm.weight"])
    (ckpt / INDEX).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"{wm['model.norm.weight']}: has no tensor 'model\.norm\.weight', "
                                               rf"but {INDEX} says it holds it"):
        load_weights(empty_qwen3(ckpt), ckpt)


def test_duplicate_tensors_without_an_index(untied, tmp_path):
    ckpt = copy_checkpoint(untied.path, tmp_path / "ckpt")
    (ckpt / "consolidated.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match=r"model\.safetensors:.* and consolidated\.safetensors:.* both load"):
        load_weights(empty_qwen3(ckpt), ckpt)


class _Boom:
    """Unpickling this would create the marker file: the loader must never unpickle."""

    marker = ""

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_pickle_only_checkpoint_is_refused_unread(untied, tmp_path):
    ckpt = copy_checkpoint(untied.path, tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    boom = _Boom()
    boom.marker = str(tmp_path / "unpickled")
    (ckpt / "pytorch_model.bin").write_bytes(pickle.dumps(boom))
    with pytest.raises(CheckpointError, match=r"only PyTorch pickle weights \(pytorch_model\.bin\)") as e:
        load_weights(empty_qwen3(ckpt), ckpt)
    assert "save_pretrained(" in str(e.value) and f"{ckpt}-safetensors" in str(e.value)
    assert not (tmp_path / "unpickled").exists()


def test_no_weights_at_all(untied, tmp_path):
    ckpt = copy_checkpoint(untied.path, tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors files in .*safetensors weights only"):
        load_weights(empty_qwen3(ckpt), ckpt)


def test_truncated_safetensors_names_the_file(untied, tmp_path):
    ckpt = copy_checkpoint(untied.path, tmp_path / "ckpt")
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(ckpt / 'model.safetensors'))}: not a readable "
                                               r"safetensors file .*truncated or corrupt"):
        load_weights(empty_qwen3(ckpt), ckpt)


def test_all_v_proj_deleted_names_them(untied, tmp_path):
    def drop(t):
        for name in [n for n in t if ".v_proj." in n]:
            del t[name]

    ckpt = edit_tensors(untied.path, tmp_path / "ckpt", drop)
    with pytest.raises(CheckpointError) as e:
        load_weights(empty_qwen3(ckpt), ckpt)
    msg = str(e.value)
    wanted = [f"model.layers.{i}.self_attn.v_proj.weight" for i in range(2)]
    assert all(repr(w) in msg for w in wanted), msg
    assert "q_proj" not in msg and "k_proj" not in msg and "2 tensor(s)" in msg


def test_a_gate_up_part_missing(untied, tmp_path):
    ckpt = edit_tensors(untied.path, tmp_path / "ckpt", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"1 tensor\(s\) that parts of fused parameters need are not in the "
                                               r"checkpoint: \['model\.layers\.1\.mlp\.up_proj\.weight'\]"):
        load_weights(empty_qwen3(ckpt), ckpt)


def test_a_declared_ignored_part_is_not_required(untied, tmp_path):
    from core_runner_qwen3.model import Qwen3ForCausalLM

    class NoUp(Qwen3ForCausalLM):
        ignored_weight_patterns = (*Qwen3ForCausalLM.ignored_weight_patterns, r"layers\.1\.mlp\.up_proj")

    ckpt = edit_tensors(untied.path, tmp_path / "ckpt", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    model = NoUp(load_hf_config(ckpt))
    load_weights(model, ckpt)
    # the other part did load
    gate = model.model.layers[1].mlp.gate_up_proj.weight[:128]
    assert torch.equal(gate, untied.hf.model.layers[1].mlp.gate_proj.weight)


def test_a_whole_unfused_parameter_missing(untied, tmp_path):
    ckpt = edit_tensors(untied.path, tmp_path / "ckpt", lambda t: t.pop("model.norm.weight"))
    with pytest.raises(CheckpointError, match=r"parameters of Qwen3ForCausalLM not found in the checkpoint: "
                                               r"\['model\.norm\.weight'\]"):
        load_weights(empty_qwen3(ckpt), ckpt)


def test_wrong_fused_part_shape(untied, tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"

    def widen(t):
        t[name] = torch.cat([t[name], t[name][:1]])

    ckpt = edit_tensors(untied.path, tmp_path / "ckpt", widen)
    with pytest.raises(CheckpointError) as e:
        load_weights(empty_qwen3(ckpt), ckpt)
    msg = str(e.value)
    assert f"tensor {name!r} of shape (33, 64) does not fit parameter 'model.layers.0.self_attn.qkv_proj.weight' " \
           "part 'k'" in msg, msg
    assert "expected (32, 64)" in msg and "model.safetensors" in msg


def test_wrong_unfused_shape(untied, tmp_path):
    ckpt = edit_tensors(untied.path, tmp_path / "ckpt",
                        lambda t: t.__setitem__("model.norm.weight", torch.ones(65)))
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight' of shape \(65,\) does not fit parameter "
                                               r"'model\.norm\.weight' \(shape \(64,\)\)"):
        load_weights(empty_qwen3(ckpt), ckpt)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weight_names_the_tensor(untied, tmp_path, bad):
    name = "model.layers.1.self_attn.o_proj.weight"

    def poison(t):
        t[name][3, 5] = bad

    ckpt = edit_tensors(untied.path, tmp_path / "ckpt", poison)
    kind = "1 NaN and 0 inf" if bad != bad else "0 NaN and 1 inf"
    with pytest.raises(CheckpointError, match=rf"tensor '{re.escape(name)}' of shape \(64, 64\) holds {kind} values "
                                               r"\(the first at index \(3, 5\)\)"):
        load_weights(empty_qwen3(ckpt), ckpt)


def test_overflow_of_the_model_dtype(untied, tmp_path):
    name = "model.layers.0.mlp.down_proj.weight"
    ckpt = edit_tensors(untied.path, tmp_path / "ckpt", lambda t: t[name].__setitem__((0, 0), 1e6))
    with pytest.raises(CheckpointError, match=rf"'{re.escape(name)}': its values \(max \|x\| = 1e\+06\) overflow "
                                               r"the model dtype torch.float16"):
        qwen3(ckpt, torch.float16)
    qwen3(ckpt, torch.bfloat16)  # the same weights fit bfloat16


def test_transform_sees_each_routed_tensor(untied):
    from core_runner_qwen3.model import Qwen3ForCausalLM

    seen = []

    def halve(name, t):
        seen.append(name)
        return t / 2 if name == "model.norm.weight" else t

    model = Qwen3ForCausalLM(load_hf_config(untied.path))
    load_weights(model, untied.path, transform=halve)
    assert "model.layers.0.self_attn.v_proj.weight" in seen and len(seen) == len(set(seen))
    assert torch.equal(model.model.norm.weight, untied.hf.model.norm.weight / 2)


def test_a_missing_expert_part_of_a_fused_moe(tmp_path):
    import transformers
    from core_runner_qwen3.model_moe import Qwen3MoeForCausalLM

    cfg = transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    transformers.Qwen3MoeForCausalLM(cfg).save_pretrained(str(tmp_path / "moe"))
    gone = ["model.layers.0.mlp.experts.2.up_proj.weight", "model.layers.0.mlp.experts.3.down_proj.weight"]

    def drop(t):
        assert all(g in t for g in gone), sorted(t)[:12]
        for g in gone:
            del t[g]

    ckpt = edit_tensors(tmp_path / "moe", tmp_path / "ckpt", drop)
    load_weights(Qwen3MoeForCausalLM(load_hf_config(tmp_path / "moe")), tmp_path / "moe")
    with pytest.raises(CheckpointError, match=rf"2 tensor\(s\) .*: {re.escape(repr(gone))}"):
        load_weights(Qwen3MoeForCausalLM(load_hf_config(ckpt)), ckpt)


def test_dummy_load_format_needs_only_the_config(untied, tmp_path):
    """load_format='dummy': random weights in vLLM's range, repeatable, norms at 1; a
    config-only directory is refused by 'auto' and runs with 'dummy'."""
    import shutil

    from core_runner import LLM

    shutil.copy(Path(untied.path) / "config.json", tmp_path / "config.json")
    opts = dict(device="cpu", dtype="float32", max_model_len=32, max_num_seqs=2, block_size=4, num_kv_blocks=16)
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(str(tmp_path), **opts)
    a, b = (LLM(str(tmp_path), load_format="dummy", **opts).engine.model for _ in range(2))
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), f"{name}: dummy weights must be repeatable"
        if p.dim() == 1 and "norm" in name:
            assert torch.all(p == 1), name
        else:
            assert float(p.abs().max()) <= 1e-3 and float(p.std()) > 1e-4, name
    from core_runner import SamplingParams

    out = LLM(str(tmp_path), load_format="dummy", **opts).generate(
        [[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    with pytest.raises(ValueError, match="load_format='pt' is invalid"):
        LLM(str(tmp_path), load_format="pt", **opts)
