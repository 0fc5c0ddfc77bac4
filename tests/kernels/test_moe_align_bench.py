"""benchmarks/moe_align_bench.py on small sizes (the interpreter on CPU): both alignments
timed and equal on every size, for both routings."""
import importlib.util
from pathlib import Path


def test_bench_rows_are_equal_and_timed(device, tmp_path):
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "moe_align_bench.py"
    spec = importlib.util.spec_from_file_location("moe_align_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "align.json"
    rows = mod.main(["--device", device, "--tokens", "3", "40", "--iters", "1", "--json", str(out)])
    assert [(r["routing"], r["tokens"]) for r in rows] == [("v2-lite", 3), ("v2-lite", 40), ("v3", 3), ("v3", 40)]
    assert all(r["equal"] and r["torch_us"] > 0 and r["triton_us"] > 0 for r in rows)
    assert out.read_text().count('"routing"') == 4
